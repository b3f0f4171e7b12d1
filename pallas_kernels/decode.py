"""Pallas GPU (Triton) kernel: decode attention over a hybrid low-bit + bf16 KV cache.

One query token per sequence attends to three key sets of one KV head:

* a paged low-bit region (2/4/8-bit packed codes, or raw 16-bit), scanned in
  tiles and dequantized in registers: per-token key scales multiply the
  logits, per-channel (channel_key) keys are dequantized in the tile, the
  value scale is folded into the probabilities, so no dequantized copy of the
  cache is ever written;
* a full-precision vertical-line (VL) region;
* a full-precision window ring.

Grid: (batch * kv_heads, splits). The query heads of one KV head (its GQA
group) are the rows of every matmul, padded to `rows` >= 16, so each K/V
tile is read from HBM once per group. Splits [0, n_low) share the used pages
of the low-bit region (n_low may be 0 when another kernel scans it, see
`pallas_kernels.decode_mgpu`), splits [n_low, n_low + n_vl) share the VL tokens and
the last split scans the ring. Each split writes its unnormalized output,
running max and denominator; `merge_splits` combines them by log-sum-exp.

Packed layout (see hyquant_jax/quant.py): with n = 8 // bits codes per byte
and Dp = D // n bytes per row, code j of byte i is dim j * Dp + i, in bits
[j*bits, (j+1)*bits). A loaded byte tile therefore unpacks into n contiguous
slices of dims with shifts and masks only (no in-register slicing, which
Triton cannot lower).

Code -> float conversion (`_Codes`, `DecodeLayout.convert`):
* "asm" (default): inline PTX turns 4 packed bytes into fp16 values
  unit * (code - center), unit = 2**shift, with prmt + lop3 + one f16x2
  subtraction (~1.25 instructions per code instead of a shift, mask and
  convert per code); the dots run in fp16 with 1 / unit folded into q (or,
  under channel_key, into the per-channel key scale) and into the stored
  output. Symmetric codes come out centered, so no offset
  terms remain. Interpret mode computes the same values with jnp. fp16
  operands need |q| / sqrt(D) (and, under channel_key, the dequantized keys)
  below 65504; convert="magic" keeps bf16's range.
* "magic": the bf16 with bits 0x4300 | u is exactly 128 + u (u < 128); the
  128 * sum(...) excess is removed per row with sums computed once per tile.
* "cast": u -> bf16 by conversion.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

NEG_INIT = -1e30  # running-max start: finite, so empty tiles never give inf - inf
MAGIC = 128.0
HEAD_DIMS = (64, 128, 256)
MIN_GROUP = 16  # channels per per-token scale, at least: the dot operands of a group's slice


@dataclasses.dataclass(frozen=True)
class DecodeLayout:
    """Static description of the cache arrays and the launch (hashable).

    key_mode: "sym" | "asym" | "channel" | "raw"; value_mode: "sym" | "asym" | "raw".
    key_group / value_group: channels per per-token scale (ignored for raw / channel).
    """

    kv_heads: int
    group: int  # real query rows per KV head
    rows: int  # padded rows (power of two, >= 16)
    head_dim: int
    key_bits: int
    value_bits: int
    key_mode: str
    value_mode: str
    key_group: int
    value_group: int
    block: int  # page size in slots
    pages_per_tile: int
    n_low: int
    n_vl: int
    vl_tile: int
    ring_tile: int
    ring_size: int
    convert: str  # "asm", "magic" or "cast" (see _Codes)
    ring_logits: bool = False  # also write the ring split's logits (for the ring scores, see hybrid_decode_splits)

    @property
    def num_splits(self) -> int:
        return self.n_low + self.n_vl + 1


def _parts(bits: int, head_dim: int, group: int, mode: str):
    """Static list of (byte_col0, width, shift, dim0, group_index) slices of a packed row.

    Each slice is loaded as a [tile, width] byte block; shifting by `shift` and
    masking gives the codes of dims [dim0, dim0 + width), all in one scale group.
    """
    if mode == "raw":
        return [(0, head_dim, 0, 0, 0)]
    n = 8 // bits
    dp = head_dim // n
    width = dp if mode == "channel" else min(dp, group)
    out = []
    for c in range(dp // width):
        for j in range(n):
            dim0 = j * dp + c * width
            out.append((c * width, width, j * bits, dim0, dim0 // group if mode != "channel" else 0))
    return out


@dataclasses.dataclass(frozen=True)
class _Codes:
    """How one packed slice becomes a float tile f = unit * (code - center).

    The true (signed) code is code - half, so code - half = f / unit + delta
    with delta = center - half; dot products fold 1 / unit into the other
    operand and add delta * (row sums) only where delta != 0.
    """

    shift: int  # bit offset of the code in its byte
    bits: int
    half: float  # 2**(bits-1) for symmetric schemes, else 0
    convert: str

    @property
    def unit(self) -> float:
        return float(1 << self.shift) if self.convert == "asm" else 1.0

    @property
    def center(self) -> float:
        if self.convert == "asm":
            return self.half  # codes come out centered: no offset terms at all
        return -MAGIC if self.convert == "magic" and self.bits < 8 else 0.0

    @property
    def delta(self) -> float:
        return self.center - self.half

    @property
    def dtype(self):
        return jnp.float16 if self.convert == "asm" else jnp.bfloat16


def _unpack(byte_tile, c: _Codes, interpret: bool):
    """uint8 tile -> float tile unit * (code - center) of the codes at bits [shift, shift + bits)."""
    mask = (1 << c.bits) - 1
    if c.convert != "asm":
        u = (byte_tile >> c.shift) & mask if c.shift or mask != 255 else byte_tile
        if c.convert == "magic" and c.bits < 8:
            return lax.bitcast_convert_type(u.astype(jnp.uint16) | jnp.uint16(0x4300), jnp.bfloat16)
        return u.astype(jnp.bfloat16)
    if interpret:  # same values as the PTX below, for CPU interpret mode
        u = ((byte_tile >> c.shift) & mask).astype(jnp.float32)
        return (c.unit * (u - c.center)).astype(jnp.float16)
    [out] = plgpu.elementwise_inline_asm(
        _asm_unpack(c), args=[byte_tile], constraints="=r,=r,r", pack=4,
        result_shape_dtypes=[jax.ShapeDtypeStruct(byte_tile.shape, jnp.float16)])
    return out


def _asm_unpack(c: _Codes) -> str:
    """PTX turning 4 bytes into 4 fp16 values unit * (code - center), 10 instructions per 8 codes of a byte pair.

    prmt moves bytes 0,1 (then 2,3) into the low bytes of the two 16-bit lanes;
    lop3 keeps the code's bits and ORs in 0x6400 (fp16 1024, whose ulp is 1):
    the lane is then exactly 1024 + unit * code; one f16x2 subtraction of
    1024 + unit * center leaves unit * (code - center), exact in fp16.
    """
    mask = ((1 << c.bits) - 1) << c.shift
    sub = 0x6400 + int(c.unit * c.center)  # fp16 bits of 1024 + unit * center (< 2048: ulp 1)
    return (
        "{\n.reg .b32 t0, t1, k;\n"
        "prmt.b32 t0, $2, $2, 0x1100;\n"
        "prmt.b32 t1, $2, $2, 0x3322;\n"
        f"lop3.b32 $0, t0, {mask | mask << 16:#010x}, 0x64006400, 0xEA;\n"
        f"lop3.b32 $1, t1, {mask | mask << 16:#010x}, 0x64006400, 0xEA;\n"
        f"mov.b32 k, {sub | sub << 16:#010x};\n"
        "sub.f16x2 $0, $0, k;\n"
        "sub.f16x2 $1, $1, k;\n}"
    )


def _dot_t(a, b):
    """a [M, K] . b[N, K]^T -> float32 [M, N]."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot(a, b):
    """a [M, K] . b [K, N] -> float32 [M, N]."""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _softmax_update(s, m_prev, l_prev):
    """Online softmax step for logits s [R, T] (invalid = -inf)."""
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new[:, None])
    return p, m_new, alpha, alpha * l_prev + jnp.sum(p, axis=1)


