"""`HybridKVCache`: the decode-time KV cache of one attention layer.

Every cached token of every (sequence, KV head) lives in exactly one region:

* low-bit region: pages of `block_size` slots; page p of sequence b holds
  `page_count[b, p]` tokens at its front (a page is a frozen chunk of the
  prompt prefix or one block flushed from the window, minus promoted VL
  tokens). Codes are packed (see `quant.py`); scales are per token and channel
  group, or, for scheme "channel_key", keys have a per-channel scale and zero
  point per page.
* VL region: `num_vl[b]` full-precision vertical-line tokens.
* window ring: `window + block_size` full-precision slots; the valid ones are
  `ring_start, ..., ring_start + ring_len - 1` (mod ring size), oldest first.
  `ring_score` accumulates the decode attention mass of each slot.

Attention is permutation-invariant over keys (positions are already in the
keys through RoPE), so regions store tokens in any order. Capacities are
static (`max_len` tokens per sequence); lengths are per sequence.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax import quant
from hyquant_jax.backends import BACKENDS, resolve_backend
from hyquant_jax.config import HyQuantConfig, as_lengths, check_config, num_vl_tokens
from hyquant_jax.reorder import stable_partition
from hyquant_jax.vti import vertical_token_identification
from models.attention import BATCH, KV_HEADS, logical_axes
from pallas_kernels import cache_write

SLOT_ALIGN = 256  # low-bit slots are padded to a multiple of this (kernel tiling)
VL_ALIGN = 64  # VL capacity is padded to a multiple of this (kernel tile)


@partial(
    jax.tree_util.register_dataclass,
    data_fields=[
        "k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero",
        "page_count", "num_pages", "vl_k", "vl_v", "num_vl",
        "ring_k", "ring_v", "ring_score", "ring_start", "ring_len", "length",
    ],
    meta_fields=["max_len"],
)
@dataclasses.dataclass(frozen=True)
class HybridKVCache:
    """Hybrid-precision KV cache; B sequences, H KV heads, head_dim D.

    k_codes: uint8 [B, H, S, D*key_bits/8] packed codes (or full precision
      [B, H, S, D] when key_bits == 16); S = pages * block_size slots.
    k_scale, k_zero: bf16 [B, H, S, G] per token and channel group, or
      [B, H, pages, D] per page and channel ("channel_key"); None when unused
      (16 bits; k_zero for symmetric schemes).
    v_codes, v_scale, v_zero: the same for values (always per token).
    page_count: int32 [B, pages] tokens at the front of each page.
    num_pages: int32 [B] pages in use.
    vl_k, vl_v: [B, H, C, D] full-precision VL tokens; num_vl: int32 [B].
    ring_k, ring_v: [B, H, R, D] window ring, R = window + block_size.
    ring_score: float32 [B, H, R] accumulated decode attention mass per slot.
    ring_start, ring_len: int32 [B] first valid slot and valid slot count.
    length: int32 [B] tokens appended per sequence (prompt + decoded): the tokens cached, unless
      `overflowed`.
    max_len: static capacity in tokens per sequence.
    """

    # Each array's leading logical axes (`models.attention.logical_axes`): the per-head arrays are split by
    # sequence and KV head, the per-sequence counters by sequence only (`hyquant_jax.sharding` reads these).
    k_codes: jax.Array = logical_axes(BATCH, KV_HEADS)
    k_scale: jax.Array | None = logical_axes(BATCH, KV_HEADS)
    k_zero: jax.Array | None = logical_axes(BATCH, KV_HEADS)
    v_codes: jax.Array = logical_axes(BATCH, KV_HEADS)
    v_scale: jax.Array | None = logical_axes(BATCH, KV_HEADS)
    v_zero: jax.Array | None = logical_axes(BATCH, KV_HEADS)
    page_count: jax.Array = logical_axes(BATCH)
    num_pages: jax.Array = logical_axes(BATCH)
    vl_k: jax.Array = logical_axes(BATCH, KV_HEADS)
    vl_v: jax.Array = logical_axes(BATCH, KV_HEADS)
    num_vl: jax.Array = logical_axes(BATCH)
    ring_k: jax.Array = logical_axes(BATCH, KV_HEADS)
    ring_v: jax.Array = logical_axes(BATCH, KV_HEADS)
    ring_score: jax.Array = logical_axes(BATCH, KV_HEADS)
    ring_start: jax.Array = logical_axes(BATCH)
    ring_len: jax.Array = logical_axes(BATCH)
    length: jax.Array = logical_axes(BATCH)
    max_len: int

    @property
    def batch(self) -> int:
        return self.ring_k.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.ring_k.shape[1]

    @property
    def head_dim(self) -> int:
        return self.ring_k.shape[3]

    @property
    def dtype(self):
        return self.ring_k.dtype

    @property
    def num_slots(self) -> int:
        return self.k_codes.shape[2]

    @property
    def vl_capacity(self) -> int:
        return self.vl_k.shape[2]

    def nbytes(self) -> int:
        """Bytes of all arrays (allocated capacity)."""
        return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(self))

    def used_bytes(self, config: HyQuantConfig) -> np.ndarray:
        """Bytes per sequence that hold cached tokens (host-side, int64 [B]).

        Counts the codes and scales of used pages, the used VL slots and the
        whole ring (it is always allocated), but not unused capacity.
        """
        h, d = self.num_kv_heads, self.head_dim
        elem = jnp.dtype(self.dtype).itemsize
        per_slot = sum(
            _region_bytes_per_slot(x) for x in (self.k_codes, self.v_codes)
        )
        per_slot += sum(_token_param_bytes(x) for x in (self.k_scale, self.k_zero)
                        if x is not None and config.scheme != "channel_key")
        per_slot += sum(_token_param_bytes(x) for x in (self.v_scale, self.v_zero) if x is not None)
        per_page = 0
        if config.scheme == "channel_key" and config.key_bits != 16:
            per_page = 2 * d * jnp.dtype(quant.PARAM_DTYPE).itemsize
        pages = np.asarray(self.num_pages).astype(np.int64)
        vl = np.asarray(self.num_vl).astype(np.int64)
        ring = self.ring_k.shape[2]
        return h * (pages * (config.block_size * per_slot + per_page) + (vl + ring) * 2 * d * elem)

    @property
    def overflowed(self) -> jax.Array:
        """bool [B]: the sequence was appended past `max_len` (`length` counts every appended token).

        `generate` sizes the cache so that this never happens. A hand-written decode loop that goes on past
        max_len keeps a consistent cache, but not every token: once every page is taken, each window flush
        drops the oldest window block instead of storing it. (Outside jit, `append` refuses to go past
        max_len.)"""
        return self.length > self.max_len

    def check_room(self, new_tokens: int) -> None:
        """Host-side check: raise if appending `new_tokens` would overflow."""
        longest = int(np.max(np.asarray(self.length))) if self.batch else 0
        if longest + new_tokens > self.max_len:
            raise ValueError(
                f"HybridKVCache overflow: a sequence holds {longest} tokens and {new_tokens} more would exceed "
                f"max_len={self.max_len}; build the cache with a larger max_len"
            )


def _region_bytes_per_slot(codes: jax.Array) -> int:
    return codes.shape[-1] * codes.dtype.itemsize


def _token_param_bytes(param: jax.Array) -> int:
    return param.shape[-1] * param.dtype.itemsize


# --------------------------------------------------------------------------- capacities


def capacities(max_len: int, config: HyQuantConfig, min_length: int = 0) -> tuple[int, int]:
    """(pages, VL capacity) that hold any history of at most `max_len` tokens.

    A history freezes a prompt of L tokens (min_length <= L <= max_len) and
    then appends max_len - L tokens. Freeze puts the prefix P = max(0, L - W)
    into ceil(P / block_size) pages at most (fewer when VL tokens leave it)
    and num_vl(P) tokens into VL; the ring then flushes only when full, f
    times, each flush filling one page and promoting flush_vl_count tokens.
    Both capacities are maximised over L. A known shortest prompt
    (min_length) removes the long-decode histories, whose flushes promote
    more VL tokens per block than a prompt's rho does.
    """
    pages, vl = worst_history(max_len, config, min_length)
    align = max(1, SLOT_ALIGN // config.block_size)
    return math.ceil(pages / align) * align, max(VL_ALIGN, math.ceil(vl / VL_ALIGN) * VL_ALIGN)


def bytes_after_freeze(prompt_len: int, config: HyQuantConfig, num_kv_heads: int, head_dim: int,
                       dtype=jnp.bfloat16) -> int:
    """Bytes that `HybridKVCache.used_bytes` counts for one sequence and layer right after `freeze` of a prompt
    of `prompt_len` tokens (host-side arithmetic, no arrays): the used pages, the VL tokens and the whole ring.

    The ring (window + block_size slots) is always allocated, so short prompts cost more than in bf16; see
    `smaller_than_bf16_from`."""
    shapes = jax.eval_shape(lambda k: _freeze(k, k, jnp.zeros((1,), jnp.int32), jnp.zeros((1, num_kv_heads, 1),
                                                                                       jnp.int32),
                                              jnp.zeros((1,), jnp.int32), config, SLOT_ALIGN),
                            jax.ShapeDtypeStruct((1, num_kv_heads, 1, head_dim), dtype))
    cache = dataclasses.replace(  # the counts of such a prompt on the shapes of a frozen cache
        shapes, num_pages=np.zeros(1), num_vl=np.zeros(1))
    prefix = max(0, prompt_len - config.window)
    vl = num_vl_tokens(prefix, config.rho_fraction)
    pages = -(-(prefix - vl) // config.block_size)
    return int(HybridKVCache.used_bytes(dataclasses.replace(cache, num_pages=np.array([pages]),
                                                            num_vl=np.array([vl])), config)[0])


def smaller_than_bf16_from(config: HyQuantConfig, num_kv_heads: int, head_dim: int, dtype=jnp.bfloat16,
                           limit: int = 1 << 20) -> int | None:
    """The shortest prompt whose frozen hybrid cache takes fewer bytes than a bf16 cache of the same tokens
    (`bytes_after_freeze` against 2 * tokens * heads * head_dim * 2 bytes); None if none up to `limit`."""
    bf16 = 2 * num_kv_heads * head_dim * jnp.dtype(dtype).itemsize
    lo, hi = 1, limit  # hybrid minus bf16 bytes falls as the prompt grows: bisect for the first negative
    if bytes_after_freeze(hi, config, num_kv_heads, head_dim, dtype) >= hi * bf16:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if bytes_after_freeze(mid, config, num_kv_heads, head_dim, dtype) < mid * bf16:
            hi = mid
        else:
            lo = mid + 1
    return lo


def worst_history(max_len: int, config: HyQuantConfig, min_length: int = 0) -> tuple[int, int]:
    """Unpadded (pages, VL tokens) of `capacities`: the most either can take over all histories."""
    if not 0 <= min_length <= max_len:
        raise ValueError(f"min_length must lie in [0, max_len={max_len}], got {min_length}")
    bs, w = config.block_size, config.window
    # A prompt of L >= W tokens leaves t = max_len - L to append, which flush the full ring ceil(t / bs) - 1
    # times (at least 0). A shorter prompt has an empty prefix and flushes as often as one of W tokens, so
    # L < W adds no history. Within one flush count the smallest t (largest prefix) is the worst case.
    t_max = max(0, max_len - max(w, min_length))
    histories = [(max(0, max_len - t - w), max(0, -(-t // bs) - 1))  # (prefix at freeze, flushes after it)
                 for t in (0, *range(bs + 1, t_max + 1, bs))]
    pages = max(max(1, -(-p // bs) + f) for p, f in histories)
    vl = max(num_vl_tokens(p, config.rho_fraction) + f * config.flush_vl_count for p, f in histories)
    return pages, vl


# --------------------------------------------------------------------------- quantizing pages


def _quantize_keys(x, valid, config: HyQuantConfig):
    """x [B, H, S, D] float, valid bool [B, H, S] -> (codes, scale, zero)."""
    if config.key_bits == 16:
        return x, None, None
    if config.scheme == "channel_key":
        b, h, s, d = x.shape
        bs = config.block_size
        pages = x.reshape(b, h, s // bs, bs, d)
        codes, scale, zero = quant.quantize_channels(pages, config.key_bits, valid.reshape(b, h, s // bs, bs))
        return quant.pack(codes.reshape(x.shape), config.key_bits), scale, zero
    codes, scale, zero = quant.quantize_tokens(
        x, config.key_bits, symmetric=config.scheme == "token_sym", group_size=config.group_size
    )
    return quant.pack(codes, config.key_bits), scale, zero


def _quantize_values(x, config: HyQuantConfig):
    if config.value_bits == 16:
        return x, None, None
    codes, scale, zero = quant.quantize_tokens(
        x, config.value_bits, symmetric=config.scheme == "token_sym", group_size=config.group_size
    )
    return quant.pack(codes, config.value_bits), scale, zero


def dequantize_keys(cache: HybridKVCache, config: HyQuantConfig) -> jax.Array:
    """Low-bit keys as float32 [B, H, S, D] (invalid slots included)."""
    if config.key_bits == 16:
        return cache.k_codes.astype(jnp.float32)
    codes = quant.unpack(cache.k_codes, config.key_bits)
    if config.scheme == "channel_key":
        b, h, s, d = codes.shape
        bs = config.block_size
        x = quant.dequantize_channels(codes.reshape(b, h, s // bs, bs, d), cache.k_scale, cache.k_zero)
        return x.reshape(b, h, s, d)
    return quant.dequantize_tokens(codes, cache.k_scale, cache.k_zero, config.key_bits)


def dequantize_values(cache: HybridKVCache, config: HyQuantConfig) -> jax.Array:
    """Low-bit values as float32 [B, H, S, D] (invalid slots included)."""
    if config.value_bits == 16:
        return cache.v_codes.astype(jnp.float32)
    codes = quant.unpack(cache.v_codes, config.value_bits)
    return quant.dequantize_tokens(codes, cache.v_scale, cache.v_zero, config.value_bits)


# --------------------------------------------------------------------------- validity masks


def low_bit_valid(cache: HybridKVCache, block_size: int) -> jax.Array:
    """bool [B, S]: slot holds a token (same for every head)."""
    slot = jnp.arange(cache.num_slots)
    page, within = slot // block_size, slot % block_size
    count = jnp.take_along_axis(cache.page_count, jnp.broadcast_to(page, (cache.batch, page.size)), axis=1)
    return (page[None, :] < cache.num_pages[:, None]) & (within[None, :] < count)


def vl_valid(cache: HybridKVCache) -> jax.Array:
    """bool [B, C]."""
    return jnp.arange(cache.vl_capacity)[None, :] < cache.num_vl[:, None]


def ring_valid(cache: HybridKVCache) -> jax.Array:
    """bool [B, R]."""
    size = cache.ring_k.shape[2]
    age = (jnp.arange(size)[None, :] - cache.ring_start[:, None]) % size
    return age < cache.ring_len[:, None]


def check_decode_query(q, cache: HybridKVCache) -> None:
    """Raise ValueError unless q is a floating [B, Hq, D] query for `cache` (Hq a multiple of its KV heads)."""
    if (q.ndim != 3 or q.shape[0] != cache.batch or q.shape[2] != cache.head_dim or q.shape[1] % cache.num_kv_heads
            or not jnp.issubdtype(q.dtype, jnp.floating)):
        raise ValueError(
            f"q must be floating [B, Hq, D] with B={cache.batch}, D={cache.head_dim} and Hq a multiple of "
            f"{cache.num_kv_heads}, got {q.dtype} {q.shape}"
        )


def check_cache(cache: HybridKVCache, config: HyQuantConfig) -> None:
    """Raise ValueError if the cache layout does not match the config."""
    d = cache.head_dim
    config.check_head_dim(d)
    if cache.ring_k.shape[2] != config.ring_size:
        raise ValueError(
            f"cache ring has {cache.ring_k.shape[2]} slots but config needs window + block_size = {config.ring_size}"
        )
    want_k = d if config.key_bits == 16 else quant.packed_width(d, config.key_bits)
    want_v = d if config.value_bits == 16 else quant.packed_width(d, config.value_bits)
    if cache.k_codes.shape[-1] != want_k or cache.v_codes.shape[-1] != want_v:
        raise ValueError(
            f"cache codes have widths {cache.k_codes.shape[-1]}/{cache.v_codes.shape[-1]} but config "
            f"key_bits={config.key_bits}, value_bits={config.value_bits} need {want_k}/{want_v}"
        )
    if cache.num_slots % config.block_size or cache.page_count.shape[1] * config.block_size != cache.num_slots:
        raise ValueError(f"cache pages do not match block_size={config.block_size}")
    if config.key_bits != 16:
        b, h, s = cache.batch, cache.num_kv_heads, cache.num_slots
        if config.scheme == "channel_key":
            want = (b, h, cache.page_count.shape[1], d)
        else:
            want = (b, h, s, config.group_count(d))
        if cache.k_scale is None or cache.k_scale.shape != want:
            got = None if cache.k_scale is None else cache.k_scale.shape
            raise ValueError(f"cache key scales have shape {got} but scheme={config.scheme!r} needs {want}")


# --------------------------------------------------------------------------- freeze


def _check_kv(k, v, lengths, name="k"):
    if k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"{name} and v must both be [B, H_kv, N, D], got {k.shape} and {v.shape}")
    if lengths.shape != (k.shape[0],) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"lengths must be an int array of shape [B]={(k.shape[0],)}, got {lengths.shape} "
                         f"{lengths.dtype}")


def _concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def freeze(
    k: jax.Array,
    v: jax.Array,
    lengths: jax.Array,
    q_tail: jax.Array,
    config: HyQuantConfig,
    max_len: int,
    vl: tuple[jax.Array, jax.Array] | None = None,
    scale: float | None = None,
    min_length: int = 0,
) -> HybridKVCache:
    """Build the hybrid cache from prefill keys/values (paper Algorithm 4).

    k, v: [B, H_kv, N, D] prompt keys (after RoPE) and values, left-aligned,
      position p of sequence b valid for p < lengths[b]; int32 lengths [B].
    q_tail: [B, H_q, T, D] right-aligned tail queries (`vti.tail_queries`).
    max_len: static capacity per sequence (prompt + generated), >= N.
    vl: optional (indices, count) from `vertical_token_identification` when
      prefill already computed them.
    min_length: static; every prompt has at least this many tokens. The
      capacity then covers only histories from such prompts (`capacities`):
      at a 32K prompt the VL region shrinks from 2112 to 1664 slots, 4% of
      the cache; the pages do not depend on it. Concrete lengths are checked
      against it. Under jit it is the caller's promise (`generate` checks it
      on the host); were it broken, a flush that finds the VL region full
      quantizes its whole block instead of promoting tokens, so nothing
      overflows.

    The last min(len, W) tokens go to the window ring; VL tokens are chosen
    from the prefix [0, len - W) once; the rest of the prefix is quantized in
    order into full pages (the last one partial).
    """
    check_config(config)
    if getattr(k, "ndim", 0) == 4:
        lengths = as_lengths(lengths, k.shape[0])
    _check_kv(k, v, lengths)
    b, h, n, d = k.shape
    config.check_head_dim(d)
    if q_tail is not None and (getattr(q_tail, "ndim", 0) != 4 or q_tail.shape[0] != b or q_tail.shape[3] != d
                               or q_tail.shape[1] % h):
        raise ValueError(f"q_tail must be [B={b}, Hq, T, D={d}] with Hq a multiple of the {h} KV heads "
                         f"(`tail_queries` of this batch's queries), got {getattr(q_tail, 'shape', type(q_tail))}")
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)):
        raise ValueError(f"freeze: max_len must be an int (static capacity in tokens), got {max_len!r}")
    if max_len < n:
        raise ValueError(f"max_len={max_len} must be >= the prompt capacity N={n}")
    if isinstance(min_length, bool) or not isinstance(min_length, (int, np.integer)) or not 0 <= min_length <= max_len:
        raise ValueError(f"freeze: min_length must be an int in [0, max_len={max_len}], got {min_length!r}")
    min_length = int(min_length)
    if _concrete(lengths):
        lens = np.asarray(lengths)
        if lens.size and (lens.min() < 0 or lens.max() > n):
            raise ValueError(f"lengths must lie in [0, {n}], got {lens.tolist()}")
        if lens.size and lens.min() < min_length:
            raise ValueError(f"freeze: every length must be >= min_length={min_length}, got {lens.tolist()}")
    if q_tail is None and vl is None:
        raise ValueError("freeze needs q_tail (tail queries [B, H_q, T, D], `tail_queries`) to identify the VL "
                         "tokens, or vl = (indices, count) from prefill")
    if vl is None:
        vl = vertical_token_identification(q_tail, k, lengths, config, scale=scale)
    return _freeze(k, v, lengths.astype(jnp.int32), vl[0], vl[1], config, max_len, min_length)


@partial(jax.jit, static_argnames=("config", "max_len", "min_length"))
def _freeze(k, v, lengths, vl_idx, vl_count, config: HyQuantConfig, max_len: int,
            min_length: int = 0) -> HybridKVCache:
    b, h, n, d = k.shape
    bs, w = config.block_size, config.window
    num_pages, vl_cap = capacities(max_len, config, min_length)
    slots = num_pages * bs
    pos = jnp.arange(n)

    recent = jnp.minimum(lengths, w)
    prefix = lengths - recent  # P per sequence
    kmax = vl_idx.shape[-1]
    if kmax > vl_cap:
        raise ValueError(f"{kmax} VL indices exceed the VL capacity {vl_cap} of max_len={max_len}")

    # VL tokens and the positions they take out of the prefix.
    vl_ok = jnp.arange(kmax)[None, None, :] < vl_count[:, None, None]
    vl_pos = jnp.where(vl_ok, vl_idx, 0)
    is_vl = jnp.zeros((b, h, n), bool).at[
        jnp.arange(b)[:, None, None], jnp.arange(h)[None, :, None], vl_pos
    ].max(vl_ok)
    vl_k = _gather_tokens(k, vl_pos, vl_ok, vl_cap)
    vl_v = _gather_tokens(v, vl_pos, vl_ok, vl_cap)

    # Quantized prefix, compacted in position order.
    is_q = (pos[None, None, :] < prefix[:, None, None]) & ~is_vl
    order = stable_partition(is_q)  # [B, H, N]: the is_q positions first
    taken = min(n, slots)
    order = order[..., :taken]
    n_q = prefix - vl_count
    slot_ok = jnp.arange(taken)[None, None, :] < n_q[:, None, None]
    q_k = _gather_tokens(k, order, slot_ok, slots)
    q_v = _gather_tokens(v, order, slot_ok, slots)
    valid = jnp.broadcast_to(jnp.arange(slots)[None, None, :] < n_q[:, None, None], (b, h, slots))
    k_codes, k_scale, k_zero = _quantize_keys(q_k, valid, config)
    v_codes, v_scale, v_zero = _quantize_values(q_v, config)
    page_count = jnp.clip(n_q[:, None] - jnp.arange(num_pages)[None, :] * bs, 0, bs).astype(jnp.int32)
    pages_used = ((n_q + bs - 1) // bs).astype(jnp.int32)

    # Window ring: the last `recent` tokens in slots [0, recent).
    ring = config.ring_size
    ring_pos = prefix[:, None] + jnp.arange(ring)[None, :]
    ring_ok = jnp.arange(ring)[None, :] < recent[:, None]
    ring_idx = jnp.broadcast_to(jnp.clip(ring_pos, 0, n - 1)[:, None, :], (b, h, ring))
    ring_ok3 = jnp.broadcast_to(ring_ok[:, None, :], (b, h, ring))
    return HybridKVCache(
        k_codes=k_codes, k_scale=k_scale, k_zero=k_zero,
        v_codes=v_codes, v_scale=v_scale, v_zero=v_zero,
        page_count=page_count, num_pages=pages_used,
        vl_k=vl_k, vl_v=vl_v, num_vl=vl_count.astype(jnp.int32),
        ring_k=_gather_tokens(k, ring_idx, ring_ok3, ring),
        ring_v=_gather_tokens(v, ring_idx, ring_ok3, ring),
        ring_score=jnp.zeros((b, h, ring), jnp.float32),
        ring_start=jnp.zeros((b,), jnp.int32),
        ring_len=recent.astype(jnp.int32),
        length=lengths.astype(jnp.int32),
        max_len=max_len,
    )


def _gather_tokens(x, idx, ok, size):
    """x [B, H, N, D], idx/ok [B, H, M] -> [B, H, size, D]; rows not ok are zero."""
    rows = jnp.take_along_axis(x, jnp.clip(idx, 0, x.shape[2] - 1)[..., None], axis=2)
    rows = jnp.where(ok[..., None], rows, jnp.zeros((), x.dtype))
    m = rows.shape[2]
    if m < size:
        rows = jnp.pad(rows, ((0, 0), (0, 0), (0, size - m), (0, 0)))
    return rows[:, :, :size]


# --------------------------------------------------------------------------- append


def append(
    cache: HybridKVCache,
    k: jax.Array,
    v: jax.Array,
    config: HyQuantConfig,
    active: jax.Array | None = None,
    flush: bool = True,
    backend: str = "auto",
) -> HybridKVCache:
    """Add one decoded token per sequence.

    k, v: [B, H_kv, D]; active: optional bool [B] (inactive sequences are
    left unchanged). If a sequence's ring is full, its oldest block is
    flushed first: quantized into a new page, or, with `promote_flushed`, its
    top-rho tokens by `ring_score` move to the VL region and the rest are
    quantized. flush=False: the caller has already made room with
    `flush_full_rings` (no active ring is full), so the flush is not even
    considered. Called outside jit, it checks capacity on the host first.
    backend: as `decode_attention`'s; the kernel backends ("auto" on a GPU, "triton", "mosaic",
    "interpret") write the ring's three rows and advance ring_len and length with one Pallas launch
    (`pallas_kernels.cache_write.append_rows`), "reference" with jnp. Both give the same cache bit for bit.
    """
    ring_writer = _ring_writer(backend, cache)
    want = (cache.batch, cache.num_kv_heads, cache.head_dim)
    if k.shape != want or v.shape != want:
        raise ValueError(f"append: k and v must be [B, H_kv, D]={want}, got {k.shape} and {v.shape}")
    if active is None:
        active = jnp.ones((cache.batch,), bool)
    elif active.shape != (cache.batch,):
        raise ValueError(f"append: active must be bool [B]={(cache.batch,)}, got {active.shape}")
    if _concrete(cache.length):
        cache.check_room(1)
        if not flush and _concrete(active) and bool(np.any(np.asarray(_full_rings(cache, active, config)))):
            raise ValueError("append(flush=False): a sequence's window ring is full; call flush_full_rings first")
    check_cache(cache, config)
    return _append(cache, k, v, active, config, flush, ring_writer)


def _ring_writer(backend: str, cache: HybridKVCache) -> str:
    """How `append` writes the ring rows: "kernel", "interpret" or "jnp"."""
    if backend not in BACKENDS:
        raise ValueError(f"append: backend must be one of {BACKENDS}, got {backend!r}")
    backend = resolve_backend(backend)
    if backend == "reference" or not cache_write.fits((cache.ring_k,)):
        return "jnp"
    return "interpret" if backend == "interpret" else "kernel"


def _full_rings(cache: HybridKVCache, active, config: HyQuantConfig):
    return active & (cache.ring_len == config.ring_size)


@partial(jax.jit, static_argnames=("config",))
def flush_full_rings(caches: tuple[HybridKVCache, ...], config: HyQuantConfig, active: jax.Array) -> tuple:
    """Make room for one token in every full window ring of several caches (e.g. all layers).

    active: bool [B]. Each cache's full rings (of active sequences) flush
    their oldest block as in `append`. One `lax.cond` guards all caches:
    most decode steps flush nothing and then run no flush kernels at all
    (a per-layer cond costs a device-side branch per layer and step). Caches
    of one shape whose blocks are small (`STACKED_FLUSH_MAX_BYTES`) are
    quantized as one stacked computation, with per-cache writes.
    """
    caches = tuple(caches)
    full = [_full_rings(c, active, config) for c in caches]

    def flush_all(cs):
        return _flush_stacked(cs, full, config) or tuple(_flush_oldest_block(c, f, config) for c, f in zip(cs, full))

    return jax.lax.cond(jnp.any(jnp.stack(full)), flush_all, lambda cs: cs, caches)


def steps_until_full(caches: tuple[HybridKVCache, ...], config: HyQuantConfig, active: jax.Array) -> jax.Array:
    """Decode steps that every active sequence can append before its window ring is full: int32 [], the
    minimum of ring_size - ring_len over the caches and the active sequences (ring_size with none active;
    at least 1). After `flush_full_rings`, `append(flush=False)` is valid for that many steps in a row."""
    room = jnp.stack([jnp.where(active, config.ring_size - c.ring_len, config.ring_size) for c in caches])
    return jnp.maximum(jnp.min(room), 1).astype(jnp.int32)


@partial(jax.jit, static_argnames=("config", "flush", "ring_writer"))
def _append(cache: HybridKVCache, k, v, active, config: HyQuantConfig, flush: bool = True,
            ring_writer: str = "jnp") -> HybridKVCache:
    if flush:  # most steps flush nothing: skip the block quantization and its ~40 small kernels then
        (cache,) = flush_full_rings((cache,), config, active)
    if ring_writer != "jnp":  # one launch writes the rows and advances the counters (see append_rows)
        ring_k, ring_v, ring_score, ring_len, length = cache_write.append_rows(
            (cache.ring_k, cache.ring_v, cache.ring_score), (k, v, jnp.zeros(k.shape[:2], jnp.float32)),
            cache.ring_start, cache.ring_len, active, (cache.length,), interpret=ring_writer == "interpret")
        return dataclasses.replace(cache, ring_k=ring_k, ring_v=ring_v, ring_score=ring_score, ring_len=ring_len,
                                   length=length)
    slot = (cache.ring_start + cache.ring_len) % config.ring_size
    ring_k = _write_rows(cache.ring_k, slot, k[:, :, None].astype(cache.dtype), active)
    ring_v = _write_rows(cache.ring_v, slot, v[:, :, None].astype(cache.dtype), active)
    ring_score = _write_rows(cache.ring_score[..., None], slot, jnp.zeros(k.shape[:2] + (1, 1)), active)[..., 0]
    step = active.astype(jnp.int32)
    return dataclasses.replace(
        cache, ring_k=ring_k, ring_v=ring_v, ring_score=ring_score,
        ring_len=cache.ring_len + step, length=cache.length + step,
    )


def _write_rows(buf, start, rows, mask):
    """buf [B, H, S, X]; write rows [B, H, n, X] at slot start[b] where mask[b]."""

    def one(buf_b, start_b, rows_b, mask_b):
        old = jax.lax.dynamic_slice_in_dim(buf_b, start_b, rows_b.shape[1], axis=1)
        new = jnp.where(mask_b, rows_b.astype(buf_b.dtype), old)
        return jax.lax.dynamic_update_slice_in_dim(buf_b, new, start_b, axis=1)

    return jax.vmap(one)(buf, start, rows, mask)


def _read_rows(buf, start, n):
    return jax.vmap(lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, n, axis=1))(buf, start)


def _flush_oldest_block(cache: HybridKVCache, flush, config: HyQuantConfig) -> HybridKVCache:
    """Move the oldest window block of each flushing sequence out of the ring.

    With `promote_flushed`, a sequence whose VL region has no room for flush_vl_count more tokens (possible
    only when a prompt was shorter than freeze's min_length promised) quantizes the whole block instead:
    the page holds block_size tokens and nothing is written past the VL capacity.
    """
    return _write_block(cache, flush, _flushed_block(_oldest_block(cache, config), flush, config), config)


def _oldest_block(cache: HybridKVCache, config: HyQuantConfig) -> dict:
    """The ring's oldest block_size rows (k, v [B, H, bs, D], score f32 [B, H, bs] with promotion) and the
    room left in the VL region (int32 [B])."""
    bs, start = config.block_size, cache.ring_start
    block = dict(k=_read_rows(cache.ring_k, start, bs), v=_read_rows(cache.ring_v, start, bs),
                 vl_room=cache.vl_capacity - cache.num_vl)
    if config.flush_vl_count:
        block["score"] = _read_rows(cache.ring_score[..., None], start, bs)[..., 0]
    return block


def _flushed_block(block: dict, flush, config: HyQuantConfig) -> dict:
    """What a flush writes, from `_oldest_block`'s rows: the quantized block (codes and scales of one page),
    the promoted VL rows, and the page's token count. Elementwise over a leading axis, so it also runs
    vmapped over the layers (`_flush_stacked`)."""
    bs, kf = config.block_size, config.flush_vl_count
    blk_k, blk_v = block["k"], block["v"]
    b, h = blk_k.shape[:2]
    out = {}
    count = jnp.full((b,), bs, jnp.int32)
    if kf:
        promote = flush & (kf <= block["vl_room"])  # [B]
        _, top = jax.lax.top_k(block["score"], kf)
        top = jnp.sort(top, axis=-1)
        promoted = jnp.zeros((b, h, bs), bool).at[
            jnp.arange(b)[:, None, None], jnp.arange(h)[None, :, None], top
        ].set(True)
        out["vl_k"] = jnp.take_along_axis(blk_k, top[..., None], axis=2)
        out["vl_v"] = jnp.take_along_axis(blk_v, top[..., None], axis=2)
        out["promote"] = promote
        keep = jnp.argsort(promoted, axis=-1, stable=True)  # kept tokens first, in order
        keep_ok = jnp.broadcast_to(jnp.arange(bs) < bs - kf, (b, h, bs))
        kept = promote[:, None, None, None]
        blk_k = jnp.where(kept, _gather_tokens(blk_k, keep, keep_ok, bs), blk_k)
        blk_v = jnp.where(kept, _gather_tokens(blk_v, keep, keep_ok, bs), blk_v)
        count = jnp.where(promote, bs - kf, bs)
    valid = jnp.broadcast_to(jnp.arange(bs)[None, None, :] < count[:, None, None], (b, h, bs))
    out["k_codes"], out["k_scale"], out["k_zero"] = _quantize_keys(blk_k, valid, config)
    out["v_codes"], out["v_scale"], out["v_zero"] = _quantize_values(blk_v, config)
    out["count"] = count
    return out


def _write_block(cache: HybridKVCache, flush, block: dict, config: HyQuantConfig) -> HybridKVCache:
    """Write `_flushed_block`'s values into one cache for the sequences with `flush` and advance the ring.

    A sequence appended past `max_len` can find every page taken (the capacity covers histories of up to
    max_len tokens): its oldest window block is then dropped instead of stored, so the cache stays
    consistent (the newest tokens in the ring, nothing written out of bounds) and `overflowed` says so."""
    bs, kf = config.block_size, config.flush_vl_count
    b, h = cache.batch, cache.num_kv_heads
    start, page = cache.ring_start, cache.num_pages
    dropped = flush
    flush = flush & (page < cache.page_count.shape[1])  # a free page: store the block
    slot = page * bs
    updates = {}
    if kf:
        promote = block["promote"] & flush
        updates["vl_k"] = _write_rows(cache.vl_k, cache.num_vl, block["vl_k"], promote)
        updates["vl_v"] = _write_rows(cache.vl_v, cache.num_vl, block["vl_v"], promote)
        updates["num_vl"] = cache.num_vl + kf * promote
    updates["k_codes"] = _write_rows(cache.k_codes, slot, block["k_codes"], flush)
    updates["v_codes"] = _write_rows(cache.v_codes, slot, block["v_codes"], flush)
    if config.scheme == "channel_key" and config.key_bits != 16:
        updates["k_scale"] = _write_rows(cache.k_scale, page, block["k_scale"], flush)
        updates["k_zero"] = _write_rows(cache.k_zero, page, block["k_zero"], flush)
    else:
        for name in ("k_scale", "k_zero"):
            if block[name] is not None:
                updates[name] = _write_rows(getattr(cache, name), slot, block[name], flush)
    for name in ("v_scale", "v_zero"):
        if block[name] is not None:
            updates[name] = _write_rows(getattr(cache, name), slot, block[name], flush)
    page_count = _write_rows(
        cache.page_count[:, None, :, None], page, block["count"][:, None, None, None], flush
    )[:, 0, :, 0]
    ring_score = _write_rows(cache.ring_score[..., None], start, jnp.zeros((b, h, bs, 1)), dropped)[..., 0]
    return dataclasses.replace(
        cache,
        page_count=page_count,
        num_pages=page + flush.astype(jnp.int32),
        ring_score=ring_score,
        ring_start=jnp.where(dropped, (start + bs) % config.ring_size, start),
        ring_len=cache.ring_len - bs * dropped.astype(jnp.int32),
        **updates,
    )


# Stack the layers' blocks for one quantization only while they are small. The stacked rows (k and v, plus
# the scores) are layers x B x H x block_size x D: at Qwen3-8B's shapes in bf16 ~9.5 MB a sequence, so the
# stacked path runs up to B=7 and larger batches, which lack the memory, flush layer by layer.
STACKED_FLUSH_MAX_BYTES = 64 * 2**20


def _flush_stacked(caches: tuple, full: list, config: HyQuantConfig) -> tuple | None:
    """`_flush_oldest_block` for several caches of one shape with the block quantization computed once over
    the stacked layers (~35 small XLA kernels a flush instead of ~35 a layer); only the writes stay per cache.
    None when the caches differ in shape or their blocks are too large to stack."""
    blocks = [_oldest_block(c, config) for c in caches]
    shapes = {tuple((x.shape, x.dtype) for x in jax.tree_util.tree_leaves(bl)) for bl in blocks}
    size = sum(x.size * x.dtype.itemsize for bl in blocks for x in jax.tree_util.tree_leaves(bl))
    if len(caches) < 2 or len(shapes) != 1 or size > STACKED_FLUSH_MAX_BYTES:
        return None
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *blocks)
    done = jax.vmap(lambda bl, f: _flushed_block(bl, f, config))(stacked, jnp.stack(full))
    return tuple(_write_block(c, f, jax.tree_util.tree_map(lambda x, i=i: x[i], done), config)
                 for i, (c, f) in enumerate(zip(caches, full)))


# --------------------------------------------------------------------------- decode scores


@partial(jax.jit, static_argnames=("config", "scale"))
def accumulate_ring_scores(
    cache: HybridKVCache, q: jax.Array, lse: jax.Array, config: HyQuantConfig, scale: float | None = None,
    ring_logits: jax.Array | None = None,
) -> HybridKVCache:
    """Add this decode step's attention mass on each ring slot to `ring_score`.

    q: [B, H_q, D] the step's queries; lse: float32 [B, H_q] log-sum-exp of
    the step's full attention logits (from decode attention). The mass of a
    slot is exp(q.k * scale - lse), summed over the query heads of its KV head.
    ring_logits: float32 [B, H_q, R], q.k * scale of every ring slot when the
    decode kernel already computed them (`decode_launch.decode_attention(...,
    ring_logits=True)`); else they are computed here. A no-op when flushed
    tokens are never promoted.
    """
    if config.flush_vl_count == 0:
        return cache
    b, hq, d = q.shape
    h = cache.num_kv_heads
    if ring_logits is not None:
        if ring_logits.shape != (b, hq, cache.ring_k.shape[2]):
            raise ValueError(f"ring_logits must be [B, H_q, R] = {(b, hq, cache.ring_k.shape[2])}, "
                             f"got {ring_logits.shape}")
        logits = ring_logits.astype(jnp.float32).reshape(b, h, hq // h, -1)
    else:
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        qg = q.astype(jnp.float32).reshape(b, h, hq // h, d)
        logits = jnp.einsum("bhgd,bhrd->bhgr", qg, cache.ring_k.astype(jnp.float32)) * scale
    lse_g = lse.reshape(b, h, hq // h, 1)
    mass = jnp.where(jnp.isfinite(lse_g), jnp.exp(logits - lse_g), 0.0).sum(axis=2)
    mass = jnp.where(ring_valid(cache)[:, None, :], mass, 0.0)
    return dataclasses.replace(cache, ring_score=cache.ring_score + mass)
