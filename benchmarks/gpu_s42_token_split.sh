#!/bin/bash
# Session 42, one GPU call (~8 min): the decode step's own token as one more split (decode_step attends over
# the cache as it was, then appends; the append runs off the path from q to the output).
# Before it, here: mkdir -p .gpu_run/before_token_split && git archive cf84d77 hyquant_jax models pallas_kernels \
#   benchmarks tests pyproject.toml | tar -x -C .gpu_run/before_token_split --exclude=benchmarks/results
# then run with carry [".gpu_run"].
# 1. GPU tests of the new path: the decode kernels with new_token (Triton and Mosaic), the merge kernel with the
#    token, ring logits, the Mosaic kernel, generate's device loops (MOSAIC_MIN_PAGES lowered to 1 there).
# 2. e2e B=1 at 32K and 128K, one process each, in the order: this tree (bf16, hyquant), the tree before
#    (hyquant), this tree (hyquant): the A/B in both orders.
# PART=2 (the second call, after the token's logits were made a float32 sum instead of a dot that XLA ran in
#    TF32 on the GPU: 1 of 21 tests failed on that in the first call): the new-token tests again, then the B=1
#    table of this tree, one process (1K, 8K, 32K, 128K, bf16 and hyquant), and hyquant again in a second.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-1}" = 3 ]; then
  (cd .gpu_run/bf16_attend_first && PYTHONPATH=. timeout 90 python3 -m pytest -q -p no:cacheprovider -rf \
     tests/test_models.py -k "attend_first or decode_steps_match_full" > "$OUT/bf16_attend_first_tests_s42.log" 2>&1)
  echo "tests rc=$?"; tail -2 "$OUT/bf16_attend_first_tests_s42.log"
  VARIANTS=$'.|bf16|\n.gpu_run/bf16_attend_first|bf16|\n.|bf16|' PREFIXES=32768,131072 STEPS=64 REPS=3 \
    RUN_LIMIT=100 NAME=e2e_bf16_attend_first_s42 bash benchmarks/gpu_e2e_variants.sh
  exit 0
fi
if [ "${PART:-1}" = 2 ]; then
  PYTHONPATH=. timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_decode_kernel.py \
    tests/test_decode_merge.py tests/test_generate.py -k "gpu_new_token or gpu_ring_logits or gpu_merge or on_the_device" \
    > "$OUT/token_split_gpu_tests_s42_part2.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/token_split_gpu_tests_s42_part2.log"
  VARIANTS=$'.|bf16,hyquant|\n.|hyquant||--prefixes 32768,131072' PREFIXES=1024,8192,32768,131072 STEPS=64 REPS=3 \
    RUN_LIMIT=250 NAME=e2e_s42_b1 bash benchmarks/gpu_e2e_variants.sh
  exit 0
fi
PYTHONPATH=. timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rf \
  tests/test_decode_kernel.py tests/test_decode_merge.py tests/test_decode_mgpu.py tests/test_generate.py \
  -k "gpu_new_token or gpu_ring_logits or gpu_merge or gpu_kernel_matches_oracle or on_the_device" \
  > "$OUT/token_split_gpu_tests_s42.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/token_split_gpu_tests_s42.log"
VARIANTS=$'.|bf16,hyquant|\n.gpu_run/before_token_split|hyquant|\n.|hyquant|' \
  PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=${RUN_LIMIT:-150} NAME=e2e_token_split_s42 \
  bash benchmarks/gpu_e2e_variants.sh
# PART=3 (the third call): the bf16 baseline with the same change (BF16Attention(attend_first=True): the step's
#   token as one more key, written after the attention), as a tree whose default is flipped:
#   mkdir -p .gpu_run/bf16_attend_first && tar -c hyquant_jax models pallas_kernels benchmarks/*.py tests \
#     pyproject.toml | tar -x -C .gpu_run/bf16_attend_first && sed -i \
#     's/^    attend_first: bool = False$/    attend_first: bool = True/' .gpu_run/bf16_attend_first/models/attention.py
#   The models tests (attend_first against writing first) on the GPU, then bf16 at 32K and 128K in the order
#   main, attend_first, main.
