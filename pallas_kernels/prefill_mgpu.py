"""Hybrid-precision causal prefill attention as a Pallas Mosaic GPU kernel (Hopper: wgmma, TMA, warp specialization).

The same computation and the same prepared arguments as `pallas_kernels.prefill.hybrid_prefill`
(see its docstring and `hyquant_jax.prefill_kernel._prepare`), INT8 Q.K and bf16 P.V, 64-row
query blocks and 64-key steps. Per (query head, query block, sequence) the CTA runs two
warpgroups:

- a memory warpgroup streams one sequence of key steps through `stages` SMEM slots with bulk
  (TMA) copies: first the quantized segment (INT8 keys of the reordered `kq`, their scales `ks`,
  values `vq`), then the VL segment (`kvl`, `vvl`), then the band and diagonal (`k`, `v` in
  natural order, 64-aligned steps);
- a compute warpgroup waits for each slot, computes the logits with one wgmma (INT8 x INT8 ->
  int32 for quantized keys, bf16 otherwise), masks them, updates one base-2 online softmax and
  adds P.V with P as the register A operand (bf16), then frees the slot.

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
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

LOG2E = math.log2(math.e)
M_INIT = -1e30
BLOCK = 64  # query rows per CTA (one compute warpgroup, the wgmma M) and keys per step
HEAD_DIMS = (64, 128)
COPIES = 3  # bulk copies per step: keys, key scales (dummy for bf16 steps), values


def _swizzled(dtype, cols: int):
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(cols * bits)
    return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)


def _kernel(meta_ref, q_ref, qq_ref, qrow_ref, qbias_ref, kq_ref, ks_ref, vq_ref, kvl_ref, vvl_ref, k_ref, v_ref,
            o_ref, q_s, qq_s, qrow_s, qbias_s, meta_s, kq_s, ks_s, k_s, v_s, p_s, setup_bar, full_bars,
            free_bars, *, group: int, num_q_blocks: int, stages: int, exact_factor: float, interpret: bool):
    head, c, b = lax.axis_index("heads"), lax.axis_index("q_blocks"), lax.axis_index("batch")
    qblk = num_q_blocks - 1 - c  # the longest (last) query blocks first
    s = qblk * BLOCK
    kvh = head // group
    # GPU: warpgroup 1 copies, warpgroup 0 computes. Interpret mode runs one warpgroup that does both in turn:
    # its simulated warpgroups are Python threads each running an XLA computation, which can deadlock on a
    # machine with few cores (seen on 2 cores), so CPU tests check the math, the GPU tests the hand-off.
    specialized = not interpret
    wg = lax.axis_index("wg") if specialized else 0
    memory_wg = 1 if specialized else 0

    @pl.when(wg == memory_wg)
    def _setup():
        plgpu.copy_gmem_to_smem(meta_ref.at[b, kvh, qblk], meta_s, setup_bar)
        plgpu.copy_gmem_to_smem(q_ref.at[b, head, pl.ds(s, BLOCK)], q_s, setup_bar)
        plgpu.copy_gmem_to_smem(qq_ref.at[b, head, pl.ds(s, BLOCK)], qq_s, setup_bar)
        plgpu.copy_gmem_to_smem(qrow_ref.at[b, head, pl.ds(s, BLOCK)], qrow_s, setup_bar)
        plgpu.copy_gmem_to_smem(qbias_ref.at[b, head, pl.ds(s, BLOCK)], qbias_s, setup_bar)

    plgpu.barrier_wait(setup_bar)
    nq, nvl, band_start, length = meta_s[0], meta_s[1], meta_s[2], meta_s[3]
    band_first = band_start // BLOCK * BLOCK  # steps start 64-aligned; keys before band_start are masked
    n_quant = (nq + BLOCK - 1) // BLOCK
    n_vl = (nvl + BLOCK - 1) // BLOCK
    n_band = jnp.maximum(s + BLOCK - band_first, 0) // BLOCK
    segments = (("quant", 0, n_quant), ("vl", n_quant, n_vl), ("band", n_quant + n_vl, n_band))
    n_steps = n_quant + n_vl + n_band

    def issue(kind, j, step):
        """Start the bulk copies of step `step` (the j-th of its segment) into its slot."""
        slot = step % stages
        t0 = j * BLOCK
        bar = full_bars.at[slot]
        if kind == "quant":
            plgpu.copy_gmem_to_smem(kq_ref.at[b, kvh, pl.ds(t0, BLOCK)], kq_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(ks_ref.at[b, kvh, pl.ds(t0, BLOCK)], ks_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(vq_ref.at[b, kvh, pl.ds(t0, BLOCK)], v_s.at[slot], bar)
        else:
            src_k, src_v = (kvl_ref, vvl_ref) if kind == "vl" else (k_ref, v_ref)
            t0 = t0 if kind == "vl" else band_first + t0
            plgpu.copy_gmem_to_smem(src_k.at[b, kvh, pl.ds(t0, BLOCK)], k_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(ks_ref.at[b, kvh, pl.ds(0, BLOCK)], ks_s.at[slot], bar)  # keeps COPIES
            plgpu.copy_gmem_to_smem(src_v.at[b, kvh, pl.ds(t0, BLOCK)], v_s.at[slot], bar)

    def logits_of(kind, slot):
        if kind == "quant":
            def f(acc):
                plgpu.wgmma(acc, qq_s, kq_s.at[slot].T)
                return acc[...]

            dots = pl.run_scoped(f, plgpu.ACC((BLOCK, BLOCK), jnp.int32)).astype(jnp.float32)
            qrow = plgpu.load(qrow_s, layout=plgpu.Layout.WGMMA.reduce(1))
            qbias = plgpu.load(qbias_s, layout=plgpu.Layout.WGMMA.reduce(1))
            ks = plgpu.load(ks_s.at[slot], layout=plgpu.Layout.WGMMA.reduce(0))
            return (dots * lax.broadcast_in_dim(qrow, (BLOCK, BLOCK), [0])
                    * lax.broadcast_in_dim(ks, (BLOCK, BLOCK), [1])
                    + lax.broadcast_in_dim(qbias, (BLOCK, BLOCK), [0]))

        def f(acc):
            plgpu.wgmma(acc, q_s, k_s.at[slot].T)
            return acc[...]

        return pl.run_scoped(f, plgpu.ACC((BLOCK, BLOCK), jnp.float32)) * exact_factor

    def pv(p, slot):
        """P [64, 64] f32 -> P.V [64, D] f32 (P as the register A operand; through SMEM when interpreting)."""
        a = p.astype(jnp.bfloat16)
        if interpret:  # GPU interpret mode's wgmma takes SMEM operands only
            p_s[...] = a
            plgpu.commit_smem()
            a = p_s

        def f(acc):
            plgpu.wgmma(acc, a, v_s.at[slot])
            return acc[...]

        return pl.run_scoped(f, plgpu.ACC((BLOCK, v_s.shape[-1]), jnp.float32))

    def consume(kind, j, step, carry):
        """Wait for step `step`'s slot, fold its keys into the online softmax (base 2) and P.V."""
        acc, m, l = carry
        slot = step % stages
        plgpu.barrier_wait(full_bars.at[slot])
        logits = logits_of(kind, slot)
        cols = j * BLOCK + plgpu.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 1, layout=plgpu.Layout.WGMMA)
        if kind == "quant":
            valid = cols < nq
        elif kind == "vl":
            valid = cols < nvl
        else:
            key = band_first + cols
            rows = s + plgpu.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 0, layout=plgpu.Layout.WGMMA)
            valid = (key >= band_start) & (key <= rows) & (key < length)
        logits = jnp.where(valid, logits, -jnp.inf)
        m_new = jnp.maximum(m, logits.max(axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(logits - lax.broadcast_in_dim(m_new, (BLOCK, BLOCK), [0]))
        l = l * alpha + p.sum(axis=1)
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv(p, slot)
        if specialized:
            plgpu.barrier_arrive(free_bars.at[slot])  # the memory warpgroup may refill this slot
        return acc, m_new, l

    if specialized:
        @pl.when(wg == memory_wg)
        def _memory():
            for kind, first, count in segments:
                def body(j, _, kind=kind, first=first):
                    step = first + j

                    @pl.when(step >= stages)
                    def _wait_free():  # the compute warpgroup is done with this slot's previous step
                        plgpu.barrier_wait(free_bars.at[step % stages])

                    issue(kind, j, step)

                lax.fori_loop(0, count, body, None)

            for back in range(stages, 0, -1):  # observe the frees of the last steps too
                @pl.when(n_steps - back >= 0)
                def _drain(back=back):
                    plgpu.barrier_wait(free_bars.at[(n_steps - back) % stages])

    @pl.when(wg == 0)
    def _compute():
        d = v_s.shape[-1]
        carry = (plgpu.layout_cast(jnp.zeros((BLOCK, d), jnp.float32), plgpu.Layout.WGMMA),
                 plgpu.layout_cast(jnp.full((BLOCK,), M_INIT, jnp.float32), plgpu.Layout.WGMMA.reduce(1)),
                 plgpu.layout_cast(jnp.zeros((BLOCK,), jnp.float32), plgpu.Layout.WGMMA.reduce(1)))
        for kind, first, count in segments:
            def body(j, carry, kind=kind, first=first):
                if not specialized:
                    issue(kind, j, first + j)
                return consume(kind, j, first + j, carry)

            carry = lax.fori_loop(0, count, body, carry)
        acc, _, l = carry
        inv = 1.0 / jnp.where(l > 0, l, 1.0)
        out_rows = s + plgpu.broadcasted_iota(jnp.int32, acc.shape, 0, layout=plgpu.Layout.WGMMA)
        # a select, not a product: rows past the length may hold NaN from padding garbage in q
        out = jnp.where(out_rows < length, acc * lax.broadcast_in_dim(inv, acc.shape, [0]), 0.0)
        q_s[...] = out.astype(q_s.dtype)  # every wgmma reading q_s has completed
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_s, o_ref.at[b, head, pl.ds(s, BLOCK)])
        plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("scale", "stages", "interpret"))
