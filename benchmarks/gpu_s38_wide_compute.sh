#!/bin/bash
# Session 38, call 4 (~3 min). Carry .gpu_run (written first by `python benchmarks/mosaic_ablation_variants.py`).
# With the wide boxes the streaming floor fell (call 3) but the kernel did not: what bounds `wide`? Against
# it, wide_keys_const (no key unpack) and copy_only_wide, at 2 and 3 blocks per multiprocessor, one process.
# Run on the GPU box from the repository root: bash benchmarks/gpu_s38_wide_compute.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
variants=()
for name in wide wide_keys_const keys_const copy_only_wide; do
  variants+=(--variant ".gpu_run/ablation/$name.py")
done
timeout ${A_LIMIT:-170} python3 benchmarks/decode_mgpu_ab.py "${variants[@]}" --cases 1x131072,16x32768 \
  --per-sm 2,3 --out "$OUT" --name mosaic_wide_compute_s38 > "$OUT/mosaic_wide_compute_s38.log" 2>&1
echo "ab rc=$?"
python3 - "$OUT/mosaic_wide_compute_s38.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"{r['batch']:>3} {r['context']:>7} {r['per_sm']} {r['kernel']:>16} {r['ms']:.4f}")
PY