def _store_split(o_ref, m_ref, l_ref, b, h, split, accs, m, l, lay: DecodeLayout):
    row_ok = lax.broadcasted_iota(jnp.int32, (lay.rows,), 0) < lay.group
    for (dim0, width), acc in accs:
        plgpu.store(o_ref.at[b, h, split, :, pl.ds(dim0, width)], acc, mask=row_ok[:, None])
    plgpu.store(m_ref.at[b, h, split, :], jnp.where(l > 0, m, -jnp.inf), mask=row_ok)
    plgpu.store(l_ref.at[b, h, split, :], l, mask=row_ok)


def _kernel(
    num_pages_ref, page_count_ref, num_vl_ref, ring_start_ref, ring_len_ref,
    q_ref, kc_ref, ks_ref, kz_ref, vc_ref, vs_ref, vz_ref, vlk_ref, vlv_ref, rk_ref, rv_ref,
    o_ref, m_ref, l_ref, *ring_logits_ref, lay: DecodeLayout, interpret: bool,
):
    bh, split = pl.program_id(0), pl.program_id(1)
    b, h = bh // lay.kv_heads, bh % lay.kv_heads
    rows, d = lay.rows, lay.head_dim
    m0 = jnp.full((rows,), NEG_INIT, jnp.float32)
    l0 = jnp.zeros((rows,), jnp.float32)

    @pl.when(split < lay.n_low)  # n_low = 0: the low-bit region runs elsewhere (hyquant_jax.decode_launch)
    def _low_bit():
        if not lay.n_low:
            return
        _low_bit_split(num_pages_ref, page_count_ref, q_ref, kc_ref, ks_ref, kz_ref, vc_ref, vs_ref, vz_ref,
                       o_ref, m_ref, l_ref, b, h, split, m0, l0, lay, interpret)

    def full_precision(k_ref, v_ref, count_fn, tile, num_tiles_fn, first_fn, split_out, logits_ref=None):
        q = q_ref[b, h, :, :].astype(jnp.bfloat16)
        acc0 = jnp.zeros((rows, d), jnp.float32)
        row_ok = lax.broadcasted_iota(jnp.int32, (rows,), 0) < lay.group

        def body(i, carry):
            m, l, acc = carry
            start = first_fn() + i * tile
            idx = start + lax.broadcasted_iota(jnp.int32, (tile,), 0)
            valid = count_fn(idx)
            k = k_ref[b, h, pl.ds(start, tile), :].astype(jnp.bfloat16)
            s = jnp.where(valid[None, :], _dot_t(q, k), -jnp.inf)
            if logits_ref is not None:
                plgpu.store(logits_ref.at[b, h, :, pl.ds(start, tile)], s, mask=row_ok[:, None])
            p, m, alpha, l = _softmax_update(s, m, l)
            v = v_ref[b, h, pl.ds(start, tile), :].astype(jnp.bfloat16)
            acc = alpha[:, None] * acc + _dot(p.astype(jnp.bfloat16), v)
            return m, l, acc

        m, l, acc = lax.fori_loop(0, num_tiles_fn(), body, (m0, l0, acc0))
        _store_split(o_ref, m_ref, l_ref, b, h, split_out, [((0, d), acc)], m, l, lay)

    @pl.when((split >= lay.n_low) & (split < lay.n_low + lay.n_vl))
    def _vl():
        j = split - lay.n_low
        count = num_vl_ref[b]
        per = _round_up(pl.cdiv(count, lay.n_vl), lay.vl_tile)
        t0 = j * per
        t1 = jnp.minimum(t0 + per, count)
        full_precision(vlk_ref, vlv_ref, lambda idx: idx < t1, lay.vl_tile,
                       lambda: pl.cdiv(jnp.maximum(t1 - t0, 0), lay.vl_tile), lambda: t0, split)

    @pl.when(split == lay.n_low + lay.n_vl)
    def _ring():
        start, length = ring_start_ref[b], ring_len_ref[b]
        full_precision(rk_ref, rv_ref, lambda idx: (idx - start + lay.ring_size) % lay.ring_size < length,
                       lay.ring_tile, lambda: lay.ring_size // lay.ring_tile, lambda: 0, split,
                       *ring_logits_ref)


