"""The attention protocol the models call, and its bf16 implementation.

A model computes q, k, v (after RoPE) and hands them, with one layer's
attention state, to an `Attention` implementation; the implementation stores
k, v in its state however it likes (a bf16 buffer here, a quantized hybrid
cache in `hyquant_jax.model_attention`) and returns the attention output and
the new state. The model knows nothing about how keys are stored.

Life of a state, per layer (driven by `hyquant_jax.generate`):

    state = attn.prefill_state(config, batch, prompt_len, max_len, dtype, whole)
    out, state = attn.prefill(layer, q, k, v, state, ctx)   # per prompt chunk
    state = attn.finish_prefill(layer, state, ctx)          # after the last chunk
    states, step = begin_decode_step(attn, states, step)    # before a decode step, all layers
    n = steps_until_begin(attn, states, step)               # optional: n steps need no begin_decode_step
    out, state = attn.decode(layer, q, k, v, state, step)   # per decode step, per layer

Implementations are frozen dataclasses (hashable: static under `jax.jit`);
states are pytrees. Shapes: B batch, Hq query heads, Hkv KV heads, T tokens
of a chunk, D head_dim, S cache slots.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig

# Logical axes of the attention states' and contexts' arrays: each array field names the axes of its leading
# dimensions (`logical_axes`), the rest are unsplit. `hyquant_jax.sharding` maps them onto a device mesh, as it
# maps the weights' logical axes (`models.transformer`, whose head axes have the same names).
BATCH = "batch"  # B: the sequences
KV_HEADS = "kv_heads"  # Hkv
HEADS = "heads"  # Hq
STATE_AXES = (BATCH, KV_HEADS, HEADS)


def logical_axes(*axes: str):
    """A dataclass field (no default) holding an array whose leading dimensions have these logical axes (from
    STATE_AXES; none: the array is whole on every device); the field's `metadata["logical_axes"]`."""
    return dataclasses.field(metadata={"logical_axes": axes})


@partial(jax.tree_util.register_dataclass, data_fields=["offset", "lengths"],
         meta_fields=["max_len", "whole", "min_length"])
@dataclasses.dataclass(frozen=True)
class PrefillContext:
    """One prefill call over a chunk of left-aligned, right-padded prompts.

    offset: int32 [] position (and cache slot) of the chunk's first token; every
      sequence's chunk covers positions offset, ..., offset + T - 1.
    lengths: int32 [B] prompt lengths; positions >= lengths[b] are padding.
    max_len: static capacity of the decode state, tokens per sequence.
    whole: static; True when this one chunk is the whole (padded) prompt, so
      offset == 0 and an implementation may attend within the chunk only.
    min_length: static; the caller checked that every prompt has at least this
      many tokens, so a decode state may be sized for such prompts only.
    """

    offset: jax.Array = logical_axes()
    lengths: jax.Array = logical_axes(BATCH)
    max_len: int
    whole: bool = False
    min_length: int = 0


@partial(jax.tree_util.register_dataclass, data_fields=["positions", "active"], meta_fields=["prepared"])
@dataclasses.dataclass(frozen=True)
class DecodeContext:
    """One decode step: one new token per sequence.

    positions: int32 [B] position of this step's token (= tokens cached before it).
    active: bool [B] sequences still generating; the state of an inactive
      sequence must not grow (its outputs are ignored).
    prepared: static; True when `begin_decode_step` already ran on this
      step's states (see `begin_decode_step`).
    """

    positions: jax.Array = logical_axes(BATCH)
    active: jax.Array = logical_axes(BATCH)
    prepared: bool = False


