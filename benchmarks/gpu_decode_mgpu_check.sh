#!/bin/bash
# One GPU call for the decode path with the Mosaic GPU low-bit kernel (pallas_kernels/decode_mgpu.py, taken by
# hyquant_jax.decode_kernel on Hopper for the default config): its GPU tests and the decode tests that run it
# (head_dim 128 shapes, low-bit kernel tunings), then, if they pass, the decode benchmark
# (benchmarks/decode_kernel.py: every case, the Triton-only decode timed next to it where Mosaic applies).
# Run on the GPU box from the repository root:  bash benchmarks/gpu_decode_mgpu_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-260} python3 -m pytest -m gpu tests/test_decode_mgpu.py tests/test_decode_kernel.py -q -x \
    -p no:cacheprovider -rA -k "gpu_kernel or (gpu_shapes and 128) or gpu_tunings or (gpu_schemes and channel_key)" \
    > "$OUT/decode_mgpu_gpu_tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; grep -E "passed|failed|Error" "$OUT/decode_mgpu_gpu_tests.log" | tail -8 | cut -c1-300
if [ $rc -eq 0 ]; then
  timeout ${BENCH_LIMIT:-320} python3 benchmarks/decode_kernel.py --out "$OUT" --name ${NAME:-decode_kernel_h200} \
      > "$OUT/${NAME:-decode_kernel_h200}.log" 2>&1
  echo "bench rc=$?"; tail -12 "$OUT/${NAME:-decode_kernel_h200}.log" | cut -c1-200
fi