def _round_up(x, m):
    return (x + m - 1) // m * m


def _low_bit_split(num_pages_ref, page_count_ref, q_ref, kc_ref, ks_ref, kz_ref, vc_ref, vs_ref, vz_ref,
                   o_ref, m_ref, l_ref, b, h, split, m0, l0, lay: DecodeLayout, interpret: bool):
    rows = lay.rows
    ppt = lay.pages_per_tile
    key_parts = _parts(lay.key_bits, lay.head_dim, lay.key_group, lay.key_mode)
    value_parts = _parts(lay.value_bits, lay.head_dim, lay.value_group, lay.value_mode)
    k_half = 2.0 ** (lay.key_bits - 1) if lay.key_mode == "sym" else 0.0
    v_half = 2.0 ** (lay.value_bits - 1) if lay.value_mode == "sym" else 0.0
    k_codes = [_Codes(shift, lay.key_bits, k_half, lay.convert) for (_, _, shift, _, _) in key_parts]
    v_codes = [_Codes(shift, lay.value_bits, v_half, lay.convert) for (_, _, shift, _, _) in value_parts]

    # Query slices (one per key part) in f32, their matmul operands (1 / unit folded in) and row sums.
    q_parts = [q_ref[b, h, :, pl.ds(dim0, width)].astype(jnp.float32) for (_, width, _, dim0, _) in key_parts]
    q_sums = [jnp.sum(x, axis=1) for x in q_parts]
    # Under channel keys the unit is folded into the per-channel scale instead (see logits).
    q_dots = [(x if lay.key_mode == "channel" else x / c.unit).astype(c.dtype) for x, c in zip(q_parts, k_codes)]

    pages = num_pages_ref[b]
    per = _round_up(pl.cdiv(pages, lay.n_low), ppt)
    p0 = split * per
    p1 = jnp.minimum(p0 + per, pages)
    n_iter = pl.cdiv(jnp.maximum(p1 - p0, 0), ppt)

    # A loop iteration scans ppt pages as n_sub sub-tiles of `sub` tokens: one per page under channel
    # keys (one key scale per channel and page), else one tile. All sub-tiles share one softmax update.
    sub_pages = 1 if lay.key_mode == "channel" else ppt
    n_sub, sub = ppt // sub_pages, sub_pages * lay.block
    slot = lax.broadcasted_iota(jnp.int32, (sub,), 0)
    slot_page, slot_within = slot // lay.block, slot % lay.block
    accs0 = [jnp.zeros((rows, width), jnp.float32) for (_, width, _, _, _) in value_parts]

    def logits(page, t0):
        """Logits [rows, sub] of the `sub` low-bit keys from slot t0 (page `page`), unmasked."""
        s = jnp.zeros((rows, sub), jnp.float32)
        if lay.key_mode == "raw":
            k = kc_ref[b, h, pl.ds(t0, sub), :].astype(jnp.bfloat16)
            return s + _dot_t(q_parts[0].astype(jnp.bfloat16), k)
        loaded = {}
        group_raw, group_qsum = {}, {}  # per scale group: sum_j q_j . (code_j - half), sum of q
        for (col0, width, _, dim0, grp), c, qd, qs in zip(key_parts, k_codes, q_dots, q_sums):
            if col0 not in loaded:
                loaded[col0] = kc_ref[b, h, pl.ds(t0, sub), pl.ds(col0, width)]
            kf = _unpack(loaded[col0], c, interpret)
            if lay.key_mode == "channel":
                # k = code * sc + zero per channel of this page, dequantized in the tile (one multiply-add per
                # element): the query stays loop-invariant, with no per-page rescaled copy of it, no bias
                # reduction and no per-page layout conversion. kf = unit * (code - center).
                sc = ks_ref[b, h, page, pl.ds(dim0, width)].astype(jnp.float32)
                zc = kz_ref[b, h, page, pl.ds(dim0, width)].astype(jnp.float32)
                codes = kf + jnp.asarray(c.unit * c.center, kf.dtype) if c.center else kf
                kd = codes * (sc / c.unit).astype(kf.dtype)[None, :] + zc.astype(kf.dtype)[None, :]
                s = s + _dot_t(qd, kd)
                continue
            raw = _dot_t(qd, kf)
            if c.delta:
                raw = raw + c.delta * qs[:, None]
            group_raw[grp] = group_raw[grp] + raw if grp in group_raw else raw
            group_qsum[grp] = group_qsum[grp] + qs if grp in group_qsum else qs
        for grp, raw in group_raw.items():
            sc = ks_ref[b, h, pl.ds(t0, sub), grp].astype(jnp.float32)
            s = s + sc[None, :] * raw
            if lay.key_mode == "asym":
                zc = kz_ref[b, h, pl.ds(t0, sub), grp].astype(jnp.float32)
                s = s + zc[None, :] * group_qsum[grp][:, None]
        return s

    def sub_tile(first_page):
        """(masked logits, first slot) of the sub-tile starting at `first_page`."""
        count = jnp.zeros((sub,), jnp.int32)
        for k in range(sub_pages):  # tokens held by each page of the sub-tile
            count = jnp.where(slot_page == k, page_count_ref[b, first_page + k], count)
        valid = (slot_within < count) & (first_page + slot_page < p1)
        t0 = first_page * lay.block
        return jnp.where(valid[None, :], logits(first_page, t0), -jnp.inf), t0

    def body(i, carry):
        m, l, accs = carry
        tiles = [sub_tile(p0 + i * ppt + j * sub_pages) for j in range(n_sub)]
        m_new = m
        for s, _ in tiles:
            m_new = jnp.maximum(m_new, jnp.max(s, axis=1))
        alpha = jnp.exp(m - m_new)
        probs = [jnp.exp(s - m_new[:, None]) for s, _ in tiles]
        l = alpha * l
        for p in probs:
            l = l + jnp.sum(p, axis=1)

        # Accumulators hold unit * (sum of p * v) per value part; the store divides by unit.
        new_accs = [alpha[:, None] * acc for acc in accs]
        for p, (_, t0) in zip(probs, tiles):
            loaded = {}
            for n, ((col0, width, _, dim0, grp), c) in enumerate(zip(value_parts, v_codes)):
                if lay.value_mode == "raw":
                    v = vc_ref[b, h, pl.ds(t0, sub), :].astype(jnp.bfloat16)
                    new_accs[n] = new_accs[n] + _dot(p.astype(jnp.bfloat16), v)
                    continue
                if col0 not in loaded:
                    loaded[col0] = vc_ref[b, h, pl.ds(t0, sub), pl.ds(col0, width)]
                vf = _unpack(loaded[col0], c, interpret)
                sc = vs_ref[b, h, pl.ds(t0, sub), grp].astype(jnp.float32)
                pp = (p * sc[None, :]).astype(c.dtype)
                acc = new_accs[n] + _dot(pp, vf)
                if c.delta:
                    acc = acc + (c.unit * c.delta * jnp.sum(pp.astype(jnp.float32), axis=1))[:, None]
                if lay.value_mode == "asym":
                    zc = vz_ref[b, h, pl.ds(t0, sub), grp].astype(jnp.float32)
                    acc = acc + (c.unit * jnp.sum(p * zc[None, :], axis=1))[:, None]
                new_accs[n] = acc
        return m_new, l, new_accs

    m, l, accs = lax.fori_loop(0, n_iter, body, (m0, l0, accs0))
    outs = [((dim0, width), acc * (1.0 / c.unit))
            for (_, width, _, dim0, _), c, acc in zip(value_parts, v_codes, accs)]
    _store_split(o_ref, m_ref, l_ref, b, h, split, outs, m, l, lay)