def hybrid_prefill_mgpu(meta, q, qq, qrow, qbias, kq, ks, vq, vsc, kvl, vvl, k, v, *, scale: float,
                        stages: int = 2, interpret: bool = False):
    """Run the kernel on arguments prepared by `hyquant_jax.prefill_kernel._prepare` (block_q = block_k = 64,
    INT8 Q.K, bf16 P.V; `vsc` is unused and accepted for the same argument order).

    Shapes: meta int32 [B, Hkv, Tp // 64, 4] (nq, nvl, band_start, length); q bf16 [B, Hq, Tp, D];
    qq int8 like q; qrow, qbias f32 [B, Hq, Tp]; kq int8 [B, Hkv, Tp, D]; ks f32 [B, Hkv, Tp];
    vq, k, v bf16 [B, Hkv, Tp, D]; kvl, vvl bf16 [B, Hkv, Kp, D]; Tp and Kp multiples of 64, D in {64, 128}.
    Returns bf16 [B, Hq, Tp, D]; rows at positions >= length are 0.
    """
    del vsc
    b, hq, tp, d = q.shape
    hkv = k.shape[1]
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {d}")
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if tp % BLOCK or kvl.shape[2] % BLOCK:
        raise ValueError(f"padded length {tp} and VL capacity {kvl.shape[2]} must be multiples of {BLOCK}")
    if qq.dtype != jnp.int8 or kq.dtype != jnp.int8:
        raise ValueError(f"qq and kq must be int8 (INT8 Q.K), got {qq.dtype} and {kq.dtype}")
    if meta.shape != (b, hkv, tp // BLOCK, 4):
        raise ValueError(f"meta must be {(b, hkv, tp // BLOCK, 4)}, got {meta.shape}")
    if stages < 2:
        raise ValueError(f"stages must be >= 2, got {stages}")
    bf16, nqb = jnp.bfloat16, tp // BLOCK
    # Interpret mode simulates plain SMEM arrays: no swizzled layouts there.
    swizzled = (lambda dtype, cols: ()) if interpret else _swizzled
    kernel = plgpu.kernel(
        functools.partial(_kernel, group=hq // hkv, num_q_blocks=nqb, stages=stages,
                          exact_factor=float(scale) * LOG2E, interpret=interpret),
        out_type=jax.ShapeDtypeStruct((b, hq, tp, d), bf16),
        grid=(hq, nqb, b),
        grid_names=("heads", "q_blocks", "batch"),
        num_threads=1 if interpret else 2,
        thread_name="wg",
        scratch_types=[
            plgpu.SMEM((BLOCK, d), bf16, transforms=swizzled(bf16, d)),  # q, then the output
            plgpu.SMEM((BLOCK, d), jnp.int8, transforms=swizzled(jnp.int8, d)),
            plgpu.SMEM((BLOCK,), jnp.float32),
            plgpu.SMEM((BLOCK,), jnp.float32),
            plgpu.SMEM((4,), jnp.int32),
            plgpu.SMEM((stages, BLOCK, d), jnp.int8, transforms=swizzled(jnp.int8, d)),
            plgpu.SMEM((stages, BLOCK), jnp.float32),
            plgpu.SMEM((stages, BLOCK, d), bf16, transforms=swizzled(bf16, d)),
            plgpu.SMEM((stages, BLOCK, d), bf16, transforms=swizzled(bf16, d)),
            plgpu.SMEM((BLOCK, BLOCK) if interpret else (8, 8), bf16),  # P, interpret mode only
            plgpu.Barrier(num_arrivals=5),
            plgpu.Barrier(num_arrivals=COPIES, num_barriers=stages),
            plgpu.Barrier(num_arrivals=1, num_barriers=stages),
        ],
        interpret=plgpu.InterpretGPUParams() if interpret else False,
    )
    return kernel(meta, q, qq, qrow, qbias, kq, ks, vq, kvl, vvl, k, v)
