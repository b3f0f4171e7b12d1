"""Attention implementations for a `models.Decoder` backed by a `HybridKVCache`.

* `HybridAttention`: HyQuant. A whole-prompt prefill runs
  `hyquant_jax.prefill_attention` (hybrid INT8/FP8-QK prefill, VL set from the
  tail queries) and freezes each layer right away (`freeze` with the same VL
  set, capacity `max_len`); each decode step is `hyquant_jax.decode_step`
  (append, hybrid attention, ring scores). The attention backend ("auto",
  "reference", "triton", "mosaic", "interpret") is passed through to those calls.
* `QuantizedCacheAttention`: the dequantize-then-attend baselines. Prefill
  is exact; Freeze quantizes the prompt into a `HybridKVCache` with rho = 0
  (no VL tokens); each decode step appends (flushing full blocks through the
  same code as HyQuant), dequantizes the whole low-bit region to the model
  dtype with jnp and attends over it and the bf16 window with XLA.
  `uniform_attention(bits)`: every token per-token symmetric `bits`-bit
  (HyQuantConfig(window=0, rho=0, block_size=16)); decoded tokens wait in the
  16-slot bf16 staging ring until a block fills. `kivi_attention(bits)`:
  KIVI-style, keys per channel over 32-token groups, values per token in
  32-channel groups (asymmetric), a bf16 residual window of 128 recent tokens
  (HyQuantConfig(scheme="channel_key", group_size=32, block_size=32,
  window=128, rho=0)); the window holds 128-160 tokens between flushes.
* `FP8CacheAttention`: the FP8 (e4m3) K/V cache with a per-token scale that
  serving engines offer; exact prefill, then every token quantized
  (`FP8KVBuffer`), dequantized for each decode step.

Chunked prefill (prompt longer than one chunk): hybrid INT8-QK prefill needs a
layer's whole prompt at once, so chunks attend exactly over a bf16 staging
copy of the prompt keys (as the bf16 baseline does); the last
`tail_query_count` queries of each prompt are kept, and after the last chunk
VTI picks the VL set from them and Freeze builds the same hybrid cache.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax import quant
from hyquant_jax.attention import check_tuning, decode_step, prefill_attention
from hyquant_jax.backends import BACKENDS
from hyquant_jax.cache import (
    HybridKVCache,
    append,
    dequantize_keys,
    dequantize_values,
    flush_full_rings,
    freeze,
    low_bit_valid,
    ring_valid,
    steps_until_full,
    vl_valid,
)
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.vti import tail_query_count, vertical_token_identification
from models.attention import (
    BATCH,
    HEADS,
    KV_HEADS,
    BF16Attention,
    DecodeContext,
    KVBuffer,
    PrefillContext,
    causal_attention,
    check_chunk_impl,
    grouped_attention,
    logical_axes,
    prefix_attention,
    write_chunk,
    write_token,
)


@partial(jax.tree_util.register_dataclass, data_fields=["k", "v", "q_tail"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class PromptStaging:
    """Chunked-prefill state of one layer: the prompt's keys/values and tail queries.

    k, v: [B, Hkv, N, D] (N = padded prompt length); q_tail: [B, Hq, Wt, D]
    right-aligned queries of the last Wt prompt positions (zero before position 0).
    """

    k: jax.Array = logical_axes(BATCH, KV_HEADS)
    v: jax.Array = logical_axes(BATCH, KV_HEADS)
    q_tail: jax.Array = logical_axes(BATCH, HEADS)


def _stage_chunk(state: PromptStaging, q, k, v, ctx: PrefillContext) -> PromptStaging:
    """Write a chunk's k, v into the staging buffers and keep its tail queries."""
    t, wt = q.shape[2], state.q_tail.shape[2]
    pos = ctx.lengths[:, None] - wt + jnp.arange(wt)[None, :]  # [B, Wt] positions of the tail rows
    rel = pos - ctx.offset
    inside = (rel >= 0) & (rel < t) & (pos >= 0)
    rows = jnp.take_along_axis(q, jnp.clip(rel, 0, t - 1)[:, None, :, None], axis=2)
    q_tail = jnp.where(inside[:, None, :, None], rows.astype(state.q_tail.dtype), state.q_tail)
    return PromptStaging(write_chunk(state.k, k, ctx.offset), write_chunk(state.v, v, ctx.offset), q_tail)


