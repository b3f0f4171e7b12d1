"""Accuracy-evaluation helpers on a real model: shared prefills, teacher forcing, captured states.

Everything here drives a `models.Decoder` with the model-facing attention
implementations (`BF16Attention`, `HybridAttention`, `QuantizedCacheAttention`,
`VerticalSparseAttention`) so that an evaluation measures exactly the code
that generates text. It adds what an accuracy benchmark needs on top:

* `SharedPrefill`: prefill once per *prefill flavor* and build the decode
  state of several methods from it. Methods differ in prefill only through
  their attention operator: "exact" (bf16 and the dequantize-then-attend
  baselines, whose prefill is exact), "hybrid" (HyQuant's INT8-QK prefill
  with VL + window in full precision; bit widths do not change it) and
  "sparse" (vertical-only). `decode_state` then runs each method's own
  Freeze on the shared prompt keys/values, as its `prefill` would have.
* `teacher_forced_nll`: a jitted `lax.scan` that feeds given tokens one at a
  time through a method's decode path and returns the next-token NLL.
* `capture_qkv`: per-layer q, k, v (after RoPE) of an exact forward pass.

The jitted functions take the model as `models.split_model(model)`: a static
`ModelDef` and a dict of weights (split once, call many times).
* `decode_operator`: a method's decode attention (Freeze + append + attend)
  on captured states, with the layers as the batch, against exact float32
  attention (`decode_operator_reference`).
* `column_mass`: per-head attention mass on each key column (coverage).

Shapes: B batch, Hq / Hkv query / KV heads, T tokens, D head_dim, L layers.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax.attention import prefill_attention
from hyquant_jax.cache import freeze
from hyquant_jax.causal_chunks import map_causal_chunks
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.model_attention import HybridAttention, QuantizedCacheAttention
from hyquant_jax.reference import check_prefill_shapes, exact_attention, prefill_chunk, prefill_key_mean, vl_mask
from hyquant_jax.sparse_attention import VerticalSparseAttention, sparse_prefill_attention
from hyquant_jax.vti import tail_queries, tail_query_count, vertical_token_identification
from models.attention import BF16Attention, DecodeContext, KVBuffer, PrefillContext, cache_slots, grouped_attention
from models.transformer import ModelDef

FLAVORS = ("exact", "hybrid", "sparse")


@partial(jax.tree_util.register_dataclass, data_fields=["k", "v", "vl_idx", "vl_count"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class PromptKV:
    """One layer's prompt keys/values and the VL set its prefill chose.

    k, v: [B, Hkv, T, D] in the cache dtype (after RoPE); vl_idx: int32
    [B, Hkv, K] (K = 0 for the exact flavor); vl_count: int32 [B].
    """

    k: jax.Array
    v: jax.Array
    vl_idx: jax.Array
    vl_count: jax.Array


def exact_causal_attention(q, k, v, chunk: int = 512):
    """Exact causal attention, query chunks reading only the keys they can see (`map_causal_chunks`).

    q: [B, Hq, T, D]; k, v: [B, Hkv, T, D]. Same numerics as
    `BF16Attention`'s off-GPU prefill (float32 logits and probabilities) at
    about half its work. Returns [B, Hq, T, D] in q.dtype.
    """
    def attend(qc, pos, key_len):
        mask = (jnp.arange(key_len)[None, :] <= pos[:, None])[None, None, None]
        return grouped_attention(qc, k[:, :, :key_len], v[:, :, :key_len], mask, f32_probs=True)

    return map_causal_chunks(attend, q, q.shape[2], chunk)


@partial(jax.jit, static_argnames=("window", "block", "qk_format", "scale", "query_chunk"))
def _hybrid_prefill_causal(q, k, v, lengths, is_vl, *, window, block, qk_format, scale, query_chunk):
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qg = q.astype(jnp.float32).reshape(b, hkv, hq // hkv, t, d)
    k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)
    key_ok = jnp.arange(t)[None, :] < lengths[:, None]  # [B, S]
    key_mean = prefill_key_mean(k32, lengths)

    def attend(qc, pos, key_len):
        return prefill_chunk(qc, pos, k32[:, :, :key_len], v32[:, :, :key_len], key_ok[:, :key_len], key_mean,
                             is_vl[:, :, :key_len], window=window, block=block, qk_format=qk_format, hybrid=True,
                             scale=scale)

    out = map_causal_chunks(attend, qg, t, query_chunk).reshape(b, hq, t, d)
    q_ok = jnp.arange(t)[None, None, :, None] < lengths[:, None, None, None]
    return jnp.where(q_ok, out, 0.0).astype(q.dtype)


def hybrid_prefill_causal(q, k, v, lengths, vl_idx, vl_count, config: HyQuantConfig, scale: float | None = None,
                          query_chunk: int = 512):
    """`hybrid_prefill_attention_reference` with the causally dead keys skipped.

    Same arguments, math and result (up to float summation order) as the
    reference: per-token INT8/FP8 Q and mean-smoothed K are quantized
    independently of which keys a chunk reads, so a query chunk computing
    logits only over the keys it can see (`map_causal_chunks`) changes
    nothing but halves the work.
    Returns [B, Hq, T, D] in q.dtype.
    """
    check_prefill_shapes(q, k, v, lengths)
    is_vl = vl_mask(vl_idx, vl_count, k.shape[2])
    return _hybrid_prefill_causal(q, k, v, lengths, is_vl, window=config.window, block=config.prefill_block,
                                  qk_format=config.prefill_qk, scale=scale, query_chunk=query_chunk)


def choose_vl(q, k, lengths, config: HyQuantConfig):
    """The VL set HyQuant picks for a prompt: VTI over k [B, Hkv, T, D] from the tail of q [B, Hq, T, D].

    Returns (vl_idx int32 [B, Hkv, K], vl_count int32 [B]) as `vertical_token_identification`.
    """
    return vertical_token_identification(tail_queries(q, lengths, tail_query_count(config)), k, lengths, config)


def hybrid_prefill(q, k, v, lengths, config: HyQuantConfig, query_chunk: int = 512):
    """VTI from the tail queries, then `hybrid_prefill_causal` (as `prefill_attention` with backend "reference").

    Returns (out [B, Hq, T, D], (vl_idx, vl_count)).
    """
    vl = choose_vl(q, k, lengths, config)
    return hybrid_prefill_causal(q, k, v, lengths, *vl, config, query_chunk=query_chunk), vl


def _empty_vl(batch: int, heads: int):
    return jnp.zeros((batch, heads, 0), jnp.int32), jnp.zeros((batch,), jnp.int32)


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
            vl = (_empty_vl(k.shape[0], k.shape[1]) if self.config is None
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
    if isinstance(attention, (BF16Attention, QuantizedCacheAttention)):
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
    sequence (>= the padded prompt length). bf16: a KVBuffer; quantized
    baselines: Freeze with no VL; HyQuant and vertical-only sparse: Freeze
    with the VL set of the matching prefill flavor.
    """
    b, h, t, d = kv.k.shape
    if max_len < t:
        raise ValueError(f"max_len={max_len} must be >= the padded prompt length {t}")
    if isinstance(attention, BF16Attention):
        dt = attention.cache_dtype or kv.k.dtype
        pad = ((0, 0), (0, 0), (0, cache_slots(max_len) - t), (0, 0))
        return KVBuffer(jnp.pad(kv.k.astype(dt), pad), jnp.pad(kv.v.astype(dt), pad))
    if isinstance(attention, QuantizedCacheAttention):
        return freeze(kv.k, kv.v, lengths, None, attention.config, max_len, vl=_empty_vl(b, h))
    if isinstance(attention, (HybridAttention, VerticalSparseAttention)):
        return freeze(kv.k, kv.v, lengths, None, attention.config, max_len, vl=(kv.vl_idx, kv.vl_count))
    raise ValueError(f"decode_state: unsupported attention {type(attention).__name__}")


