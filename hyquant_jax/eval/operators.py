"""Attention operators on captured states: a method's decode attention against exact attention, and coverage.

* `capture_qkv`: per-layer q, k, v (after RoPE) of an exact forward pass of a real model.
* `decode_operator`: a method's decode attention (Freeze + append + attend) on captured states, with the
  layers as the batch, against exact float32 attention (`decode_operator_reference`); `relative_mse`.
* `column_mass`: per-head attention mass on each key column (coverage).

Shapes: B batch, Hq / Hkv query / KV heads, T tokens, D head_dim, L layers.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax.eval.causal_prefill import choose_vl, exact_causal_attention
from hyquant_jax.eval.shared_prefill import PromptKV, decode_state
from hyquant_jax.eval.sparse_attention import VerticalSparseAttention
from hyquant_jax.model_attention import HybridAttention, empty_vl
from hyquant_jax.reference import exact_attention
from models.attention import DecodeContext, PrefillContext
from models.transformer import ModelDef


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
    return empty_vl(k.shape[0], k.shape[1])


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