def _staged_attention(q, state: PromptStaging, ctx: PrefillContext, impl: str = "xla"):
    """Exact causal attention of a chunk's queries over the staged prompt keys (`prefix_attention`'s impl)."""
    q_pos = ctx.offset + jnp.arange(q.shape[2])
    f32 = BF16Attention(chunk_impl=impl)._chunk_f32()
    return prefix_attention(q, state.k, state.v, q_pos, f32_probs=f32, impl=impl)


def _staging(config, hq: HyQuantConfig, batch, prompt_len, dtype) -> PromptStaging:
    kv = (batch, config.num_kv_heads, prompt_len, config.head_dim)
    tail = (batch, config.num_heads, tail_query_count(hq), config.head_dim)
    return PromptStaging(jnp.zeros(kv, dtype), jnp.zeros(kv, dtype), jnp.zeros(tail, dtype))


def empty_vl(batch: int, heads: int):
    """No VL tokens: (vl_idx int32 [B, Hkv, 0], vl_count int32 [B] zeros), as `freeze(vl=...)` takes them."""
    return jnp.zeros((batch, heads, 0), jnp.int32), jnp.zeros((batch,), jnp.int32)


def _check_backend(name: str, value: str) -> None:
    if value not in BACKENDS:
        raise ValueError(f"{name} must be one of {BACKENDS}, got {value!r}")


class RingFlushing:
    """The once-per-step work of an attention over `HybridKVCache`s (a `config` attribute): flush the full
    window rings of all layers under one branch before a step, and say for how many steps no ring fills, so
    that `hyquant_jax.generate.decode` runs those steps without the branch (see `steps_until_begin`); and a
    step's append that leaves the flush to that branch (`append_step`)."""

    def begin_decode_step(self, states: tuple, ctx: DecodeContext) -> tuple:
        """Flush every full window ring of all layers under one branch (see `flush_full_rings`)."""
        return flush_full_rings(states, self.config, ctx.active)

    def steps_until_begin(self, states: tuple, ctx: DecodeContext) -> jax.Array:
        """Decode steps from now that need no flush (`steps_until_full`), called after `begin_decode_step`."""
        return steps_until_full(states, self.config, ctx.active)

    def append_step(self, cache: HybridKVCache, k: jax.Array, v: jax.Array, ctx: DecodeContext) -> HybridKVCache:
        """A decode step's k, v [B, Hkv, D] appended in the cache's dtype (`append`; the window flush only when
        `begin_decode_step` has not run on this step)."""
        dt = cache.dtype
        return append(cache, k.astype(dt), v.astype(dt), self.config, active=ctx.active, flush=not ctx.prepared)


