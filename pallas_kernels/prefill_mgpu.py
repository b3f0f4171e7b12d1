"""Hybrid-precision causal prefill attention as a Pallas Mosaic GPU kernel (Hopper: wgmma, TMA, warp specialization).

The same computation and the same prepared arguments as `pallas_kernels.prefill.hybrid_prefill`
(see its docstring and `hyquant_jax.prefill_launch._prepare`), INT8 Q.K and bf16 P.V. Per
(query head, CTA of `compute_wgs` blocks of 64 query rows, sequence) the CTA runs warpgroups:

- a memory warpgroup streams one sequence of key steps (`block_kv` keys each) through `stages`
  SMEM slots with bulk (TMA) copies: first the quantized segment (INT8 keys of the reordered
  `kq`, their scales `ks`, values `vq`), then the VL segment (`kvl`, `vvl`), then the band and
  diagonal (`k`, `v` in natural order, aligned steps);
- each compute warpgroup (one per 64-row block, sharing every key step) waits for a slot's keys,
  computes its logits with one wgmma (INT8 x INT8 -> int32 for quantized keys, bf16 otherwise)
  and frees the keys, masks the logits where a step is partial, updates one base-2 online softmax,
  waits for the values and adds P.V in place with P as the register A operand (bf16), then frees
  the values. Keys and values of a slot refill separately, once every compute warpgroup freed them.

GPU interpret mode (CPU tests) runs one warpgroup that copies and then computes each step in
turn: the same math and masks, without the hand-off between warpgroups (the GPU tests cover it).

Masks: quantized and VL steps drop columns past nq / nvl; band steps drop keys before
band_start, after the query row (causal) and at or past the sequence length. Rows at or past
the length are written as 0. The running max starts finite, so a row whose keys are all masked
never produces NaN.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lib.mlir import ir  # Mosaic GPU's MLIR bindings, for the FP8 probabilities (jax is pinned)
from jax._src.lib.mlir.dialects import vector
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.mosaic_common import swizzled

LOG2E = math.log2(math.e)
M_INIT = -1e30
BLOCK = 64  # query rows per compute warpgroup (the wgmma M); also the smallest key step
HEAD_DIMS = (64, 128)
COMPUTE_WGS = (1, 2)  # compute warpgroups per CTA
BLOCK_KVS = (64, 128)  # keys per step
MIN_STAGES = 2  # key steps in shared memory at once, at least
KEY_COPIES = 2  # bulk copies per step behind a slot's key barrier: keys and key scales (dummy for bf16 steps)
# int32 -> float32 as an integer add and a float subtract: the bits of 1.5 * 2**23 + x for |x| < 2**22 (INT8 dots
# over D <= 128 stay below 128**3 = 2**21). The convert instruction runs at a quarter of the float rate.
MAGIC_BITS = 0x4B400000
MAGIC = 12582912.0
FP8_MAX = 448.0  # float8_e4m3fn's largest value: FP8 probabilities are p * FP8_MAX
LOG2_FP8_MAX = math.log2(FP8_MAX)


def fp8_key_order(x, axis: int):
    """x with the keys along `axis` (a multiple of 16) in the order the FP8 P.V operands hold them: within each
    group of 16, key 8a + 2j + r (a, r in {0, 1}, j in 0..3) moves to position 4j + 2a + r.

    An f32 tile in the WGMMA layout gives thread (lane 4g + j) columns 8c + 2j and 8c + 2j + 1 of each 8-column
    tile c; the 8-bit A operand layout wants columns 16c' + 4j .. 16c' + 4j + 3 of each 16-column tile c'. The
    kernel packs its four probabilities of tiles 2c' and 2c' + 1 into one register as they are, so the tensor
    cores see P's columns in this order, and the values come in the same order (`fp8_values`): P.V unchanged,
    no shuffle between threads.
    """
    axis = axis % x.ndim
    n = x.shape[axis]
    grouped = x.reshape(x.shape[:axis] + (n // 16, 2, 4, 2) + x.shape[axis + 1:])  # (group, a, j, r)
    return jnp.swapaxes(grouped, axis + 1, axis + 2).reshape(x.shape)


def int32_to_float_magic(x):
    """int32 array with |x| < 2**22 -> float32, exact, without a convert instruction."""
    return lax.bitcast_convert_type(x + MAGIC_BITS, jnp.float32) - MAGIC


def fp8_values(v, vmax=None):
    """The quantized segment's values as the FP8 P.V takes them: v [..., T, D] (T a multiple of 16) ->
    (float8_e4m3fn [..., D, T] with the keys in `fp8_key_order`, float32 [..., D] the scale
    of each channel divided by FP8_MAX, i.e. what the kernel multiplies its FP8 sums by). vmax: the largest
    |v| per channel [..., D] (default: computed from v)."""
    v = v.astype(jnp.float32)
    vmax = jnp.max(jnp.abs(v), axis=-2) if vmax is None else vmax
    scale = jnp.where(vmax > 0, vmax / FP8_MAX, 1.0)
    codes = (v / scale[..., None, :]).astype(jnp.float8_e4m3fn)
    return jnp.swapaxes(fp8_key_order(codes, -2), -1, -2), (scale / FP8_MAX).astype(jnp.float32)


def _fp8_probabilities(ctx, p):
    """p: f32 [64, bk] in the WGMMA layout -> float8_e4m3fn [64, bk] in the 8-bit WGMMA layout, each thread's
    own values converted and packed in place (columns in `fp8_key_order`)."""
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    fp8x4 = ir.VectorType.get((4,), ir.Float8E4M3FNType.get())
    layout = mgpu.WGMMA_LAYOUT_8BIT
    regs = np.empty(layout.registers_shape(p.shape), dtype=object)

    def pair(c, h):
        reg = p.registers[0, c, 0, 0, h, 0, 0, 0, 0]
        return [vector.extract(reg, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([n]))
                for n in range(2)]

    for c in range(p.shape[1] // 16):
        for h in range(2):
            # cvt...e4m3x2 d, a, b puts a in the high byte: bytes 0..3 = columns 8(2c) + 2j + {0, 1} then
            # 8(2c + 1) + 2j + {0, 1}
            word = mgpu_utils.inline_ptx(
                "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
                "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
                *pair(2 * c, h), *pair(2 * c + 1, h), result_types=i32)
            regs[0, c, 0, 0, h, 0, 0, 0, 0] = mgpu_utils.bitcast(word, fp8x4)
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)


def _kernel(meta_ref, q_ref, qq_ref, qrow_ref, qbias_ref, kq_ref, ks_ref, vq_ref, vsc_ref, kvl_ref, vvl_ref, k_ref,
            v_ref, o_ref, q_s, qq_s, qrow_s, qbias_s, meta_s, kq_s, ks_s, k_s, values_s, p_s, setup_bar, k_full,
            v_full, k_free, v_free, turn_bar, *fp8_scratch, group: int, num_ctas: int, compute_wgs: int, block_kv: int,
            stages: int, pingpong: bool, skip_masks: bool, magic_convert: bool, pv_fp8: bool, exact_factor: float,
            interpret: bool):
    head, c, b = lax.axis_index("heads"), lax.axis_index("q_blocks"), lax.axis_index("batch")
    cw, bk = compute_wgs, block_kv
    # pv_fp8: the quantized steps' values are FP8 [D, bk] tiles in the same slot memory as the bf16 [bk, D] tiles
    # of the other steps (a step reads its slot through the view it was written with)
    v_s, vt_s = values_s if pv_fp8 else (values_s, None)
    # the value scales of the quantized segment, and in interpret mode FP8 P
    vsc_s, p8_s = (tuple(fp8_scratch) + (None,))[:2] if pv_fp8 else (None, None)
    base = (num_ctas - 1 - c) * (BLOCK * cw)  # first query row of this CTA; the longest (last) blocks first
    kvh = head // group
    # GPU: warpgroup cw copies, warpgroups 0..cw-1 compute (BLOCK rows each). Interpret mode runs one
    # warpgroup that copies and computes each step in turn, for each row block: its simulated warpgroups are
    # Python threads each running an XLA computation, which can deadlock on a machine with few cores (seen on
    # 2 cores), so CPU tests check the math and the GPU tests the hand-off between warpgroups.
    specialized = not interpret
    wg = lax.axis_index("wg") if specialized else 0
    memory_wg = cw if specialized else 0
    # Ping-pong (two compute warpgroups): they take turns at the tensor cores, one's softmax running while
    # the other's matmuls do. Each takes a turn (arrive, then wait for the other) after issuing its Q.K and
    # after its softmax; warpgroup 1 starts one turn late and warpgroup 0 finishes one turn late.
    pingpong = pingpong and specialized and cw == 2

    def take_turn():
        plgpu.barrier_arrive(turn_bar)
        plgpu.barrier_wait(turn_bar)

    @pl.when(wg == memory_wg)
    def _setup():
        plgpu.copy_gmem_to_smem(meta_ref.at[b, kvh, pl.ds(base // BLOCK, cw)], meta_s, setup_bar)
        if pv_fp8:
            plgpu.copy_gmem_to_smem(vsc_ref.at[b, kvh], vsc_s, setup_bar)
        for w in range(cw):
            rows = pl.ds(base + w * BLOCK, BLOCK)
            plgpu.copy_gmem_to_smem(q_ref.at[b, head, rows], q_s.at[w], setup_bar)
            plgpu.copy_gmem_to_smem(qq_ref.at[b, head, rows], qq_s.at[w], setup_bar)
            plgpu.copy_gmem_to_smem(qrow_ref.at[b, head, rows], qrow_s.at[w], setup_bar)
            plgpu.copy_gmem_to_smem(qbias_ref.at[b, head, rows], qbias_s.at[w], setup_bar)

    plgpu.barrier_wait(setup_bar)
    # The row blocks of a CTA share one key stream that covers every block's segments: the longest quantized
    # and VL prefixes and the band from the earliest band start to the end of the last block. Each block masks
    # what is not its own (`block_meta`): with prefill_block 64, the keys between the two blocks' band starts
    # are quantized for the second block and in the band for the first, so the stream holds them both ways.
    # Blocks past the length have nq = nvl = 0 and band_start = their first row, which changes nothing here.
    length = meta_s[0, 3]
    nq_cta = functools.reduce(jnp.maximum, [meta_s[w, 0] for w in range(cw)])
    nvl_cta = functools.reduce(jnp.maximum, [meta_s[w, 1] for w in range(cw)])
    band_first = functools.reduce(jnp.minimum, [meta_s[w, 2] for w in range(cw)]) // bk * bk  # aligned steps
    n_quant = (nq_cta + bk - 1) // bk
    n_vl = (nvl_cta + bk - 1) // bk
    n_band = (jnp.maximum(base + BLOCK * cw - band_first, 0) + bk - 1) // bk
    segments = (("quant", 0, n_quant), ("vl", n_quant, n_vl), ("band", n_quant + n_vl, n_band))
    n_steps = n_quant + n_vl + n_band

    def issue_keys(kind, j, step):
        """Start the bulk copies of step `step`'s keys and key scales (the j-th step of its segment)."""
        slot, t0 = step % stages, j * bk
        bar = k_full.at[slot]
        if kind == "quant":
            plgpu.copy_gmem_to_smem(kq_ref.at[b, kvh, pl.ds(t0, bk)], kq_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(ks_ref.at[b, kvh, pl.ds(t0, bk)], ks_s.at[slot], bar)
        else:
            src, t0 = (kvl_ref, t0) if kind == "vl" else (k_ref, band_first + t0)
            plgpu.copy_gmem_to_smem(src.at[b, kvh, pl.ds(t0, bk)], k_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(ks_ref.at[b, kvh, pl.ds(0, bk)], ks_s.at[slot], bar)  # keeps KEY_COPIES

    def issue_values(kind, j, step):
        """Start the bulk copy of step `step`'s values."""
        slot, t0 = step % stages, j * bk
        if kind == "quant" and pv_fp8:
            plgpu.copy_gmem_to_smem(vq_ref.at[b, kvh, :, pl.ds(t0, bk)], vt_s.at[slot, 0], v_full.at[slot])
            return
        src, t0 = {"quant": (vq_ref, t0), "vl": (vvl_ref, t0), "band": (v_ref, band_first + t0)}[kind]
        plgpu.copy_gmem_to_smem(src.at[b, kvh, pl.ds(t0, bk)], v_s.at[slot], v_full.at[slot])

    def logits_of(kind, slot, w, rowvec):
        """Base-2 logits of a step as t * mul + add per row: (t f32 [64, bk], mul, add).

        Quantized steps: t = dots x key scale, mul = q-scale x softmax factor, add = q.mean bias (rowvec, row
        vectors loaded once per row block); bf16 steps: t = q.k, mul = softmax factor, add = None. The softmax
        applies mul and add per row, folded into one multiply-add per logit (mul > 0, so row maxima commute).
        """
        if kind == "quant":
            def f(acc):
                plgpu.wgmma(acc, qq_s.at[w], kq_s.at[slot].T)
                if pingpong:
                    take_turn()
                return acc[...]

            dots = pl.run_scoped(f, plgpu.ACC((BLOCK, bk), jnp.int32))
            dots = int32_to_float_magic(dots) if magic_convert else dots.astype(jnp.float32)
            ks = plgpu.load(ks_s.at[slot], layout=plgpu.Layout.WGMMA.reduce(0))
            return dots * lax.broadcast_in_dim(ks, (BLOCK, bk), [1]), rowvec[0], rowvec[1]

        def f(acc):
            plgpu.wgmma(acc, q_s.at[w], k_s.at[slot].T)
            if pingpong:
                take_turn()
            return acc[...]

        return pl.run_scoped(f, plgpu.ACC((BLOCK, bk), jnp.float32)), exact_factor, None

    def add_pv(acc, p, slot):
        """acc + P.V: P [64, bk] f32 as the register A operand, accumulated in place into acc [64, D] f32.

        Interpret mode (its wgmma takes SMEM operands only, and no accumulator initialized from registers):
        P through SMEM into a fresh accumulator, then added."""
        a = p.astype(jnp.bfloat16)
        if interpret:
            p_s[...] = a
            plgpu.commit_smem()

            def fresh(acc_ref):
                plgpu.wgmma(acc_ref, p_s, v_s.at[slot])
                return acc_ref[...]

            return acc + pl.run_scoped(fresh, plgpu.ACC(acc.shape, jnp.float32))

        def accumulate(acc_ref):
            plgpu.wgmma(acc_ref, a, v_s.at[slot])

        return pl.run_state(accumulate)(plgpu.ACC.init(acc))

    to_fp8 = None if interpret else plgpu.inline_mgpu(
        arg_types=(plgpu.Layout.WGMMA,),
        return_type=plgpu.ShapeDtypeStruct((BLOCK, bk), jnp.float8_e4m3fn, layout=plgpu.Layout.WGMMA_8BIT),
    )(_fp8_probabilities)

    def add_pv_fp8(acc, alpha, p, slot):
        """acc * alpha + P.V with P [64, bk] f32 (scaled by FP8_MAX) and the slot's FP8 values: the step's
        product in a fresh f32 accumulator, added in registers (FP8 products accumulated in place across steps
        would lose precision with every step).

        Interpret mode: P through SMEM, its columns in `fp8_key_order` as the registers hold them on GPU."""
        if interpret:
            p8_s[...] = fp8_key_order(p, 1).astype(p8_s.dtype)
            plgpu.commit_smem()
            a = p8_s
        else:
            a = to_fp8(p)

        def fresh(acc_ref):
            plgpu.wgmma(acc_ref, a, vt_s.at[slot, 0].T)
            return acc_ref[...]

        part = pl.run_scoped(fresh, plgpu.ACC(acc.shape, jnp.float32))
        return acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + part

    def block_meta(w):
        """(nq, nvl, band_start) of row block w: its own quantized and VL prefixes and band start."""
        return meta_s[w, 0], meta_s[w, 1], meta_s[w, 2]

    def consume(kind, j, step, w, carry, masked, rowvec):
        """Wait for step `step`'s slot; fold its keys into row block w's online softmax (base 2) and P.V.

        masked=False: every key of the step is valid for every row (no mask computed)."""
        acc, m, l = carry
        nq, nvl, band_start = block_meta(w)
        slot = step % stages
        plgpu.barrier_wait(k_full.at[slot])
        t, mul, add = logits_of(kind, slot, w, rowvec)
        if specialized:
            plgpu.barrier_arrive(k_free.at[slot])  # once all compute warpgroups arrive, the slot's keys refill
        if masked:
            cols = j * bk + plgpu.broadcasted_iota(jnp.int32, (BLOCK, bk), 1, layout=plgpu.Layout.WGMMA)
            if kind == "quant":
                valid = cols < nq
            elif kind == "vl":
                valid = cols < nvl
            else:
                key = band_first + cols
                rows = base + w * BLOCK + plgpu.broadcasted_iota(jnp.int32, (BLOCK, bk), 0,
                                                                 layout=plgpu.Layout.WGMMA)
                valid = (key >= band_start) & (key <= rows) & (key < length)
            t = jnp.where(valid, t, -jnp.inf)
        t_max = t.max(axis=1)
        per_row = functools.partial(lax.broadcast_in_dim, shape=(BLOCK, bk), broadcast_dimensions=[0])
        fp8 = pv_fp8 and kind == "quant"
        if add is None:
            m_new = jnp.maximum(m, t_max * mul)
            p = jnp.exp2(t * mul - per_row(m_new))
        else:
            m_new = jnp.maximum(m, t_max * mul + add)
            # FP8 probabilities are p * FP8_MAX: the factor rides in the exponent (the sums and the output are
            # rescaled once, after the quantized segment)
            p = jnp.exp2(t * per_row(mul) - per_row(m_new - add - (LOG2_FP8_MAX if fp8 else 0.0)))
        alpha = jnp.exp2(m - m_new)
        l = l * alpha + p.sum(axis=1)
        if pingpong:
            take_turn()
        plgpu.barrier_wait(v_full.at[slot])
        if fp8:
            acc = add_pv_fp8(acc, alpha, p, slot)
        else:
            acc = add_pv(acc * lax.broadcast_in_dim(alpha, acc.shape, [0]), p, slot)
        if specialized:
            plgpu.barrier_arrive(v_free.at[slot])
        return acc, m_new, l

    def rows_of(w):
        """Run row block w over every step and write its output."""
        d = v_s.shape[-1]
        carry = (plgpu.layout_cast(jnp.zeros((BLOCK, d), jnp.float32), plgpu.Layout.WGMMA),
                 plgpu.layout_cast(jnp.full((BLOCK,), M_INIT, jnp.float32), plgpu.Layout.WGMMA.reduce(1)),
                 plgpu.layout_cast(jnp.zeros((BLOCK,), jnp.float32), plgpu.Layout.WGMMA.reduce(1)))
        rowvec = (plgpu.load(qrow_s.at[w], layout=plgpu.Layout.WGMMA.reduce(1)),
                  plgpu.load(qbias_s.at[w], layout=plgpu.Layout.WGMMA.reduce(1)))
        if pingpong and w == 1:
            take_turn()
        nq, nvl, band_start = block_meta(w)
        for kind, first, count in segments:
            # Steps whose keys are all valid for every row of block w skip the mask: its full quantized and
            # VL steps, and band steps wholly after its band_start and before both the CTA's first row and
            # the length. The rest (partial last steps, steps past the block's own prefixes, the band's
            # first steps, the diagonal) are masked.
            if kind == "quant":
                ranges = ((0, nq // bk, False), (nq // bk, count, True))
            elif kind == "vl":
                ranges = ((0, nvl // bk, False), (nvl // bk, count, True))
            else:
                lo = jnp.minimum((band_start - band_first + bk - 1) // bk, count)
                hi = jnp.clip((jnp.minimum(base, length) - band_first) // bk, lo, count)
                ranges = ((0, lo, True), (lo, hi, False), (hi, count, True))
            if not skip_masks:
                ranges = ((0, count, True),)
            for start, stop, masked in ranges:
                def body(j, carry, kind=kind, first=first, masked=masked):
                    if not specialized:
                        issue_keys(kind, j, first + j)
                        issue_values(kind, j, first + j)
                    return consume(kind, j, first + j, w, carry, masked, rowvec)

                carry = lax.fori_loop(start, stop, body, carry)
            if kind == "quant" and pv_fp8:
                # the quantized segment summed p * FP8_MAX and p * FP8_MAX * v / (FP8_MAX * vsc): back to p, p * v
                acc, m, l = carry
                vsc = plgpu.load(vsc_s, layout=plgpu.Layout.WGMMA.reduce(0))
                carry = (acc * lax.broadcast_in_dim(vsc, acc.shape, [1]), m, l * (1.0 / FP8_MAX))
        if pingpong and w == 0:
            take_turn()
        acc, _, l = carry
        inv = 1.0 / jnp.where(l > 0, l, 1.0)
        out_rows = base + w * BLOCK + plgpu.broadcasted_iota(jnp.int32, acc.shape, 0, layout=plgpu.Layout.WGMMA)
        # a select, not a product: rows past the length may hold NaN from padding garbage in q
        out = jnp.where(out_rows < length, acc * lax.broadcast_in_dim(inv, acc.shape, [0]), 0.0)
        q_s[w] = out.astype(q_s.dtype)  # every wgmma reading q_s[w] has completed
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_s.at[w], o_ref.at[b, head, pl.ds(base + w * BLOCK, BLOCK)])
        plgpu.wait_smem_to_gmem(0)

    if not specialized:
        for w in range(cw):
            rows_of(w)
        return

    @pl.when(wg == memory_wg)
    def _memory():
        if cw > 1:
            plgpu.set_max_registers(40, action="decrease")
        for kind, first, count in segments:
            def body(j, _, kind=kind, first=first):
                step = first + j

                # Keys and values of a slot refill separately: the next keys load while this slot's P.V runs.
                for free, refill in ((k_free, issue_keys), (v_free, issue_values)):
                    @pl.when(step >= stages)
                    def _wait_free(free=free):  # the compute warpgroups are done with the slot's previous step
                        plgpu.barrier_wait(free.at[step % stages])

                    refill(kind, j, step)

            lax.fori_loop(0, count, body, None)

        for back in range(stages, 0, -1):  # observe the frees of the last steps too
            @pl.when(n_steps - back >= 0)
            def _drain(back=back):
                plgpu.barrier_wait(k_free.at[(n_steps - back) % stages])
                plgpu.barrier_wait(v_free.at[(n_steps - back) % stages])

    @pl.when(wg < memory_wg)
    def _compute():
        if cw > 1:
            plgpu.set_max_registers(232, action="increase")
        if cw == 1:
            rows_of(0)
        else:
            for w in range(cw):
                pl.when(wg == w)(functools.partial(rows_of, w))


def argument_shapes(batch: int, q_heads: int, kv_heads: int, tokens: int, vl_slots: int, head_dim: int,
                    pv_fp8: bool = False) -> tuple:
    """jax.ShapeDtypeStruct of each argument of `hybrid_prefill_mgpu`, in order (for lowering without data)."""
    sd = jax.ShapeDtypeStruct
    b, hq, hkv, tp, kp, d = batch, q_heads, kv_heads, tokens, vl_slots, head_dim
    bf, i8, f32 = jnp.bfloat16, jnp.int8, jnp.float32
    vq = sd((b, hkv, d, tp), jnp.float8_e4m3fn) if pv_fp8 else sd((b, hkv, tp, d), bf)
    return (sd((b, hkv, tp // 64, 4), jnp.int32), sd((b, hq, tp, d), bf), sd((b, hq, tp, d), i8),
            sd((b, hq, tp), f32), sd((b, hq, tp), f32), sd((b, hkv, tp, d), i8), sd((b, hkv, tp), f32),
            vq, sd((b, hkv, d), f32), sd((b, hkv, kp, d), bf), sd((b, hkv, kp, d), bf),
            sd((b, hkv, tp, d), bf), sd((b, hkv, tp, d), bf))


@functools.partial(jax.jit, static_argnames=("scale", "compute_wgs", "block_kv", "stages", "pingpong",
                                             "approx_math", "skip_masks", "magic_convert", "pv_fp8", "interpret"))
def hybrid_prefill_mgpu(meta, q, qq, qrow, qbias, kq, ks, vq, vsc, kvl, vvl, k, v, *, scale: float,
                        compute_wgs: int, block_kv: int, stages: int, pingpong: bool, approx_math: bool,
                        skip_masks: bool, magic_convert: bool, pv_fp8: bool,
                        interpret: bool = False):
    """Run the kernel on arguments prepared by `hyquant_jax.prefill_launch._prepare` (block_q 64,
    block_k = max(block_kv, 64 * compute_wgs): the prompt's padding; INT8 Q.K; P.V in bf16, or with `pv_fp8`
    in FP8 over the quantized segment, where vq and vsc come from `fp8_values` (vsc is unused otherwise and
    accepted for the same argument order)).

    Shapes: meta int32 [B, Hkv, Tp // 64, 4] (nq, nvl, band_start, length) per 64-row block; q bf16
    [B, Hq, Tp, D]; qq int8 like q; qrow, qbias f32 [B, Hq, Tp]; kq int8 [B, Hkv, Tp, D]; ks f32 [B, Hkv, Tp];
    vq, k, v bf16 [B, Hkv, Tp, D] (vq float8_e4m3fn [B, Hkv, D, Tp] with pv_fp8, vsc f32 [B, Hkv, D]);
    kvl, vvl bf16 [B, Hkv, Kp, D]; Tp a multiple of 64 * compute_wgs and of
    block_kv, Kp a multiple of block_kv, D in {64, 128}. A CTA runs `compute_wgs` row blocks of 64 on one
    key stream that covers the segments of all its blocks, each block masking what is not its own
    (prefill_block any multiple of 64). `stages` key steps of `block_kv` keys are in SMEM at once. With two
    compute warpgroups `pingpong` makes them alternate at the tensor cores. `approx_math`: approximate exp2
    (Mosaic GPU's compiler option). `skip_masks`: steps whose keys are all valid for every row skip the mask
    (False masks every step). The launch the library takes: `hyquant_jax.prefill_launch.PrefillTuning`.
    `magic_convert`: the int32 Q.K dots become float32 by an integer add and a float subtract instead of a
    convert instruction (exact either way).
    Returns bf16 [B, Hq, Tp, D]; rows at positions >= length are 0.
    """
    b, hq, tp, d = q.shape
    hkv = k.shape[1]
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {d}")
    if not scale > 0:  # the softmax takes row maxima before the per-row factors: they must be positive
        raise ValueError(f"scale must be > 0, got {scale}")
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if compute_wgs not in COMPUTE_WGS or block_kv not in BLOCK_KVS or stages < MIN_STAGES:
        raise ValueError(f"need compute_wgs in {COMPUTE_WGS}, block_kv in {BLOCK_KVS}, stages >= {MIN_STAGES}; got "
                         f"{compute_wgs}, {block_kv}, {stages}")
    if tp % (BLOCK * compute_wgs) or tp % block_kv or kvl.shape[2] % block_kv:
        raise ValueError(f"padded length {tp} must be a multiple of {BLOCK * compute_wgs} and {block_kv}, VL "
                         f"capacity {kvl.shape[2]} of {block_kv}")
    if qq.dtype != jnp.int8 or kq.dtype != jnp.int8:
        raise ValueError(f"qq and kq must be int8 (INT8 Q.K), got {qq.dtype} and {kq.dtype}")
    if meta.shape != (b, hkv, tp // BLOCK, 4):
        raise ValueError(f"meta must be {(b, hkv, tp // BLOCK, 4)}, got {meta.shape}")
    want_vq = ((b, hkv, d, tp), jnp.float8_e4m3fn) if pv_fp8 else ((b, hkv, tp, d), jnp.bfloat16)
    if (vq.shape, vq.dtype) != want_vq or vsc.shape != (b, hkv, d):
        raise ValueError(f"vq must be {want_vq[1].__name__} {want_vq[0]} and vsc [B, Hkv, D] {(b, hkv, d)} "
                         f"(pv_fp8={pv_fp8}), got {vq.dtype} {vq.shape} and {vsc.shape}")
    if pv_fp8 and block_kv != 128:
        raise ValueError(f"pv_fp8 needs block_kv 128 (the 8-bit operand is one 128-byte swizzle wide), got "
                         f"{block_kv}")
    bf16, cw = jnp.bfloat16, compute_wgs
    # Interpret mode simulates plain SMEM arrays: no swizzled layouts there.
    smem_transforms = (lambda dtype, cols: ()) if interpret else swizzled
    values = plgpu.SMEM((stages, block_kv, d), bf16, transforms=smem_transforms(bf16, d))
    if pv_fp8:
        # slot s of the FP8 view ([s, 0]: D x bk bytes) lies within slot s of the bf16 view (bk x D x 2 bytes)
        fp8 = jnp.float8_e4m3fn
        values = plgpu.RefUnion(values, plgpu.SMEM((stages, 2, d, block_kv), fp8,
                                                   transforms=smem_transforms(fp8, block_kv)))
    kernel = plgpu.kernel(
        functools.partial(_kernel, group=hq // hkv, num_ctas=tp // (BLOCK * cw), compute_wgs=cw,
                          block_kv=block_kv, stages=stages, pingpong=pingpong, skip_masks=skip_masks,
                          magic_convert=magic_convert, pv_fp8=pv_fp8,
                          exact_factor=float(scale) * LOG2E,
                          interpret=interpret),
        out_type=jax.ShapeDtypeStruct((b, hq, tp, d), bf16),
        grid=(hq, tp // (BLOCK * cw), b),
        grid_names=("heads", "q_blocks", "batch"),
        num_threads=1 if interpret else cw + 1,
        thread_name="wg",
        scratch_types=[
            plgpu.SMEM((cw, BLOCK, d), bf16, transforms=smem_transforms(bf16, d)),  # q, then the output
            plgpu.SMEM((cw, BLOCK, d), jnp.int8, transforms=smem_transforms(jnp.int8, d)),
            plgpu.SMEM((cw, BLOCK), jnp.float32),
            plgpu.SMEM((cw, BLOCK), jnp.float32),
            plgpu.SMEM((cw, 4), jnp.int32),
            plgpu.SMEM((stages, block_kv, d), jnp.int8, transforms=smem_transforms(jnp.int8, d)),
            plgpu.SMEM((stages, block_kv), jnp.float32),
            plgpu.SMEM((stages, block_kv, d), bf16, transforms=smem_transforms(bf16, d)),
            values,
            plgpu.SMEM((BLOCK, block_kv) if interpret else (8, 8), bf16),  # P, interpret mode only
            plgpu.Barrier(num_arrivals=1 + 4 * cw + pv_fp8),
            plgpu.Barrier(num_arrivals=KEY_COPIES, num_barriers=stages),  # keys of a slot landed
            plgpu.Barrier(num_arrivals=1, num_barriers=stages),  # values of a slot landed
            plgpu.Barrier(num_arrivals=cw, num_barriers=stages),  # keys of a slot free
            plgpu.Barrier(num_arrivals=cw, num_barriers=stages),  # values of a slot free
            plgpu.Barrier(num_arrivals=cw),  # ping-pong turns
            *([plgpu.SMEM((d,), jnp.float32)] if pv_fp8 else []),  # vsc
            *([plgpu.SMEM((BLOCK, block_kv), jnp.float8_e4m3fn)] if pv_fp8 and interpret else []),  # FP8 P
        ],
        compiler_params=plgpu.CompilerParams(approx_math=approx_math),
        interpret=plgpu.InterpretGPUParams() if interpret else False,
    )
    return kernel(meta, q, qq, qrow, qbias, kq, ks, vq, vsc, kvl, vvl, k, v)