class Attention(Protocol):
    """What a model needs from an attention implementation (see module docstring)."""

    def prefill_state(self, config: ModelConfig, batch: int, prompt_len: int, max_len: int, dtype,
                      whole: bool) -> Any:
        """Empty per-layer state for a prompt padded to prompt_len, capacity max_len tokens."""

    def prefill(self, layer: int, q: jax.Array, k: jax.Array, v: jax.Array, state: Any,
                ctx: PrefillContext) -> tuple[jax.Array, Any]:
        """q [B, Hq, T, D], k, v [B, Hkv, T, D] -> (causal attention out [B, Hq, T, D], state)."""

    def finish_prefill(self, layer: int, state: Any, ctx: PrefillContext) -> Any:
        """The decode state after the last prefill chunk."""

    def decode(self, layer: int, q: jax.Array, k: jax.Array, v: jax.Array, state: Any,
               ctx: DecodeContext) -> tuple[jax.Array, Any]:
        """q [B, Hq, D], k, v [B, Hkv, D] -> (out [B, Hq, D], state with k, v appended)."""

    # Optional: `begin_decode_step(self, states: tuple, ctx) -> states`, work done once per decode
    # step for all layers together before the layers' `decode` calls (see `begin_decode_step`), and
    # `steps_until_begin(self, states, ctx) -> int32 []`: how many steps from now need no such work
    # (see `steps_until_begin`).

    def used_bytes(self, state: Any, lengths) -> np.ndarray:
        """Host-side: bytes per sequence (int64 [B]) that one layer's decode state uses
        for `lengths` cached tokens."""


def begin_decode_step(attention, states: tuple, ctx: DecodeContext) -> tuple[tuple, DecodeContext]:
    """Run the implementation's optional once-per-step work on all layers' states.

    Returns (states, ctx with prepared=True). An implementation without
    `begin_decode_step` gets its states and ctx back unchanged; one with it
    (the hybrid cache: flush full window rings under a single branch for all
    layers) may rely on ctx.prepared in `decode`.
    """
    begin = getattr(attention, "begin_decode_step", None)
    if begin is None:
        return states, ctx
    return begin(states, ctx), dataclasses.replace(ctx, prepared=True)


def steps_until_begin(attention, states: tuple, ctx: DecodeContext) -> jax.Array | None:
    """How many decode steps, this one included, may run with ctx.prepared=True and no further
    `begin_decode_step`: int32 [] >= 1, from the implementation's optional `steps_until_begin`, called on
    the states `begin_decode_step` returned; None when the implementation has no such method (then the
    decode loop calls `begin_decode_step` before every step).

    The hybrid cache's once-per-step work is a branch that flushes the full window rings; a ring fills
    once per block of steps, so a decode loop that asks this after each flush runs the steps in between
    without the branch (`hyquant_jax.generate.decode`).
    """
    until = getattr(attention, "steps_until_begin", None)
    return None if until is None else until(states, ctx)


