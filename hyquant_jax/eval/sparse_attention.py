"""Vertical-only sparse attention: the MInference-style ablation of the paper's Table 12.

It keeps exactly the keys HyQuant keeps in full precision, the vertical-line
(VL) tokens and the local window, and *drops* every other key instead of
storing it in low precision. Comparing it with HyQuant measures what the
quantized long tail is worth (paper Appendix B.6).

* Prefill: query i of block c = i // prefill_block sees key j <= i iff j is
  in the block's full-precision band (j >= c * prefill_block - window, the
  same band as hybrid prefill) or j is a VL token; everything else is masked.
* Decode: the cache is HyQuant's `HybridKVCache` (same Freeze, same sliding
  window, same VL promotion of flushed tokens), but attention reads only the
  VL region and the window ring; the low-bit pages are never read (they are
  still written, so this class measures accuracy, not memory).

Reference (pure jnp, float32) only: this is an accuracy ablation, not a kernel.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax.cache import HybridKVCache, accumulate_ring_scores, freeze
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.eval.causal_prefill import choose_vl, grouped_causal_prefill
from hyquant_jax.model_attention import RingFlushing
from hyquant_jax.reference import check_prefill_shapes, hybrid_decode_attention_reference, softmax_attend, vl_mask
from models.attention import DecodeContext, PrefillContext


@partial(jax.jit, static_argnames=("window", "block", "scale", "query_chunk"))
def _sparse_prefill(q, k, v, lengths, is_vl, *, window, block, scale, query_chunk):
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale

    def attend(qc, q_pos, key_len, k32, v32, key_ok):
        key_pos = jnp.arange(key_len)
        causal = key_pos[None, :] <= q_pos[:, None]  # [C, S]
        band = key_pos[None, :] >= ((q_pos // block) * block - window)[:, None]
        keep = (causal[None, None, None] & (band[None, None, None] | is_vl[:, :, None, None, :key_len])
                & key_ok[:, None, None, None, :key_len])
        logits = jnp.einsum("bhgtd,bhsd->bhgts", qc, k32[:, :, :key_len]) * scale
        return softmax_attend(logits, keep, v32[:, :, :key_len])[0]

    return grouped_causal_prefill(attend, q, k, v, lengths, query_chunk)


def vertical_sparse_prefill_reference(q, k, v, lengths, vl_idx, vl_count, config: HyQuantConfig,
                                      scale: float | None = None, query_chunk: int = 512):
    """Causal prefill attention over the VL tokens and each query block's band only.

    q: [B, Hq, T, D]; k, v: [B, Hkv, T, D] (left-aligned, ragged int32
    `lengths` [B]); vl_idx int32 [B, Hkv, K], vl_count int32 [B] from
    `vertical_token_identification`. Query i in block c = i // prefill_block
    sees keys j <= i with j >= c * prefill_block - window or j a VL token;
    all other keys are dropped. Math in float32; rows of padded queries are
    zero. Returns [B, Hq, T, D] in q.dtype.
    """
    check_prefill_shapes(q, k, v, lengths)
    is_vl = vl_mask(vl_idx, vl_count, k.shape[2])
    return _sparse_prefill(q, k, v, lengths, is_vl, window=config.window, block=config.prefill_block,
                           scale=scale, query_chunk=query_chunk)


def vertical_sparse_decode_reference(q, cache: HybridKVCache, config: HyQuantConfig, scale: float | None = None):
    """Decode attention of q [B, Hq, D] over the cache's VL tokens and window ring only.

    The low-bit region is masked out (as if it held no pages). Returns
    (out [B, Hq, D] in q.dtype, lse float32 [B, Hq] of the attended logits).
    """
    no_pages = dataclasses.replace(cache, num_pages=jnp.zeros_like(cache.num_pages))
    return hybrid_decode_attention_reference(q, no_pages, config, scale=scale)


def sparse_prefill_attention(q, k, v, lengths, config: HyQuantConfig, scale: float | None = None,
                             query_chunk: int = 512):
    """VTI from the prompt's tail queries, then vertical-only sparse prefill.

    Same shapes as `hyquant_jax.prefill_attention`; returns (out, (vl_idx, vl_count)).
    """
    vl = choose_vl(q, k, lengths, config, scale=scale)
    return vertical_sparse_prefill_reference(q, k, v, lengths, *vl, config, scale=scale, query_chunk=query_chunk), vl


@dataclasses.dataclass(frozen=True)
class VerticalSparseAttention(RingFlushing):
    """Vertical-only sparse attention for a `models.Decoder` (see module docstring).

    config: window, rho, block_size and VL promotion as in HyQuant (the bit
    widths only size the never-read low-bit pages). cache_dtype: dtype of the
    kept tokens (None: k's dtype). Prefill must be whole-prompt (the VL set
    needs all prompt keys before any query is answered).
    """

    config: HyQuantConfig = HyQuantConfig()
    cache_dtype: Any = None
    name: str = "sparse_vl"

    def prefill_state(self, config, batch, prompt_len, max_len, dtype, whole):
        if not whole:
            raise ValueError("VerticalSparseAttention needs whole-prompt prefill: set prefill_chunk >= the padded "
                             f"prompt length ({prompt_len})")
        return None

    def prefill(self, layer, q, k, v, state, ctx: PrefillContext):
        out, vl = sparse_prefill_attention(q, k, v, ctx.lengths, self.config)
        dt = self.cache_dtype or k.dtype
        return out, freeze(k.astype(dt), v.astype(dt), ctx.lengths, None, self.config, ctx.max_len, vl=vl,
                           min_length=ctx.min_length)

    def finish_prefill(self, layer, state, ctx: PrefillContext):
        return state

    def decode(self, layer, q, k, v, cache: HybridKVCache, ctx: DecodeContext):
        cache = self.append_step(cache, k, v, ctx)
        out, lse = vertical_sparse_decode_reference(q, cache, self.config)
        return out, accumulate_ring_scores(cache, q, lse, self.config)

    def used_bytes(self, cache: HybridKVCache, lengths=None) -> np.ndarray:
        """Bytes of the kept tokens only (VL + window ring), int64 [B]."""
        h, d = cache.num_kv_heads, cache.head_dim
        elem = jnp.dtype(cache.dtype).itemsize
        kept = np.asarray(cache.num_vl).astype(np.int64) + cache.ring_k.shape[2]
        return h * kept * 2 * d * elem
