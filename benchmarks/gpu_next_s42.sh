#!/bin/bash
# Prepared in session 40, not run (no device time left). Four GPU calls (PART=a, b, c, d), ~3-7 min each.
# Before them, here:
#   bash benchmarks/prepare_patched_tree.sh decode_after_operand
#   bash benchmarks/prepare_patched_tree.sh fused_qkv_probe
# then run with carry [".gpu_run"].
# PART=a: results/decode_after_operand.patch: the Mosaic launch waits for the ring append through an operand it
#   does not read (low_bit_splits(after=ring_len)) instead of a select on q, so the query conversion
#   (loop_convert_pad_fusion, ~1.6 us) runs beside the append instead of after it (session 40's profile: append
#   2.0-4.0 us, conversion 4.2-5.8, Mosaic kernel from 6.2 in each layer). Its GPU tests (the real kernel with the
#   new operand: decode_mgpu oracle, decode tunings and ring logits through both kernels, generate's device loops),
#   then e2e B=1 at 32K / 128K, main and the patch, one process each, one autotune cache. Merge if (1) passes and
#   (2) is faster (expected ~2 us a layer, ~0.07 ms a step).
# PART=b: results/fused_qkv_probe.patch (a probe, not for merging as is): the decode step's q, k and v projections
#   as one GEMM over the concatenated weights (XLA hoists the concatenation out of the decode loops on CPU; the
#   script checks the GPU HLO: the concatenate must be in the entry computation, not a loop body). In hyquant's
#   layer the q GEMM starts ~5 us after the k/v reduction fusion (bf16's start together). If hyquant gains more
#   than bf16, store the weights fused (Params.wqkv, loaders, sharding by KV-head groups) in a later session.
# PART=c (~4 min, main only): hyquant's first timed loop runs ~0.6 ms a step slower than the next ones (~35 ms
#   once per call, session 40). Suspect: the first call after the warm-up gets a new temp buffer address and XLA
#   updates every command buffer of the loop (with the device loops' conditional nodes since session 37); session
#   33's test of that (SKIP_TEMP) predates the device loops. 32K, --reps 4, as is and with SKIP_TEMP.
# PART=d (~3 min, main only): hyquant_jax.decode_kernel.MOSAIC_MIN_PAGES (Mosaic low-bit launch from B=1 32K) was
#   chosen against XLA's split merge; with session 40's merge kernel the Mosaic path may pay off earlier. The
#   decode alone at B=1 8K / 16K / 32K with the low-bit pages in the Triton kernel and in the Mosaic kernel.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-a}" = d ]; then
  PYTHONPATH=. timeout 300 python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_mosaic_threshold_s41 \
    --cases 'qwen3-8b B1 8K,qwen3-8b B1 16K,qwen3-8b B1 32K' --compare-tunings 'low=triton;low=mosaic' \
    > "$OUT/decode_mosaic_threshold_s41.log" 2>&1
  echo "threshold rc=$?"; tail -12 "$OUT/decode_mosaic_threshold_s41.log" | cut -c1-200
elif [ "${PART:-a}" = c ]; then
  VARIANTS=$'.|bf16,hyquant|\n.|hyquant|--xla_gpu_command_buffer_update_mode=SKIP_TEMP' PREFIXES=32768 STEPS=64 \
    REPS=4 RUN_LIMIT=170 NAME=e2e_first_call_skip_temp bash benchmarks/gpu_e2e_variants.sh
elif [ "${PART:-a}" = a ]; then
  (cd .gpu_run/decode_after_operand && PYTHONPATH=. timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rA \
      tests/test_decode_mgpu.py tests/test_decode_merge.py tests/test_decode_kernel.py tests/test_generate.py \
      -k "gpu or tunings or ring_logits or on_the_device" > "$OUT/after_operand_gpu_tests.log" 2>&1)
  echo "tests rc=$?"; tail -3 "$OUT/after_operand_gpu_tests.log"
  VARIANTS=$'.|bf16,hyquant|\n.gpu_run/decode_after_operand|bf16,hyquant|' PREFIXES=32768,131072 STEPS=64 REPS=3 \
    RUN_LIMIT=170 NAME=e2e_after_operand bash benchmarks/gpu_e2e_variants.sh
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