# --------------------------------------------------------------------------- shared math


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                      scale: float | None = None, f32_probs: bool = False, token=None) -> jax.Array:
    """Masked softmax attention with GQA grouping, no K/V repeat.

    q [B, Hq, T, D]; k, v [B, Hkv, S, D]; mask bool broadcastable to
    [B, 1, 1, T, S]. Logits and softmax in float32; the probabilities are
    cast to v.dtype for the PV product (flash-attention numerics) unless
    f32_probs, which multiplies float32 probabilities with float32 values
    (the numerics of `hyquant_jax.reference`). token: None or (k, v [B, Hkv, D]), one more key that every
    query sees (a decode step's own token before it is written to the cache). Rows with no visible key give
    0. Returns [B, Hq, T, D] in q.dtype.
    """
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qg = q.reshape(b, hkv, hq // hkv, t, d)
    logits = jnp.einsum("bhgtd,bhsd->bhgts", qg, k, preferred_element_type=jnp.float32) * scale
    logits = jnp.where(mask, logits, -jnp.inf)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    if token is not None:
        t_k, t_v = token
        t_logit = jnp.einsum("bhgtd,bhd->bhgt", qg, t_k, preferred_element_type=jnp.float32)[..., None] * scale
        peak = jnp.maximum(peak, t_logit)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    p = jnp.exp(logits - peak)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    if token is not None:
        t_p = jnp.exp(t_logit - peak)
        denom = denom + t_p
    safe = jnp.where(denom > 0, denom, 1.0)
    p = p / safe
    pv = jnp.float32 if f32_probs else v.dtype
    out = jnp.einsum("bhgts,bhsd->bhgtd", p.astype(pv), v.astype(pv), preferred_element_type=jnp.float32)
    if token is not None:  # its probability and value rounded to the PV dtype, as the cached keys' are
        t_pv = (t_p / safe).astype(pv).astype(jnp.float32) * t_v.astype(pv).astype(jnp.float32)[:, :, None, None]
        out = out + t_pv
    return out.reshape(b, hq, t, d).astype(q.dtype)


LOGITS_BUDGET = 1 << 30  # bytes of float32 logits one step of `prefix_attention` may hold
KEY_BLOCK = 4096  # key slots `prefix_attention` reads per step


def prefix_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array, f32_probs: bool = False,
                     logits_budget: int = LOGITS_BUDGET, key_block: int = KEY_BLOCK, impl: str = "xla") -> jax.Array:
    """Attention of a prompt chunk's queries over the keys written so far: query t (absolute position
    q_pos[t]) sees key slots 0 .. q_pos[t] of k, v (chunked prefill).

    q [B, Hq, T, D]; k, v [B, Hkv, S, D]; q_pos int32 [T]. The keys are read `key_block` slots at a time, with
    an online softmax (float32 running max, denominator and output), and only up to the block holding the
    query block's last position: a chunk at offset o reads its o + T slots, not all S of the staging buffer
    (on average half of them over a prompt's chunks). The queries run in blocks, one after the other
    (`lax.map`), of as many rows (a power of two) as keep a step's float32 logits [B, Hq, rows, key_block]
    within `logits_budget` bytes: 2048 rows at once for a 32-head model, where one step over all 128K slots
    of a 128K prompt would hold 34 GB. As in `grouped_attention`, the probabilities are cast to v.dtype for
    the PV product unless f32_probs, and a row without a visible key gives 0. Returns [B, Hq, T, D] in q.dtype.

    impl "triton": the same attention as one fused kernel (`pallas_kernels.prefix`, flash attention whose
    logits stay in registers; Pallas interpret mode off the GPU; key tiles of 64 slots, or 32 or 16 where
    they divide S); S must be a multiple of 16, f32_probs off unless v is float32. impl "auto": "triton"
    where `fused_chunk_applies`, else "xla".
    """
    check_chunk_impl("prefix_attention: impl", impl)
    if impl == "auto":
        impl = "triton" if fused_chunk_applies(k.shape[2], q.shape[3], v.dtype, f32_probs) else "xla"
    if impl == "triton":
        from pallas_kernels.prefix import key_tile
        from pallas_kernels.prefix import prefix_attention as fused

        if f32_probs and v.dtype != jnp.float32:
            raise ValueError("prefix_attention: f32_probs with a non-float32 v needs impl='xla' (the kernel's P.V "
                             "takes v.dtype)")
        tile = key_tile(k.shape[2])
        if tile is None:
            raise ValueError(f"prefix_attention: impl='triton' needs the key slots S={k.shape[2]} to be a multiple "
                             f"of 16 (for chunked prefill: prefill_chunk a multiple of 16)")
        return fused(q, k, v, jnp.asarray(q_pos), block_k=tile, interpret=jax.default_backend() != "gpu")
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = hq // hkv
    kb = max(1, min(key_block, s))
    rows = max(1, logits_budget // (4 * b * hq * kb))
    block = min(t, max(16, 1 << (rows.bit_length() - 1)))
    scale = 1.0 / math.sqrt(d)
    pv = jnp.float32 if f32_probs else v.dtype

    def attend(qc, pc):
        qg = qc.reshape(b, hkv, g, qc.shape[2], d)
        stat = (b, hkv, g, qc.shape[2])

        def step(j, carry):
            m, l, acc = carry
            first = j * kb
            start = jnp.minimum(first, s - kb)  # the last block may start early: slots before `first` are done
            slots = start + jnp.arange(kb)
            kj = jax.lax.dynamic_slice_in_dim(k, start, kb, axis=2)
            vj = jax.lax.dynamic_slice_in_dim(v, start, kb, axis=2)
            seen = (slots[None, :] >= first) & (slots[None, :] <= pc[:, None])  # [rows, kb]
            logits = jnp.einsum("bhgtd,bhsd->bhgts", qg, kj, preferred_element_type=jnp.float32) * scale
            logits = jnp.where(seen, logits, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # no key seen yet: p and alpha stay 0
            alpha = jnp.exp(m - m_safe)
            p = jnp.exp(logits - m_safe[..., None])
            out = jnp.einsum("bhgts,bhsd->bhgtd", p.astype(pv), vj.astype(pv), preferred_element_type=jnp.float32)
            return m_new, l * alpha + jnp.sum(p, axis=-1), acc * alpha[..., None] + out

        empty = (jnp.full(stat, -jnp.inf, jnp.float32), jnp.zeros(stat, jnp.float32),
                 jnp.zeros(stat + (d,), jnp.float32))
        # the first block is always read; the loop's carry starts from its result, which (unlike `empty`) has
        # the varying axes of q, k and v under `shard_map`
        _, l, acc = jax.lax.fori_loop(1, jnp.max(pc) // kb + 1, step, step(0, empty))
        out = acc / jnp.where(l > 0, l, 1.0)[..., None]
        return out.reshape(b, hq, qc.shape[2], d).astype(q.dtype)

    q_pos = jnp.minimum(jnp.asarray(q_pos, jnp.int32), s - 1)
    if block >= t:
        return attend(q, q_pos)
    n = -(-t // block)
    pad = n * block - t
    qb = jnp.pad(q, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(b, hq, n, block, -1).transpose(2, 0, 1, 3, 4)
    pb = jnp.pad(q_pos, (0, pad)).reshape(n, block)  # padded rows see slot 0 and are dropped below
    out = jax.lax.map(lambda x: attend(*x), (qb, pb))  # [n, B, Hq, block, D]
    return out.transpose(1, 2, 0, 3, 4).reshape(b, hq, n * block, -1)[:, :, :t]


CHUNK_IMPLS = ("auto", "xla", "triton")


def check_chunk_impl(name: str, value: str) -> None:
    if value not in CHUNK_IMPLS:
        raise ValueError(f"{name} must be one of {CHUNK_IMPLS}, got {value!r}")


def fused_chunk_applies(slots: int, head_dim: int, v_dtype, f32_probs: bool) -> bool:
    """Whether chunk_impl "auto" takes the fused kernel: on a GPU, bf16/fp16 values (P.V in v.dtype, so not
    with f32_probs), staged slots a multiple of 16 and a power-of-two head_dim of at least 16. Off the GPU the
    kernel would run in Pallas interpret mode, far slower than XLA."""
    from pallas_kernels.prefix import key_tile

    return (jax.default_backend() == "gpu" and jnp.dtype(v_dtype) in (jnp.bfloat16, jnp.float16) and not f32_probs
            and key_tile(slots) is not None and head_dim >= 16 and head_dim & (head_dim - 1) == 0)


def cudnn_applies(q: jax.Array) -> bool:
    """Whether cuDNN flash attention takes q [B, H, T, D]: on a GPU, bf16/fp16, D a multiple of 8 up to 128."""
    d = q.shape[-1]
    return (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
            and d % 8 == 0 and d <= 128)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, impl: str = "xla",
                     f32_probs: bool = False) -> jax.Array:
    """Causal self-attention within one chunk: q [B, Hq, T, D], k, v [B, Hkv, T, D].

    impl "xla": `grouped_attention` (f32_probs passed on); "cudnn":
    `jax.nn.dot_product_attention(implementation="cudnn")` (flash attention,
    GQA-native, [B, T, H, D] layout); "auto": "cudnn" where `cudnn_applies`,
    else "xla". (`dot_product_attention`'s own default, implementation=None,
    is XLA in jax 0.11.2: it materialises the T x T logits, 128 GiB at 32K.)
    Padded queries are computed like any other and ignored by the caller;
    valid queries never see padded keys (they come later).
    """
    if impl == "auto":
        impl = "cudnn" if cudnn_applies(q) else "xla"
    if impl == "cudnn":
        out = jax.nn.dot_product_attention(
            q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
            is_causal=True, implementation="cudnn")
        return out.transpose(0, 2, 1, 3)
    t = q.shape[2]
    mask = jnp.tril(jnp.ones((t, t), bool))[None, None, None]
    return grouped_attention(q, k, v, mask, f32_probs=f32_probs)


SLOT_ALIGN = 512


def cache_slots(max_len: int) -> int:
    """Slots of a full-precision cache for `max_len` tokens: rounded up to a multiple of SLOT_ALIGN.

    On the GPU, XLA's matmul for P.V (contraction over the slots) pads an
    operand whose slot count is not tile-aligned, i.e. copies the whole V
    cache every decode step; aligned slots cost a little memory and no copy.
    Slots past max_len stay masked. 512 rather than 256: the bf16 attention is
    ~2x slower at odd multiples of 256 slots from 64K up (docs/design.md,
    "Answered questions").
    """
    return -(-max_len // SLOT_ALIGN) * SLOT_ALIGN


def write_chunk(buf: jax.Array, x: jax.Array, offset: jax.Array) -> jax.Array:
    """buf [B, H, S, D] with x [B, H, T, D] written at slots offset.. (in place under donation)."""
    return jax.lax.dynamic_update_slice_in_dim(buf, x.astype(buf.dtype), offset, axis=2)


def write_token(buf: jax.Array, x: jax.Array, positions: jax.Array) -> jax.Array:
    """buf [B, H, S, D] with x [B, H, D] written at slot positions[b] of each sequence (a scatter)."""

    def one(buf_b, x_b, pos_b):
        return jax.lax.dynamic_update_slice_in_dim(buf_b, x_b[:, None].astype(buf_b.dtype), pos_b, axis=1)

    return jax.vmap(one)(buf, x, positions)


def write_tokens(bufs: tuple, xs: tuple, positions: jax.Array) -> tuple:
    """`write_token` for several buffers at the same slots: one Pallas launch on a GPU
    (`pallas_kernels.cache_write`, the kernel the hybrid cache's ring writes use: XLA makes one or more
    kernels per buffer of the vmapped update), the vmapped updates elsewhere. Same result bit for bit."""
    from pallas_kernels.cache_write import fits, write_rows

    if jax.default_backend() == "gpu" and fits(bufs):
        return write_rows(bufs, xs, positions)
    return tuple(write_token(b, x, positions) for b, x in zip(bufs, xs))


# --------------------------------------------------------------------------- bf16


@partial(jax.tree_util.register_dataclass, data_fields=["k", "v"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class KVBuffer:
    """Full-precision KV cache of one layer: k, v [B, Hkv, S, D], S = cache_slots(max_len); slot = position."""

    k: jax.Array = logical_axes(BATCH, KV_HEADS)
    v: jax.Array = logical_axes(BATCH, KV_HEADS)

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclasses.dataclass(frozen=True)
class BF16Attention:
    """Exact attention over a preallocated full-precision cache (the fast baseline).

    Prefill writes each chunk into the cache with one `dynamic_update_slice`;
    decode writes one token per sequence (`write_tokens`) and attends over all S
    slots with keys masked to positions <= the step's position. Under
    `jax.jit` with the states donated, both updates happen in place: a decode
    step reads the cache once and writes only the new token.

    prefill_impl: "auto" (cuDNN flash attention where `cudnn_applies`, XLA
      elsewhere), "xla" or "cudnn" for whole-prompt prefill.
    chunk_impl: chunked prefill's attention (`prefix_attention`'s impl): "auto" (the fused kernel where
      `fused_chunk_applies`, i.e. on a GPU: docs/design.md "Chunked prefill"), "xla" (online softmax over key
      blocks) or "triton" (the fused kernel, in interpret mode off the GPU).
    cache_dtype: storage dtype (None: the dtype of k, e.g. bf16).
    f32_probs: PV product in float32 (see `grouped_attention`); None: only
      off-GPU, where it matches the numerics of the jnp reference backends
      (on GPU it would upcast the whole V cache every step).
    attend_first: decode attends over the cache before the step's token is written, with that token as one
      more key (`grouped_attention(..., token=...)`), then writes it: the write leaves the path from q to
      the output, as the hybrid cache's ring append does (`hyquant_jax.decode_step`). Off by default: it
      made the bf16 step slower on the H200 at B=1 32K and 128K.
    """

    prefill_impl: str = "auto"
    cache_dtype: Any = None
    f32_probs: bool | None = None
    attend_first: bool = False
    chunk_impl: str = "auto"

    def __post_init__(self):
        if self.prefill_impl not in ("auto", "xla", "cudnn"):
            raise ValueError(f"BF16Attention.prefill_impl must be 'auto', 'xla' or 'cudnn', got {self.prefill_impl!r}")
        check_chunk_impl("BF16Attention.chunk_impl", self.chunk_impl)

    def _impl(self) -> str:
        if self.prefill_impl == "auto":
            return "auto" if jax.default_backend() == "gpu" else "xla"
        return self.prefill_impl

    def _f32(self) -> bool:
        return jax.default_backend() != "gpu" if self.f32_probs is None else self.f32_probs

    def _chunk_f32(self) -> bool:
        """f32_probs for chunked prefill: the fused kernel takes P.V in v.dtype unless f32_probs is set ("auto"
        keeps the XLA path's choice and so takes the kernel only where that is off)."""
        return bool(self.f32_probs) if self.chunk_impl == "triton" else self._f32()

    def prefill_state(self, config, batch, prompt_len, max_len, dtype, whole):
        dtype = self.cache_dtype or dtype
        shape = (batch, config.num_kv_heads, cache_slots(max_len), config.head_dim)
        return KVBuffer(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def prefill(self, layer, q, k, v, state: KVBuffer, ctx: PrefillContext):
        state = KVBuffer(write_chunk(state.k, k, ctx.offset), write_chunk(state.v, v, ctx.offset))
        if ctx.whole:
            return causal_attention(q, k, v, self._impl(), self._f32()), state
        q_pos = ctx.offset + jnp.arange(q.shape[2])
        return prefix_attention(q, state.k, state.v, q_pos, f32_probs=self._chunk_f32(), impl=self.chunk_impl), state

    def finish_prefill(self, layer, state, ctx):
        return state

    def used_bytes(self, state: KVBuffer, lengths) -> np.ndarray:
        _, h, _, d = state.k.shape
        return np.asarray(lengths, np.int64) * (2 * h * d * state.k.dtype.itemsize)

    def decode(self, layer, q, k, v, state: KVBuffer, ctx: DecodeContext):
        s = state.k.shape[2]
        pos = jnp.minimum(ctx.positions, s - 1)
        k, v = k.astype(state.k.dtype), v.astype(state.v.dtype)
        if not self.attend_first:
            state = KVBuffer(*write_tokens((state.k, state.v), (k, v), pos))
            mask = (jnp.arange(s)[None, :] <= pos[:, None])[:, None, None, None, :]
            out = grouped_attention(q[:, :, None], state.k, state.v, mask, f32_probs=self._f32())
            return out[:, :, 0], state
        mask = (jnp.arange(s)[None, :] < pos[:, None])[:, None, None, None, :]
        out = grouped_attention(q[:, :, None], state.k, state.v, mask, f32_probs=self._f32(), token=(k, v))
        # the write takes the cache through a barrier with the output, so it runs after the attention has read
        # the cache (in place: no copy of the cache to keep the old slot for the reader)
        out, cache_k, cache_v = jax.lax.optimization_barrier((out, state.k, state.v))
        return out[:, :, 0], KVBuffer(*write_tokens((cache_k, cache_v), (k, v), pos))
