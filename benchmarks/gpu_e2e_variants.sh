#!/bin/bash
# One GPU call: e2e.py's b1 section once per variant, one process each, merged into OUT/NAME.json.
# A variant is one line of VARIANTS: "TREE|METHODS|XLA_FLAGS[|ARGS]", where TREE is the source tree to run (. for
# the working tree, or a tree built here and carried, e.g. .gpu_run/patched from `prepare_patched_tree.sh`),
# METHODS an e2e.py method list, XLA_FLAGS the flags of that process ("" for none) and ARGS more e2e.py
# options of that variant (after the common ones, so e.g. its own --prefixes wins). Session 33's call b
# (~5 min; results/e2e_variants_s33b_h200.json):
#   VARIANTS=$'.|bf16,hyquant|\n.|bf16,hyquant|--xla_gpu_command_buffer_scheduling_mode=LHS\n.|bf16,hyquant|--xla_gpu_command_buffer_scheduling_mode=CONCURRENT' \
#   PREFIXES=1024,32768 STEPS=64 REPS=3 RUN_LIMIT=120 NAME=e2e_variants_s33b_h200 bash benchmarks/gpu_e2e_variants.sh
# CPU check: OUT=/tmp/x E2E_ARGS=--smoke PREFIXES=64 STEPS=8 VARIANTS='.|bf16|' bash benchmarks/gpu_e2e_variants.sh
set -u
OUT=${OUT:-/tmp/out}
NAME=${NAME:-e2e_variants_h200}
ROOT=$(pwd)
mkdir -p "$OUT/variants"
export PYTHONUNBUFFERED=1
# Every e2e.py process of the call shares one JAX compilation cache and, inside it, XLA's autotune cache
# (e2e.worker_env): the variants run the GEMM kernels the first compile picked for each fusion they share.
mapfile -t LINES <<< "${VARIANTS:?set VARIANTS: one TREE|METHODS|XLA_FLAGS per line}"
for i in "${!LINES[@]}"; do
  IFS='|' read -r tree methods flags extra <<< "${LINES[$i]}"
  (cd "$ROOT/$tree" && PYTHONPATH=. XLA_FLAGS="$flags" timeout ${RUN_LIMIT:-150} python3 benchmarks/e2e.py \
      --out "$OUT/variants" --name "v$i" --sections b1 --methods "$methods" --prefixes ${PREFIXES:-1024,32768} \
      --steps ${STEPS:-64} --reps ${REPS:-4} --no-plot ${E2E_ARGS:-} $extra) >> "$OUT/$NAME.log" 2>&1
  echo "v$i rc=$? tree=$tree methods=$methods flags='$flags' args='$extra'"
  grep -A8 "^B=1" "$OUT/$NAME.log" | tail -8
done
python3 - "$OUT" "$NAME" "${LINES[@]}" <<'PY'
import json, os, sys
out, name, lines = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = []
for i, line in enumerate(lines):
    tree, methods, flags, extra = (line.split("|") + ["", "", ""])[:4]
    entry = {"variant": i, "tree": tree, "methods": methods, "xla_flags": flags, "args": extra}
    path = os.path.join(out, "variants", f"v{i}.json")
    if os.path.exists(path):
        d = json.load(open(path))
        entry["b1"] = d["b1"]
        entry["environment"] = d["environment"]
    else:
        entry["error"] = f"no JSON (see {name}.log)"
    rows.append(entry)
json.dump({"note": "e2e.py b1, one process per variant (source tree, methods, XLA_FLAGS), same call",
           "variants": rows}, open(os.path.join(out, f"{name}.json"), "w"), indent=1)
PY
rm -rf "$OUT/variants"
