#!/bin/bash
# Prepared in session 40; PART=a and d ran in session 41, e in session 42 (MOSAIC_MIN_PAGES 1024 kept:
# results/e2e_mosaic_threshold_s42.json), b and c wait. One GPU call each, ~3-7 min.
# Before them, here: bash benchmarks/prepare_patched_tree.sh NAME (fused_qkv_probe for b, mosaic_min_pages_4096
# for e), then run with carry [".gpu_run"].
# Done in session 41 (benchmarks/NOTES.md): PART=a, results/decode_after_operand.patch (the Mosaic launch waits
#   for the ring append through an unread operand instead of a select on q): GPU tests 26/26, but no gain (main
#   first: main 5.70 / patch 5.47 ms at 32K; patch first: patch 5.72 / main 5.69), not merged. PART=d, the Mosaic
#   threshold: MOSAIC_MIN_PAGES lowered from 4096 to 1024.
# PART=b: results/fused_qkv_probe.patch (a probe, not for merging as is): the decode step's q, k and v projections
#   as one GEMM over the concatenated weights (XLA hoists the concatenation out of the decode loops on CPU; the
#   script checks the GPU HLO: the concatenate must be in the entry computation, not a loop body). In hyquant's
#   layer the q GEMM starts ~5 us after the k/v reduction fusion (bf16's start together). If hyquant gains more
#   than bf16, store the weights fused (Params.wqkv, loaders, sharding by KV-head groups) in a later session.
#   Process-to-process spread of one tree is ~0.1 ms at 32K (results/process_variance_s41.json): a gain must
#   show in both orders to count.
# PART=c (~4 min, main only): hyquant's first timed loop runs ~0.6 ms a step slower than the next ones (~35 ms
#   once per call, sessions 40 and 41). Suspect: the first call after the warm-up gets a new temp buffer address
#   and XLA updates every command buffer of the loop (with the device loops' conditional nodes since session
#   37); session 33's test of that (SKIP_TEMP) predates the device loops. 32K, --reps 4, as is and with SKIP_TEMP.
# PART=e (~5 min): the new Mosaic threshold end to end: B=1 hyquant at 8K and 16K with MOSAIC_MIN_PAGES 1024
#   (main: Mosaic low-bit kernel) and 4096 (results/mosaic_min_pages_4096.patch: Triton only), in the order
#   main, old, main. Keep 1024 if main is faster in both comparisons (the kernel alone: ~2-3 us a layer).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-b}" = e ]; then
  VARIANTS=$'.|hyquant|\n.gpu_run/mosaic_min_pages_4096|hyquant|\n.|hyquant|' PREFIXES=8192,16384 STEPS=64 REPS=3 \
    RUN_LIMIT=150 NAME=e2e_mosaic_threshold_s42 bash benchmarks/gpu_e2e_variants.sh
elif [ "${PART:-b}" = d ]; then
  PYTHONPATH=. timeout 300 python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_mosaic_threshold_s41 \
    --cases 'qwen3-8b B1 8K,qwen3-8b B1 16K,qwen3-8b B1 32K' --compare-tunings 'low=triton;low=mosaic' \
    > "$OUT/decode_mosaic_threshold_s41.log" 2>&1
  echo "threshold rc=$?"; tail -12 "$OUT/decode_mosaic_threshold_s41.log" | cut -c1-200
  # session 41's second call (smaller caches)
  PYTHONPATH=. timeout 250 python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_mosaic_threshold_small_s41 \
    --cases 'qwen3-8b B1 1K,B1 2K,qwen3-8b B1 4K,B2 4K,B4 4K,B16 1K' --compare-tunings 'low=triton;low=mosaic' \
    > "$OUT/decode_mosaic_threshold_small_s41.log" 2>&1
  echo "threshold (small) rc=$?"
elif [ "${PART:-b}" = c ]; then
  VARIANTS=$'.|bf16,hyquant|\n.|hyquant|--xla_gpu_command_buffer_update_mode=SKIP_TEMP' PREFIXES=32768 STEPS=64 \
    REPS=4 RUN_LIMIT=170 NAME=e2e_first_call_skip_temp bash benchmarks/gpu_e2e_variants.sh
elif [ "${PART:-b}" = a ]; then
  (cd .gpu_run/decode_after_operand && PYTHONPATH=. timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rA \
      tests/test_decode_mgpu.py tests/test_decode_merge.py tests/test_decode_kernel.py tests/test_generate.py \
      -k "mgpu or merge or tunings or ring_logits or on_the_device" > "$OUT/after_operand_gpu_tests.log" 2>&1)
  echo "tests rc=$?"; tail -3 "$OUT/after_operand_gpu_tests.log"
  # Session 41's first run (main first) gave main 5.70 / 7.11 ms against the patch's 5.47 / 6.97 while session 40
  # timed main at 5.49 / 6.98: the patch runs first here, so that an order effect shows.
  VARIANTS=$'.gpu_run/decode_after_operand|bf16,hyquant|\n.|bf16,hyquant|' PREFIXES=32768,131072 STEPS=64 REPS=3 \
    RUN_LIMIT=170 NAME=e2e_after_operand_reversed bash benchmarks/gpu_e2e_variants.sh
else
  VARIANTS=$'.|bf16,hyquant|\n.gpu_run/fused_qkv_probe|bf16,hyquant|' PREFIXES=32768,131072 STEPS=64 REPS=3 \
    RUN_LIMIT=170 NAME=e2e_fused_qkv_probe bash benchmarks/gpu_e2e_variants.sh
  (cd .gpu_run/fused_qkv_probe && PYTHONPATH=. timeout 120 python3 - > "$OUT/fused_qkv_hoist.log" 2>&1 <<'PY'
import re, jax, jax.numpy as jnp
from benchmarks import e2e
from hyquant_jax import SamplingConfig
from hyquant_jax.generate import decode
from models import init_params
args = e2e.parse_args(["--sections", "b1", "--layers", "2"])
config = e2e._model(args)
params = init_params(jax.random.PRNGKey(0), config, jnp.bfloat16)
attention, _ = e2e._attention(args, "hyquant")
states = e2e._states(attention, config, 32768, 1, 32768 + 200)
static = dict(config=config, attention=attention, sampling=SamplingConfig(), max_new_tokens=65, eos_ids=(), pad_id=0,
              layer_kernels="auto")
hlo = decode.lower(params, states, jnp.zeros((1,), jnp.int32), jnp.full((1,), 32768, jnp.int32), jax.random.PRNGKey(2),
                   **static).compile().as_text()
width = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
comp, where = None, []
for line in hlo.splitlines():
    m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    comp = m.group(1) if m else comp
    if "concatenate(" in line and f"[{config.hidden_size},{width}]" in line.replace(" ", ""):
        where.append(comp)
print("qkv weight concatenates in computations:", where)
comp, callers = None, []  # a concatenate inside a fusion: the computations that call that fusion
for line in hlo.splitlines():
    m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    comp = m.group(1) if m else comp
    callers += [comp for w in where if re.search(rf"calls=%{re.escape(w)}\b", line)]
print("called from:", callers, "(ENTRY is", re.search(r"ENTRY %?([\w.\-]+)", hlo).group(1) + ")")
PY
  )
  echo "hoist check rc=$?"; cat "$OUT/fused_qkv_hoist.log" | tail -3
fi