@dataclasses.dataclass(frozen=True)
class HybridAttention(RingFlushing):
    """HyQuant attention for a `models.Decoder` (see module docstring).

    config: the HyQuant settings. backend: decode-attention backend;
    prefill_backend: hybrid-prefill backend (None: same as backend).
    cache_dtype: dtype of the full-precision regions (None: k's dtype).
    decode_tuning: the decode kernels' launch knobs (`hyquant_jax.decode_launch.DecodeTuning`, e.g. the Mosaic
    kernel's blocks per multiprocessor); None: their defaults. Ignored by the reference backend.
    chunk_impl: chunked prefill's attention over the staged prompt, as `models.BF16Attention.chunk_impl`.
    """

    config: HyQuantConfig = HyQuantConfig()
    backend: str = "auto"
    prefill_backend: str | None = None
    cache_dtype: Any = None
    decode_tuning: Any = None
    chunk_impl: str = "auto"

    def __post_init__(self):
        _check_backend("HybridAttention.backend", self.backend)
        if self.prefill_backend is not None:
            _check_backend("HybridAttention.prefill_backend", self.prefill_backend)
        check_tuning(self.decode_tuning, "HybridAttention.decode_tuning")
        check_chunk_impl("HybridAttention.chunk_impl", self.chunk_impl)

    def _dtype(self, x):
        return self.cache_dtype or x.dtype

    def prefill_state(self, config, batch, prompt_len, max_len, dtype, whole):
        return None if whole else _staging(config, self.config, batch, prompt_len, self.cache_dtype or dtype)

    def prefill(self, layer, q, k, v, state, ctx: PrefillContext):
        if ctx.whole:
            backend = self.prefill_backend or self.backend
            out, vl = prefill_attention(q, k, v, ctx.lengths, self.config, backend=backend)
            dt = self._dtype(k)
            cache = freeze(k.astype(dt), v.astype(dt), ctx.lengths, None, self.config, ctx.max_len, vl=vl,
                           min_length=ctx.min_length)
            return out, cache
        state = _stage_chunk(state, q, k, v, ctx)
        return _staged_attention(q, state, ctx, self.chunk_impl), state

    def finish_prefill(self, layer, state, ctx: PrefillContext):
        if isinstance(state, HybridKVCache):
            return state
        vl = vertical_token_identification(state.q_tail, state.k, ctx.lengths, self.config)
        return freeze(state.k, state.v, ctx.lengths, state.q_tail, self.config, ctx.max_len, vl=vl,
                      min_length=ctx.min_length)

    def decode(self, layer, q, k, v, cache: HybridKVCache, ctx: DecodeContext):
        dt = cache.dtype
        return decode_step(q, k.astype(dt), v.astype(dt), cache, self.config, backend=self.backend,
                           active=ctx.active, flush=not ctx.prepared, tuning=self.decode_tuning)

    def used_bytes(self, cache: HybridKVCache, lengths=None) -> np.ndarray:
        return cache.used_bytes(self.config)


@dataclasses.dataclass(frozen=True)
class QuantizedCacheAttention(RingFlushing):
    """Dequantize-then-attend baseline over a `HybridKVCache` with rho = 0 (see module docstring).

    config: bits, scheme, window and block of the quantized cache; rho must
    be 0. cache_dtype: dtype of the window and of the dequantized keys
    (None: k's dtype). name: label for reports. f32_probs: PV product in
    float32 (None: only off-GPU, as `BF16Attention.f32_probs`).
    """

    config: HyQuantConfig
    cache_dtype: Any = None
    name: str = "quantized"
    f32_probs: bool | None = None

    def __post_init__(self):
        if self.config.rho != 0:
            raise ValueError(f"QuantizedCacheAttention.config.rho must be 0 (no VL tokens), got {self.config.rho}")

    def prefill_state(self, config, batch, prompt_len, max_len, dtype, whole):
        return None if whole else _staging(config, self.config, batch, prompt_len, self.cache_dtype or dtype)

    def prefill(self, layer, q, k, v, state, ctx: PrefillContext):
        if ctx.whole:
            bf16 = BF16Attention(f32_probs=self.f32_probs)
            out = causal_attention(q, k, v, bf16._impl(), bf16._f32())
            dt = self.cache_dtype or k.dtype
            vl = empty_vl(k.shape[0], k.shape[1])
            cache = freeze(k.astype(dt), v.astype(dt), ctx.lengths, None, self.config, ctx.max_len, vl=vl,
                           min_length=ctx.min_length)
            return out, cache
        state = _stage_chunk(state, q, k, v, ctx)
        return _staged_attention(q, state, ctx), state

    def finish_prefill(self, layer, state, ctx: PrefillContext):
        if isinstance(state, HybridKVCache):
            return state
        vl = empty_vl(state.k.shape[0], state.k.shape[1])
        return freeze(state.k, state.v, ctx.lengths, None, self.config, ctx.max_len, vl=vl,
                      min_length=ctx.min_length)

    def decode(self, layer, q, k, v, cache: HybridKVCache, ctx: DecodeContext):
        cache = self.append_step(cache, k, v, ctx)
        f32 = BF16Attention(f32_probs=self.f32_probs)._f32()
        return dequantized_attention(q, cache, self.config, f32_probs=f32), cache

    def used_bytes(self, cache: HybridKVCache, lengths=None) -> np.ndarray:
        return cache.used_bytes(self.config)


