"""Shared prefills: prefill a real model once per prefill flavor, then build several methods' decode states.

Everything in `hyquant_jax.eval` drives a `models.Decoder` with the model-facing attention implementations
(`BF16Attention`, `HybridAttention`, `QuantizedCacheAttention`, `VerticalSparseAttention`) so that an
evaluation measures exactly the code that generates text.

`SharedPrefill` prefills once per *prefill flavor*. Methods differ in prefill only through their attention
operator: "exact" (bf16 and the dequantize-then-attend baselines, whose prefill is exact), "hybrid"
(HyQuant's INT8-QK prefill with VL + window in full precision; bit widths do not change it) and "sparse"
(vertical-only). `decode_state` then runs each method's own Freeze on the shared prompt keys/values, as its
`prefill` would have.

The jitted functions take the model as `models.split_model(model)`: a static `ModelDef` and a dict of weights
(split once, call many times). Shapes: B batch, Hq / Hkv query / KV heads, T tokens, D head_dim.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from hyquant_jax.attention import prefill_attention
from hyquant_jax.cache import freeze
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.eval.causal_prefill import choose_vl, exact_causal_attention, hybrid_prefill
from hyquant_jax.eval.sparse_attention import VerticalSparseAttention, sparse_prefill_attention
from hyquant_jax.model_attention import (
    FP8CacheAttention,
    HybridAttention,
    QuantizedCacheAttention,
    empty_vl,
    fp8_buffer,
)
from models.attention import BATCH, KV_HEADS, BF16Attention, KVBuffer, PrefillContext, cache_slots, logical_axes
from models.transformer import ModelDef

FLAVORS = ("exact", "hybrid", "sparse")


@partial(jax.tree_util.register_dataclass, data_fields=["k", "v", "vl_idx", "vl_count"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class PromptKV:
    """One layer's prompt keys/values and the VL set its prefill chose.

    k, v: [B, Hkv, T, D] in the cache dtype (after RoPE); vl_idx: int32
    [B, Hkv, K] (K = 0 for the exact flavor); vl_count: int32 [B].
    """

    k: jax.Array = logical_axes(BATCH, KV_HEADS)
    v: jax.Array = logical_axes(BATCH, KV_HEADS)
    vl_idx: jax.Array = logical_axes(BATCH, KV_HEADS)
    vl_count: jax.Array = logical_axes(BATCH)


def _prefill_relevant(config: HyQuantConfig) -> HyQuantConfig:
    """The config with every field that does not change prefill reset to its default."""
    d = HyQuantConfig()
    return dataclasses.replace(config, key_bits=d.key_bits, value_bits=d.value_bits, scheme=d.scheme,
                               group_size=d.group_size, promote_flushed=d.promote_flushed)


@dataclasses.dataclass(frozen=True)
class SharedPrefill:
    """Prefill-only attention that keeps the prompt K/V so several methods can be frozen from it.

    flavor: "exact", "hybrid" (HyQuant's hybrid prefill, `prefill_attention`)
    or "sparse" (`sparse_prefill_attention`); config: HyQuant settings of the
    last two. With "exact", a config only picks the VL set (VTI from the tail
    queries) while attention stays exact: HyQuant's decode state as
    `HybridAttention` builds it after a chunked (exact) prefill; None keeps
    no VL set (bf16 and the baselines). backend: hybrid-prefill backend; "reference"
    runs `hybrid_prefill_causal` (the reference math without the causally
    dead keys), any other goes through `prefill_attention`.
    cache_dtype: dtype the prompt K/V are kept in (the methods' cache dtype).
    Whole-prompt prefill only. Per-layer state: `PromptKV`.
    """

    flavor: str = "exact"
    config: HyQuantConfig | None = None
    backend: str = "reference"
    cache_dtype: Any = None
    query_chunk: int = 512

    def __post_init__(self):
        if self.flavor not in FLAVORS:
            raise ValueError(f"SharedPrefill.flavor must be one of {FLAVORS}, got {self.flavor!r}")
        if self.config is None and self.flavor != "exact":
            raise ValueError(f"SharedPrefill.config must be a HyQuantConfig for flavor {self.flavor!r}")

    def prefill_state(self, config, batch, prompt_len, max_len, dtype, whole):
        if not whole:
            raise ValueError("SharedPrefill needs whole-prompt prefill")
        return None

    def prefill(self, layer, q, k, v, state, ctx: PrefillContext):
        if self.flavor == "exact":
            out = exact_causal_attention(q, k, v, self.query_chunk)
            vl = (empty_vl(k.shape[0], k.shape[1]) if self.config is None
                  else choose_vl(q, k, ctx.lengths, self.config))
        elif self.flavor == "hybrid" and self.backend == "reference":
            out, vl = hybrid_prefill(q, k, v, ctx.lengths, self.config, self.query_chunk)
        elif self.flavor == "hybrid":
            out, vl = prefill_attention(q, k, v, ctx.lengths, self.config, backend=self.backend)
        else:
            out, vl = sparse_prefill_attention(q, k, v, ctx.lengths, self.config, query_chunk=self.query_chunk)
        dt = self.cache_dtype or k.dtype
        return out, PromptKV(k.astype(dt), v.astype(dt), vl[0], vl[1])

    def finish_prefill(self, layer, state, ctx):
        return state

    def decode(self, layer, q, k, v, state, ctx):
        raise ValueError("SharedPrefill only prefills; build a method's decode state with decode_state()")


def prefill_flavor(attention, cache_dtype=None, backend: str = "reference", exact: bool = False) -> SharedPrefill:
    """The `SharedPrefill` whose prompt K/V give `attention` the same decode state as its own prefill.

    exact: for `HybridAttention`, an exact prefill that still picks the VL set
    (what its chunked prefill does for prompts longer than one chunk).
    """
    if isinstance(attention, (BF16Attention, QuantizedCacheAttention, FP8CacheAttention)):
        return SharedPrefill("exact", None, backend, cache_dtype)
    if isinstance(attention, HybridAttention):
        return SharedPrefill("exact" if exact else "hybrid", _prefill_relevant(attention.config), backend,
                             cache_dtype)
    if isinstance(attention, VerticalSparseAttention):
        return SharedPrefill("sparse", _prefill_relevant(attention.config), backend, cache_dtype)
    raise ValueError(f"no prefill flavor for attention {type(attention).__name__}")


@partial(jax.jit, static_argnames=("model_def", "prefill"))
def run_prefill(model_def: ModelDef, weights, tokens: jax.Array, lengths: jax.Array, *, prefill: SharedPrefill):
    """Whole-prompt prefill: tokens int32 [B, T] right-padded, lengths int32 [B].

    Returns (logits float32 [B, V] at each prompt's last token, tuple of one `PromptKV` per layer).
    """
    model = model_def.merge(weights)
    b, t = tokens.shape
    ctx = PrefillContext(jnp.int32(0), lengths, t, whole=True)
    return model(tokens, ctx, (None,) * model.config.num_layers, attention=prefill, output_index=lengths - 1)


def decode_state(attention, kv: PromptKV, lengths: jax.Array, max_len: int):
    """One layer's decode state of `attention` built from shared prompt K/V (as its own prefill would).

    lengths: int32 [B] prompt lengths; max_len: capacity in tokens per
    sequence (>= the padded prompt length). bf16: a KVBuffer; fp8: an FP8KVBuffer; quantized
    baselines: Freeze with no VL; HyQuant and vertical-only sparse: Freeze
    with the VL set of the matching prefill flavor.
    """
    b, h, t, d = kv.k.shape
    if max_len < t:
        raise ValueError(f"max_len={max_len} must be >= the padded prompt length {t}")
    if isinstance(attention, (BF16Attention, FP8CacheAttention)):
        dt = attention.cache_dtype or kv.k.dtype
        pad = ((0, 0), (0, 0), (0, cache_slots(max_len) - t), (0, 0))
        buffer = KVBuffer(jnp.pad(kv.k.astype(dt), pad), jnp.pad(kv.v.astype(dt), pad))
        return buffer if isinstance(attention, BF16Attention) else fp8_buffer(buffer)
    if isinstance(attention, QuantizedCacheAttention):
        return freeze(kv.k, kv.v, lengths, None, attention.config, max_len, vl=empty_vl(b, h))
    if isinstance(attention, (HybridAttention, VerticalSparseAttention)):
        return freeze(kv.k, kv.v, lengths, None, attention.config, max_len, vl=(kv.vl_idx, kv.vl_count))
    raise ValueError(f"decode_state: unsupported attention {type(attention).__name__}")


def decode_states(attention, kvs: tuple, lengths, max_len: int) -> tuple:
    """`decode_state` for every layer."""
    return tuple(decode_state(attention, kv, lengths, max_len) for kv in kvs)


