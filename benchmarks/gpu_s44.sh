#!/bin/bash
# Session 44's GPU calls (one H200 each), with carry [".gpu_run"]. Trees built here first:
#   for t in head:HEAD before_fused_qkv:1370b99; do mkdir -p .gpu_run/${t%%:*} && git archive ${t#*:} hyquant_jax \
#     models pallas_kernels benchmarks tests pyproject.toml | tar -x -C .gpu_run/${t%%:*} --exclude=benchmarks/results; \
#     cp benchmarks/decode_memory.py .gpu_run/${t%%:*}/benchmarks/; done
# (head: the tree before the token-slot change, ba93b3f; before_fused_qkv: before session 43's fused weights).
# PART=1 (~9.5 min): the token's ring slot taken from the appended cache (decode_step, token_slot).
#   a) GPU tests: the kernels' new-token and ring-logit checks (with token_slot) and decode_step's layer kernels.
#   b) decode_memory.py, hyquant at 32K with 4 layers (LAYERS=36 for the full model), for the working tree and
#      head (MEMORY_TREES=.gpu_run/before_fused_qkv adds that tree): the copies in the compiled decode loop's
#      bodies (session 43 saw two s32 copies of ring_len a layer) and the decode's own memory.
#   c) e2e B=1 32K, one process each: head (bf16, hyquant), new, head, new.
# PART=2 (~8.5 min): 1 Mosaic block per multiprocessor at B=1 (17 splits; default 2, 33 splits), e2e at 32K and
#   128K, order default, 1, default, 1; first which loop bodies hold the copies that PART=1 left (3 a layer).
# PART=3 (~9 min): the batch rows at 32K for the largest-batch and best-throughput targets, not re-run since
#   session 40 (hyquant 72, 74, 75, 76 and on until out of memory; bf16 24, 25 and on), with this session's code.
# PART=4 (~5 min): why the batch rows' peak rose ~1 GiB for both methods since session 40 (B=76 no longer fits):
#   decode_memory.py with the real weights (--allocate-weights: live bytes after e2e.py's initialization) and the
#   compiled decode at 32K, hyquant B=74 for the working tree and before_fused_qkv, bf16 B=25 for the working tree.
# PART=5 (~4 min): PART=4 found ~1.09 GiB in use after the op-by-op init beyond the weights (none before the fused
#   q/k/v). With init_params compiled per layer: the bytes after init, then hyquant B=76 and 77 at 32K.
# PART=6 (~2 min): bf16 B=25 and 26 with the compiled init (does bf16 fit one more sequence now?).
# PART=7 (~4 min): the B=1 table with this session's code, bf16 and hyquant at 1K / 8K / 32K / 128K, one process.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-1}" = 1 ]; then
  PYTHONPATH=. timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/test_decode_kernel.py \
    tests/test_models.py -k "new_token or ring_logits or decode_step" > "$OUT/token_slot_gpu_tests_s44.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/token_slot_gpu_tests_s44.log"
  for tree in . .gpu_run/head ${MEMORY_TREES:-}; do
    tag=$(basename "$tree"); [ "$tree" = . ] && tag=new
    (cd "$tree" && PYTHONPATH=. timeout 90 python3 benchmarks/decode_memory.py --method hyquant --prefix 32768 \
        --layers ${LAYERS:-4} --out "$OUT/memory_$tag") > "$OUT/decode_memory_s44_$tag.log" 2>&1
    echo "$tag rc=$?"; grep -v "^outside" "$OUT/decode_memory_s44_$tag.log" | tail -7 | cut -c1-300
  done
  VARIANTS=$'.gpu_run/head|bf16,hyquant|\n.|hyquant|\n.gpu_run/head|hyquant|\n.|hyquant|' \
    PREFIXES=32768 STEPS=64 REPS=3 RUN_LIMIT=110 NAME=e2e_token_slot_s44 bash benchmarks/gpu_e2e_variants.sh
