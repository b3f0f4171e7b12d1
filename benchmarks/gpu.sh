#!/usr/bin/env bash
# The GPU runner: one part per kind of run. From the repository root of a CUDA machine with jax[cuda] 0.11.2:
#
#   bash benchmarks/gpu.sh tests [FILE ...]  the `gpu` test marker, one pytest process per test file (default: every
#                                            file that has GPU tests, kernels first), each with its own time limit
#   bash benchmarks/gpu.sh kernels           decode kernel, prefill kernel, chunked prefill attention, read bandwidth
#   bash benchmarks/gpu.sh e2e               end to end: B=1 at 1K / 32K / 128K, then the 32K batch sweep up to out of
#                                            memory, one process per method
#   bash benchmarks/gpu.sh accuracy          the accuracy benchmark at its full specification (float32, as on CPU)
#   bash benchmarks/gpu.sh serve             the serving engine, bf16 against HyQuant in the same cache memory: 64
#                                            requests of 2K-16K prompts into 32K slots (CACHE_GIB, default 40)
#   bash benchmarks/gpu.sh ab BASE           this tree against the checkout at BASE in one call, one process per tree
#                                            and benchmark, BASE first: AB="decode_kernel e2e_b1" (default),
#                                            e2e_batch_bf16 / e2e_batch_hyquant (BATCHES_BF16=..., BATCHES_HYQUANT=...)
#
# Results go to benchmarks/results under their canonical names (<benchmark>_<device>.json), or to $OUT when it is
# set; every command's log goes to $LOGS (default $OUT/logs or /tmp/hyquant_gpu_logs). Environment: LIMIT (seconds
# per command, default 540), PREFIXES (e2e B=1 contexts), BATCHES (e2e batch sizes), CASES (decode kernel cases,
# e.g. "B1 32K,B1 128K").
set -u
cd "$(dirname "$0")/.."
part=${1:-}
shift || true
results=${OUT:-benchmarks/results}
logs=${LOGS:-${OUT:+$OUT/logs}}
logs=${logs:-/tmp/hyquant_gpu_logs}
mkdir -p "$results" "$logs"
results=$(cd "$results" && pwd) logs=$(cd "$logs" && pwd)
parts=$(mktemp -d)  # one call's partial results, combined into the canonical file
export PYTHONUNBUFFERED=1  # `python3 -m benchmarks.X` from the root: the working folder is on the import path
limit=${LIMIT:-540}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1

# run NAME CMD...: one command under the time limit, its output in $logs/NAME.log, one status line printed
run() {
  local name=$1
  shift
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc $(grep -v '^\s*$' "$logs/$name.log" | tail -1 | cut -c1-150)"
  return $rc
}

case "$part" in
  tests)
    files=("$@")
    [ ${#files[@]} -gt 0 ] || files=(decode_mgpu decode decode_merge prefix prefill_mgpu prefill cache_write norm_rope
                                   generate models sharding)
    for f in "${files[@]}"; do
      run "tests_$f" python3 -m pytest -q -m gpu -p no:cacheprovider "tests/test_$f.py"
    done
    ;;
  kernels)
    run decode_kernel python3 -m benchmarks.decode_kernel --out "$results"
    run prefill_kernel python3 -m benchmarks.prefill_kernel --out "$results"
    run chunked_prefill_attention python3 -m benchmarks.chunked_prefill_attention --triton --out "$results"
    run read_bandwidth python3 -m benchmarks.read_bandwidth --out "$results"
    ;;
  e2e)
    run e2e_b1 python3 -m benchmarks.e2e --out "$parts" --name b1 --sections b1 --methods bf16,hyquant \
      --prefixes "${PREFIXES:-1024,32768,131072}" --steps 64 --reps 3 --no-plot
    for method in bf16 hyquant; do
      run "e2e_batch_$method" python3 -m benchmarks.e2e --out "$parts" --name "batch_$method" --sections batch \
        --methods "$method" --batches "${BATCHES:-1,4,8,16,32,48,64}" --until-oom --steps 64 --reps 2 --no-plot
    done
    run e2e_combine python3 -m benchmarks.e2e --out "$results" --combine "$parts"/*.json
    ;;
  serve)
    run serve python3 -m benchmarks.serve --context 32768 --cache-gib "${CACHE_GIB:-40}" --requests 64 \
      --prompt-lengths 2048:16384 --max-tokens 256 --out "$results"
    ;;
  accuracy)
    run accuracy python3 -m benchmarks.accuracy --spec --dtype float32 --out "$results"
    ;;
  ab)
    base=${1:?usage: bash benchmarks/gpu.sh ab BASE (a checkout of the tree to compare against)}
    base=$(cd "$base" && pwd) here=$PWD
    for bench in ${AB:-decode_kernel e2e_b1}; do
      for tree in "$base" "$here"; do
        tag=$([ "$tree" = "$here" ] && echo new || echo base)
        mkdir -p "$results/ab_$tag"
        case $bench in
          decode_kernel) cmd=(-m benchmarks.decode_kernel --name decode_kernel ${CASES:+--cases "$CASES"}) ;;
          e2e_b1) cmd=(-m benchmarks.e2e --name e2e_b1 --sections b1 --methods bf16,hyquant
                       --prefixes "${PREFIXES:-32768,131072}" --steps 64 --reps 3 --no-plot) ;;
          e2e_batch_bf16|e2e_batch_hyquant)  # the largest batch of a method: BATCHES_BF16 / BATCHES_HYQUANT
            method=${bench#e2e_batch_} var=BATCHES_$(echo "${bench#e2e_batch_}" | tr a-z A-Z)
            cmd=(-m benchmarks.e2e --name "$bench" --sections batch --methods "$method"
                 --batches "${!var:?$var: the batch sizes to time}" --no-until-oom --steps 64 --reps 2 --no-plot) ;;
          *) echo "ab: unknown benchmark $bench (decode_kernel, e2e_b1, e2e_batch_bf16, e2e_batch_hyquant)"; exit 2 ;;
        esac
        (cd "$tree" && run "ab_${bench}_$tag" python3 "${cmd[@]}" --out "$results/ab_$tag")
      done
    done
    run ab_report python3 -m benchmarks.report --results "$results" --ab "$results/ab_base" "$results/ab_new" \
      "${BASE_LABEL:-$base}"
    ;;
  *)
    sed -n '2,18p' "$0"
    exit 2
    ;;
esac
