#!/bin/bash
# Session 53's device plan (what ran and what it found: benchmarks/NOTES.md, session 53; every call ran on an
# H100, asked for an H200). The premise: the low-bit kernel's stream, and every copy-only probe of it, stayed at
# ~80% of what XLA's 2 GiB reads reach (sessions 38, 52) whatever the copy shape or the bytes in flight.
# PART=i (ran, ~3 min): interleaved splits (split s takes pages s, s + splits, ...: do a KV head's 33 blocks
#   reading neighbouring pages stream faster than 264 blocks each on its own run?): the stream probe at B1 32K /
#   128K and B16 32K, contiguous against interleaved, read_bandwidth (2 GiB), the kernel's GPU oracle tests with
#   interleave, the chunked-prefill kernel's GPU test at head_dim 64, then decode_mgpu_ab.py --interleave --wide.
#   Found: exact, and no faster (the kernel 1-8% slower).
# PART=e (not run: PART=i showed no gain): e2e B=1 at 32K and 128K with and without interleave.
# PART=r (ran): XLA reads of 67 MB-2 GiB (run as SIZES_ONLY=1 GIBS="0.0625 0.125 0.25"), and the copy-only probe
#   at B1 32K-256K. Found: at the kernel's sizes XLA reads no faster than the probe.
# PART=b (ran, with PACK=1): the probe at 2, 4 and 8 blocks a multiprocessor: the same times.
# PART=p (ran as CONTEXTS=1x131072,1x262144): the decode kernel's block timeline: no tail.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# the device tool returns at most 8 files a call: PACK=1 packs everything into one tar at the end
trap '[ -n "${PACK:-}" ] && tar -czf /tmp/s53_pack.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/s53_pack.tgz "$OUT/"' EXIT
export PYTHONUNBUFFERED=1
case "${PART:-i}" in
i)
  PYTHONPATH=. timeout 170 python3 benchmarks/stream_probe.py --out "$OUT" --name stream_probe_interleave_s53 \
    --cases 1x32768,1x131072,16x32768 \
    --configs w64_p1_s2,w64_p1_s2_i,w64_p1_s2_codes,w64_p1_s2_codes_i,w256_p4_s2_codes,w256_p4_s2_codes_i,t8,t8_i \
    > "$OUT/stream_probe_interleave_s53.log" 2>&1
  echo "stream rc=$?"; grep -v Warning "$OUT/stream_probe_interleave_s53.log" | tail -34
  PYTHONPATH=. timeout 60 python3 benchmarks/read_bandwidth.py --out "$OUT" --name read_bandwidth_s53 \
    > "$OUT/read_bandwidth_s53.log" 2>&1
  echo "read rc=$?"; tail -3 "$OUT/read_bandwidth_s53.log"
  PYTHONPATH=. timeout 150 python3 -m pytest -q -m gpu tests/test_decode_mgpu.py \
    -k "interleave or (matches_oracle and not pages_per_copy and not wide_matches)" \
    > "$OUT/decode_mgpu_interleave_gpu_tests_s53.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/decode_mgpu_interleave_gpu_tests_s53.log"
  PYTHONPATH=. timeout 90 python3 -m pytest -q -m gpu tests/test_prefix_kernel.py -k head_dim_64 \
    > "$OUT/prefix_kernel_head_dim_64_gpu_tests_s53.log" 2>&1
  echo "prefix tests rc=$?"; tail -2 "$OUT/prefix_kernel_head_dim_64_gpu_tests_s53.log"
  PYTHONPATH=. timeout 170 python3 benchmarks/decode_mgpu_ab.py --interleave --wide \
    --cases 1x131072,1x32768,16x32768 --out "$OUT" --name decode_mgpu_interleave_s53 \
    > "$OUT/decode_mgpu_interleave_s53.log" 2>&1
  echo "ab rc=$?"; grep '^{' "$OUT/decode_mgpu_interleave_s53.log" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); print(r['batch'], r['context'], r['kernel'], round(r['ms'], 4), '%.1e' % r['max_rel_diff_vs_first'])"
  ;;
e)
  VARIANTS=".|bf16,hyquant|"$'\n'".|hyquant||--mosaic-interleave"$'\n'".|hyquant|"$'\n'".|hyquant||--mosaic-interleave" \
    PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=120 NAME=e2e_interleave_s53 \
    timeout 560 bash benchmarks/gpu_e2e_variants.sh
  ;;
r)
  # Does a read of the low-bit kernel's size (~37 MB at B1 32K, ~147 MB at 128K, a layer) reach the HBM rate
  # at all? XLA's reads over array sizes from 32 MB to 2 GiB, and the stream probe's copy-only kernels at B1
  # 32K-256K (the slope between 128K and 256K is beyond L2, 50 MB, at both ends).
  # (The call of session 53 left out --gib, so it read 2 GiB each time; those files were dropped.)
  for gib in ${GIBS:-0.03125 0.0625 0.125 0.25 0.5 2}; do
    PYTHONPATH=. timeout 60 python3 benchmarks/read_bandwidth.py --gib "$gib" --out "$OUT" \
      --name "read_bandwidth_${gib}gib_s53" > "$OUT/read_bandwidth_${gib}gib_s53.log" 2>&1
    echo "$gib GiB rc=$?: $(grep -o "'tb_s': {[^}]*}" "$OUT/read_bandwidth_${gib}gib_s53.log")"
  done
  [ -n "${SIZES_ONLY:-}" ] && exit 0
  PYTHONPATH=. timeout 150 python3 benchmarks/stream_probe.py --out "$OUT" --name stream_probe_sizes_s53 \
    --cases 1x32768,1x65536,1x131072,1x262144 --configs w64_p1_s2,w64_p1_s2_codes,t8 \
    > "$OUT/stream_probe_sizes_s53.log" 2>&1
  echo "stream rc=$?"; grep -v Warning "$OUT/stream_probe_sizes_s53.log" | tail -16
  ;;
b)
  # More blocks a multiprocessor for the copy-only kernels (XLA's reads run many more warps a multiprocessor
  # than the kernel's 2 blocks of 128 threads): B1 128K and 256K at 2, 4 and 8 blocks a multiprocessor.
  for per_sm in 2 4 8; do
    PYTHONPATH=. timeout 80 python3 benchmarks/stream_probe.py --out "$OUT" --name "stream_probe_per_sm${per_sm}_s53" \
      --cases 1x131072,1x262144 --configs w64_p1_s2,w64_p1_s2_codes,t2,t8 --per-sm $per_sm \
      > "$OUT/stream_probe_per_sm${per_sm}_s53.log" 2>&1
    echo "per_sm $per_sm rc=$?"; grep -v Warning "$OUT/stream_probe_per_sm${per_sm}_s53.log" | tail -12
  done
  ;;
p)
  # The copy-only kernels' time is ~15 us above bytes / HBM rate at B1 128K-256K (PART=r, b): is it a tail
  # (blocks of unequal speed) or a late start? The decode kernel's own profile: each block's start and duration.
  PYTHONPATH=. timeout 200 python3 benchmarks/profile_decode_mgpu.py --out "$OUT" --name profile_decode_mgpu_timeline_s53 \
    --contexts ${CONTEXTS:-1x32768,1x131072,1x262144,16x32768} > "$OUT/profile_decode_mgpu_timeline_s53.log" 2>&1
  echo "profile rc=$?"; grep -v Warning "$OUT/profile_decode_mgpu_timeline_s53.log" | grep "^B\|block\|SMs"
  ;;
*)
  echo "PART must be i, e, r, b or p" >&2; exit 2
  ;;
esac
