#!/bin/bash
# Prepared in session 51 (its one device call ran gpu_next_s50.sh PART=k; no device was lent after it). For the
# 128K target: PART=s, then PART=c (a call each: together they may pass the 10-minute limit of a call), PART=e
# if c shows a gain; then PART=m (block_q 128 of the prefix kernel) and PART=t.
# PART=m (~8 min): `PART=m bash benchmarks/gpu_next_s50.sh`: the prefix kernel's GPU tests (chunk_impl "auto" and
#   block_q 128 against the references), the launch sweep, e2e chunked prefill at 32K and 128K.
# PART=s (~3 min): `benchmarks/stream_probe.py`: how fast a copy-only Mosaic kernel streams the low-bit pages in
#   other copy shapes (wider box rows, several pages a copy, more slots). The decode kernel's own streaming
#   floor (~2.9 TB/s, session 38) bounds B1 128K; if a shape streams near read_bandwidth.py's ~4.3 TB/s, the
#   kernel could take its pages that way (the only lead big enough for the 128K target).
# PART=c (~6 min): the Mosaic low-bit kernel with several pages a slot (`low_bit_splits(pages_per_copy=...)`,
#   added in session 51, compiled offline only: 135 registers, no spills, `mosaic_sass.py --pages-per-copy`):
#   all GPU tests of tests/test_decode_mgpu.py (its new per-copy and wide oracle cases among them) and the whole
#   decode's tunings (test_gpu_tunings, with pages_per_copy 4 and wide among them), then the kernel
#   alone with 1, 2 and 4 pages a copy, each with and without wide rows (`wide`), at B1 32K / 128K and B16 32K
#   (`decode_mgpu_ab.py --pages-per-copy 1,2,4 --wide`).
#   Best after PART=s (if the probe shows multi-page copies streaming faster). If 2 or 4 is faster, PART=e.
# PART=e (~7 min): e2e B=1 at 32K and 128K, alternating the default and the candidate launch, CAND (default
#   "--mosaic-pages-per-copy 4"; e.g. CAND="--mosaic-pages-per-copy 4 --mosaic-wide" if PART=c says so).
# PART=t (~6 min): the per-call cost: the B=1 step at 32K and 128K with decode calls of 64 and of 256 steps,
#   bf16 and hyquant in one call (sessions 46-48 suspected a per-call command-buffer cost that 64-step calls
#   charge to 64 steps).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case "${PART:-m}" in
m)
  PART=m bash benchmarks/gpu_next_s50.sh
  ;;
s)
  PYTHONPATH=. timeout 300 python3 benchmarks/stream_probe.py --out "$OUT" --name stream_probe_s51 \
    > "$OUT/stream_probe_s51.log" 2>&1
  echo "rc=$?"; cat "$OUT/stream_probe_s51.log" | grep -v Warning | tail -45
  PYTHONPATH=. timeout 120 python3 benchmarks/read_bandwidth.py --out "$OUT" --name read_bandwidth_s51 > "$OUT/read_bandwidth_s51.log" 2>&1
  echo "read rc=$?"; tail -4 "$OUT/read_bandwidth_s51.log"
  ;;
c)
  PYTHONPATH=. timeout 240 python3 -m pytest -q -m gpu tests/test_decode_mgpu.py \
    "tests/test_decode_kernel.py::test_gpu_tunings" > "$OUT/decode_mgpu_gpu_tests_s51.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/decode_mgpu_gpu_tests_s51.log"
  PYTHONPATH=. timeout 400 python3 benchmarks/decode_mgpu_ab.py --pages-per-copy 1,2,4 --wide --out "$OUT" \
    --name decode_mgpu_pages_per_copy_s51 > "$OUT/decode_mgpu_pages_per_copy_s51.log" 2>&1
  echo "ab rc=$?"; grep -o '"batch.*' "$OUT/decode_mgpu_pages_per_copy_s51.log" | cut -c1-200
  ;;
e)
  cand=${CAND:---mosaic-pages-per-copy 4}
  VARIANTS=".|bf16,hyquant|"$'\n'".|hyquant||$cand"$'\n'".|hyquant|"$'\n'".|hyquant||$cand" \
    PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=150 NAME=e2e_pages_per_copy_s51 \
    timeout 580 bash benchmarks/gpu_e2e_variants.sh
  ;;
t)
  for steps in 64 256; do
    PYTHONPATH=. timeout 270 python3 benchmarks/e2e.py --out "$OUT" --name e2e_b1_steps${steps}_s51 --sections b1 \
      --methods bf16,hyquant --prefixes 32768,131072 --steps $steps --reps 3 --no-plot \
      > "$OUT/e2e_b1_steps${steps}_s51.log" 2>&1
    echo "steps $steps rc=$?"; grep -A6 "^B=1" "$OUT/e2e_b1_steps${steps}_s51.log"
  done
  ;;
esac
