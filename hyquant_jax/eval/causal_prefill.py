"""Reference-path causal prefills whose query chunks read only the keys they can see.

The accuracy benchmark prefills long prompts through the float32 reference math; a chunk of C queries ending
at position e needs keys [0, e) only, which halves the work of a full-key pass (`map_causal_chunks`). Here:
exact attention, HyQuant's hybrid prefill (`hybrid_prefill_causal`, `hybrid_prefill`) and the shared frame of
such prefills (`grouped_causal_prefill`), which `hyquant_jax.eval.sparse_attention` uses too.

Shapes: B batch, Hq / Hkv query / KV heads, T tokens, D head_dim.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from hyquant_jax.config import HyQuantConfig
from hyquant_jax.reference import check_prefill_shapes, prefill_chunk, prefill_key_mean, vl_mask
from hyquant_jax.vti import tail_queries, tail_query_count, vertical_token_identification
from models.attention import grouped_attention


def map_causal_chunks(attend, q: jax.Array, t: int, chunk: int) -> jax.Array:
    """Causal attention of q [..., T, D] in query chunks of `chunk` rows.

    attend(q_chunk [..., C, D], positions int32 [C], key_len: int) returns
    the chunk's output [..., C, D] from keys [0, key_len), key_len the
    chunk's end. Positions past T (the last chunk's padding) see every key
    and are dropped. Returns [..., T, D].

    The chunks run one after the other (an optimization barrier ties each
    chunk's query to the previous output), so XLA keeps one chunk's logits
    alive instead of scheduling chunks side by side: for 5 prompts of 8K
    tokens through SmolLM2 the temporary memory of the hybrid prefill falls
    from 18.3 GiB to 2.4 GiB (archive:benchmarks/reference_prefill_cost.py).
    """
    chunk = min(chunk, t)
    n = -(-t // chunk)
    qp = jnp.pad(q, [(0, 0)] * (q.ndim - 2) + [(0, n * chunk - t), (0, 0)])
    outs = []
    for c in range(n):
        qc = qp[..., c * chunk:(c + 1) * chunk, :]
        if outs:  # chunk c starts after chunk c - 1 is done: one chunk's temporaries live at a time
            qc, outs[-1] = jax.lax.optimization_barrier((qc, outs[-1]))
        outs.append(attend(qc, c * chunk + jnp.arange(chunk), min((c + 1) * chunk, t)))
    return jnp.concatenate(outs, axis=-2)[..., :t, :]


def grouped_causal_prefill(attend, q, k, v, lengths, query_chunk: int):
    """The float32 frame of a reference prefill over right-padded prompts, in causal query chunks.

    q [B, Hq, T, D]; k, v [B, Hkv, T, D]; lengths int32 [B]. attend(qc, q_pos, key_len, k32, v32, key_ok)
    gets a chunk of float32 queries grouped by KV head qc [B, Hkv, Hq/Hkv, C, D], their positions int32 [C],
    the chunk's key count, the float32 keys and values [B, Hkv, T, D] and the valid keys bool [B, T], and
    returns the chunk's output [B, Hkv, Hq/Hkv, C, D]. Rows of padded queries are zero. Returns
    [B, Hq, T, D] in q.dtype.
    """
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    qg = q.astype(jnp.float32).reshape(b, hkv, hq // hkv, t, d)
    k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)
    key_ok = jnp.arange(t)[None, :] < lengths[:, None]  # [B, S]
    out = map_causal_chunks(lambda qc, pos, key_len: attend(qc, pos, key_len, k32, v32, key_ok), qg, t,
                            query_chunk).reshape(b, hq, t, d)
    q_ok = jnp.arange(t)[None, None, :, None] < lengths[:, None, None, None]
    return jnp.where(q_ok, out, 0.0).astype(q.dtype)


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
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    key_mean = prefill_key_mean(k.astype(jnp.float32), lengths)

    def attend(qc, pos, key_len, k32, v32, key_ok):
        return prefill_chunk(qc, pos, k32[:, :, :key_len], v32[:, :, :key_len], key_ok[:, :key_len], key_mean,
                             is_vl[:, :, :key_len], window=window, block=block, qk_format=qk_format, hybrid=True,
                             scale=scale)

    return grouped_causal_prefill(attend, q, k, v, lengths, query_chunk)


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


def choose_vl(q, k, lengths, config: HyQuantConfig, scale: float | None = None):
    """The VL set HyQuant picks for a prompt: VTI over k [B, Hkv, T, D] from the tail of q [B, Hq, T, D].

    Returns (vl_idx int32 [B, Hkv, K], vl_count int32 [B]) as `vertical_token_identification`.
    """
    q_tail = tail_queries(q, lengths, tail_query_count(config))
    return vertical_token_identification(q_tail, k, lengths, config, scale=scale)


def hybrid_prefill(q, k, v, lengths, config: HyQuantConfig, query_chunk: int = 512):
    """VTI from the tail queries, then `hybrid_prefill_causal` (as `prefill_attention` with backend "reference").

    Returns (out [B, Hq, T, D], (vl_idx, vl_count)).
    """
    vl = choose_vl(q, k, lengths, config)
    return hybrid_prefill_causal(q, k, v, lengths, *vl, config, query_chunk=query_chunk), vl
