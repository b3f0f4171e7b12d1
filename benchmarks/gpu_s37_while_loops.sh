#!/bin/bash
# Session 37, call 1 (~9 min): the decode loops as device-side loops (WHILE among decode's command-buffer
# kinds) against the host-driven loops, where the host reads every step's loop condition back and waits for
# the GPU to drain before it launches the next step's graph (session 36: hyquant idles 0.35-0.5 ms a step).
# (A) XLA's log of a 2-layer run: which while loops run from the host (condition evaluations per variant);
# (B) the step timed in one process, B=1, 36 layers, 32K then 1K (step_ablation_probe.py's modifiers);
# (C) the GPU test: the same tokens, lengths and caches bit for bit.
# Run on the GPU box from the repository root: bash benchmarks/gpu_s37_while_loops.sh
# The call ran before `decode` chose its loops itself, with the probe's modifier @while for today's @device and
# no modifier for today's @host: its result files name the variants that way (hyquant = hyquant@host,
# hyquant@while = hyquant@device, bf16@stop = bf16@host@stop, bf16@while@stop = bf16@device@stop).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
VARIANTS=bf16,hyquant@host,hyquant@device,bf16@host@stop,bf16@device@stop,hyquant@host@stop,hyquant@device@stop,hyquant@host
TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=while_thunk=3,command_buffer_thunk=2,command_buffer_conversion_pass=2 \
  timeout 120 python3 benchmarks/step_ablation_probe.py --out "$OUT" --name while_vlog_s37 --layers 2 \
  --prefixes 32768 --steps 64 --reps 1 --variants hyquant@host,hyquant@device,bf16@host@stop,bf16@device@stop \
  > "$OUT/while_vlog_s37.txt" 2>&1
echo "vlog rc=$?"
python3 benchmarks/vlog_command_buffers.py "$OUT/while_vlog_s37.txt" > "$OUT/while_vlog_s37_summary.txt" 2>&1
grep -E "^result|While|Cmd" "$OUT/while_vlog_s37_summary.txt" | cut -c1-200 | head -30
gzip -f "$OUT/while_vlog_s37.txt"
timeout ${B32_LIMIT:-200} python3 benchmarks/step_ablation_probe.py --out "$OUT" --name while_probe_s37_32k \
  --prefixes 32768 --steps 64 --reps 3 --variants "$VARIANTS" > "$OUT/while_probe_s37_32k.log" 2>&1
echo "probe 32K rc=$?"; grep -E "^ +[0-9]+ " "$OUT/while_probe_s37_32k.log"
timeout ${TEST_LIMIT:-180} python3 -m pytest -m gpu tests/test_generate.py -k device_match -q -p no:cacheprovider \
  -rA --durations=3 > "$OUT/while_gpu_tests_s37.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT/while_gpu_tests_s37.log" | tail -4 | cut -c1-300
timeout ${B1_LIMIT:-170} python3 benchmarks/step_ablation_probe.py --out "$OUT" --name while_probe_s37_1k \
  --prefixes 1024 --steps 64 --reps 3 --variants "$VARIANTS" > "$OUT/while_probe_s37_1k.log" 2>&1
echo "probe 1K rc=$?"; grep -E "^ +[0-9]+ " "$OUT/while_probe_s37_1k.log"
