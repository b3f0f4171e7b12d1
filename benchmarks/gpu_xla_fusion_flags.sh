#!/bin/bash
# One GPU call (~6 min): does an XLA fusion option cut the bf16 B=1 decode step's ~25 small kernels per layer
# (issue 5: bf16 must come within 1.3x of its byte floor)? e2e.py's b1 section for bf16 at a 1K prefix under
# each XLA_FLAGS variant below, one process each, merged into xla_fusion_flags_h200.json (rows per variant;
# a variant XLA rejects or that fails keeps its error). Then, if HLO=1, decode_hlo_copies.py (compile only):
# every kernel-launching instruction of the bf16 and hyquant decode loop bodies with the JAX op it came from.
# Run from the repository root:  [HLO=1] bash benchmarks/gpu_xla_fusion_flags.sh
# (CPU check of the script: OUT=/tmp/x E2E_ARGS=--smoke PREFIXES=64 bash benchmarks/gpu_xla_fusion_flags.sh)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/flags"
export PYTHONPATH=. PYTHONUNBUFFERED=1
VARIANTS=(  # options this jaxlib accepts (an unknown one aborts XLA); the last is the baseline again, for spread
  ""
  "--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true"
  "--xla_gpu_experimental_enable_fusion_block_level_rewriter=true"
  "--xla_gpu_experimental_all_fusions_with_triton=true"
  "--xla_gpu_experimental_enable_same_shape_multi_output_fusion=true"
  "--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true --xla_gpu_experimental_enable_fusion_block_level_rewriter=true --xla_gpu_unsupported_enable_triton_multi_output_fusion=true"
  ""
)
for i in "${!VARIANTS[@]}"; do
  XLA_FLAGS="${VARIANTS[$i]}" timeout ${RUN_LIMIT:-100} python3 benchmarks/e2e.py --out "$OUT/flags" --name "v$i" \
      --sections b1 --methods bf16 --prefixes ${PREFIXES:-1024} --steps 32 --reps 3 --no-plot ${E2E_ARGS:-} \
      >> "$OUT/xla_fusion_flags.log" 2>&1
  echo "v$i rc=$? flags='${VARIANTS[$i]}'"; grep -A1 "^B=1" "$OUT/xla_fusion_flags.log" | tail -1
done
python3 - "$OUT" "${VARIANTS[@]}" <<'EOF'
import json, os, sys
out, variants = sys.argv[1], sys.argv[2:]
rows = []
for i, flags in enumerate(variants):
    path = os.path.join(out, "flags", f"v{i}.json")
    entry = {"variant": i, "xla_flags": flags}
    if os.path.exists(path):
        d = json.load(open(path))
        entry["b1"] = d["b1"]
        entry["environment"] = d["environment"]
    else:
        entry["error"] = "no JSON (see xla_fusion_flags.log)"
    rows.append(entry)
json.dump({"note": "e2e.py b1, bf16, one process per XLA_FLAGS variant, same call", "variants": rows},
          open(os.path.join(out, "xla_fusion_flags_h200.json"), "w"), indent=1)
EOF
rm -rf "$OUT/flags"
if [ "${HLO:-0}" = 1 ]; then
  timeout ${HLO_LIMIT:-150} python3 benchmarks/decode_hlo_copies.py --out "$OUT" --name decode_hlo_copies_h200 \
      > "$OUT/decode_hlo_copies_h200.log" 2>&1
  echo "hlo rc=$?"; grep "copies" "$OUT/decode_hlo_copies_h200.log" | head -8
fi
