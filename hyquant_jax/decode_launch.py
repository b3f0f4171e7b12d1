"""The decode op: one decode step's attention over a `HybridKVCache` through the Pallas kernels.

Implementations (`IMPLEMENTATIONS`, in the order "auto" prefers them; `resolve` maps backend names to them):
  "mosaic"    on Hopper, for the configs `mosaic_low_bit_fits` covers, the low-bit pages go to
              `pallas_kernels.decode_mgpu` (Mosaic GPU) and the Triton kernel scans the VL tokens and the ring;
  "triton"    `pallas_kernels.decode` (Triton) scans every region: low-bit pages, VL tokens, window ring;
  "reference" `hyquant_jax.reference`, any device (`hyquant_jax.attention` runs it).
Both kernel implementations merge their splits, and the step's own token, in one launch
(`pallas_kernels.decode_merge`), or through XLA where the Triton launch has too many splits for one of its
programs (`decode_merge.fits`).

`plan` makes every static choice (implementation, launch shapes, merge) for a cache shape, config, tuning and
device; `decode_attention` runs a plan; `decode_step` is the kernel path's whole step (flush, attend, append,
ring scores). Why two kernels and where each runs: docs/design.md, "Two decode kernels".
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from hyquant_jax import backends
from hyquant_jax.backends import TRITON_WARPS, Implementation
from hyquant_jax.cache import (
    HybridKVCache,
    accumulate_ring_scores,
    append,
    check_cache,
    check_decode_query,
    flush_full_rings,
)
from hyquant_jax.config import HyQuantConfig
from pallas_kernels import decode as triton_decode
from pallas_kernels import decode_mgpu
from pallas_kernels.decode import DecodeLayout, hybrid_decode_splits, merge_splits
from pallas_kernels.decode_merge import fits as merge_fits
from pallas_kernels.decode_merge import merge_hybrid_splits

CONVERTS = ("asm", "magic", "cast")
LOW_BIT_KERNELS = ("auto", "mosaic", "triton")
# "auto" takes the Mosaic low-bit kernel from this many (sequence, KV head, page) triples of cache capacity:
# below it the second launch and the merge cost more than the kernel saves (docs/design.md, "Two decode
# kernels").
MOSAIC_MIN_PAGES = 1024
# At most this many tokens per Triton low-bit split at any batch: a split that scans 16K-32K tokens alone
# leaves the last wave nearly empty (docs/design.md, "Split heuristic").
MAX_SPLIT_TOKENS = 4096
# The Mosaic split count past one wave of blocks models each block as its pages plus this many pages of fixed
# cost (docs/design.md, "Split heuristic").
MOSAIC_BLOCK_OVERHEAD_PAGES = 16


@dataclasses.dataclass(frozen=True)
class DecodeTuning:
    """The decode kernels' launch knobs, checked on construction; None means `plan` picks.

    n_low: splits over the low-bit region; n_vl: splits over the VL region;
    pages_per_tile: pages scanned per loop iteration (under channel_key, one sub-tile per page);
    convert: "asm" (fp16 from bit patterns through inline PTX), "magic" (bf16 from bit
      patterns, keeps bf16's range where fp16 operands would overflow) or "cast" (int -> float); see
      pallas_kernels/decode.py;
    num_warps, num_stages: the Triton launch's (None: 4 warps, 3 stages, the best measured by
      benchmarks/decode_kernel.py --sweep);
    sm_count: multiprocessors the splits fill; None: the device's (`backends.multiprocessor_count`: 132
      off-GPU, so that plans made on a CPU match a Hopper GPU's);
    low_bit: which kernel scans the low-bit pages: "mosaic" (`pallas_kernels.decode_mgpu`; needs a Hopper
      GPU and a config `mosaic_low_bit_fits`), "triton" (the Triton kernel, with the other regions) or
      "auto" (mosaic where it runs and the cache has room for at least MOSAIC_MIN_PAGES pages over all
      sequences and KV heads, else triton);
    mosaic_blocks_per_sm, mosaic_stages: the Mosaic kernel's blocks per multiprocessor (`mosaic_splits`) and
      pages in flight per block; mosaic_splits: that split count itself (overrides mosaic_blocks_per_sm).
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

    def __post_init__(self):
        for name in ("n_low", "n_vl", "pages_per_tile", "num_stages", "sm_count", "mosaic_splits"):
            value = getattr(self, name)
            if value is not None and not _is_count(value):
                raise ValueError(f"DecodeTuning.{name} must be None or an int >= 1, got {value!r}")
        for name in ("mosaic_blocks_per_sm", "mosaic_stages"):
            if not _is_count(getattr(self, name)):
                raise ValueError(f"DecodeTuning.{name} must be an int >= 1, got {getattr(self, name)!r}")
        if self.num_warps is not None and (not _is_count(self.num_warps) or self.num_warps not in TRITON_WARPS):
            raise ValueError(f"DecodeTuning.num_warps must be None or one of {TRITON_WARPS}, got {self.num_warps!r}")
        if self.convert not in CONVERTS:
            raise ValueError(f"DecodeTuning.convert must be one of {CONVERTS}, got {self.convert!r}")
        if self.low_bit not in LOW_BIT_KERNELS:
            raise ValueError(f"DecodeTuning.low_bit must be one of {LOW_BIT_KERNELS}, got {self.low_bit!r}")


