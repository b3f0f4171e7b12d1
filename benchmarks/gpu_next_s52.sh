#!/bin/bash
# Session 52's device plan. Run in session 52 on an H100 (benchmarks/NOTES.md, session 52): PART=q, then ad-hoc
# calls that covered p's A/B, c's tests and A/B, and m's tests and sweep. Still to run: PART=t (64- vs 256-step
# decode calls), and on an H200 PART=s in full (the probe's other shapes and B16). One call per PART; c, e, m
# and t are gpu_next_s51.sh's (its header says what each runs):
# PART=s (~6 min):
#   - `benchmarks/stream_probe.py`: how fast a copy-only Mosaic kernel streams the low-bit pages, over TMA copy
#     shapes (wider box rows, several pages a copy, more slots; session 51) and, new, by thread loads (t1-t8:
#     the codes loaded by the 128 threads with 16-byte ld.global.nc, 1-8 pages in flight, each t row checked
#     exact against a NumPy fold of the bytes). The decode kernel's own streaming floor (~2.9 TB/s, session 38)
#     bounds B1 128K; a shape near read_bandwidth.py's ~4.3 TB/s is the lead for the 128K target.
#   - `benchmarks/l2_prefetch_probe.py` (new): whether the o projection's GEMV (Qwen3-8B: [1, 4096] x [4096,
#     4096] bf16) runs faster after a TMA prefetch of its weight into L2, with a compute-only or an L2-polluting
#     phase between the prefetch and the GEMV; if it does, the low-bit kernel's last pages could prefetch the
#     o projection (the hybrid's attention leaves HBM bandwidth unused, bf16's does not).
#   - `benchmarks/read_bandwidth.py`, the yardstick, in the same call.
# PART=p (~9 min; new in session 52): the Mosaic kernel's L2 prefetch of the o projection weight
#   (`DecodeTuning.mosaic_prefetch`, e2e `--mosaic-prefetch start|end`; offline SASS only so far): its GPU tests
#   (outputs bit for bit those without it), then e2e B=1 at 32K and 128K, one process a variant: bf16 and
#   hyquant, hyquant with the prefetch at the end, hyquant, hyquant with it at the start. Worth the call
#   whether or not PART=s's probe shows the premise: this is the direct test.
# PART=q (~9.5 min; for a session that gets one call): the essentials of p and s in one call: the prefetch's
#   GPU tests, e2e B=1 32K / 128K for bf16 + hyquant, hyquant with the prefetch at the end, hyquant; then the
#   L2 probe (3 busy phases) and the stream probe at B1 32K / 128K (TMA codes-only rows against t2 / t4 / t8).
# Session 53 removed the L2 prefetch (DecodeTuning.mosaic_prefetch, e2e --mosaic-prefetch): PART=p and q need
# `git apply benchmarks/results/mosaic_l2_prefetch_s52.patch` first.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case "${PART:-s}" in
s)
  PYTHONPATH=. timeout 330 python3 benchmarks/stream_probe.py --out "$OUT" --name stream_probe_s52 \
    > "$OUT/stream_probe_s52.log" 2>&1
  echo "rc=$?"; grep -v Warning "$OUT/stream_probe_s52.log" | tail -70
  PYTHONPATH=. timeout 150 python3 benchmarks/l2_prefetch_probe.py --out "$OUT" --name l2_prefetch_probe_s52 \
    > "$OUT/l2_prefetch_probe_s52.log" 2>&1
  echo "l2 rc=$?"; grep -v Warning "$OUT/l2_prefetch_probe_s52.log" | tail -12
  PYTHONPATH=. timeout 90 python3 benchmarks/read_bandwidth.py --out "$OUT" --name read_bandwidth_s52 \
    > "$OUT/read_bandwidth_s52.log" 2>&1
  echo "read rc=$?"; tail -4 "$OUT/read_bandwidth_s52.log"
  ;;
p)
  PYTHONPATH=. timeout 150 python3 -m pytest -q -m gpu tests/test_decode_mgpu.py -k prefetch \
    > "$OUT/prefetch_gpu_tests_s52.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/prefetch_gpu_tests_s52.log"
  VARIANTS=".|bf16,hyquant|"$'\n'".|hyquant||--mosaic-prefetch end"$'\n'".|hyquant|"$'\n'".|hyquant||--mosaic-prefetch start" \
    PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=110 NAME=e2e_prefetch_s52 \
    timeout 420 bash benchmarks/gpu_e2e_variants.sh
  ;;
q)
  PYTHONPATH=. timeout 120 python3 -m pytest -q -m gpu tests/test_decode_mgpu.py -k prefetch \
    > "$OUT/prefetch_gpu_tests_s52.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/prefetch_gpu_tests_s52.log"
  VARIANTS=".|bf16,hyquant|"$'\n'".|hyquant||--mosaic-prefetch end"$'\n'".|hyquant|" \
    PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=105 NAME=e2e_prefetch_s52 \
    timeout 320 bash benchmarks/gpu_e2e_variants.sh
  PYTHONPATH=. timeout 60 python3 benchmarks/l2_prefetch_probe.py --out "$OUT" --name l2_prefetch_probe_s52 \
    --busy none,spin5,read32 > "$OUT/l2_prefetch_probe_s52.log" 2>&1
  echo "l2 rc=$?"; grep -v Warning "$OUT/l2_prefetch_probe_s52.log" | tail -6
  PYTHONPATH=. timeout 75 python3 benchmarks/stream_probe.py --out "$OUT" --name stream_probe_s52 \
    --cases 1x32768,1x131072 --configs w64_p1_s2,w64_p1_s2_codes,w256_p4_s2_codes,t2,t4,t8 \
    > "$OUT/stream_probe_s52.log" 2>&1
  echo "stream rc=$?"; grep -v Warning "$OUT/stream_probe_s52.log" | tail -20
  ;;
c|e|m|t)
  bash benchmarks/gpu_next_s51.sh
  ;;
*)
  echo "PART must be s, p, q, c, e, m or t" >&2; exit 2
  ;;
esac
