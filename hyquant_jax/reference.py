"""Pure-jnp reference attention: the oracles the Pallas kernels are compared with.

All math runs in float32; outputs come back in the query dtype, log-sum-exps
in float32. Fully masked rows (no key at all) give output 0 and lse -inf,
never NaN. Shapes: B batch, Hq query heads, Hkv KV heads (Hq % Hkv == 0),
T queries, S keys, D head_dim.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax import quant
from hyquant_jax.cache import (
    HybridKVCache,
    check_cache,
    check_decode_query,
    dequantize_keys,
    dequantize_values,
    low_bit_valid,
    ring_valid,
    vl_valid,
)
from hyquant_jax.config import HyQuantConfig


def _group(q, hkv):
    """[B, Hq, T, D] -> [B, Hkv, g, T, D] (GQA without repeating K/V)."""
    b, hq, t, d = q.shape
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    return q.reshape(b, hkv, hq // hkv, t, d)


def softmax_attend(logits, mask, v):
    """Masked softmax attention in float32.

    logits: [B, H, g, T, S] (already scaled); mask: bool broadcastable to it;
    v: [B, H, S, D]. Returns (out [B, H, g, T, D], lse [B, H, g, T]).
    """
    logits = jnp.where(mask, logits, -jnp.inf)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    p = jnp.where(mask, jnp.exp(logits - peak), 0.0)
    denom = p.sum(axis=-1)
    # Zero the values of keys no row may see (padding): 0 * NaN would leak into the output.
    seen = jnp.any(jnp.broadcast_to(mask, logits.shape), axis=(2, 3))  # [B, H, S]
    v = jnp.where(seen[..., None], v.astype(jnp.float32), 0.0)
    out = jnp.einsum("bhgts,bhsd->bhgtd", p, v)
    out = out / jnp.where(denom > 0, denom, 1.0)[..., None]
    lse = jnp.where(denom > 0, jnp.log(jnp.where(denom > 0, denom, 1.0)) + peak[..., 0], -jnp.inf)
    return out, lse


def _scale(d, scale):
    return 1.0 / math.sqrt(d) if scale is None else scale


def _key_mask(kv_lengths, s, q_positions):
    """bool [B, 1, 1, T or 1, S]: key j valid and (if positions given) j <= position."""
    ok = jnp.arange(s)[None, :] < kv_lengths[:, None]  # [B, S]
    if q_positions is None:
        return ok[:, None, None, None, :]
    causal = jnp.arange(s)[None, None, :] <= q_positions[:, :, None]  # [B, T, S]
    return (ok[:, None, :] & causal)[:, None, None]


@partial(jax.jit, static_argnames=("scale",))
def exact_attention(q, k, v, kv_lengths, q_positions=None, scale: float | None = None):
    """Exact attention over the first kv_lengths[b] keys.

    q: [B, Hq, T, D]; k, v: [B, Hkv, S, D]; kv_lengths: int [B];
    q_positions: optional int [B, T] (causal: key j visible iff j <= position).
    Returns (out [B, Hq, T, D] in q.dtype, lse float32 [B, Hq, T]).
    """
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    qg = _group(q.astype(jnp.float32), hkv)
    logits = jnp.einsum("bhgtd,bhsd->bhgts", qg, k.astype(jnp.float32)) * _scale(d, scale)
    out, lse = softmax_attend(logits, _key_mask(kv_lengths, s, q_positions), v)
    return out.reshape(b, hq, t, d).astype(q.dtype), lse.reshape(b, hq, t)


# --------------------------------------------------------------------------- decode


@partial(jax.jit, static_argnames=("config", "scale"))
def _hybrid_decode(q, cache: HybridKVCache, config: HyQuantConfig, scale):
    b, hq, d = q.shape
    h = cache.num_kv_heads
    keys = jnp.concatenate([dequantize_keys(cache, config), cache.vl_k.astype(jnp.float32),
                            cache.ring_k.astype(jnp.float32)], axis=2)
    values = jnp.concatenate([dequantize_values(cache, config), cache.vl_v.astype(jnp.float32),
                              cache.ring_v.astype(jnp.float32)], axis=2)
    mask = jnp.concatenate([low_bit_valid(cache, config.block_size), vl_valid(cache), ring_valid(cache)], axis=1)
    qg = _group(q[:, :, None].astype(jnp.float32), h)
    logits = jnp.einsum("bhgtd,bhsd->bhgts", qg, keys) * _scale(d, scale)
    out, lse = softmax_attend(logits, mask[:, None, None, None, :], values)
    return out.reshape(b, hq, d).astype(q.dtype), lse.reshape(b, hq)


def hybrid_decode_attention_reference(q, cache: HybridKVCache, config: HyQuantConfig, scale: float | None = None):
    """Decode attention of one query token per sequence over a `HybridKVCache`.

    q: [B, Hq, D]. The low-bit region is dequantized to float32 (reference
    only: the kernel never materializes it). Returns (out [B, Hq, D] in
    q.dtype, lse float32 [B, Hq]).
    """
    check_decode_query(q, cache)
    check_cache(cache, config)
    return _hybrid_decode(q, cache, config, scale)


# --------------------------------------------------------------------------- uniform baselines


def quantize_dequantize(x, lengths, bits: int, scheme: str, group_size: int | None, block_size: int, is_key: bool):
    """Quantize every token of x [B, H, S, D] and return the float32 reconstruction.

    Keys under "channel_key" use per-channel scales over consecutive blocks of
    `block_size` tokens (only the first lengths[b] tokens count for the range);
    everything else is per token. bits == 16 returns x unchanged.
    """
    x32 = x.astype(jnp.float32)
    if bits == 16:
        return x32
    if scheme == "channel_key" and is_key:
        b, h, s, d = x.shape
        pad = (-s) % block_size
        xp = jnp.pad(x32, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(b, h, -1, block_size, d)
        valid = (jnp.arange(s + pad)[None, :] < lengths[:, None]).reshape(b, 1, -1, block_size)
        codes, scale, zero = quant.quantize_channels(xp, bits, jnp.broadcast_to(valid, xp.shape[:-1]))
        return quant.dequantize_channels(codes, scale, zero).reshape(b, h, s + pad, d)[:, :, :s]
    codes, scale, zero = quant.quantize_tokens(x32, bits, symmetric=scheme == "token_sym", group_size=group_size)
    return quant.dequantize_tokens(codes, scale, zero, bits)


@partial(jax.jit, static_argnames=("config", "scale"))
def uniform_quantized_attention(q, k, v, kv_lengths, config: HyQuantConfig, q_positions=None,
                                scale: float | None = None):
    """Baseline: every cached token low-bit (config bits and scheme; no VL, no window).

    Same shapes and returns as `exact_attention`.
    """
    kq = quantize_dequantize(k, kv_lengths, config.key_bits, config.scheme, config.group_size,
                             config.block_size, is_key=True)
    vq = quantize_dequantize(v, kv_lengths, config.value_bits, config.scheme, config.group_size,
                             config.block_size, is_key=False)
    return exact_attention(q, kq, vq, kv_lengths, q_positions=q_positions, scale=scale)


# --------------------------------------------------------------------------- prefill


def vl_mask(vl_idx, vl_count, num_keys):
    """bool [B, Hkv, N] from VL indices [B, Hkv, K] (first vl_count[b] valid)."""
    b, h, kmax = vl_idx.shape
    ok = jnp.arange(kmax)[None, None, :] < vl_count[:, None, None]
    return jnp.zeros((b, h, num_keys), bool).at[
        jnp.arange(b)[:, None, None], jnp.arange(h)[None, :, None], jnp.where(ok, vl_idx, 0)
    ].max(ok)


def _quantized_logits(q, k, key_mean, qk_format):
    """Q.K of the quantized segment: q [B,H,g,T,D], k [B,H,S,D] float32 -> [B,H,g,T,S].

    Keys are smoothed by their per-head mean (q.mean is added back exactly),
    then Q and the smoothed K are quantized with one scale per token.
    """
    exact_bias = jnp.einsum("bhgtd,bhd->bhgt", q, key_mean)[..., None]
    centered = k - key_mean[:, :, None, :]
    if qk_format == "bf16":
        return jnp.einsum("bhgtd,bhsd->bhgts", q, centered) + exact_bias
    fn = quant.quantize_int8 if qk_format == "int8" else quant.quantize_fp8
    qi, sq = fn(q)
    ki, sk = fn(centered)
    dots = jnp.einsum("bhgtd,bhsd->bhgts", qi.astype(jnp.float32), ki.astype(jnp.float32))
    return dots * sq * sk[:, :, None, None, :, 0] + exact_bias


def prefill_key_mean(k32, lengths):
    """Per-head mean of the valid keys (the smoothing of the quantized Q.K): k32 [B, H, S, D] -> [B, H, D]."""
    key_ok = jnp.arange(k32.shape[2])[None, :] < lengths[:, None]
    return jnp.where(key_ok[:, None, :, None], k32, 0.0).sum(2) / jnp.maximum(lengths, 1)[:, None, None]


def prefill_chunk(qc, q_pos, k32, v32, key_ok, key_mean, is_vl, *, window, block, qk_format, hybrid, scale):
    """Causal hybrid (or, hybrid=False, uniformly quantized) attention of one query chunk over keys [0, S).

    qc: float32 [B, H, g, C, D] at positions q_pos [C]; k32, v32: float32
    [B, H, S, D]; key_ok: bool [B, S]; key_mean: [B, H, D] (`prefill_key_mean`
    over all keys); is_vl: bool [B, H, S]. Keys in the query's full-precision
    band or VL use exact logits, the rest quantized ones. Returns [B, H, g, C, D].
    """
    key_pos = jnp.arange(k32.shape[2])
    causal = (key_pos[None, :] <= q_pos[:, None])[None, None, None] & key_ok[:, None, None, None, :]
    logits = _quantized_logits(qc, k32, key_mean, qk_format)
    if hybrid:
        band = key_pos[None, :] >= ((q_pos // block) * block - window)[:, None]  # [C, S]
        exact = band[None, None, None] | is_vl[:, :, None, None, :]
        logits = jnp.where(exact, jnp.einsum("bhgtd,bhsd->bhgts", qc, k32), logits)
    out, _ = softmax_attend(logits * scale, causal, v32)
    return out


@partial(jax.jit, static_argnames=("window", "block", "qk_format", "hybrid", "scale", "query_chunk"))
def _prefill(q, k, v, lengths, is_vl, *, window, block, qk_format, hybrid, scale, query_chunk):
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    scale = _scale(d, scale)
    k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)
    key_ok = jnp.arange(t)[None, :] < lengths[:, None]  # [B, S]
    key_mean = prefill_key_mean(k32, lengths)
    chunk = min(query_chunk, t)
    pad = (-t) % chunk
    qg = _group(jnp.pad(q.astype(jnp.float32), ((0, 0), (0, 0), (0, pad), (0, 0))), hkv)
    n_chunks = (t + pad) // chunk
    qg = qg.reshape(b, hkv, hq // hkv, n_chunks, chunk, d).transpose(3, 0, 1, 2, 4, 5)

    def one_chunk(args):
        qc, c = args  # [B, H, g, C, D]
        return prefill_chunk(qc, c * chunk + jnp.arange(chunk), k32, v32, key_ok, key_mean, is_vl, window=window,
                             block=block, qk_format=qk_format, hybrid=hybrid, scale=scale)

    out = jax.lax.map(one_chunk, (qg, jnp.arange(n_chunks)))  # [n, B, H, g, C, D]
    out = out.transpose(1, 2, 3, 0, 4, 5).reshape(b, hq, t + pad, d)[:, :, :t]
    q_ok = jnp.arange(t)[None, None, :, None] < lengths[:, None, None, None]
    return jnp.where(q_ok, out, 0.0).astype(q.dtype)


def check_prefill_shapes(q, k, v, lengths):
    """Raise ValueError unless q is [B, Hq, T, D], k and v [B, Hkv, T, D] (Hq % Hkv == 0) of floating dtypes,
    and lengths integer [B]; concrete lengths (not traced) must also lie in [0, T]."""
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"q must be [B, Hq, T, D] and k, v [B, Hkv, T, D]; got {q.shape}, {k.shape}, {v.shape}")
    b, hq, t, d = q.shape
    if k.shape[0] != b or k.shape[2] != t or k.shape[3] != d or hq % k.shape[1]:
        raise ValueError(f"k/v shape {k.shape} does not match q shape {q.shape} (GQA needs Hq % Hkv == 0)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be a floating-point array, got {x.dtype}")
    if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"lengths must be int [B]={(b,)}, got {lengths.dtype} {lengths.shape}")
    if not isinstance(lengths, jax.core.Tracer):
        values = np.asarray(lengths)
        if values.min(initial=0) < 0 or values.max(initial=0) > t:
            raise ValueError(f"lengths must lie in [0, T={t}], got {values.tolist()}")


def hybrid_prefill_attention_reference(q, k, v, lengths, vl_idx, vl_count, config: HyQuantConfig,
                                       scale: float | None = None, query_chunk: int = 256):
    """Causal hybrid-precision prefill attention (paper Eq. 7, Algorithm 2).

    q: [B, Hq, T, D]; k, v: [B, Hkv, T, D] (left-aligned, ragged `lengths`);
    vl_idx, vl_count: the VL set from `vertical_token_identification`.
    Query i in block c = i // prefill_block sees keys j <= i. Keys j >= c *
    prefill_block - window (the block's full-precision band) and VL keys use
    exact Q.K; all other keys use `config.prefill_qk` (int8 / fp8 per-token
    scales on Q and on mean-smoothed K; bf16 means no quantization). Values
    stay in full precision. Rows of padded queries are zero.
    Returns [B, Hq, T, D] in q.dtype.
    """
    check_prefill_shapes(q, k, v, lengths)
    is_vl = vl_mask(vl_idx, vl_count, k.shape[2])
    return _prefill(q, k, v, lengths, is_vl, window=config.window, block=config.prefill_block,
                    qk_format=config.prefill_qk, hybrid=True, scale=scale, query_chunk=query_chunk)


def uniform_quantized_prefill_reference(q, k, v, lengths, qk_format: str = "int8",
                                        scale: float | None = None, query_chunk: int = 256):
    """SageAttention-style baseline: every causal key through quantized Q.K."""
    check_prefill_shapes(q, k, v, lengths)
    is_vl = jnp.zeros(k.shape[:3], bool)
    return _prefill(q, k, v, lengths, is_vl, window=0, block=16, qk_format=qk_format, hybrid=False,
                    scale=scale, query_chunk=query_chunk)