def _is_count(value) -> bool:
    return type(value) is int and value >= 1  # not a bool


def check_tuning(tuning, name: str = "tuning") -> DecodeTuning | None:
    """`tuning` if it is None (the plan's defaults) or a `DecodeTuning`; anything else is a ValueError naming
    the argument `name`."""
    if tuning is not None and not isinstance(tuning, DecodeTuning):
        raise ValueError(f"{name} must be None or a hyquant_jax.decode_launch.DecodeTuning, got {tuning!r}")
    return tuning


# ----------------------------------------------------------------------------- fit rules and implementations

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


def triton_unfit(cache: HybridKVCache, config: HyQuantConfig) -> str | None:
    """Why `pallas_kernels.decode` cannot scan this cache and config (static facts only), or None where it can."""
    per_token_scales = any(mode in ("sym", "asym") for mode in _modes(config))
    if per_token_scales and (config.group_size or cache.head_dim) < triton_decode.MIN_GROUP:
        return (f"the Pallas decode kernel needs group_size >= {triton_decode.MIN_GROUP} (dot operands of >= "
                f"{triton_decode.MIN_GROUP} channels); got group_size={config.group_size}; use backend='reference'")
    if cache.head_dim not in triton_decode.HEAD_DIMS:
        return f"the Pallas decode kernel supports head_dim {triton_decode.HEAD_DIMS}; got {cache.head_dim}"
    return None


