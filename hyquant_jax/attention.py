"""Attention entry points: check the arguments, pick the implementation the backend names on this device
(`decode_launch.resolve`, `prefill_launch.resolve`) and run it: the reference here, the kernels in
`hyquant_jax.decode_launch` and `hyquant_jax.prefill_launch`."""

from __future__ import annotations

from hyquant_jax import reference
from hyquant_jax.cache import HybridKVCache, accumulate_ring_scores, append, check_decode_query
from hyquant_jax.config import HyQuantConfig, as_lengths, check_config
from hyquant_jax.vti import tail_queries, tail_query_count, vertical_token_identification

# decode_launch and prefill_launch are imported on first use, not with the package: they import Mosaic GPU,
# the largest part of `import hyquant_jax`, which the reference backend never runs.


def _check_cache_and_config(cache, config) -> None:
    check_config(config)
    if not isinstance(cache, HybridKVCache):
        raise ValueError(f"cache must be a hyquant_jax.HybridKVCache (from hyquant_jax.freeze), got "
                         f"{type(cache).__name__}")


def check_tuning(tuning, name: str = "tuning"):
    """`tuning` if it is None (the decode kernels' defaults) or a `decode_launch.DecodeTuning`; anything else
    is a ValueError naming the argument `name`."""
    if tuning is None:
        return None
    from hyquant_jax import decode_launch  # on first use: see the note above

    return decode_launch.check_tuning(tuning, name)


def decode_attention(q, cache: HybridKVCache, config: HyQuantConfig, backend: str = "auto",
                     scale: float | None = None, ring_logits: bool = False, tuning=None):
    """One decode step's attention over a `HybridKVCache`.

    q: [B, Hq, D]. Returns (out [B, Hq, D] in q.dtype, lse float32 [B, Hq]); with ring_logits a third value:
    the scaled logits of every window-ring slot, float32 [B, Hq, ring_size], from the kernel backends (their
    ring split computes them anyway), None from the reference backend. tuning: the kernel backends' launch
    knobs (`decode_launch.DecodeTuning`; None: their defaults); the reference backend ignores it.
    """
    _check_cache_and_config(cache, config)
    check_decode_query(q, cache)
    tuning = check_tuning(tuning)
    from hyquant_jax import decode_launch  # on first use: see the note above

    path = decode_launch.resolve(backend, cache, config, q.shape[1])
    if path == "reference":
        out, lse = reference.hybrid_decode_attention_reference(q, cache, config, scale=scale)
        return (out, lse, None) if ring_logits else (out, lse)
    return decode_launch.decode_attention(q, cache, config, interpret=path == "interpret", scale=scale,
                                          ring_logits=ring_logits, tuning=tuning)


def decode_step(q, k, v, cache: HybridKVCache, config: HyQuantConfig, backend: str = "auto",
                active=None, scale: float | None = None, flush: bool = True, tuning=None):
    """Append this step's k, v [B, Hkv, D], attend with q [B, Hq, D], update ring scores.

    flush=False: the window rings were already given room (`flush_full_rings`, see `append`).
    tuning: the kernel backends' launch knobs (`decode_launch.DecodeTuning`; None: their defaults).
    Returns (out [B, Hq, D], new cache). The kernel backends run `decode_launch.decode_step` (which attends
    before it appends); the reference appends, attends and recomputes the ring scores in jnp.
    """
    _check_cache_and_config(cache, config)
    check_decode_query(q, cache)
    tuning = check_tuning(tuning)
    from hyquant_jax import decode_launch  # on first use: see the note above

    path = decode_launch.resolve(backend, cache, config, q.shape[1])
    if path != "reference":
        return decode_launch.decode_step(q, k, v, cache, config, interpret=path == "interpret", active=active,
                                         scale=scale, flush=flush, tuning=tuning)
    cache = append(cache, k, v, config, active=active, flush=flush, backend=backend)
    out, lse = reference.hybrid_decode_attention_reference(q, cache, config, scale=scale)
    return out, accumulate_ring_scores(cache, q, lse, config, scale=scale)


def prefill_attention(q, k, v, lengths, config: HyQuantConfig, backend: str = "auto",
                      scale: float | None = None):
    """Causal hybrid prefill attention with VTI from the prompt's tail queries.

    q: [B, Hq, T, D]; k, v: [B, Hkv, T, D]; lengths: int32 [B].
    Returns (out [B, Hq, T, D], (vl_idx, vl_count)) so Freeze can reuse the VL set.
    """
    check_config(config)
    if getattr(q, "ndim", 0) == 4:  # else check_prefill_shapes names q
        lengths = as_lengths(lengths, q.shape[0])
    reference.check_prefill_shapes(q, k, v, lengths)
    q_tail = tail_queries(q, lengths, tail_query_count(config))
    vl = vertical_token_identification(q_tail, k, lengths, config, scale=scale)
    from hyquant_jax import prefill_launch  # on first use: see the note above

    implementation = prefill_launch.resolve(backend, q.shape[-1], config)
    if implementation == "reference":
        out = reference.hybrid_prefill_attention_reference(q, k, v, lengths, *vl, config, scale=scale)
    elif implementation == "mosaic":
        out = prefill_launch.prefill_attention_mgpu(q, k, v, lengths, *vl, config, scale=scale)
    else:
        out = prefill_launch.prefill_attention(q, k, v, lengths, *vl, config, interpret=implementation == "interpret",
                                               scale=scale)
    return out, vl
