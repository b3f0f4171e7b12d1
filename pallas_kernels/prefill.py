"""Hybrid-precision causal prefill attention: one Pallas GPU kernel (Triton lowering).

For one query block of `block_q` rows starting at position s (one query head,
one sequence) the kernel runs a single base-2 online softmax over three key
segments (paper Eq. 7, Algorithm 2):

1. quantized segment: the first `nq` rows of `kq`, keys already smoothed
   (per-head mean subtracted), quantized (int8 or fp8 e4m3, one scale per
   token) and reordered by the caller so that, for every query block, the
   non-VL keys before the block's full-precision band are a contiguous prefix.
   logit2 = (qq . kq) * qrow * ks + qbias, where qrow = s_q * scale * log2(e)
   and qbias = (q . key_mean) * scale * log2(e) restore the exact mean term.
   P.V uses the values reordered the same way (bf16, or fp8 e4m3 with one
   scale per channel when `pv_fp8`).
2. VL segment: the first `nvl` rows of `kvl`/`vvl` (bf16, sorted by position).
3. band: the original keys [band_start, s) (exact, no mask) and the diagonal
   [s, s + block_q) with the causal mask, in bf16.

With `uniform=True` (SageAttention-style baseline) segments 2 and 3 are off:
all keys [0, s) come from `kq` (natural order) and the diagonal is quantized
too, with the causal mask.

Per query block the caller supplies meta = (nq, nvl, band_start, length); the
kernel knows nothing about VTI, caches or models. Triton lowering rules
respected here: every load is a power-of-two block read from a ref (never a
slice of a loaded value), dot operands have dims >= 16, dots use
`lax.dot_general` with `preferred_element_type`, ragged segment lengths are
traced `fori_loop` bounds, masks are `jnp.where` on the logits, and the
running max starts at a finite value so masked tiles never produce NaN.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

LOG2E = math.log2(math.e)
FP8_MAX = 448.0
M_INIT = -1e30  # finite start of the running max: exp2(M_INIT - m) is 0, never NaN
QK_FORMATS = ("int8", "fp8", "bf16")

# q . k^T with both operands row-major [rows, D].
_NT = (((1,), (1,)), ((), ()))


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _prefill_kernel(
    meta_ref,  # [4] int32: nq, nvl, band_start, length
    q_ref,  # [BQ, D] bf16
    qq_ref,  # [BQ, D] int8 / fp8 / bf16
    qrow_ref,  # [BQ] f32
    qbias_ref,  # [BQ] f32
    kq_ref,  # [Tp, D] int8 / fp8 / bf16 (reordered)
    ks_ref,  # [Tp] f32 (reordered)
    vq_ref,  # [Tp, D] bf16, or [D, Tp] fp8 when pv_fp8 (reordered)
    vsc_ref,  # [D] f32 (per-channel V scale / 448 when pv_fp8)
    kvl_ref,  # [Kp, D] bf16
    vvl_ref,  # [Kp, D] bf16
    k_ref,  # [Tp, D] bf16 (natural order)
    v_ref,  # [Tp, D] bf16 (natural order)
    o_ref,  # [BQ, D]
    *,
    block_q: int,
    block_k: int,
    block_kb: int,
    num_q_blocks: int,
    exact_factor: float,
    qk_format: str,
    uniform: bool,
    pv_fp8: bool,
):
    c = num_q_blocks - 1 - pl.program_id(1)  # heaviest (last) query blocks first
    s = c * block_q
    nq = meta_ref[0]
    nvl = meta_ref[1]
    band_start = meta_ref[2]
    length = meta_ref[3]
    d = o_ref.shape[-1]
    rows = s + jnp.arange(block_q, dtype=jnp.int32)  # query positions

    acc = jnp.zeros((block_q, d), jnp.float32)
    m = jnp.zeros((block_q,), jnp.float32) + M_INIT
    l = jnp.zeros((block_q,), jnp.float32)
    carry = (acc, m, l)

    def update(carry, logits, pv):
        acc, m, l = carry
        m_new = jnp.maximum(m, jnp.max(logits, axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(logits - m_new[:, None])
        l = l * alpha + jnp.sum(p, axis=1)
        acc = acc * alpha[:, None] + pv(p)
        return acc, m_new, l

    def pv_bf16(v):
        return lambda p: lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.float32)

    # ------------------------------------------------------------ segment 1: quantized keys
    qq = qq_ref[...]
    if qk_format != "bf16":
        qrow = qrow_ref[...]
        qbias = qbias_ref[...]
    if pv_fp8:
        vsc = vsc_ref[...]

    def quant_tile(start, carry, size, mask):
        kq = kq_ref[pl.ds(start, size), :]
        if qk_format == "int8":
            dots = lax.dot_general(qq, kq, _NT, preferred_element_type=jnp.int32).astype(jnp.float32)
        else:
            dots = lax.dot_general(qq, kq, _NT, preferred_element_type=jnp.float32)
        if qk_format == "bf16":
            logits = dots * exact_factor
        else:
            ks = ks_ref[pl.ds(start, size)]
            logits = dots * qrow[:, None] * ks[None, :] + qbias[:, None]
        if mask is not None:
            logits = jnp.where(mask, logits, -jnp.inf)
        if pv_fp8:
            vt = vq_ref[:, pl.ds(start, size)]  # [D, size] fp8

            def pv(p):
                p8 = (p * FP8_MAX).astype(vt.dtype)
                o = lax.dot_general(p8, vt, _NT, preferred_element_type=jnp.float32)
                return o * vsc[None, :]
        else:
            pv = pv_bf16(vq_ref[pl.ds(start, size), :])
        return update(carry, logits, pv)

    n_full = lax.div(nq, block_k)
    n_part = lax.div(nq + (block_k - 1), block_k) - n_full  # 0 or 1 masked tile
    carry = lax.fori_loop(0, n_full, lambda i, cr: quant_tile(i * block_k, cr, block_k, None), carry)

    def quant_last(i, cr):
        start = (n_full + i) * block_k
        cols = start + jnp.arange(block_k, dtype=jnp.int32)
        return quant_tile(start, cr, block_k, (cols < nq)[None, :])

    carry = lax.fori_loop(0, n_part, quant_last, carry)

    if uniform:
        # Diagonal block through quantized Q.K with the causal mask.
        for t in range(block_q // block_kb):
            start = s + t * block_kb
            cols = start + jnp.arange(block_kb, dtype=jnp.int32)
            mask = (cols[None, :] <= rows[:, None]) & (cols[None, :] < length)
            carry = quant_tile(start, carry, block_kb, mask)
    else:
        q = q_ref[...]

        def exact_tile(kr, vr, start, carry, size, mask):
            kt = kr[pl.ds(start, size), :]
            logits = lax.dot_general(q, kt, _NT, preferred_element_type=jnp.float32) * exact_factor
            if mask is not None:
                logits = jnp.where(mask, logits, -jnp.inf)
            return update(carry, logits, pv_bf16(vr[pl.ds(start, size), :]))

        # ------------------------------------------------------------ segment 2: VL keys
        nv_full = lax.div(nvl, block_k)
        nv_part = lax.div(nvl + (block_k - 1), block_k) - nv_full
        carry = lax.fori_loop(
            0, nv_full, lambda i, cr: exact_tile(kvl_ref, vvl_ref, i * block_k, cr, block_k, None), carry)

        def vl_last(i, cr):
            start = (nv_full + i) * block_k
            cols = start + jnp.arange(block_k, dtype=jnp.int32)
            return exact_tile(kvl_ref, vvl_ref, start, cr, block_k, (cols < nvl)[None, :])

        carry = lax.fori_loop(0, nv_part, vl_last, carry)

        # ------------------------------------------------------------ segment 3: band + diagonal
        n_band = lax.div(s - band_start, block_kb)
        carry = lax.fori_loop(
            0, n_band, lambda i, cr: exact_tile(k_ref, v_ref, band_start + i * block_kb, cr, block_kb, None),
            carry)
        for t in range(block_q // block_kb):
            start = s + t * block_kb
            cols = start + jnp.arange(block_kb, dtype=jnp.int32)
            mask = (cols[None, :] <= rows[:, None]) & (cols[None, :] < length)
            carry = exact_tile(k_ref, v_ref, start, carry, block_kb, mask)

    acc, m, l = carry
    out = acc / jnp.where(l > 0.0, l, 1.0)[:, None]
    out = jnp.where((rows < length)[:, None], out, 0.0)
    o_ref[...] = out.astype(o_ref.dtype)


@functools.partial(
    jax.jit,
    static_argnames=("scale", "block_q", "block_k", "qk_format", "uniform", "pv_fp8", "num_warps",
                     "num_stages", "interpret", "out_dtype"),
)
def hybrid_prefill(
    meta, q, qq, qrow, qbias, kq, ks, vq, vsc, kvl, vvl, k, v, *,
    scale: float,
    block_q: int,
    block_k: int,
    qk_format: str = "int8",
    uniform: bool = False,
    pv_fp8: bool = False,
    num_warps: int,
    num_stages: int,
    interpret: bool = False,
    out_dtype=jnp.bfloat16,
):
    """Run the kernel on prepared arrays (see `hyquant_jax.prefill_launch` for the glue).

    Shapes (B batch, Hq query heads, Hkv KV heads, Tp padded length, a multiple
    of block_q and block_k; Kp VL capacity, a multiple of block_k; D head_dim):
      meta int32 [B, Hkv, Tp // block_q, 4] (nq, nvl, band_start, length) per query block;
      q [B, Hq, Tp, D] bf16; qq like q in the QK format; qrow, qbias f32 [B, Hq, Tp];
      kq [B, Hkv, Tp, D] (QK format), ks f32 [B, Hkv, Tp];
      vq bf16 [B, Hkv, Tp, D], or fp8 [B, Hkv, D, Tp] when pv_fp8; vsc f32 [B, Hkv, D];
      kvl, vvl bf16 [B, Hkv, Kp, D]; k, v bf16 [B, Hkv, Tp, D].
    `scale` is the softmax scale (the exact segments use scale * log2(e)).
    Returns [B, Hq, Tp, D] in out_dtype; rows at positions >= length are 0.
    """
    b, hq, tp, d = q.shape
    hkv = k.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    group = hq // hkv
    kp = kvl.shape[2]
    if qk_format not in QK_FORMATS:
        raise ValueError(f"qk_format must be one of {QK_FORMATS}, got {qk_format!r}")
    for name, val in (("block_q", block_q), ("block_k", block_k), ("head_dim", d)):
        if not _is_pow2(val) or val < 16:
            raise ValueError(f"{name} must be a power of two >= 16, got {val}")
    if tp % block_q or tp % block_k or kp % block_k:
        raise ValueError(f"padded length {tp} and VL capacity {kp} must be multiples of block_q={block_q} "
                         f"and block_k={block_k}")
    block_kb = min(block_k, block_q)
    nqb = tp // block_q
    if meta.shape != (b, hkv, nqb, 4):
        raise ValueError(f"meta must be {(b, hkv, nqb, 4)}, got {meta.shape}")

    kernel = functools.partial(
        _prefill_kernel, block_q=block_q, block_k=block_k, block_kb=block_kb, num_q_blocks=nqb,
        exact_factor=float(scale) * LOG2E, qk_format=qk_format, uniform=uniform, pv_fp8=pv_fp8)

    def kvh(h):
        return lax.div(h, jnp.int32(group))

    def qblk(cc):
        return nqb - 1 - cc

    # Grid (query head, query block, batch): the heads of one query block run
    # together, so the K/V rows a KV-head group reads are shared through L2.
    q_spec = pl.BlockSpec((None, None, block_q, d), lambda h, cc, bb: (bb, h, qblk(cc), 0))
    row_spec = pl.BlockSpec((None, None, block_q), lambda h, cc, bb: (bb, h, qblk(cc)))
    kv_full = pl.BlockSpec((None, None, tp, d), lambda h, cc, bb: (bb, kvh(h), 0, 0))
    in_specs = [
        pl.BlockSpec((None, None, None, 4), lambda h, cc, bb: (bb, kvh(h), qblk(cc), 0)),  # meta
        q_spec,  # q
        q_spec,  # qq
        row_spec,  # qrow
        row_spec,  # qbias
        kv_full,  # kq
        pl.BlockSpec((None, None, tp), lambda h, cc, bb: (bb, kvh(h), 0)),  # ks
        (pl.BlockSpec((None, None, d, tp), lambda h, cc, bb: (bb, kvh(h), 0, 0)) if pv_fp8 else kv_full),  # vq
        pl.BlockSpec((None, None, d), lambda h, cc, bb: (bb, kvh(h), 0)),  # vsc
        pl.BlockSpec((None, None, kp, d), lambda h, cc, bb: (bb, kvh(h), 0, 0)),  # kvl
        pl.BlockSpec((None, None, kp, d), lambda h, cc, bb: (bb, kvh(h), 0, 0)),  # vvl
        kv_full,  # k
        kv_full,  # v
    ]
    return pl.pallas_call(
        kernel,
        grid=(hq, nqb, b),
        in_specs=in_specs,
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct((b, hq, tp, d), out_dtype),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="hyquant_hybrid_prefill" if not uniform else "hyquant_uniform_prefill",
    )(meta, q, qq, qrow, qbias, kq, ks, vq, vsc, kvl, vvl, k, v)
