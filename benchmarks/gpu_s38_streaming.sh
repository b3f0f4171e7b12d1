#!/bin/bash
# Session 38, call 2 (~5 min). Carry .gpu_run (written first by `python benchmarks/mosaic_ablation_variants.py`).
# Is the Mosaic low-bit kernel's B=1 page loop bound by streaming its pages in? The kernel against its
# streaming floor (copy_only: the loop only waits for and refills the slots), with four slots, and with only
# the two code copies per page (codes_copies, copy_only_codes); keys_const / tiles_const again (call 1's
# spread was ~5-7%), and the candidate pv_overlap. B1 32K and 128K at 2 and 3 blocks per multiprocessor, then B16 32K at 2.
# Run on the GPU box from the repository root: bash benchmarks/gpu_s38_streaming.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
variants=()
for name in copy_only copy_only_stages4 codes_copies copy_only_codes keys_const tiles_const pv_overlap; do
  variants+=(--variant ".gpu_run/ablation/$name.py")
done
summary() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"{r['batch']:>3} {r['context']:>7} {r['per_sm']} {r['splits']:>3} {r['kernel']:>18} {r['ms']:.4f}")
PY
}
timeout ${A_LIMIT:-200} python3 benchmarks/decode_mgpu_ab.py "${variants[@]}" --cases 1x32768,1x131072 \
  --per-sm 2,3 --out "$OUT" --name mosaic_streaming_s38_b1 > "$OUT/mosaic_streaming_s38_b1.log" 2>&1
echo "b1 rc=$?"; summary "$OUT/mosaic_streaming_s38_b1.log"
timeout ${B_LIMIT:-120} python3 benchmarks/decode_mgpu_ab.py "${variants[@]}" --cases 16x32768 \
  --per-sm 2 --out "$OUT" --name mosaic_streaming_s38_b16 > "$OUT/mosaic_streaming_s38_b16.log" 2>&1
echo "b16 rc=$?"; summary "$OUT/mosaic_streaming_s38_b16.log"
