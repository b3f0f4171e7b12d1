"""Glue between `HybridKVCache` and the Pallas decode kernels.

`pallas_kernels.decode` (Triton) scans every region: low-bit pages, VL tokens, window ring. On Hopper, for
the configs it covers (`mosaic_low_bit_fits`: K4V4 "channel_key", pages of 64, head_dim 128, GQA groups of
at most 16) and caches of at least MOSAIC_MIN_PAGES pages, the low-bit pages go to
`pallas_kernels.decode_mgpu` (Mosaic GPU) instead and the Triton kernel scans only the VL and ring splits:
on the H200 the whole decode is then 1.14x (B1 32K), 1.68x (B1 128K) and 1.52x (B16 32K) as fast as with
the Triton kernel alone (benchmarks/results/decode_kernel_h200.json). This module picks the launch shapes
and merges the per-split results of both in one launch (`pallas_kernels.decode_merge`; XLA's merge where the
Triton kernel's splits are too many for one of its programs, `decode_merge.fits`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from hyquant_jax import backends
from hyquant_jax.cache import HybridKVCache, check_cache, check_decode_query
from hyquant_jax.config import HyQuantConfig
from pallas_kernels.decode import DecodeLayout, hybrid_decode_splits, merge_splits
from pallas_kernels.decode_merge import fits as merge_fits
from pallas_kernels.decode_merge import merge_hybrid_splits

CONVERTS = ("asm", "magic", "cast")
LOW_BIT_KERNELS = ("auto", "mosaic", "triton")
# "auto" takes the Mosaic low-bit kernel from this many (sequence, KV head, page) triples of cache capacity:
# below it the second launch and the merge cost more than the kernel saves. On the H200, Qwen3-8B heads, the
# whole decode with the low-bit pages in either kernel and the split merge as one kernel, us Triton / Mosaic:
# 512 triples (B1 4K) 15.9 / 18.2, 1024 (B1 8K) 21.4 / 19.5, (B2 4K) 20.4 / 20.9, 2048 (B1 16K) 28.6 / 25.3,
# (B4 4K) 27.5 / 25.9, 4096 (B1 32K) 46.9 / 34.4 (docs/design.md, "The split merge kernel").
MOSAIC_MIN_PAGES = 1024
MAX_SPLIT_TOKENS = 4096  # splits of <= 4K tokens measured best from B=16 to 64 at 32K on the H200 (split sweep)


@dataclasses.dataclass(frozen=True)
class DecodeTuning:
    """Launch knobs; None means the heuristic picks.

    n_low: splits over the low-bit region; n_vl: splits over the VL region;
    pages_per_tile: pages scanned per loop iteration (under channel_key, one sub-tile per page);
    convert: "asm" (fp16 from bit patterns through inline PTX), "magic" (bf16 from bit
      patterns, keeps bf16's range where fp16 operands would overflow) or "cast" (int -> float); see
      pallas_kernels/decode.py;
    sm_count: multiprocessors the splits fill; None: `hyquant_jax.backends.multiprocessor_count()` (the
      device's, 132 off-GPU, so that plans made on a CPU match a Hopper GPU's);
    low_bit: which kernel scans the low-bit pages: "mosaic" (`pallas_kernels.decode_mgpu`; needs a Hopper
      GPU and a config `mosaic_low_bit_fits`), "triton" (the Triton kernel, with the other regions) or
      "auto" (mosaic where it fits and the cache holds at least MOSAIC_MIN_PAGES pages over all sequences
      and KV heads, else triton);
    mosaic_blocks_per_sm, mosaic_stages: the Mosaic kernel's splits (batch x KV heads x splits fill this
      many blocks per multiprocessor, at least 2 splits, while that fits one wave of resident blocks; past
      it the count that wastes the least of the last wave; `decode_mgpu.default_splits`) and pages in
      flight per block; mosaic_splits: that split count itself (overrides mosaic_blocks_per_sm).
    """

    n_low: int | None = None
    n_vl: int | None = None
    pages_per_tile: int | None = None
    convert: str = "asm"
    num_warps: int | None = None
    num_stages: int | None = None
    sm_count: int | None = None
    low_bit: str = "auto"
    mosaic_blocks_per_sm: int = 2
    mosaic_stages: int = 2
    mosaic_splits: int | None = None

    def launch(self) -> tuple[int, int]:
        """(num_warps, num_stages) of the Triton launch: 4 warps / 3 stages unless set. Measured best on the
        H200 at every case timed: B1 1K-128K 4-15% faster than 2 warps / 2 stages, B16 32K 5% faster; 4 / 3 is
        also the best at B16 32K for the Triton kernel alone."""
        return self.num_warps or 4, self.num_stages or 3


def _multiprocessors(tuning: DecodeTuning) -> int:
    """`tuning.sm_count`, or where it is None the device's (`backends.multiprocessor_count()`)."""
    return backends.multiprocessor_count() if tuning.sm_count is None else tuning.sm_count


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def _pow2_ceil(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


def _largest_pow2_divisor(n: int, cap: int) -> int:
    t = cap
    while n % t:
        t //= 2
    return t


def _modes(config: HyQuantConfig):
    if config.key_bits == 16:
        key_mode = "raw"
    elif config.scheme == "channel_key":
        key_mode = "channel"
    else:
        key_mode = "sym" if config.scheme == "token_sym" else "asym"
    if config.value_bits == 16:
        value_mode = "raw"
    else:
        value_mode = "sym" if config.scheme == "token_sym" else "asym"
    return key_mode, value_mode


def mosaic_low_bit_fits(cache: HybridKVCache, config: HyQuantConfig, q_heads: int) -> bool:
    """Whether `pallas_kernels.decode_mgpu` covers this cache and config (static facts only)."""
    from pallas_kernels import decode_mgpu

    return (config.key_bits == 4 and config.value_bits == 4 and config.scheme == "channel_key"
            and config.group_size in (None, cache.head_dim) and config.block_size == decode_mgpu.PAGE
            and cache.head_dim == decode_mgpu.HEAD_DIM and q_heads // cache.num_kv_heads <= decode_mgpu.ROWS)


def use_mosaic_low_bit(cache: HybridKVCache, config: HyQuantConfig, q_heads: int, tuning: DecodeTuning,
                       interpret: bool, device=None) -> bool:
    """Whether the low-bit pages go to the Mosaic kernel (see `DecodeTuning.low_bit`); raises for "mosaic"
    where it cannot run."""
    if tuning.low_bit not in LOW_BIT_KERNELS:
        raise ValueError(f"DecodeTuning.low_bit must be one of {LOW_BIT_KERNELS}, got {tuning.low_bit!r}")
    if tuning.mosaic_splits is not None and tuning.mosaic_splits < 1:
        raise ValueError(f"DecodeTuning.mosaic_splits must be None or >= 1, got {tuning.mosaic_splits}")
    if tuning.low_bit == "triton":
        return False
    device = jax.devices()[0] if device is None else device
    fits = mosaic_low_bit_fits(cache, config, q_heads)
    if tuning.low_bit == "mosaic" and (interpret or not fits or not backends.is_hopper(device)):
        raise ValueError(
            "DecodeTuning.low_bit='mosaic' needs a Hopper GPU (not interpret mode), key_bits = value_bits = 4, "
            "scheme 'channel_key', group_size None, block_size 64, head_dim 128 and at most 16 query heads per "
            f"KV head; got {config}, head_dim {cache.head_dim}, {q_heads} query / {cache.num_kv_heads} KV heads "
            f"on {device.device_kind}")
    large = cache.batch * cache.num_kv_heads * cache.page_count.shape[1] >= MOSAIC_MIN_PAGES
    return fits and not interpret and backends.is_hopper(device) and (large or tuning.low_bit == "mosaic")


def decode_layout(cache: HybridKVCache, config: HyQuantConfig, q_heads: int,
                  tuning: DecodeTuning = DecodeTuning(), low_bit_elsewhere: bool = False,
                  ring_logits: bool = False) -> DecodeLayout:
    """Static kernel layout for this cache shape, config and tuning.

    low_bit_elsewhere: the Mosaic kernel scans the low-bit pages (n_low = 0); the Triton kernel's splits then
    cover the VL tokens (about 512 per split, up to half the fill) and the ring. ring_logits: the kernel also
    writes the ring's logits (`decode_attention(..., ring_logits=True)`)."""
    b, h, d = cache.batch, cache.num_kv_heads, cache.head_dim
    group = q_heads // h
    key_mode, value_mode = _modes(config)
    channel_group = config.group_size or d
    for mode, bits in ((key_mode, config.key_bits), (value_mode, config.value_bits)):
        if mode in ("sym", "asym") and channel_group < 16:
            raise NotImplementedError(
                f"the Pallas decode kernel needs group_size >= 16 (dot operands of >= 16 channels); "
                f"got group_size={config.group_size}; use backend='reference'"
            )
    if d not in (64, 128, 256):
        raise NotImplementedError(f"the Pallas decode kernel supports head_dim 64, 128, 256; got {d}")
    if tuning.convert not in CONVERTS:
        raise ValueError(f"DecodeTuning.convert must be one of {CONVERTS}, got {tuning.convert!r}")
    num_pages = cache.page_count.shape[1]
    ppt = tuning.pages_per_tile
    if ppt is None:
        ppt = max(1, 128 // config.block_size)
    ppt = min(ppt, num_pages)
    if num_pages % ppt:
        ppt = 1
    # Splits: enough thread blocks to fill the GPU at small batch, and at most MAX_SPLIT_TOKENS per split
    # at any batch (a split that scans 16K-32K tokens alone leaves the last wave nearly empty).
    fill = _pow2_floor(4 * _multiprocessors(tuning) // (b * h))
    short = _pow2_ceil(math.ceil(num_pages * config.block_size / MAX_SPLIT_TOKENS))
    if low_bit_elsewhere:
        n_low = 0
        n_vl = tuning.n_vl or max(1, min(max(1, fill // 2), math.ceil(cache.vl_capacity / 512)))
    else:
        n_low = tuning.n_low or max(1, min(max(fill, short), num_pages // ppt))
        n_vl = tuning.n_vl or max(1, n_low // 4)
    vl_tile = _largest_pow2_divisor(cache.vl_capacity, 64)
    ring_size = config.ring_size
    return DecodeLayout(
        kv_heads=h, group=group, rows=max(16, 1 << math.ceil(math.log2(group))), head_dim=d,
        key_bits=config.key_bits, value_bits=config.value_bits, key_mode=key_mode, value_mode=value_mode,
        key_group=channel_group, value_group=channel_group, block=config.block_size, pages_per_tile=ppt,
        n_low=n_low, n_vl=n_vl, vl_tile=vl_tile, ring_tile=_largest_pow2_divisor(ring_size, 64),
        ring_size=ring_size, convert=tuning.convert, ring_logits=ring_logits,
    )


def decode_attention(q, cache: HybridKVCache, config: HyQuantConfig, interpret: bool = False,
                     scale: float | None = None, tuning: DecodeTuning | None = None, ring_logits: bool = False,
                     new_token=None, token_slot=None):
    """Hybrid decode attention through the Pallas kernel.

    q: [B, Hq, D]. Returns (out [B, Hq, D] in q.dtype, lse float32 [B, Hq]); with ring_logits also the
    scaled logits of every window-ring slot, float32 [B, Hq, ring_size] (-inf for empty slots), as the
    kernel computed them (bf16 q and keys, float32 sums): `accumulate_ring_scores` takes them instead of
    recomputing q . ring_k in XLA.

    new_token: None or (k, v [B, Hkv, D] in the cache dtype, active bool [B]): the step's own token, not yet
    in the cache, attended as if `append(cache, k, v, active=active, flush=False)` had run first (the ring
    logits then hold its logit at the slot that append fills). The caller appends it afterwards, so the
    append runs after the attention launches that read the ring instead of before them (`decode_step`).
    token_slot: None or int32 [B], the ring slot that append fills (None: `(ring_start + ring_len) %
    ring_size` of `cache`). `decode_step` takes it from the appended cache: the append advances `ring_len` in
    place, and a reader of the old value after it made XLA copy `ring_len` twice a layer and step.
    """
    check_decode_query(q, cache)
    b, hq, d = q.shape
    check_cache(cache, config)
    if new_token is not None:
        k, v, active = new_token
        want = (b, cache.num_kv_heads, d)
        if k.shape != want or v.shape != want or jnp.shape(active) != (b,):
            raise ValueError(f"new_token must be (k, v [B, Hkv, D]={want}, active bool [B]={(b,)}), got "
                             f"{k.shape}, {v.shape}, {jnp.shape(active)}")
        new_token = (k, v, jnp.asarray(active).astype(bool))
    if token_slot is not None and (new_token is None or jnp.shape(token_slot) != (b,)):
        raise ValueError(f"token_slot must be int32 [B]={(b,)} and comes with new_token, got shape "
                         f"{jnp.shape(token_slot)}" + (" without new_token" if new_token is None else ""))
    tuning = DecodeTuning() if tuning is None else tuning
    lay, num_warps, num_stages, mosaic_launch = decode_plan(cache, config, hq, tuning, interpret, ring_logits)
    result = _run(q, cache, lay, scale if scale is not None else 1.0 / math.sqrt(d), num_warps, num_stages,
                  interpret, mosaic_launch, new_token)
    if new_token is None or not lay.ring_logits:
        return result
    out, lse, ring, token_logits = result  # the token's logit at the ring slot that the caller's append fills
    slot = (cache.ring_start + cache.ring_len) % config.ring_size if token_slot is None else token_slot
    at = (jnp.arange(config.ring_size)[None, :] == slot[:, None]) & new_token[2][:, None]  # [B, R]
    return out, lse, jnp.where(at[:, None, :], token_logits[..., None], ring)


def decode_plan(cache: HybridKVCache, config: HyQuantConfig, q_heads: int, tuning: DecodeTuning = DecodeTuning(),
                interpret: bool = False, ring_logits: bool = False):
    """The launches of `decode_attention` (static): (Triton layout, its num_warps, num_stages, and the Mosaic
    low-bit launch (splits, stages) or None when the Triton kernel scans the low-bit pages too)."""
    mosaic = use_mosaic_low_bit(cache, config, q_heads, tuning, interpret)
    lay = decode_layout(cache, config, q_heads, tuning, low_bit_elsewhere=mosaic, ring_logits=ring_logits)
    num_warps, num_stages = tuning.launch()
    mosaic_launch = None
    if mosaic:
        from pallas_kernels.decode_mgpu import default_splits

        pages = cache.page_count.shape[1]
        splits = tuning.mosaic_splits or default_splits(cache.batch, cache.num_kv_heads, pages,
                                                        sms=_multiprocessors(tuning),
                                                        per_sm=tuning.mosaic_blocks_per_sm)
        mosaic_launch = (splits, tuning.mosaic_stages)
    return lay, num_warps, num_stages, mosaic_launch


def _mosaic_low_bit(q, cache: HybridKVCache, scale: float, splits: int, stages: int, packed: bool = False):
    """The low-bit pages through `pallas_kernels.decode_mgpu`, as Triton-style splits (packed: (o, ml) as the
    kernel writes them, `low_bit_splits(..., packed=True)`, for `decode_merge`). q: [B, Hq, D]."""
    from pallas_kernels import decode_mgpu

    # A bf16 q goes in as it is and each block prepares its rows (no XLA conversion launch between the q/k
    # norm + RoPE kernel and this one, which is on every layer's critical path at B=1).
    bf16 = q.dtype == jnp.bfloat16
    out = decode_mgpu.low_bit_splits(
        q if bf16 else decode_mgpu.kernel_query(q, cache.num_kv_heads, scale), cache.k_codes, cache.k_scale,
        cache.k_zero, cache.v_codes, cache.v_scale[..., 0], cache.v_zero[..., 0], cache.page_count, cache.num_pages,
        num_splits=splits, stages=stages, packed=packed, query_scale=float(scale) if bf16 else None)
    return out if packed else decode_mgpu.natural_splits(*out)


def _scaled_queries(q, lay: DecodeLayout, scale):
    """q [B, Hq, D] -> q * scale, float32 [B, H, group, D]."""
    b, hq, d = q.shape
    return (q.astype(jnp.float32) * scale).reshape(b, lay.kv_heads, lay.group, d)


def _kernel_queries(q, lay: DecodeLayout, scale):
    """q [B, Hq, D] -> scaled bf16 queries [B, H, rows, D] (GQA rows padded with zeros), as the Triton kernel
    takes them."""
    qg = _scaled_queries(q, lay, scale)
    return jnp.pad(qg, ((0, 0), (0, 0), (0, lay.rows - lay.group), (0, 0))).astype(jnp.bfloat16)


def token_logits(q, k, active, lay: DecodeLayout, scale):
    """Scaled logits of a key that is not in the cache: q [B, Hq, D], k [B, H, D], active bool [B] ->
    float32 [B, H, rows] (the kernel's bf16 queries, float32 sums; -inf where not active)."""
    # bf16 rounding as an explicit op: XLA drops a float32 -> bf16 -> float32 convert pair inside a fusion
    # (excess precision), which left these logits ~1e-3 off the kernel's on the H200
    qg = jax.lax.reduce_precision(_scaled_queries(q, lay, scale), exponent_bits=8, mantissa_bits=7)
    kb = jax.lax.reduce_precision(k.astype(jnp.float32), exponent_bits=8, mantissa_bits=7)
    logits = jnp.sum(qg * kb[:, :, None, :], axis=-1)  # a float32 sum, not a dot (which XLA may run in TF32)
    logits = jnp.pad(logits, ((0, 0), (0, 0), (0, lay.rows - lay.group)))
    return jnp.where(active[:, None, None], logits, -jnp.inf)


def triton_splits(q, cache: HybridKVCache, lay: DecodeLayout, scale, num_warps, num_stages, interpret):
    """The Triton kernel's splits over the regions `lay` gives it. q: [B, Hq, D].

    Returns (o f32 [B, H, NS, rows, D], m, l f32 [B, H, NS, rows], ring logits f32 [B, H, rows, ring_size] or
    None without `lay.ring_logits`)."""
    qg = _kernel_queries(q, lay, scale)
    unused = jnp.zeros((1,), jnp.bfloat16)
    o, m, l, *ring = hybrid_decode_splits(
        qg, cache.k_codes,
        unused if cache.k_scale is None else cache.k_scale,
        unused if cache.k_zero is None else cache.k_zero,
        cache.v_codes,
        unused if cache.v_scale is None else cache.v_scale,
        unused if cache.v_zero is None else cache.v_zero,
        cache.page_count, cache.num_pages, cache.vl_k, cache.vl_v, cache.num_vl,
        cache.ring_k, cache.ring_v, cache.ring_start, cache.ring_len,
        lay=lay, num_warps=num_warps, num_stages=num_stages, interpret=interpret,
    )
    return o, m, l, (ring[0] if ring else None)


@jax.jit(static_argnames=("lay", "scale", "num_warps", "num_stages", "interpret", "mosaic_launch"))
def _run(q, cache: HybridKVCache, lay: DecodeLayout, scale, num_warps, num_stages, interpret, mosaic_launch=None,
         new_token=None):
    """(out, lse), with `lay.ring_logits` also the ring logits [B, Hq, R], and with a new token as well its
    logits [B, Hq] (which `decode_attention` places at its ring slot, outside: see its token_slot)."""
    b, hq, d = q.shape
    low = None
    if mosaic_launch is not None:
        low = _mosaic_low_bit(q, cache, scale, *mosaic_launch, packed=True)
    o, m, l, ring = triton_splits(q, cache, lay, scale, num_warps, num_stages, interpret)
    token = None
    if new_token is not None:  # the step's own token: one more split of one key, merged with the others
        k, v, active = new_token
        token = (token_logits(q, k, active, lay, scale), v)
    if low is not None or merge_fits(o.shape[2], lay.group):
        # The splits (both launches' when the Mosaic kernel ran, read as it wrote them) in one merge launch
        # (pallas_kernels.decode_merge) instead of XLA's four dependent fusions: on the H200, B=1 32K 5.49
        # against 5.71 ms a decode step, 128K 6.98 against 7.20 (docs/design.md, "The split merge kernel").
        out, lse = merge_hybrid_splits(o, m, l, *(low or (None, None)), token, group=lay.group,
                                       out_dtype=q.dtype, interpret=interpret)
    else:
        out, lse = merge_splits(o, m, l, lay.group, token)
    if not lay.ring_logits:
        return out.astype(q.dtype), lse
    ring = ring[:, :, :lay.group].reshape(b, hq, lay.ring_size)
    if token is None:
        return out.astype(q.dtype), lse, ring
    return out.astype(q.dtype), lse, ring, token[0][:, :, :lay.group].reshape(b, hq)