@functools.partial(jax.jit, static_argnames=("lay", "num_warps", "num_stages", "interpret"))
def hybrid_decode_splits(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, page_count, num_pages,
                         vl_k, vl_v, num_vl, ring_k, ring_v, ring_start, ring_len, *,
                         lay: DecodeLayout, num_warps: int, num_stages: int, interpret: bool = False):
    """Run the kernel; returns per-split (o [B,H,NS,rows,D] f32, m, l [B,H,NS,rows] f32), and with
    `lay.ring_logits` also the ring split's logits f32 [B, H, rows, ring_size] (q . k of every ring slot,
    -inf where the slot holds no token; rows past `lay.group` are not written).

    q: bf16 [B, H, rows, D] queries already multiplied by the softmax scale,
    zero rows past `lay.group` (bf16 so the row sums used by the offset terms
    are exact sums of what the matmuls see). Cache arrays as in `HybridKVCache`; unused scale /
    zero arrays may be any small placeholder array (they are never read).
    """
    b, h, rows, d = q.shape
    ns = lay.num_splits
    out_shape = [
        jax.ShapeDtypeStruct((b, h, ns, rows, d), jnp.float32),
        jax.ShapeDtypeStruct((b, h, ns, rows), jnp.float32),
        jax.ShapeDtypeStruct((b, h, ns, rows), jnp.float32),
    ] + ([jax.ShapeDtypeStruct((b, h, rows, lay.ring_size), jnp.float32)] if lay.ring_logits else [])
    return pl.pallas_call(
        functools.partial(_kernel, lay=lay, interpret=interpret),
        grid=(b * h, ns),
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="hyquant_decode",
    )(num_pages, page_count, num_vl, ring_start, ring_len, q, k_codes, k_scale, k_zero, v_codes, v_scale,
      v_zero, vl_k, vl_v, ring_k, ring_v)


