"""Attention entry points: run hybrid decode or prefill on the backend asked for (`hyquant_jax.backends`)."""

from __future__ import annotations

import jax.numpy as jnp

from hyquant_jax import reference
from hyquant_jax.backends import prefill_backend, resolve_backend
from hyquant_jax.cache import HybridKVCache, accumulate_ring_scores, append, flush_full_rings
from hyquant_jax.config import HyQuantConfig, as_lengths, check_config
from hyquant_jax.vti import tail_queries, tail_query_count, vertical_token_identification


def _check_cache_and_config(cache, config) -> None:
    check_config(config)
    if not isinstance(cache, HybridKVCache):
        raise ValueError(f"cache must be a hyquant_jax.HybridKVCache (from hyquant_jax.freeze), got "
                         f"{type(cache).__name__}")


def check_tuning(tuning, name: str = "tuning"):
    """`tuning` if it is None (the decode kernels' defaults) or a `decode_launch.DecodeTuning`; anything else
    is a ValueError naming the argument `name`."""
    from hyquant_jax.decode_launch import DecodeTuning  # imported lazily: only kernel backends need Pallas

    if tuning is not None and not isinstance(tuning, DecodeTuning):
        raise ValueError(f"{name} must be None or a hyquant_jax.decode_launch.DecodeTuning, got {tuning!r}")
    return tuning


def decode_attention(q, cache: HybridKVCache, config: HyQuantConfig, backend: str = "auto",
                     scale: float | None = None, ring_logits: bool = False, tuning=None):
    """One decode step's attention over a `HybridKVCache`.

    q: [B, Hq, D]. Returns (out [B, Hq, D] in q.dtype, lse float32 [B, Hq]); with ring_logits a third value:
    the scaled logits of every window-ring slot, float32 [B, Hq, ring_size], from the kernel backends (their
    ring split computes them anyway), None from the reference backend. tuning: the kernel backends' launch
    knobs (`decode_launch.DecodeTuning`; None: their defaults); the reference backend ignores it.
    """
    _check_cache_and_config(cache, config)
    backend = resolve_backend(backend)
    tuning = check_tuning(tuning)
    if backend == "reference":
        out, lse = reference.hybrid_decode_attention_reference(q, cache, config, scale=scale)
        return (out, lse, None) if ring_logits else (out, lse)
    from hyquant_jax import decode_launch  # imported lazily: only kernel backends need Pallas

    return decode_launch.decode_attention(q, cache, config, interpret=backend == "interpret", scale=scale,
                                          ring_logits=ring_logits, tuning=tuning)


def decode_step(q, k, v, cache: HybridKVCache, config: HyQuantConfig, backend: str = "auto",
                active=None, scale: float | None = None, flush: bool = True, tuning=None):
    """Append this step's k, v [B, Hkv, D], attend with q [B, Hq, D], update ring scores.

    flush=False: the window rings were already given room (`flush_full_rings`, see `append`).
    tuning: the kernel backends' launch knobs (`decode_launch.DecodeTuning`; None: their defaults).
    Returns (out [B, Hq, D], new cache).

    The kernel backends attend over the cache as it was and this step's token as one more key
    (`decode_launch.decode_attention(..., new_token=...)`), then append it: the append writes the ring the
    Triton launch reads, so XLA runs it after that launch, off the path from q to the output, where before
    both attention launches waited for it.
    """
    _check_cache_and_config(cache, config)
    ring_logits = config.flush_vl_count > 0  # ring scores are kept only when flushed tokens can be promoted
    resolved = resolve_backend(backend)
    tuning = check_tuning(tuning)
    if resolved == "reference":
        cache = append(cache, k, v, config, active=active, flush=flush, backend=backend)
        out, lse, *logits = decode_attention(q, cache, config, backend=backend, scale=scale, ring_logits=ring_logits)
    else:
        from hyquant_jax import decode_launch

        want = (cache.batch, cache.num_kv_heads, cache.head_dim)
        if k.shape != want or v.shape != want:
            raise ValueError(f"decode_step: k and v must be [B, H_kv, D]={want}, got {k.shape} and {v.shape}")
        active = jnp.ones((cache.batch,), bool) if active is None else jnp.asarray(active)
        if active.shape != (cache.batch,):
            raise ValueError(f"decode_step: active must be bool [B]={(cache.batch,)}, got {active.shape}")
        active = active.astype(bool)
        if flush:
            (cache,) = flush_full_rings((cache,), config, active)
        appended = append(cache, k, v, config, active=active, flush=False, backend=backend)
        # The token's ring slot from the appended cache: the append advances ring_len in place, and a reader
        # of the old value after it costs two s32 copies a layer and step (inactive rows: masked there).
        slot = (appended.ring_start + appended.ring_len - 1) % config.ring_size
        # the kernels hand over their ring logits, so XLA makes no second pass over the ring
        out, lse, *logits = decode_launch.decode_attention(
            q, cache, config, interpret=resolved == "interpret", scale=scale,
            ring_logits=ring_logits, new_token=(k, v, active), token_slot=slot, tuning=tuning)
        cache = appended
    ring_logits = logits[0] if logits else None
    cache = accumulate_ring_scores(cache, q, lse, config, scale=scale, ring_logits=ring_logits)
    return out, cache


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
    backend = prefill_backend(backend, q.shape[-1], config)
    if backend == "reference":
        out = reference.hybrid_prefill_attention_reference(q, k, v, lengths, *vl, config, scale=scale)
    elif backend == "mosaic":
        from hyquant_jax import prefill_launch

        out = prefill_launch.prefill_attention_mgpu(q, k, v, lengths, *vl, config, scale=scale,
                                                    **prefill_launch.MOSAIC_PREFILL)
    else:
        from hyquant_jax import prefill_launch

        out = prefill_launch.prefill_attention(q, k, v, lengths, *vl, config, interpret=backend == "interpret",
                                               scale=scale)
    return out, vl
