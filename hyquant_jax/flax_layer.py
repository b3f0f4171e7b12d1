"""HyQuant attention as a Flax NNX layer, for a user's own Flax decoder.

    attn = hq.HyQuantAttention(hq.HyQuantConfig())
    out, prompt = attn(q, k, v, mode="prefill", lengths=lengths)   # whole prompts: VTI, INT8 Q.K off the VL set
    cache = attn.freeze(prompt, max_len=1024)                       # Freeze: VL set, low-bit pages, window
    out1, cache = attn(q1, k1, v1, mode="decode", cache=cache)      # one token per sequence, cache in and out

Why q/k/v and not the hidden state: the projections, their biases, q/k norms and the position encoding (RoPE and
its scalings) belong to the user's model and differ between model families; the hybrid cache needs only the
keys and values after them. So the layer owns no weights, and drops in where a block calls
`nnx.dot_product_attention`, in the same [batch, length, heads, head_dim] layout (XLA folds the transposes to
the library's heads-first layout into the neighbouring projections).

Why the cache is an explicit argument and not a Flax variable collection: a `HybridKVCache` is an immutable
pytree with static capacities that Freeze rebuilds from the prompt and that a jitted decode step takes donated
and updates in place (its buffers are reused by XLA); a mutable `nnx.Cache` variable would hide it in the
module's state, so every split / merge and every jit boundary would carry it with the weights. Here the cache is
passed in and returned, as `(out, cache)`.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hyquant_jax.attention import check_tuning, decode_step, prefill_attention
from hyquant_jax.backends import BACKENDS
from hyquant_jax.cache import HybridKVCache, freeze
from hyquant_jax.config import HyQuantConfig
from models.attention import BATCH, KV_HEADS, logical_axes

MODES = ("prefill", "decode")


@partial(jax.tree_util.register_dataclass, data_fields=["k", "v", "lengths", "vl_idx", "vl_count"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class PromptCache:
    """What Freeze needs from a prefill: the prompt's keys and values and the VL set its attention picked.

    k, v: [B, Hkv, T, D] in the cache dtype (heads first, as `freeze` takes them); lengths: int32 [B] prompt
    lengths (positions >= lengths[b] are padding); vl_idx: int32 [B, Hkv, K] prompt positions of the VL
    tokens; vl_count: int32 [B] valid entries of vl_idx per sequence.
    """

    k: jax.Array = logical_axes(BATCH, KV_HEADS)
    v: jax.Array = logical_axes(BATCH, KV_HEADS)
    lengths: jax.Array = logical_axes(BATCH)
    vl_idx: jax.Array = logical_axes(BATCH, KV_HEADS)
    vl_count: jax.Array = logical_axes(BATCH)


class HyQuantAttention(nnx.Module):
    """Causal self-attention over a HyQuant hybrid KV cache (see the module docstring).

    config: the hybrid cache (bits, scheme, rho, window, page size). backend: "auto" (the Pallas kernels on a
    GPU, the jnp reference elsewhere), "reference", "triton", "mosaic" or "interpret". cache_dtype: dtype of the
    full-precision regions (VL tokens, window). decode_tuning: the decode kernels' launch knobs
    (`hyquant_jax.decode_launch.DecodeTuning`, None: defaults).

    Shapes: B sequences, T tokens, Hq query heads, Hkv KV heads (Hq a multiple of Hkv: GQA), D head_dim.
    """

    def __init__(self, config: HyQuantConfig = HyQuantConfig(), *, backend: str = "auto",
                 cache_dtype: Any = jnp.bfloat16, decode_tuning=None):
        if not isinstance(config, HyQuantConfig):
            raise ValueError(f"config must be a hyquant_jax.HyQuantConfig, got {type(config).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.config = config
        self.backend = backend
        self.cache_dtype = jnp.dtype(cache_dtype)
        self.decode_tuning = check_tuning(decode_tuning, "decode_tuning")

    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array, *, mode: str, lengths: jax.Array | None = None,
                 cache: HybridKVCache | None = None, active: jax.Array | None = None):
        """mode "prefill" (`prefill`, needs lengths) or "decode" (`decode`, needs cache)."""
        if mode == "prefill":
            if lengths is None or cache is not None:
                raise ValueError("mode='prefill' takes lengths (int32 [B] prompt lengths) and no cache")
            return self.prefill(q, k, v, lengths)
        if mode == "decode":
            if cache is None or lengths is not None:
                raise ValueError("mode='decode' takes cache (the HybridKVCache of freeze or of the previous step) "
                                 "and no lengths")
            return self.decode(q, k, v, cache, active)
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    def prefill(self, q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array) -> tuple[jax.Array, PromptCache]:
        """Causal hybrid prefill attention over whole right-padded prompts.

        q [B, T, Hq, D], k, v [B, T, Hkv, D]; lengths int32 [B] in [1, T]. Returns (out [B, T, Hq, D] in q.dtype,
        rows past a prompt's length are padding; `PromptCache` for `freeze`). The VL tokens come from the
        prompt's tail queries (VTI) and attend in full precision, the rest of the prefix through INT8 Q.K
        (`HyQuantConfig.prefill_qk`), the local band exactly.
        """
        _check_qkv(q, k, v, "prefill")
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
        lengths = jnp.asarray(lengths, jnp.int32)
        out, (vl_idx, vl_count) = prefill_attention(q, k, v, lengths, self.config, backend=self.backend)
        prompt = PromptCache(k.astype(self.cache_dtype), v.astype(self.cache_dtype), lengths, vl_idx, vl_count)
        return out.transpose(0, 2, 1, 3), prompt

    def freeze(self, prompt: PromptCache, max_len: int, min_length: int = 0) -> HybridKVCache:
        """The hybrid cache of a prefilled prompt (paper Algorithm 4): the VL tokens in full precision, the last
        `window` tokens in the full-precision ring, the rest quantized into pages. max_len: static capacity in
        tokens per sequence (prompt + generated), >= T. min_length: static lower bound of the prompt lengths
        (a smaller VL region; see `hyquant_jax.freeze`)."""
        return freeze(prompt.k, prompt.v, prompt.lengths, None, self.config, max_len,
                      vl=(prompt.vl_idx, prompt.vl_count), min_length=min_length)

    def decode(self, q: jax.Array, k: jax.Array, v: jax.Array, cache: HybridKVCache,
               active: jax.Array | None = None) -> tuple[jax.Array, HybridKVCache]:
        """One decode step: append k, v and attend with q over the cache and the new token.

        q [B, 1, Hq, D], k, v [B, 1, Hkv, D]; active: optional bool [B], sequences whose cache grows (the others'
        outputs are to be ignored). Returns (out [B, 1, Hq, D] in q.dtype, the new cache). Under jit with the
        cache donated, the append writes in place; a full window ring is flushed into a page first.
        """
        _check_qkv(q, k, v, "decode")
        if q.shape[1] != 1:
            raise ValueError(f"decode takes one token per sequence: q [B, 1, Hq, D], got {q.shape}")
        dt = cache.dtype
        out, cache = decode_step(q[:, 0], k[:, 0].astype(dt), v[:, 0].astype(dt), cache, self.config,
                                 backend=self.backend, active=active, tuning=self.decode_tuning)
        return out[:, None], cache


def _check_qkv(q, k, v, name: str) -> None:
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3] \
            or q.shape[2] % k.shape[2]:
        raise ValueError(f"{name}: need q [B, T, Hq, D] and k, v [B, T, Hkv, D] with Hkv dividing Hq, got "
                         f"{q.shape}, {k.shape}, {v.shape}")