def merge_splits(o, m, l, group: int, token=None):
    """Combine split results by log-sum-exp.

    o [B, H, NS, rows, D], m, l [B, H, NS, rows] -> (out [B, H*group, D] f32, lse [B, H*group] f32).
    Empty splits have m = -inf and l = 0; a sequence with no keys gets 0 and -inf. token: None or (logits f32
    [B, H, rows], v [B, H, D]): one more key outside the splits (a decode step's own token, attended before it
    is written to the cache), i.e. a split with m = logits, l = 1 and o = v; -inf logits leave it out.
    """
    if token is not None:
        t_m, t_v = token
        t_o = jnp.broadcast_to(t_v[:, :, None, None, :].astype(o.dtype), o.shape[:2] + (1,) + o.shape[3:])
        o = jnp.concatenate([o, t_o], 2)
        m = jnp.concatenate([m, t_m[:, :, None]], 2)
        l = jnp.concatenate([l, jnp.where(jnp.isfinite(t_m), 1.0, 0.0)[:, :, None]], 2)
    o, m, l = o[:, :, :, :group], m[:, :, :, :group], l[:, :, :, :group]
    peak = jnp.max(m, axis=2, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    w = jnp.exp(m - peak)  # -inf -> 0
    denom = jnp.sum(w * l, axis=2)
    out = jnp.sum(w[..., None] * o, axis=2) / jnp.where(denom > 0, denom, 1.0)[..., None]
    lse = jnp.where(denom > 0, jnp.log(jnp.where(denom > 0, denom, 1.0)) + peak[:, :, 0], -jnp.inf)
    b, h, g, d = out.shape
    return out.reshape(b, h * g, d), lse.reshape(b, h * g)
