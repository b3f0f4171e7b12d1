"""Vertical-line token identification (paper Algorithm 1), GQA-native and ragged."""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax.config import HyQuantConfig, as_lengths, num_vl_tokens


def tail_query_count(config: HyQuantConfig) -> int:
    """How many of the last prompt queries form the tail-query proxy.

    Algorithm 1 uses min(W, L_Q); with W = 0 there would be none, so the
    proxy then uses the last `block_size` queries instead.
    """
    return config.window if config.window > 0 else config.block_size


def tail_queries(q: jax.Array, lengths: jax.Array, num: int) -> jax.Array:
    """Right-aligned tails of left-aligned queries.

    q: [B, Hq, L, D], row i is the query at position i; lengths: int [B].
    Returns [B, Hq, num, D] where row num-1 is the query at position
    lengths-1, row num-1-j at lengths-1-j. Rows before position 0 are zero.
    """
    if getattr(q, "ndim", 0) != 4:
        raise ValueError(f"q must be [B, Hq, L, D], got {getattr(q, 'shape', type(q).__name__)}")
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 1:
        raise ValueError(f"num must be an int >= 1 (tail queries per sequence), got {num!r}")
    b, _, length, _ = q.shape
    lengths = as_lengths(lengths, b)
    pos = lengths[:, None] - num + jnp.arange(num)[None, :]  # [B, num]
    rows = jnp.take_along_axis(q, jnp.clip(pos, 0, length - 1)[:, None, :, None], axis=2)
    return jnp.where((pos >= 0)[:, None, :, None], rows, 0).astype(q.dtype)


def max_vl_count(num_keys: int, config: HyQuantConfig) -> int:
    """Static upper bound on the VL tokens VTI picks from `num_keys` keys."""
    return num_vl_tokens(max(0, num_keys - config.window), config.rho_fraction)


@partial(jax.jit, static_argnames=("config", "scale"))
def vertical_token_identification(
    q_tail: jax.Array,
    k: jax.Array,
    lengths: jax.Array,
    config: HyQuantConfig,
    scale: float | None = None,
):
    """Pick one vertical-line (VL) token set per KV head.

    q_tail: [B, Hq, T, D] right-aligned tail queries (see `tail_queries`); the
      last min(T, lengths, tail_query_count(config)) rows of each sequence are
      averaged into the query proxy.
    k: [B, Hkv, N, D] keys, left-aligned; position p of sequence b is valid for
      p < lengths[b]. Hq must be a multiple of Hkv.
    lengths: int32 [B].

    Only the non-window prefix [0, P), P = max(0, lengths - W), is scored, so
    padding and window tokens are never selected. Each query head's proxy
    logits over the prefix are softmax-normalised and summed over the query
    heads of a KV head (the column attention mass of Eq. 4), and the top
    k = min(P, max(1, ceil(P * rho))) prefix positions are kept.

    Returns (indices int32 [B, Hkv, Kmax] sorted ascending, with -1 after the
    first `count` entries; count int32 [B]). Kmax = max_vl_count(N, config).
    """
    b, hq, t, d = q_tail.shape
    _, hkv, n, _ = k.shape
    if hq % hkv:
        raise ValueError(f"q_tail heads ({hq}) must be a multiple of k heads ({hkv})")
    kmax = max_vl_count(n, config)
    count = num_vl_tokens(jnp.maximum(lengths - config.window, 0), config.rho_fraction).astype(jnp.int32)
    if kmax == 0:
        return jnp.zeros((b, hkv, 0), jnp.int32), count
    scale = 1.0 / math.sqrt(d) if scale is None else scale

    used = jnp.minimum(jnp.minimum(lengths, t), tail_query_count(config))  # [B]
    row_ok = jnp.arange(t)[None, :] >= (t - used)[:, None]  # [B, T]
    q32 = jnp.where(row_ok[:, None, :, None], q_tail.astype(jnp.float32), 0.0)
    qbar = q32.sum(axis=2) / jnp.maximum(used, 1)[:, None, None].astype(jnp.float32)  # [B, Hq, D]
    qbar = qbar.reshape(b, hkv, hq // hkv, d)

    logits = jnp.einsum("bhgd,bhpd->bhgp", qbar, k.astype(jnp.float32)) * scale
    prefix = jnp.maximum(lengths - config.window, 0)
    in_prefix = jnp.arange(n)[None, :] < prefix[:, None]  # [B, N]
    logits = jnp.where(in_prefix[:, None, None, :], logits, -jnp.inf)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    mass = jnp.exp(logits - peak)
    mass = mass / jnp.maximum(mass.sum(axis=-1, keepdims=True), 1e-30)
    score = jnp.where(in_prefix[:, None, :], mass.sum(axis=2), -jnp.inf)  # [B, Hkv, N]

    _, top = jax.lax.top_k(score, kmax)  # [B, Hkv, Kmax], best first
    keep = jnp.arange(kmax)[None, None, :] < count[:, None, None]
    top = jnp.sort(jnp.where(keep, top, n), axis=-1)
    return jnp.where(top < n, top, -1).astype(jnp.int32), count