def decode_states(attention, kvs: tuple, lengths, max_len: int) -> tuple:
    """`decode_state` for every layer."""
    return tuple(decode_state(attention, kv, lengths, max_len) for kv in kvs)


@partial(jax.jit, static_argnames=("model_def", "attention"), donate_argnames=("states",))
def teacher_forced_nll(model_def: ModelDef, weights, states: tuple, tokens: jax.Array, positions: jax.Array, *,
                       attention):
    """Feed tokens[:, i] through the decode path and score tokens[:, i + 1].

    tokens: int32 [B, N + 1]; positions: int32 [B] position of tokens[:, 0]
    (= tokens already cached). Returns (nll float32 [B, N] of tokens[:, 1:],
    argmax int32 [B, N] the model's top-1 prediction at each step, final states).
    """
    model = model_def.merge(weights)
    b, n1 = tokens.shape
    active = jnp.ones((b,), bool)

    def step(states, i):
        ctx = DecodeContext(positions + i, active)
        tok = jax.lax.dynamic_slice_in_dim(tokens, i, 1, axis=1)
        target = jax.lax.dynamic_slice_in_dim(tokens, i + 1, 1, axis=1)[:, 0]
        logits, states = model(tok, ctx, states, attention=attention)
        logp = jax.nn.log_softmax(logits[:, 0], axis=-1)
        nll = -jnp.take_along_axis(logp, target[:, None], axis=1)[:, 0]
        return states, (nll, jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32))

    states, (nll, top1) = jax.lax.scan(step, states, jnp.arange(n1 - 1))
    return nll.T, top1.T, states


