"""Glue between `hyquant_jax.attention.prefill_attention` and the Pallas prefill kernel.

`prefill_attention` prepares the arrays `pallas_kernels.prefill.hybrid_prefill`
takes, with the exact math of `reference.hybrid_prefill_attention_reference`:

* Q: per-token int8 (or fp8 e4m3) codes and scales; the scale times
  softmax_scale * log2(e) is one float per row (`qrow`), and the smoothing
  term q . key_mean (exact, float32) another (`qbias`).
* K: the per-(sequence, KV head) mean of the valid keys is subtracted, then
  per-token int8 / fp8 quantization. Keys (codes and scales) and values are
  reordered per (sequence, KV head) so the non-VL keys come first, in position
  order: for any query block, the quantized keys (non-VL, before the block's
  band) are then the prefix of length band_lo - #VL before band_lo.
* VL keys/values are gathered (sorted by position) into a small bf16 array.
* Per query block: meta = (nq, nvl, band_start, length).

T is padded to a multiple of the kernel blocks here, so any length works;
padded query rows come back as zeros and are cut off. K/V are never repeated
over the query heads of a group (GQA-native).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from hyquant_jax import quant
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.reference import check_prefill_shapes
from hyquant_jax.reorder import stable_partition
from pallas_kernels import prefill as _kernel
from pallas_kernels import prefill_mgpu as _mgpu

LOG2E = _kernel.LOG2E
PV_FORMATS = ("bf16", "fp8")
# The Mosaic prefill kernel's launch: two 64-row compute warpgroups per CTA taking turns at the tensor cores,
# 128-key steps, approximate exp2, INT8 dots converted by an add and a subtract: the fastest setting measured
# on the H200 (docs/design.md, "Prefill kernels").
MOSAIC_PREFILL = dict(compute_wgs=2, block_kv=128, pingpong=True, approx_math=True, magic_convert=True)


def default_blocks(head_dim: int, prefill_block: int) -> tuple[int, int, int, int]:
    """(block_q, block_k, num_warps, num_stages) used when none are given."""
    block_q = min(prefill_block, 64 if head_dim > 128 else 128)
    block_k = 32 if head_dim > 128 else 64
    return block_q, block_k, _default_warps(block_q, head_dim), 2


def _default_warps(block_q: int, head_dim: int) -> int:
    # Offline ptxas (sm_90a): 4 warps spill at block_q=128 for every head_dim; 8 do not.
    return 8 if block_q >= 128 or block_q * head_dim >= 128 * 128 else 4


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _quantize(x, qk_format):
    """Per-token quantization along the last axis: (codes, float32 scale [..., T])."""
    if qk_format == "int8":
        codes, scale = quant.quantize_int8(x)
    elif qk_format == "fp8":
        codes, scale = quant.quantize_fp8(x)
    else:
        return x.astype(jnp.bfloat16), jnp.ones(x.shape[:-1], jnp.float32)
    return codes, scale[..., 0]


def _take_rows(x, idx):
    """x [B, H, T, ...], idx int [B, H, N] -> x[b, h, idx[b, h]]."""
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 3))
    return jnp.take_along_axis(x, idx, axis=2)


def _prepare(q, k, v, lengths, vl_idx, vl_count, *, config: HyQuantConfig, scale, uniform, qk_format, pv_format,
             block_q, block_k):
    """The kernel's array arguments (a tuple, in `hybrid_prefill` order) and its static scale."""
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    pb = config.prefill_block
    window = config.window
    tp = _round_up(max(t, 1), max(block_q, block_k))
    nqb = tp // block_q
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, t)

    pad = ((0, 0), (0, 0), (0, tp - t), (0, 0))
    key_ok = jnp.arange(tp)[None, :] < lengths[:, None]  # [B, Tp]
    # Padding never reaches a softmax, but keep it finite and out of the key mean.
    qb = jnp.pad(q, pad).astype(jnp.bfloat16)
    kb = jnp.where(key_ok[:, None, :, None], jnp.pad(k, pad), 0).astype(jnp.bfloat16)
    vb = jnp.where(key_ok[:, None, :, None], jnp.pad(v, pad), 0).astype(jnp.bfloat16)

    # ---- Q and smoothed K, per-token quantized (the reference's exact recipe).
    q32 = jnp.pad(q, pad).astype(jnp.float32)
    k32 = jnp.where(key_ok[:, None, :, None], jnp.pad(k, pad).astype(jnp.float32), 0.0)
    key_mean = k32.sum(2) / jnp.maximum(lengths, 1)[:, None, None].astype(jnp.float32)  # [B, Hkv, D]
    factor = scale * LOG2E
    if qk_format == "bf16":
        qq = qb
        qrow = jnp.full((b, hq, tp), factor, jnp.float32)
        qbias = jnp.zeros((b, hq, tp), jnp.float32)
        kq, ks = kb, jnp.ones((b, hkv, tp), jnp.float32)
    else:
        qq, sq = _quantize(q32, qk_format)
        qrow = sq * factor
        qg = q32.reshape(b, hkv, g, tp, d)
        # A float32 product and row sum, not a HIGHEST einsum: as a reduction over D, XLA can fuse it with
        # q's max-abs pass instead of materializing q in float32 for a dot.
        qbias = (qg * key_mean[:, :, None, None, :]).sum(-1).reshape(b, hq, tp) * factor
        kq, ks = _quantize(k32 - key_mean[:, :, None, :], qk_format)

    # ---- Per-query-block segment bounds.
    s = jnp.arange(nqb, dtype=jnp.int32) * block_q  # [NQB]
    active = s[None, :] < lengths[:, None]  # [B, NQB]
    kmax = vl_idx.shape[-1]
    if uniform:
        nq = jnp.where(active, s[None, :], 0)[:, None, :] + jnp.zeros((b, hkv, 1), jnp.int32)
        nvl = jnp.zeros_like(nq)
        band_start = jnp.broadcast_to(s[None, None, :], nq.shape)
        vq = vb
        kvl = jnp.zeros((b, hkv, block_k, d), jnp.bfloat16)
        vvl = kvl
    else:
        band_lo = jnp.maximum((s // pb) * pb - window, 0)  # [NQB]
        if kmax:
            ok = jnp.arange(kmax)[None, None, :] < vl_count[:, None, None]  # [B, 1, K]
            ok = ok & (vl_idx >= 0) & (vl_idx < t)
            nvl = jnp.sum(ok[..., None, :] & (vl_idx[..., None, :] < band_lo[:, None]), axis=-1)  # [B,Hkv,NQB]
            nvl = nvl.astype(jnp.int32)
            is_vl = jnp.zeros((b, hkv, tp), bool).at[
                jnp.arange(b)[:, None, None], jnp.arange(hkv)[None, :, None], jnp.where(ok, vl_idx, tp)
            ].set(True, mode="drop")
            perm = stable_partition(~is_vl)  # non-VL first, by position
            kq = _take_rows(kq, perm)
            ks = _take_rows(ks, perm)
            vq = _take_rows(vb, perm)
            kp = _round_up(kmax, block_k)
            gidx = jnp.where(ok, vl_idx, 0)
            kvl = jnp.where(ok[..., None], _take_rows(kb, gidx), 0)
            vvl = jnp.where(ok[..., None], _take_rows(vb, gidx), 0)
            kvl = jnp.pad(kvl, ((0, 0), (0, 0), (0, kp - kmax), (0, 0)))
            vvl = jnp.pad(vvl, ((0, 0), (0, 0), (0, kp - kmax), (0, 0)))
        else:
            nvl = jnp.zeros((b, hkv, nqb), jnp.int32)
            vq = vb
            kvl = jnp.zeros((b, hkv, block_k, d), jnp.bfloat16)
            vvl = kvl
        nq = jnp.where(active[:, None, :], band_lo[None, None, :] - nvl, 0)
        nvl = jnp.where(active[:, None, :], nvl, 0)
        band_start = jnp.where(active[:, None, :], band_lo[None, None, :], s[None, None, :])
        band_start = jnp.broadcast_to(band_start, nq.shape)
    length_col = jnp.broadcast_to(lengths[:, None, None], nq.shape)
    meta = jnp.stack([nq, nvl, band_start, length_col], axis=-1).astype(jnp.int32)  # [B, Hkv, NQB, 4]

    if pv_format == "fp8":
        # One scale per (sequence, KV head, channel); the kernel scales P by 448.
        vmax = jnp.max(jnp.abs(vq.astype(jnp.float32)), axis=2)  # [B, Hkv, D]
        vscale = jnp.where(vmax > 0, vmax / quant.FP8_MAX, 1.0)
        vq = (vq.astype(jnp.float32) / vscale[:, :, None, :]).astype(jnp.float8_e4m3fn)
        vq = jnp.swapaxes(vq, 2, 3)  # [B, Hkv, D, Tp]: K-major operand of the P.V dot
        vsc = (vscale / quant.FP8_MAX).astype(jnp.float32)
    else:
        vsc = jnp.zeros((b, hkv, d), jnp.float32)

    args = (meta, qb, qq, qrow.astype(jnp.float32), qbias.astype(jnp.float32), kq, ks.astype(jnp.float32), vq,
            vsc, kvl.astype(jnp.bfloat16), vvl.astype(jnp.bfloat16), kb, vb)
    return args, scale


@partial(jax.jit, static_argnames=("config", "interpret", "scale", "uniform", "qk_format", "pv_format",
                                   "block_q", "block_k", "num_warps", "num_stages"))
def _prefill(q, k, v, lengths, vl_idx, vl_count, *, config: HyQuantConfig, interpret, scale, uniform,
             qk_format, pv_format, block_q, block_k, num_warps, num_stages):
    args, scale = _prepare(q, k, v, lengths, vl_idx, vl_count, config=config, scale=scale, uniform=uniform,
                           qk_format=qk_format, pv_format=pv_format, block_q=block_q, block_k=block_k)
    out = _kernel.hybrid_prefill(
        *args, scale=scale, block_q=block_q, block_k=block_k, qk_format=qk_format, uniform=uniform,
        pv_fp8=pv_format == "fp8", num_warps=num_warps, num_stages=num_stages, interpret=interpret,
        out_dtype=q.dtype)
    return out[:, :, :q.shape[2]]


def prepare_kernel_call(q, k, v, lengths, vl_idx, vl_count, config: HyQuantConfig, interpret: bool = False,
                        scale: float | None = None, *, uniform: bool = False, pv_format: str = "bf16",
                        block_q: int | None = None, block_k: int | None = None, num_warps: int | None = None,
                        num_stages: int | None = None):
    """Split `prefill_attention` into its glue and its kernel (for benchmarks).

    Returns (args, kernel): `args` are the prepared arrays (computed now, jitted)
    and `kernel(*args)` runs only the Pallas kernel, returning [B, Hq, Tp, D]
    (Tp >= T: cut rows off with [:, :, :T]).
    """
    _check(q, k, v, lengths)
    if uniform:
        qk_format = config.prefill_qk
        config = HyQuantConfig(window=0, rho=0.0, prefill_qk=qk_format,
                               prefill_block=block_q or default_blocks(q.shape[-1], 256)[0])
    bq, bk, nw, ns = _resolve(config, q.shape[-1], block_q, block_k, num_warps, num_stages)
    prep = jax.jit(partial(_prepare, config=config, scale=scale, uniform=uniform, qk_format=config.prefill_qk,
                           pv_format=pv_format, block_q=bq, block_k=bk))
    args, kscale = prep(q, k, v, lengths, vl_idx.astype(jnp.int32), vl_count.astype(jnp.int32))
    kernel = partial(_kernel.hybrid_prefill, scale=float(kscale), block_q=bq, block_k=bk,
                     qk_format=config.prefill_qk, uniform=uniform, pv_fp8=pv_format == "fp8", num_warps=nw,
                     num_stages=ns, interpret=interpret, out_dtype=q.dtype)
    return args, kernel


def _resolve(config: HyQuantConfig, d, block_q, block_k, num_warps, num_stages):
    dq, dk, dw, ds = default_blocks(d, config.prefill_block)
    block_q = dq if block_q is None else block_q
    block_k = dk if block_k is None else block_k
    num_warps = _default_warps(block_q, d) if num_warps is None else num_warps
    num_stages = ds if num_stages is None else num_stages
    if block_q > config.prefill_block or config.prefill_block % block_q:
        raise ValueError(f"block_q={block_q} must divide config.prefill_block={config.prefill_block}")
    return block_q, block_k, num_warps, num_stages


def _check(q, k, v, lengths):
    check_prefill_shapes(q, k, v, lengths)
    d = q.shape[3]
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16 (64, 128, 256), got {d}")


def _check_vl(q, k, vl_idx, vl_count):
    if vl_idx.ndim != 3 or vl_idx.shape[:2] != k.shape[:2] or vl_count.shape != (q.shape[0],):
        raise ValueError(f"vl_idx must be [B, Hkv, K] and vl_count [B]; got {vl_idx.shape}, {vl_count.shape}")


def prefill_attention(q, k, v, lengths, vl_idx, vl_count, config: HyQuantConfig, interpret: bool = False,
                      scale: float | None = None, *, pv_format: str = "bf16", block_q: int | None = None,
                      block_k: int | None = None, num_warps: int | None = None, num_stages: int | None = None):
    """Causal hybrid prefill attention with the Pallas kernel (matches
    `reference.hybrid_prefill_attention_reference`).

    q: [B, Hq, T, D]; k, v: [B, Hkv, T, D]; lengths int [B]; vl_idx int32
    [B, Hkv, Kmax] sorted ascending, the first vl_count[b] valid (from
    `vertical_token_identification`). QK format from `config.prefill_qk`.
    pv_format "fp8" also runs P.V of the quantized segment in fp8 e4m3 (one
    scale per channel of V; not in the reference, an option for speed).
    Returns [B, Hq, T, D] in q.dtype; rows at positions >= lengths are 0.
    """
    _check(q, k, v, lengths)
    if pv_format not in PV_FORMATS:
        raise ValueError(f"pv_format must be one of {PV_FORMATS}, got {pv_format!r}")
    _check_vl(q, k, vl_idx, vl_count)
    bq, bk, nw, ns = _resolve(config, q.shape[-1], block_q, block_k, num_warps, num_stages)
    return _prefill(q, k, v, lengths, vl_idx.astype(jnp.int32), vl_count.astype(jnp.int32), config=config,
                    interpret=interpret, scale=scale, uniform=False, qk_format=config.prefill_qk,
                    pv_format=pv_format, block_q=bq, block_k=bk, num_warps=nw, num_stages=ns)


def uniform_prefill_attention(q, k, v, lengths, qk_format: str = "int8", interpret: bool = False,
                              scale: float | None = None, *, pv_format: str = "bf16", block_q: int | None = None,
                              block_k: int | None = None, num_warps: int | None = None,
                              num_stages: int | None = None):
    """SageAttention-style baseline on the same kernel: every causal key through
    quantized Q.K (no VL, no window; matches `reference.uniform_quantized_prefill_reference`)."""
    _check(q, k, v, lengths)
    if pv_format not in PV_FORMATS:
        raise ValueError(f"pv_format must be one of {PV_FORMATS}, got {pv_format!r}")
    pb = block_q or default_blocks(q.shape[-1], 256)[0]
    config = HyQuantConfig(window=0, rho=0.0, prefill_qk=qk_format, prefill_block=pb)
    bq, bk, nw, ns = _resolve(config, q.shape[-1], block_q, block_k, num_warps, num_stages)
    b, hkv = k.shape[:2]
    empty = jnp.zeros((b, hkv, 0), jnp.int32)
    return _prefill(q, k, v, lengths, empty, jnp.zeros((b,), jnp.int32), config=config, interpret=interpret,
                    scale=scale, uniform=True, qk_format=qk_format, pv_format=pv_format, block_q=bq,
                    block_k=bk, num_warps=nw, num_stages=ns)


@partial(jax.jit, static_argnames=("config", "interpret", "scale", "compute_wgs", "block_kv", "stages",
                                   "pingpong", "approx_math", "skip_masks", "magic_convert"))
def _prefill_mgpu(q, k, v, lengths, vl_idx, vl_count, *, config: HyQuantConfig, interpret, scale, compute_wgs,
                  block_kv, stages, pingpong, approx_math, skip_masks, magic_convert):
    args, scale = _prepare(q, k, v, lengths, vl_idx, vl_count, config=config, scale=scale, uniform=False,
                           qk_format="int8", pv_format="bf16", block_q=_mgpu.BLOCK,
                           block_k=max(block_kv, _mgpu.BLOCK * compute_wgs))
    out = _mgpu.hybrid_prefill_mgpu(*args, scale=scale, compute_wgs=compute_wgs, block_kv=block_kv, stages=stages,
                                    pingpong=pingpong, approx_math=approx_math, skip_masks=skip_masks,
                                    magic_convert=magic_convert, interpret=interpret)
    return out[:, :, :q.shape[2]].astype(q.dtype)


def prefill_attention_mgpu(q, k, v, lengths, vl_idx, vl_count, config: HyQuantConfig, interpret: bool = False,
                           scale: float | None = None, *, compute_wgs: int = 1, block_kv: int = 64,
                           stages: int = 2, pingpong: bool = False, approx_math: bool = False,
                           skip_masks: bool = True, magic_convert: bool = False):
    """`prefill_attention` through the Mosaic GPU kernel (`pallas_kernels.prefill_mgpu`, Hopper only).

    Same arguments, result and reference as `prefill_attention`. Scope: INT8 Q.K
    (`config.prefill_qk == "int8"`), bf16 P.V, head_dim 64 or 128. A CTA computes
    `compute_wgs` (1 or 2) blocks of 64 query rows on one stream of key steps of
    `block_kv` (64 or 128) keys, `stages` of them in shared memory at once;
    `config.prefill_block` must be a multiple of 64. `pingpong`: two compute
    warpgroups take turns at the tensor cores. `approx_math`, `skip_masks`, `magic_convert`: see
    `pallas_kernels.prefill_mgpu.hybrid_prefill_mgpu`.
    """
    _check(q, k, v, lengths)
    problems = []
    if config.prefill_qk != "int8":
        problems.append(f"config.prefill_qk 'int8' (got {config.prefill_qk!r})")
    if config.prefill_block % _mgpu.BLOCK:
        problems.append(f"config.prefill_block a multiple of {_mgpu.BLOCK} (got {config.prefill_block})")
    if q.shape[-1] not in _mgpu.HEAD_DIMS:
        problems.append(f"head_dim in {_mgpu.HEAD_DIMS} (got {q.shape[-1]})")
    if problems:
        raise ValueError("the Mosaic GPU prefill kernel needs " + "; ".join(problems))
    _check_vl(q, k, vl_idx, vl_count)
    return _prefill_mgpu(q, k, v, lengths, vl_idx.astype(jnp.int32), vl_count.astype(jnp.int32), config=config,
                         interpret=interpret, scale=scale, compute_wgs=compute_wgs, block_kv=block_kv,
                         stages=stages, pingpong=pingpong, approx_math=approx_math, skip_masks=skip_masks,
                         magic_convert=magic_convert)