def dequantized_attention(q: jax.Array, cache: HybridKVCache, config: HyQuantConfig,
                          f32_probs: bool = False) -> jax.Array:
    """Decode attention that first dequantizes the low-bit region to the cache dtype.

    q: [B, Hq, D]. Logits of the low-bit, VL and window regions are computed
    by separate einsums (no concatenated key copy) and share one softmax;
    probabilities are cast to the cache dtype for PV unless f32_probs.
    Returns [B, Hq, D] in q.dtype.
    """
    b, hq, d = q.shape
    h = cache.num_kv_heads
    dt = cache.dtype
    qg = q.reshape(b, h, hq // h, d).astype(dt)
    scale = 1.0 / math.sqrt(d)
    regions = (
        (dequantize_keys(cache, config).astype(dt), dequantize_values(cache, config).astype(dt),
         low_bit_valid(cache, config.block_size)),
        (cache.vl_k, cache.vl_v, vl_valid(cache)),
        (cache.ring_k, cache.ring_v, ring_valid(cache)),
    )
    logits = [jnp.where(m[:, None, None, :], jnp.einsum("bhgd,bhsd->bhgs", qg, kk,
                                                         preferred_element_type=jnp.float32) * scale, -jnp.inf)
              for kk, _, m in regions]
    peak = jnp.max(jnp.stack([jnp.max(x, axis=-1) for x in logits]), axis=0)[..., None]
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    probs = [jnp.exp(x - peak) for x in logits]
    denom = sum(p.sum(axis=-1, keepdims=True) for p in probs)
    pv_dtype = jnp.float32 if f32_probs else dt
    out = sum(jnp.einsum("bhgs,bhsd->bhgd", p.astype(pv_dtype), vv.astype(pv_dtype),
                         preferred_element_type=jnp.float32)
              for p, (_, vv, _) in zip(probs, regions))
    out = out / jnp.where(denom > 0, denom, 1.0)
    return out.reshape(b, hq, d).astype(q.dtype)


@partial(jax.tree_util.register_dataclass, data_fields=["k_codes", "k_scale", "v_codes", "v_scale"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class FP8KVBuffer:
    """FP8 KV cache of one layer, slot = position: codes float8_e4m3fn [B, Hkv, S, D] and one bf16 scale per
    token and head [B, Hkv, S, 1] (`quant.quantize_fp8_tokens`), S = `cache_slots(max_len)`."""

    k_codes: jax.Array = logical_axes(BATCH, KV_HEADS)
    k_scale: jax.Array = logical_axes(BATCH, KV_HEADS)
    v_codes: jax.Array = logical_axes(BATCH, KV_HEADS)
    v_scale: jax.Array = logical_axes(BATCH, KV_HEADS)

    def nbytes(self) -> int:
        return sum(x.nbytes for x in (self.k_codes, self.k_scale, self.v_codes, self.v_scale))


def fp8_buffer(kv: KVBuffer) -> FP8KVBuffer:
    """A full-precision `KVBuffer` quantized token by token to FP8 (every slot, padding included)."""
    return FP8KVBuffer(*quant.quantize_fp8_tokens(kv.k), *quant.quantize_fp8_tokens(kv.v))


@dataclasses.dataclass(frozen=True)
class FP8CacheAttention:
    """The FP8 KV cache most serving engines offer: keys and values in float8 e4m3 with a per-token scale.

    Prefill is exact (`BF16Attention` over a full-precision buffer, chunked or whole); `finish_prefill`
    quantizes the buffer (`fp8_buffer`). Each decode step quantizes its token into its slot, dequantizes the
    whole cache to `cache_dtype` with jnp and attends over it with XLA (a reference path, not a kernel).
    cache_dtype: dtype of the prefill buffer and of the dequantized keys (None: k's dtype). f32_probs: as
    `BF16Attention.f32_probs`.
    """

    cache_dtype: Any = None
    f32_probs: bool | None = None
    name: str = "fp8"

    def _exact(self) -> BF16Attention:
        return BF16Attention(cache_dtype=self.cache_dtype, f32_probs=self.f32_probs)

    def prefill_state(self, config, batch, prompt_len, max_len, dtype, whole):
        return self._exact().prefill_state(config, batch, prompt_len, max_len, dtype, whole)

    def prefill(self, layer, q, k, v, state: KVBuffer, ctx: PrefillContext):
        return self._exact().prefill(layer, q, k, v, state, ctx)

    def finish_prefill(self, layer, state: KVBuffer, ctx: PrefillContext) -> FP8KVBuffer:
        return fp8_buffer(state)

    def decode(self, layer, q, k, v, state: FP8KVBuffer, ctx: DecodeContext):
        s = state.k_codes.shape[2]
        pos = jnp.minimum(ctx.positions, s - 1)
        parts = (*quant.quantize_fp8_tokens(k), *quant.quantize_fp8_tokens(v))
        state = FP8KVBuffer(*(write_token(buf, x, pos) for buf, x in zip(jax.tree_util.tree_leaves(state), parts)))
        dt = self.cache_dtype or k.dtype
        keys = quant.dequantize_fp8_tokens(state.k_codes, state.k_scale, dt)
        values = quant.dequantize_fp8_tokens(state.v_codes, state.v_scale, dt)
        mask = (jnp.arange(s)[None, :] <= pos[:, None])[:, None, None, None, :]
        out = grouped_attention(q[:, :, None], keys, values, mask, f32_probs=self._exact()._f32())
        return out[:, :, 0], state

    def used_bytes(self, state: FP8KVBuffer, lengths) -> np.ndarray:
        """Codes and scales of `lengths` tokens, int64 [B]."""
        _, h, _, d = state.k_codes.shape
        per_token = 2 * h * (d * state.k_codes.dtype.itemsize + state.k_scale.dtype.itemsize)
        return np.asarray(lengths, np.int64) * per_token


# --------------------------------------------------------------------------- factories

ATTENTION_KINDS = ("bf16", "hyquant", "uniform2", "uniform4", "uniform8", "kivi2", "kivi4", "fp8")


def uniform_config(bits: int = 4) -> HyQuantConfig:
    """Every cached token per-token symmetric `bits`-bit (16-slot staging ring, no VL)."""
    return HyQuantConfig(key_bits=bits, value_bits=bits, scheme="token_sym", window=0, block_size=16,
                         rho=0.0, prefill_block=16)


def kivi_config(bits: int = 4, group: int = 32, residual: int = 128) -> HyQuantConfig:
    """KIVI-style: per-channel keys over `group` tokens, per-token values in `group` channels, bf16 residual."""
    return HyQuantConfig(key_bits=bits, value_bits=bits, scheme="channel_key", group_size=group,
                         window=residual, block_size=group, rho=0.0, prefill_block=group)


def uniform_attention(bits: int = 4, cache_dtype=None) -> QuantizedCacheAttention:
    return QuantizedCacheAttention(uniform_config(bits), cache_dtype, name=f"uniform{bits}")


def kivi_attention(bits: int = 4, cache_dtype=None) -> QuantizedCacheAttention:
    return QuantizedCacheAttention(kivi_config(bits), cache_dtype, name=f"kivi{bits}")


def make_attention(kind: str, config: HyQuantConfig | None = None, backend: str = "auto",
                   prefill_backend: str | None = None, cache_dtype=None, decode_tuning=None):
    """Attention implementation by name: one of ATTENTION_KINDS.

    config applies to "hyquant" only (default HyQuantConfig()); backend,
    prefill_backend and decode_tuning to "hyquant"'s kernels.
    """
    if kind == "bf16":
        return BF16Attention(cache_dtype=cache_dtype)
    if kind == "hyquant":
        return HybridAttention(config or HyQuantConfig(), backend, prefill_backend, cache_dtype, decode_tuning)
    if kind.startswith("uniform") and kind in ATTENTION_KINDS:
        return uniform_attention(int(kind[7:]), cache_dtype)
    if kind.startswith("kivi") and kind in ATTENTION_KINDS:
        return kivi_attention(int(kind[4:]), cache_dtype)
    if kind == "fp8":
        return FP8CacheAttention(cache_dtype)
    raise ValueError(f"attention kind must be one of {ATTENTION_KINDS}, got {kind!r}")