# --------------------------------------------------------------------------- captured states


@dataclasses.dataclass(frozen=True)
class CaptureAttention:
    """Exact causal prefill whose per-layer state is the layer's (q, k, v) in float32 (whole prompts only)."""

    query_chunk: int = 512

    def prefill_state(self, config, batch, prompt_len, max_len, dtype, whole):
        if not whole:
            raise ValueError("CaptureAttention needs whole-prompt prefill")
        return None

    def prefill(self, layer, q, k, v, state, ctx):
        out = exact_causal_attention(q, k, v, self.query_chunk)
        return out, (q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32))

    def finish_prefill(self, layer, state, ctx):
        return state

    def decode(self, layer, q, k, v, state, ctx):
        raise ValueError("CaptureAttention only prefills")


@partial(jax.jit, static_argnames=("model_def",))
def capture_qkv(model_def: ModelDef, weights, tokens: jax.Array):
    """Per-layer q [B, Hq, T, D], k, v [B, Hkv, T, D] (float32, after RoPE) of an exact forward pass.

    tokens: int32 [B, T] (no padding). Returns a tuple of L (q, k, v) triples.
    """
    model = model_def.merge(weights)
    b, t = tokens.shape
    ctx = PrefillContext(jnp.int32(0), jnp.full((b,), t, jnp.int32), t, whole=True)
    _, states = model(tokens, ctx, (None,) * model.config.num_layers, attention=CaptureAttention(),
                      output_index=jnp.full((b,), t - 1, jnp.int32))
    return states


def _vl_for(attention, q, k, lengths):
    """VL set the method's prefill would choose for prompt q [B, Hq, P, D], k [B, Hkv, P, D]."""
    if isinstance(attention, (HybridAttention, VerticalSparseAttention)):
        return choose_vl(q, k, lengths, attention.config)
    return _empty_vl(k.shape[0], k.shape[1])


