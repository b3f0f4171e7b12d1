#!/bin/bash
# One GPU call: e2e.py's b1 section under each XLA_FLAGS variant, one process each, merged into OUT/NAME.json
# (rows per variant; a variant XLA rejects or that fails keeps its error). Then, if HLO=1, decode_hlo_copies.py
# (compile only): every kernel-launching instruction of the bf16 and hyquant decode loop bodies.
# Defaults (session 25, ~6 min): bf16 at a 1K prefix under XLA's experimental fusion options (issue 5: can a
# fusion option cut bf16's ~25 small kernels per layer?). VARIANTS (one XLA_FLAGS value per line, "" for none)
# METHODS, PREFIXES and NAME override them, e.g. session 32's launch options (~6 min):
#   VARIANTS=$'\n--xla_gpu_enable_command_buffer=+WHILE\n--xla_gpu_require_exclusive_lock=true' \
#   METHODS=bf16,hyquant PREFIXES=1024,32768 NAME=xla_launch_flags_h200 bash benchmarks/gpu_xla_fusion_flags.sh
# Run from the repository root. CPU check of the script:
#   OUT=/tmp/x E2E_ARGS=--smoke PREFIXES=64 bash benchmarks/gpu_xla_fusion_flags.sh
set -u
OUT=${OUT:-/tmp/out}
NAME=${NAME:-xla_fusion_flags_h200}
mkdir -p "$OUT/flags"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ -n "${VARIANTS+x}" ]; then
  mapfile -t VARIANTS <<< "$VARIANTS"
else
  VARIANTS=(  # options this jaxlib accepts (an unknown one aborts XLA); the last is the baseline again, for spread
    ""
    "--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true"
    "--xla_gpu_experimental_enable_fusion_block_level_rewriter=true"
    "--xla_gpu_experimental_all_fusions_with_triton=true"
    "--xla_gpu_experimental_enable_same_shape_multi_output_fusion=true"
    "--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true --xla_gpu_experimental_enable_fusion_block_level_rewriter=true --xla_gpu_unsupported_enable_triton_multi_output_fusion=true"
    ""
  )
fi
for i in "${!VARIANTS[@]}"; do
  XLA_FLAGS="${VARIANTS[$i]}" timeout ${RUN_LIMIT:-100} python3 benchmarks/e2e.py --out "$OUT/flags" --name "v$i" \
      --sections b1 --methods ${METHODS:-bf16} --prefixes ${PREFIXES:-1024} --steps 32 --reps 3 --no-plot \
      ${E2E_ARGS:-} >> "$OUT/$NAME.log" 2>&1
  echo "v$i rc=$? flags='${VARIANTS[$i]}'"; grep -A6 "^B=1" "$OUT/$NAME.log" | tail -6
done
python3 - "$OUT" "$NAME" "${VARIANTS[@]}" <<'PY'
import json, os, sys
out, name, variants = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = []
for i, flags in enumerate(variants):
    path = os.path.join(out, "flags", f"v{i}.json")
    entry = {"variant": i, "xla_flags": flags}
    if os.path.exists(path):
        d = json.load(open(path))
        entry["b1"] = d["b1"]
        entry["environment"] = d["environment"]
    else:
        entry["error"] = f"no JSON (see {name}.log)"
    rows.append(entry)
json.dump({"note": "e2e.py b1, one process per XLA_FLAGS variant, same call", "variants": rows},
          open(os.path.join(out, f"{name}.json"), "w"), indent=1)
PY
rm -rf "$OUT/flags"
if [ "${HLO:-0}" = 1 ]; then
  timeout ${HLO_LIMIT:-150} python3 benchmarks/decode_hlo_copies.py --out "$OUT" --name decode_hlo_copies_h200 \
      > "$OUT/decode_hlo_copies_h200.log" 2>&1
  echo "hlo rc=$?"; grep "copies" "$OUT/decode_hlo_copies_h200.log" | head -8
fi
