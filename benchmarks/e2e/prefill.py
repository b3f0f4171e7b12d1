"""The prefill section of the end-to-end benchmark: `generate.prefill` (+ Freeze) timed, whole or in chunks."""

from __future__ import annotations

import statistics
import time

from benchmarks.common import timed
from benchmarks.e2e.placement import data_size, peak_bytes, put


def prefill_config(args, model, attention, method, prefix, mesh=None):
    """Time the prefill (+ Freeze) of B = 1 prompt per data shard: whole, or in chunks of --prefill-chunk."""
    import jax
    import jax.numpy as jnp

    from hyquant_jax import SamplingConfig
    from hyquant_jax.generate import prefill
    from models import split_model

    config = model.config
    model_def, weights = split_model(model)

    batch = data_size(mesh)
    tokens = put(jax.random.randint(jax.random.PRNGKey(3), (batch, prefix), 0, config.vocab_size, jnp.int32), mesh)
    lengths = put(jnp.full((batch,), prefix, jnp.int32), mesh)
    chunk = args.prefill_chunk or prefix
    static = dict(attention=attention, sampling=SamplingConfig(), chunk=chunk, max_len=prefix + 8)
    t0 = time.perf_counter()
    key0 = put(jax.random.PRNGKey(0), mesh, batch_axis=False)
    compiled = prefill.lower(model_def, weights, tokens, lengths, key0, **static).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(args.reps + 1):
        key = put(jax.random.PRNGKey(r), mesh, batch_axis=False)
        _, seconds = timed(compiled, weights, tokens, lengths, key, ready=lambda result: (result[0], result[2]))
        times.append(seconds)
    seconds = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {"method": method, "prefix": prefix, "batch": batch, "chunk": chunk,
            "chunk_impl": _chunk_impl_run(attention, config, prefix), "seconds": seconds,
            "tokens_per_s": batch * prefix / seconds, "compile_s": compile_s, "peak_bytes": peak_bytes(mesh)}


def _chunk_impl_run(attention, config, slots: int) -> str:
    """The chunk attention a prefill row ran: the attention's `chunk_impl`, with "auto" resolved as
    `models.prefix_attention` resolves it for bf16 staging of `slots` keys (the quantized baselines: XLA)."""
    import jax.numpy as jnp

    from models.attention import fused_chunk_applies

    impl = getattr(attention, "chunk_impl", "xla")
    if impl == "auto":
        return "triton" if fused_chunk_applies(slots, config.head_dim, jnp.bfloat16, False) else "xla"
    return impl