@partial(jax.jit, static_argnames=("attention", "prompt_len"))
def decode_operator(attention, q, k, v, prompt_len: int):
    """A method's decode attention on captured states: Freeze the prompt, then append and attend per token.

    q: [B, Hq, T, D], k, v: [B, Hkv, T, D] float32 (e.g. the layers of a
    captured forward as the batch). Tokens [0, prompt_len) are frozen into
    the method's decode state exactly as its prefill would (VL from the
    prompt's tail queries), then tokens prompt_len..T-1 are decoded one at a
    time (`attention.decode`: append, the window slides, attend).
    Returns the decode outputs float32 [B, Hq, T - prompt_len, D].
    """
    b, _, t, _ = q.shape
    p = prompt_len
    lengths = jnp.full((b,), p, jnp.int32)
    vl = _vl_for(attention, q[:, :, :p], k[:, :, :p], lengths)
    dt = getattr(attention, "cache_dtype", None) or k.dtype
    kv = PromptKV(k[:, :, :p].astype(dt), v[:, :, :p].astype(dt), vl[0], vl[1])
    state = decode_state(attention, kv, lengths, t)
    active = jnp.ones((b,), bool)

    def step(state, i):
        qi, ki, vi = (jax.lax.dynamic_index_in_dim(x, p + i, axis=2, keepdims=False) for x in (q, k, v))
        out, state = attention.decode(0, qi, ki, vi, state, DecodeContext(lengths + i, active))
        return state, out.astype(jnp.float32)

    _, outs = jax.lax.scan(step, state, jnp.arange(t - p))  # [n, B, Hq, D]
    return outs.transpose(1, 2, 0, 3)


@partial(jax.jit, static_argnames=("prompt_len",))
def decode_operator_reference(q, k, v, prompt_len: int):
    """Exact float32 attention of queries prompt_len..T-1 over their causal prefixes: [B, Hq, T - prompt_len, D]."""
    b, _, t, _ = q.shape
    pos = jnp.broadcast_to(jnp.arange(prompt_len, t, dtype=jnp.int32), (b, t - prompt_len))
    out, _ = exact_attention(q[:, :, prompt_len:], k, v, jnp.full((b,), t, jnp.int32), q_positions=pos)
    return out.astype(jnp.float32)


def relative_mse(out: jax.Array, ref: jax.Array) -> np.ndarray:
    """Per (batch, head) relative MSE: sum((out - ref)^2) / sum(ref^2) over tokens and dims.

    out, ref: [B, H, N, D]. Returns float64 numpy [B, H].
    """
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return ((out - ref) ** 2).sum(axis=(2, 3)) / np.maximum((ref ** 2).sum(axis=(2, 3)), 1e-30)


# --------------------------------------------------------------------------- coverage


@partial(jax.jit, static_argnames=("window", "chunk"))
def column_mass(q: jax.Array, k: jax.Array, window: int, chunk: int = 512):
    """Causal softmax attention mass per key column, in total and from the local window.

    q: [Hq, T, D], k: [Hkv, T, D] one layer (float32, T a multiple of chunk).
    Returns (col float32 [Hq, T]: sum over queries i >= j of p(i, j);
    win float32 [Hq, T]: the same restricted to queries i < j + window, i.e.
    mass that key j gets while it is inside a query's local window of
    `window` keys ending at the query). Each query row sums to 1.
    """
    hq, t, d = q.shape
    hkv = k.shape[0]
    if t % chunk:
        raise ValueError(f"column_mass: T={t} must be a multiple of chunk={chunk}")
    qg = q.reshape(hkv, hq // hkv, t // chunk, chunk, d)
    key_pos = jnp.arange(t)
    scale = 1.0 / math.sqrt(d)

    def body(c, acc):
        col, win = acc
        qc = jax.lax.dynamic_index_in_dim(qg, c, axis=2, keepdims=False)  # [Hkv, g, C, D]
        q_pos = c * chunk + jnp.arange(chunk)
        logits = jnp.einsum("hgcd,hsd->hgcs", qc, k) * scale
        causal = key_pos[None, :] <= q_pos[:, None]
        p = jax.nn.softmax(jnp.where(causal, logits, -jnp.inf), axis=-1)
        near = causal & (key_pos[None, :] > q_pos[:, None] - window)
        col = col + p.sum(axis=2).reshape(hq, t)
        win = win + jnp.where(near, p, 0.0).sum(axis=2).reshape(hq, t)
        return col, win

    zeros = jnp.zeros((hq, t), jnp.float32)
    return jax.lax.fori_loop(0, t // chunk, body, (zeros, zeros))
