#!/bin/bash
# Session 38, call 1 (~8 min). Carry .gpu_run (written here first by `python benchmarks/mosaic_ablation_variants.py`).
# (A) What bounds the Mosaic low-bit kernel's page loop: the kernel as it is against copies with one part of
#     the per-page work taken out or doubled (benchmarks/mosaic_ablation_variants.py), one process, same
#     inputs, B1 32K / B1 128K / B16 32K (decode_mgpu_ab.py: low-bit kernel + q preparation + merge, ms).
# (B) e2e.py's B=1 rows at 1K and 32K with a stop token (generate's case: device-side loops for both methods).
# Run on the GPU box from the repository root: bash benchmarks/gpu_s38_kernel_ablation.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
variants=()
for name in ${ABLATIONS:-keys_const values_const tiles_const qk_twice pv_twice no_redo stages3 stages4}; do
  variants+=(--variant ".gpu_run/ablation/$name.py")
done
timeout ${A_LIMIT:-260} python3 benchmarks/decode_mgpu_ab.py "${variants[@]}" --cases ${CASES:-1x32768,1x131072,16x32768} \
  --per-sm 2 --out "$OUT" --name mosaic_ablation_s38 > "$OUT/mosaic_ablation_s38.log" 2>&1
echo "ablation rc=$?"
python3 - "$OUT/mosaic_ablation_s38.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"{r['batch']:>3} {r['context']:>7} {r['kernel']:>14} {r['ms']:.4f}")
PY
timeout ${B_LIMIT:-240} python3 benchmarks/e2e.py --out "$OUT" --name e2e_s38_stop_token --sections b1 \
  --methods bf16,hyquant --prefixes 1024,32768 --steps 64 --reps 3 --stop-token --no-plot \
  > "$OUT/e2e_s38_stop_token.log" 2>&1
echo "e2e rc=$?"; grep -A4 "B=1 decode" "$OUT/e2e_s38_stop_token.log"
