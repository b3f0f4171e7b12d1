#!/bin/bash
# Session 41: does XLA (jax 0.11.2) write the per-fusion autotune cache that e2e.py --autotune-cache points it at?
# In results/process_variance_s41.json five e2e.py processes each got a fresh folder and all five stayed empty.
# Prints the JAX cache settings of the device image, then compiles a B=1 GEMM fusion of the decode step's
# shape with the flag (and with the cache mode set explicitly) and lists what XLA wrote.
# Found (results/autotune_cache_probe_s41.log): the flag works alone (6 files written; the image sets no
# compilation cache). e2e.py's workers run with JAX_COMPILATION_CACHE_DIR, and JAX then sets the autotune
# cache folder itself (jax_persistent_cache_enable_xla_caches), overriding the flag: hence the empty folders.
# "--xla_gpu_experimental_autotune_cache_mode=update" is not a valid value (flag parsing fails).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{
env | grep -i -E "^(JAX|XLA|TF_)" || echo "no JAX/XLA/TF environment variables"
python3 -c "import jax; print('compilation_cache_dir', jax.config.jax_compilation_cache_dir); print('enable_xla_caches', jax.config.jax_persistent_cache_enable_xla_caches)"
for mode in "" " --xla_gpu_experimental_autotune_cache_mode=update"; do
  dir=$(mktemp -d)
  XLA_FLAGS="--xla_gpu_per_fusion_autotune_cache_dir=$dir$mode" python3 - <<'PY'
import jax, jax.numpy as jnp
x = jnp.ones((1, 4096), jnp.bfloat16)
w = jnp.ones((4096, 24576), jnp.bfloat16)
f = jax.jit(lambda x, w: jax.nn.silu(x @ w[:, :12288]) * (x @ w[:, 12288:]))
print("ran", float(f(x, w).sum()))
PY
  echo "mode='$mode' files written: $(find "$dir" -type f | wc -l)"; find "$dir" -type f | head -3
done
} > "$OUT/autotune_cache_probe_s41.log" 2>&1
cat "$OUT/autotune_cache_probe_s41.log" | grep -v Warning | tail -12