def mosaic_low_bit_fits(cache: HybridKVCache, config: HyQuantConfig, q_heads: int) -> bool:
    """Whether `pallas_kernels.decode_mgpu` covers this cache and config (static facts only)."""
    return (config.key_bits == 4 and config.value_bits == 4 and config.scheme == "channel_key"
            and config.group_size in (None, cache.head_dim) and config.block_size == decode_mgpu.PAGE
            and cache.head_dim == decode_mgpu.HEAD_DIM and q_heads // cache.num_kv_heads <= decode_mgpu.ROWS)


def _triton_unsupported(device, cache: HybridKVCache, config: HyQuantConfig, q_heads: int,
                        interpret: bool = False) -> str | None:
    return backends.needs_gpu(device, interpret, "Triton decode kernel") or triton_unfit(cache, config)


def _mosaic_unsupported(device, cache: HybridKVCache, config: HyQuantConfig, q_heads: int,
                        interpret: bool = False) -> str | None:
    if interpret or not backends.is_hopper(device) or not mosaic_low_bit_fits(cache, config, q_heads):
        return ("the Mosaic low-bit decode kernel needs a Hopper GPU (not interpret mode), key_bits = value_bits "
                "= 4, scheme 'channel_key', group_size None, block_size 64, head_dim 128 and at most 16 query "
                f"heads per KV head; got {config}, head_dim {cache.head_dim}, {q_heads} query / "
                f"{cache.num_kv_heads} KV heads on {getattr(device, 'device_kind', device.platform)}")
    return triton_unfit(cache, config)  # the Triton kernel still scans the VL tokens and the ring


# unsupported(device, cache, config, q_heads, interpret): the reason an implementation cannot run, or None
IMPLEMENTATIONS = {implementation.name: implementation for implementation in (
    Implementation("mosaic", _mosaic_unsupported),
    Implementation("triton", _triton_unsupported),
    Implementation("reference", backends.runs_anywhere),
)}


def resolve(backend: str, cache: HybridKVCache, config: HyQuantConfig, q_heads: int, device=None) -> str:
    """The path `hyquant_jax.decode_step` takes for `backend`: "reference", "triton" (the kernels: which one
    scans the low-bit pages is `plan`'s choice) or "interpret" (the same in interpret mode). "auto": "triton"
    where a kernel implementation runs on `device` (default: the first JAX device), else "reference";
    "mosaic": "triton"."""
    backends.check_backend(backend)
    if backend == "auto":
        device = backends.default_device(device)
        name = backends.first_supported(IMPLEMENTATIONS.values(), device, cache, config, q_heads)
        return "reference" if name == "reference" else "triton"
    return "triton" if backend == "mosaic" else backend


# ----------------------------------------------------------------------------- planning

@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """Every static choice of one `decode_attention` call (hashable: `_run` takes it as a static argument).

    low_bit: the implementation that scans the low-bit pages, "triton" or "mosaic";
    layout: the Triton launch (n_low = 0 when low_bit is "mosaic": it scans the VL tokens and the ring);
    num_warps, num_stages: the Triton launch's;
    mosaic_splits, mosaic_stages: the Mosaic launch's splits per (sequence, KV head) and pages in flight per
      block (None when low_bit is "triton");
    merge: "kernel" (`pallas_kernels.decode_merge`, one launch) or "xla" (`pallas_kernels.decode.merge_splits`);
    interpret: the Pallas kernels in interpret mode.
    """

    low_bit: str
    layout: DecodeLayout
    num_warps: int
    num_stages: int
    mosaic_splits: int | None
    mosaic_stages: int | None
    merge: str
    interpret: bool


def plan(cache: HybridKVCache, config: HyQuantConfig, q_heads: int, tuning: DecodeTuning | None = None,
         device=None, interpret: bool = False, ring_logits: bool = False) -> DecodePlan:
    """The launches of `decode_attention` (static facts only).

    cache: a `HybridKVCache` (its arrays or their `jax.ShapeDtypeStruct`s: only shapes are read);
    q_heads: query heads; tuning: None for the defaults; device: the device to plan for (default: the first
    JAX device; any object with `platform` and, for a GPU, `compute_capability` and `core_count`, so a Hopper
    plan can be made on a CPU); ring_logits: the Triton launch also writes the ring's logits.
    Raises where the tuning asks for a kernel that cannot run, or the Triton kernel cannot scan the cache.
    """
    tuning = DecodeTuning() if check_tuning(tuning) is None else tuning
    device = backends.default_device(device)
    low_bit = _low_bit(cache, config, q_heads, tuning, device, interpret)
    mosaic = low_bit == "mosaic"
    lay = decode_layout(cache, config, q_heads, tuning, low_bit_elsewhere=mosaic, ring_logits=ring_logits,
                        device=device)
    splits = None
    if mosaic:
        splits = tuning.mosaic_splits or mosaic_splits(cache.batch, cache.num_kv_heads, cache.page_count.shape[1],
                                                       _multiprocessors(tuning, device), tuning.mosaic_blocks_per_sm)
    merge = "kernel" if mosaic or merge_fits(lay.num_splits, lay.group) else "xla"
    return DecodePlan(low_bit=low_bit, layout=lay, num_warps=tuning.num_warps or 4,
                      num_stages=tuning.num_stages or 3, mosaic_splits=splits,
                      mosaic_stages=tuning.mosaic_stages if mosaic else None, merge=merge, interpret=interpret)


def _low_bit(cache: HybridKVCache, config: HyQuantConfig, q_heads: int, tuning: DecodeTuning, device,
             interpret: bool) -> str:
    """The kernel that scans the low-bit pages (see `DecodeTuning.low_bit`); raises for "mosaic" where it cannot
    run."""
    if tuning.low_bit == "triton":
        return "triton"
    why_not = IMPLEMENTATIONS["mosaic"].unsupported(device, cache, config, q_heads, interpret)
    if tuning.low_bit == "mosaic":
        if why_not is not None:
            raise ValueError(f"DecodeTuning.low_bit='mosaic': {why_not}")
        return "mosaic"
    large = cache.batch * cache.num_kv_heads * cache.page_count.shape[1] >= MOSAIC_MIN_PAGES
    return "mosaic" if why_not is None and large else "triton"


def _multiprocessors(tuning: DecodeTuning, device=None) -> int:
    """`tuning.sm_count`, or where it is None the device's (`backends.multiprocessor_count`)."""
    return backends.multiprocessor_count(device) if tuning.sm_count is None else tuning.sm_count


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def _pow2_ceil(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


def _largest_pow2_divisor(n: int, cap: int) -> int:
    t = cap
    while n % t:
        t //= 2
    return t


def decode_layout(cache: HybridKVCache, config: HyQuantConfig, q_heads: int,
                  tuning: DecodeTuning = DecodeTuning(), low_bit_elsewhere: bool = False,
                  ring_logits: bool = False, device=None) -> DecodeLayout:
    """The Triton launch's static layout for this cache shape, config and tuning (`plan` makes it).

    low_bit_elsewhere: the Mosaic kernel scans the low-bit pages (n_low = 0); the Triton kernel's splits then
    cover the VL tokens (about 512 per split, up to half the fill) and the ring. ring_logits: the kernel also
    writes the ring's logits (`decode_attention(..., ring_logits=True)`). device: whose multiprocessors the
    splits fill (default: the first JAX device; `DecodeTuning.sm_count` overrides)."""
    why_not = triton_unfit(cache, config)
    if why_not is not None:
        raise NotImplementedError(why_not)
    b, h, d = cache.batch, cache.num_kv_heads, cache.head_dim
    group = q_heads // h
    key_mode, value_mode = _modes(config)
    channel_group = config.group_size or d
    num_pages = cache.page_count.shape[1]
    ppt = tuning.pages_per_tile
    if ppt is None:
        ppt = max(1, 128 // config.block_size)
    ppt = min(ppt, num_pages)
    if num_pages % ppt:
        ppt = 1
    # Splits: enough thread blocks to fill the GPU at small batch, and at most MAX_SPLIT_TOKENS per split
    # at any batch.
    fill = _pow2_floor(4 * _multiprocessors(tuning, device) // (b * h))
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


def mosaic_splits(batch: int, kv_heads: int, pages: int, sms: int, per_sm: int = 2) -> int:
    """Splits per (sequence, KV head) for the Mosaic low-bit kernel over `pages` pages on `sms` multiprocessors.

    While batch * kv_heads * splits blocks fit one wave (`decode_mgpu.RESIDENT_BLOCKS_PER_SM` blocks per
    multiprocessor, `per_sm` if larger), the splits give `per_sm` blocks per multiprocessor, at least 2 and at
    most one per page. Past one wave, the split count (at least 2) minimises waves x (pages per block +
    MOSAIC_BLOCK_OVERHEAD_PAGES): the time if each wave waits for its slowest block. Why these rules and not
    fewer blocks per multiprocessor or one split: docs/design.md, "Split heuristic".
    """
    units = max(batch * kv_heads, 1)
    splits = max(1, min(pages, max(2, math.ceil(sms * per_sm / units))))
    resident = sms * max(decode_mgpu.RESIDENT_BLOCKS_PER_SM, per_sm)
    if units * splits <= resident:
        return splits

    def cost(s: int) -> int:
        return math.ceil(units * s / resident) * (math.ceil(pages / s) + MOSAIC_BLOCK_OVERHEAD_PAGES)

    return min(range(min(2, pages), max(pages, 1) + 1), key=lambda s: (cost(s), s))


# ----------------------------------------------------------------------------- queries

def query_groups(q, kv_heads: int, scale):
    """q [B, Hq, D] -> q * scale, float32 [B, kv_heads, Hq // kv_heads, D]: the query rows of each KV head's
    GQA group, from which every kernel's query is prepared (`_triton_query`, `decode_mgpu.kernel_query`,
    `token_logits`; the Mosaic kernel prepares a bf16 q itself the same way, `_mosaic_low_bit`)."""
    b, hq, d = q.shape
    return (q.astype(jnp.float32) * scale).reshape(b, kv_heads, hq // kv_heads, d)


def _pad_rows(x, rows: int):
    """x [B, H, group, ...] -> [B, H, rows, ...], zero rows past the group."""
    return jnp.pad(x, ((0, 0), (0, 0), (0, rows - x.shape[2])) + ((0, 0),) * (x.ndim - 3))


def _triton_query(q, lay: DecodeLayout, scale):
    """q [B, Hq, D] -> the Triton kernel's q: scaled bf16 [B, H, rows, D] (GQA rows padded with zeros)."""
    return _pad_rows(query_groups(q, lay.kv_heads, scale), lay.rows).astype(jnp.bfloat16)


def token_logits(q, k, active, lay: DecodeLayout, scale):
    """Scaled logits of a key that is not in the cache: q [B, Hq, D], k [B, H, D], active bool [B] ->
    float32 [B, H, rows] (the Triton kernel's bf16 queries, float32 sums; -inf where not active)."""
    # bf16 rounding as an explicit op: XLA drops a float32 -> bf16 -> float32 convert pair inside a fusion
    # (excess precision), which left these logits off the kernel's (docs/design.md, "The step's own token")
    qg = jax.lax.reduce_precision(query_groups(q, lay.kv_heads, scale), exponent_bits=8, mantissa_bits=7)
    kb = jax.lax.reduce_precision(k.astype(jnp.float32), exponent_bits=8, mantissa_bits=7)
    logits = jnp.sum(qg * kb[:, :, None, :], axis=-1)  # a float32 sum, not a dot (which XLA may run in TF32)
    logits = _pad_rows(logits, lay.rows)
    return jnp.where(active[:, None, None], logits, -jnp.inf)


# ----------------------------------------------------------------------------- the launches

def _mosaic_low_bit(q, cache: HybridKVCache, scale: float, splits: int, stages: int):
    """The low-bit pages through `pallas_kernels.decode_mgpu`, as the kernel writes them (o, ml), for
    `decode_merge`. q: [B, Hq, D]."""
    # A bf16 q goes in as it is and each block prepares its rows (no XLA conversion launch between the q/k
    # norm + RoPE kernel and this one, which is on every layer's critical path at B=1).
    bf16 = q.dtype == jnp.bfloat16
    return decode_mgpu.low_bit_splits(
        q if bf16 else decode_mgpu.kernel_query(query_groups(q, cache.num_kv_heads, scale)), cache.k_codes,
        cache.k_scale, cache.k_zero, cache.v_codes, cache.v_scale[..., 0], cache.v_zero[..., 0], cache.page_count,
        cache.num_pages, num_splits=splits, stages=stages, packed=True, query_scale=float(scale) if bf16 else None)


def _triton_splits(q, cache: HybridKVCache, p: DecodePlan, scale):
    """The Triton kernel's splits over the regions `p.layout` gives it. q: [B, Hq, D].

    Returns (o f32 [B, H, NS, rows, D], m, l f32 [B, H, NS, rows], ring logits f32 [B, H, rows, ring_size] or
    None without `layout.ring_logits`)."""
    qg = _triton_query(q, p.layout, scale)
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
        lay=p.layout, num_warps=p.num_warps, num_stages=p.num_stages, interpret=p.interpret,
    )
    return o, m, l, (ring[0] if ring else None)


@jax.jit(static_argnames=("p", "scale"))
def _run(q, cache: HybridKVCache, p: DecodePlan, scale, new_token=None):
    """(out, lse), with `p.layout.ring_logits` also the ring logits [B, Hq, R], and with a new token as well
    its logits [B, Hq] (which `decode_attention` places at its ring slot, outside: see its token_slot)."""
    b, hq, d = q.shape
    lay = p.layout
    low = None
    if p.low_bit == "mosaic":
        low = _mosaic_low_bit(q, cache, scale, p.mosaic_splits, p.mosaic_stages)
    o, m, l, ring = _triton_splits(q, cache, p, scale)
    token = None
    if new_token is not None:  # the step's own token: one more split of one key, merged with the others
        k, v, active = new_token
        token = (token_logits(q, k, active, lay, scale), v)
    if p.merge == "kernel":
        # The splits (both launches' when the Mosaic kernel ran, read as it wrote them) in one merge launch
        # instead of XLA's dependent fusions (docs/design.md, "The split merge kernel").
        out, lse = merge_hybrid_splits(o, m, l, *(low or (None, None)), token, group=lay.group,
                                       out_dtype=q.dtype, interpret=p.interpret)
    else:
        out, lse = merge_splits(o, m, l, lay.group, token)
    if not lay.ring_logits:
        return out.astype(q.dtype), lse
    ring = ring[:, :, :lay.group].reshape(b, hq, lay.ring_size)
    if token is None:
        return out.astype(q.dtype), lse, ring
    return out.astype(q.dtype), lse, ring, token[0][:, :, :lay.group].reshape(b, hq)


def decode_attention(q, cache: HybridKVCache, config: HyQuantConfig, interpret: bool = False,
                     scale: float | None = None, tuning: DecodeTuning | None = None, ring_logits: bool = False,
                     new_token=None, token_slot=None):
    """Hybrid decode attention through the Pallas kernels (`plan` picks them).

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
    p = plan(cache, config, hq, tuning, interpret=interpret, ring_logits=ring_logits)
    result = _run(q, cache, p, scale if scale is not None else 1.0 / math.sqrt(d), new_token)
    if new_token is None or not ring_logits:
        return result
    out, lse, ring, logits = result  # the token's logit at the ring slot that the caller's append fills
    slot = (cache.ring_start + cache.ring_len) % config.ring_size if token_slot is None else token_slot
    at = (jnp.arange(config.ring_size)[None, :] == slot[:, None]) & new_token[2][:, None]  # [B, R]
    return out, lse, jnp.where(at[:, None, :], logits[..., None], ring)


def decode_step(q, k, v, cache: HybridKVCache, config: HyQuantConfig, *, interpret: bool = False, active=None,
                scale: float | None = None, flush: bool = True, tuning: DecodeTuning | None = None):
    """The kernel path of `hyquant_jax.decode_step`: make room in full window rings (flush=False: the caller
    did, `flush_full_rings`), attend over the cache as it was with this step's k, v [B, Hkv, D] as one more
    split (`decode_attention(..., new_token=...)`), append them, update the ring scores from the kernels'
    ring logits. q: [B, Hq, D]. Returns (out [B, Hq, D], new cache).

    The append writes the ring the Triton launch reads, so XLA runs it after that launch, off the path from q
    to the output (docs/design.md, "The step's own token").
    """
    ring_logits = config.flush_vl_count > 0  # ring scores are kept only when flushed tokens can be promoted
    want = (cache.batch, cache.num_kv_heads, cache.head_dim)
    if k.shape != want or v.shape != want:
        raise ValueError(f"decode_step: k and v must be [B, H_kv, D]={want}, got {k.shape} and {v.shape}")
    active = jnp.ones((cache.batch,), bool) if active is None else jnp.asarray(active)
    if active.shape != (cache.batch,):
        raise ValueError(f"decode_step: active must be bool [B]={(cache.batch,)}, got {active.shape}")
    active = active.astype(bool)
    if flush:
        (cache,) = flush_full_rings((cache,), config, active)
    appended = append(cache, k, v, config, active=active, flush=False, backend="interpret" if interpret else "triton")
    # The token's ring slot from the appended cache: the append advances ring_len in place, and a reader of the
    # old value after it costs two s32 copies a layer and step (inactive rows: masked there).
    slot = (appended.ring_start + appended.ring_len - 1) % config.ring_size
    out, lse, *logits = decode_attention(q, cache, config, interpret=interpret, scale=scale, ring_logits=ring_logits,
                                         new_token=(k, v, active), token_slot=slot, tuning=tuning)
    cache = accumulate_ring_scores(appended, q, lse, config, scale=scale, ring_logits=logits[0] if logits else None)
    return out, cache