elif [ "${PART:-1}" = 2 ]; then
  PYTHONPATH=. timeout 90 python3 benchmarks/decode_memory.py --method hyquant --prefix 32768 --layers 4 \
    --out "$OUT/memory_bodies" > "$OUT/decode_memory_s44_bodies_4layers.log" 2>&1
  echo "memory rc=$?"; grep -v "^outside" "$OUT/decode_memory_s44_bodies_4layers.log" | tail -5
  VARIANTS=$'.|bf16,hyquant|\n.|hyquant||--mosaic-blocks-per-sm 1\n.|hyquant|\n.|hyquant||--mosaic-blocks-per-sm 1' \
    PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=150 NAME=e2e_blocks_per_sm_s44 bash benchmarks/gpu_e2e_variants.sh
elif [ "${PART:-1}" = 4 ]; then
  for spec in .:hyquant:74 .gpu_run/before_fused_qkv:hyquant:74 .:bf16:25; do
    IFS=: read -r tree method batch <<< "$spec"
    tag=$(basename "$tree"); [ "$tree" = . ] && tag=new
    (cd "$tree" && PYTHONPATH=. timeout 150 python3 benchmarks/decode_memory.py --method $method --prefix 32768 \
        --batch $batch --allocate-weights --out "$OUT/memory_b${batch}_$tag") > "$OUT/decode_memory_s44_b${batch}_${method}_$tag.log" 2>&1
    echo "$tag $method B=$batch rc=$?"; tail -n 14 "$OUT/decode_memory_s44_b${batch}_${method}_$tag.log" | cut -c1-200
  done
elif [ "${PART:-1}" = 5 ]; then
  PYTHONPATH=. timeout 150 python3 benchmarks/decode_memory.py --method hyquant --prefix 32768 --allocate-weights \
    --out "$OUT/memory_jit_init" > "$OUT/decode_memory_s44_jit_init.log" 2>&1
  echo "memory rc=$?"; grep "after init" "$OUT/decode_memory_s44_jit_init.log"
  PYTHONPATH=. timeout 300 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s44_batch_jit_init --sections batch \
    --methods hyquant --batches 76,77 --no-until-oom --steps 64 --reps 2 --no-plot > "$OUT/e2e_s44_batch_jit_init.log" 2>&1
  echo "hyquant rc=$?"; grep -A6 "^batch sweep" "$OUT/e2e_s44_batch_jit_init.log"
elif [ "${PART:-1}" = 6 ]; then
  PYTHONPATH=. timeout 240 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s44_batch_bf16_jit_init --sections batch \
    --methods bf16 --batches 25,26 --no-until-oom --steps 64 --reps 2 --no-plot > "$OUT/e2e_s44_batch_bf16_jit_init.log" 2>&1
  echo rc=$?; grep -A5 "^batch sweep" "$OUT/e2e_s44_batch_bf16_jit_init.log"
elif [ "${PART:-1}" = 7 ]; then
  PYTHONPATH=. timeout ${TABLE_LIMIT:-250} python3 benchmarks/e2e.py --out "$OUT" --name e2e_s44_b1 --sections b1 \
    --methods bf16,hyquant --prefixes 1024,8192,32768,131072 --steps 64 --reps 3 --no-plot > "$OUT/e2e_s44_b1.log" 2>&1
  echo "table rc=$?"; grep -A12 "^B=1" "$OUT/e2e_s44_b1.log" | tail -12
else
  PYTHONPATH=. timeout 360 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s44_batch_hyquant --sections batch \
    --methods hyquant --batches 72,74,75,76 --until-oom --steps 64 --reps 2 --no-plot > "$OUT/e2e_s44_batch_hyquant.log" 2>&1
  echo "hyquant rc=$?"; grep -A12 "^batch sweep" "$OUT/e2e_s44_batch_hyquant.log"
  PYTHONPATH=. timeout 150 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s44_batch_bf16 --sections batch \
    --methods bf16 --batches 24,25 --until-oom --steps 64 --reps 2 --no-plot > "$OUT/e2e_s44_batch_bf16.log" 2>&1
  echo "bf16 rc=$?"; grep -A8 "^batch sweep" "$OUT/e2e_s44_batch_bf16.log"
fi
