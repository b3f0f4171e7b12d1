#!/bin/bash
# One GPU call for variants of the Mosaic decode kernel (.gpu_run/variants/*.py, built before the call by
# benchmarks/prepare_decode_variants.sh; carry [".gpu_run"]): the kernel's GPU oracle tests for each variant
# (the variant copied over pallas_kernels/decode_mgpu.py for the tests, main's module put back after), then
# one process timing main's kernel, every variant and main's again on the same inputs at 2, 3 and 4 blocks
# per multiprocessor (benchmarks/decode_mgpu_ab.py; an exact rewrite must give max_rel_diff_vs_first 0).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
cp pallas_kernels/decode_mgpu.py /tmp/decode_mgpu_main.py
variants=()
for v in .gpu_run/variants/*.py; do
  variants+=(--variant "$v")
  cp "$v" pallas_kernels/decode_mgpu.py
  echo "== $v" >> "$OUT/decode_variants_gpu_tests.log"
  timeout ${TEST_LIMIT:-120} python3 -m pytest -m gpu tests/test_decode_mgpu.py -q -p no:cacheprovider -rA \
      -k gpu_kernel >> "$OUT/decode_variants_gpu_tests.log" 2>&1
  echo "$v tests rc=$?"; tail -1 "$OUT/decode_variants_gpu_tests.log"
done
cp /tmp/decode_mgpu_main.py pallas_kernels/decode_mgpu.py
timeout ${AB_LIMIT:-360} python3 benchmarks/decode_mgpu_ab.py "${variants[@]}" --per-sm ${PER_SM:-2,3,4} \
    --out "$OUT" --name decode_variants_ab_h200 2>&1 | grep '^{' | tee "$OUT/decode_variants_ab_h200.log" | cut -c1-170
