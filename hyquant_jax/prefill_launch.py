"""The prefill op: causal hybrid prefill attention through the Pallas kernels.

Implementations (`IMPLEMENTATIONS`, in the order "auto" prefers them; `resolve` maps backend names to them):
  "mosaic"    `pallas_kernels.prefill_mgpu` (Mosaic GPU), Hopper only, for INT8 Q.K, `prefill_block` a multiple
              of 64 and head_dim 64 or 128 (`mosaic_unfit`);
  "triton"    `pallas_kernels.prefill` (Triton), any recent NVIDIA GPU (or interpret mode), head_dim a power
              of two >= 16;
  "reference" `hyquant_jax.reference`, any device (`hyquant_jax.attention` runs it).
`PrefillTuning` holds both kernels' launch knobs, with one set of defaults. Why two kernels: docs/design.md,
"Prefill kernels".

`_prepare` makes the arrays both kernels take, with the exact math of
`reference.hybrid_prefill_attention_reference`:

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

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp

from hyquant_jax import backends, quant
from hyquant_jax.backends import TRITON_WARPS, Implementation
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.reference import check_prefill_shapes
from hyquant_jax.reorder import stable_partition
from pallas_kernels import prefill as _kernel
from pallas_kernels import prefill_mgpu as _mgpu

LOG2E = _kernel.LOG2E
PV_FORMATS = ("bf16", "fp8")


@dataclasses.dataclass(frozen=True)
class PrefillTuning:
    """The prefill kernels' launch knobs, checked on construction: one set of defaults for each kernel.

    Triton kernel (`pallas_kernels.prefill`): block_q query rows and block_k keys per step (powers of two
    >= 16; block_q divides `config.prefill_block`), num_warps, num_stages; None: `default_blocks` for the
    head_dim and `config.prefill_block` (num_warps: `_default_warps` for the block_q in use).
    Mosaic kernel (`pallas_kernels.prefill_mgpu.hybrid_prefill_mgpu`): compute_wgs (1 or 2) warpgroups of 64
    query rows per CTA on one stream of key steps of block_kv (64 or 128) keys, `stages` (>= 2) of them in
    shared memory at once; pingpong: two compute warpgroups take turns at the tensor cores; approx_math:
    approximate exp2; skip_masks: steps whose keys are all valid for every row skip the mask; magic_convert:
    the INT8 dots become float32 by an add and a subtract; pv_fp8: P.V over the quantized segment in FP8
    (e4m3 probabilities and per-channel values, block_kv 128). The defaults are the fastest setting measured
    with bf16 P.V (docs/design.md, "Prefill kernels").
    """

    block_q: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    compute_wgs: int = 2
    block_kv: int = 128
    stages: int = 2
    pingpong: bool = True
    approx_math: bool = True
    skip_masks: bool = True
    magic_convert: bool = True
    pv_fp8: bool = False

    def __post_init__(self):
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            if value is not None and not (type(value) is int and value >= 16 and value & (value - 1) == 0):
                raise ValueError(f"PrefillTuning.{name} must be None or a power of two >= 16, got {value!r}")
        if self.num_warps is not None and (type(self.num_warps) is not int or self.num_warps not in TRITON_WARPS):
            raise ValueError(f"PrefillTuning.num_warps must be None or one of {TRITON_WARPS}, got {self.num_warps!r}")
        if self.num_stages is not None and not (type(self.num_stages) is int and self.num_stages >= 1):
            raise ValueError(f"PrefillTuning.num_stages must be None or an int >= 1, got {self.num_stages!r}")
        if type(self.compute_wgs) is not int or self.compute_wgs not in _mgpu.COMPUTE_WGS:
            raise ValueError(f"PrefillTuning.compute_wgs must be one of {_mgpu.COMPUTE_WGS}, got {self.compute_wgs!r}")
        if type(self.block_kv) is not int or self.block_kv not in _mgpu.BLOCK_KVS:
            raise ValueError(f"PrefillTuning.block_kv must be one of {_mgpu.BLOCK_KVS}, got {self.block_kv!r}")
        if not (type(self.stages) is int and self.stages >= _mgpu.MIN_STAGES):
            raise ValueError(f"PrefillTuning.stages must be an int >= {_mgpu.MIN_STAGES}, got {self.stages!r}")
        for name in ("pingpong", "approx_math", "skip_masks", "magic_convert", "pv_fp8"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"PrefillTuning.{name} must be a bool, got {getattr(self, name)!r}")
        if self.pv_fp8 and self.block_kv != 128:
            raise ValueError(f"PrefillTuning.pv_fp8 needs block_kv 128, got {self.block_kv}")

    def mosaic(self) -> dict:
        """The Mosaic kernel's launch keywords (`hybrid_prefill_mgpu`)."""
        return dict(compute_wgs=self.compute_wgs, block_kv=self.block_kv, stages=self.stages, pingpong=self.pingpong,
                    approx_math=self.approx_math, skip_masks=self.skip_masks, magic_convert=self.magic_convert,
                    pv_fp8=self.pv_fp8)


def check_tuning(tuning, name: str = "tuning") -> PrefillTuning | None:
    """`tuning` if it is None (the defaults) or a `PrefillTuning`; anything else is a ValueError naming the
    argument `name`."""
    if tuning is not None and not isinstance(tuning, PrefillTuning):
        raise ValueError(f"{name} must be None or a hyquant_jax.prefill_launch.PrefillTuning, got {tuning!r}")
    return tuning


# ----------------------------------------------------------------------------- fit rules and implementations

def mosaic_unfit(head_dim: int, config: HyQuantConfig) -> list[str]:
    """What `pallas_kernels.prefill_mgpu` needs that this head_dim and config lack (empty: it fits)."""
    problems = []
    if config.prefill_qk != "int8":
        problems.append(f"config.prefill_qk 'int8' (got {config.prefill_qk!r})")
    if config.prefill_block % _mgpu.BLOCK:
        problems.append(f"config.prefill_block a multiple of {_mgpu.BLOCK} (got {config.prefill_block})")
    if head_dim not in _mgpu.HEAD_DIMS:
        problems.append(f"head_dim in {_mgpu.HEAD_DIMS} (got {head_dim})")
    return problems


def triton_unfit(head_dim: int) -> str | None:
    """Why `pallas_kernels.prefill` cannot take this head_dim, or None where it can."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head_dim must be a power of two >= 16 (64, 128, 256), got {head_dim}"
    return None


def _mosaic_unsupported(device, head_dim: int, config: HyQuantConfig, interpret: bool = False) -> str | None:
    if not interpret and not backends.is_hopper(device):
        return f"the Mosaic GPU prefill kernel needs a Hopper GPU, got {getattr(device, 'device_kind', device)}"
    problems = mosaic_unfit(head_dim, config)
    return "the Mosaic GPU prefill kernel needs " + "; ".join(problems) if problems else None


def _triton_unsupported(device, head_dim: int, config: HyQuantConfig, interpret: bool = False) -> str | None:
    return backends.needs_gpu(device, interpret, "Triton prefill kernel") or triton_unfit(head_dim)


# unsupported(device, head_dim, config, interpret): the reason an implementation cannot run, or None
IMPLEMENTATIONS = {implementation.name: implementation for implementation in (
    Implementation("mosaic", _mosaic_unsupported),
    Implementation("triton", _triton_unsupported),
    Implementation("reference", backends.runs_anywhere),
)}


def resolve(backend: str, head_dim: int, config: HyQuantConfig, device=None) -> str:
    """The implementation `hyquant_jax.prefill_attention` runs for `backend`: "auto" -> the first of
    IMPLEMENTATIONS that runs on `device` (default: the first JAX device) for this head_dim and config; other
    backend names as they are ("interpret": the Triton kernel in interpret mode)."""
    backends.check_backend(backend)
    if backend == "auto":
        return backends.first_supported(IMPLEMENTATIONS.values(), backends.default_device(device), head_dim, config)
    return backend


# ----------------------------------------------------------------------------- the Triton kernel's launch

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
                        tuning: PrefillTuning | None = None):
    """Split `prefill_attention` into its glue and its Triton kernel (for benchmarks).

    Returns (args, kernel): `args` are the prepared arrays (computed now, jitted)
    and `kernel(*args)` runs only the Pallas kernel, returning [B, Hq, Tp, D]
    (Tp >= T: cut rows off with [:, :, :T]).
    """
    _check(q, k, v, lengths)
    tuning = check_tuning(tuning) or PrefillTuning()
    if uniform:
        config = _uniform_config(config.prefill_qk, q.shape[-1], tuning)
    bq, bk, nw, ns = triton_launch(q.shape[-1], config, tuning)
    prep = jax.jit(partial(_prepare, config=config, scale=scale, uniform=uniform, qk_format=config.prefill_qk,
                           pv_format=pv_format, block_q=bq, block_k=bk))
    args, kscale = prep(q, k, v, lengths, vl_idx.astype(jnp.int32), vl_count.astype(jnp.int32))
    kernel = partial(_kernel.hybrid_prefill, scale=float(kscale), block_q=bq, block_k=bk,
                     qk_format=config.prefill_qk, uniform=uniform, pv_fp8=pv_format == "fp8", num_warps=nw,
                     num_stages=ns, interpret=interpret, out_dtype=q.dtype)
    return args, kernel


def triton_launch(head_dim: int, config: HyQuantConfig, tuning: PrefillTuning) -> tuple[int, int, int, int]:
    """(block_q, block_k, num_warps, num_stages) of the Triton launch: the tuning's, `default_blocks`' where it
    leaves them None. Raises where block_q does not divide `config.prefill_block`."""
    dq, dk, _, ds = default_blocks(head_dim, config.prefill_block)
    block_q = dq if tuning.block_q is None else tuning.block_q
    block_k = dk if tuning.block_k is None else tuning.block_k
    num_warps = _default_warps(block_q, head_dim) if tuning.num_warps is None else tuning.num_warps
    num_stages = ds if tuning.num_stages is None else tuning.num_stages
    if block_q > config.prefill_block or config.prefill_block % block_q:
        raise ValueError(f"block_q={block_q} must divide config.prefill_block={config.prefill_block}")
    return block_q, block_k, num_warps, num_stages


def _uniform_config(qk_format: str, head_dim: int, tuning: PrefillTuning) -> HyQuantConfig:
    """The config of the uniform baseline: no VL, no window, one prefill block per query block."""
    block = tuning.block_q or default_blocks(head_dim, 256)[0]
    return HyQuantConfig(window=0, rho=0.0, prefill_qk=qk_format, prefill_block=block)


def _check(q, k, v, lengths):
    check_prefill_shapes(q, k, v, lengths)
    why_not = triton_unfit(q.shape[3])
    if why_not is not None:
        raise ValueError(why_not)


def _check_vl(q, k, vl_idx, vl_count):
    if vl_idx.ndim != 3 or vl_idx.shape[:2] != k.shape[:2] or vl_count.shape != (q.shape[0],):
        raise ValueError(f"vl_idx must be [B, Hkv, K] and vl_count [B]; got {vl_idx.shape}, {vl_count.shape}")


def _check_pv_format(pv_format):
    if pv_format not in PV_FORMATS:
        raise ValueError(f"pv_format must be one of {PV_FORMATS}, got {pv_format!r}")


def prefill_attention(q, k, v, lengths, vl_idx, vl_count, config: HyQuantConfig, interpret: bool = False,
                      scale: float | None = None, *, pv_format: str = "bf16", tuning: PrefillTuning | None = None):
    """Causal hybrid prefill attention with the Triton kernel (matches
    `reference.hybrid_prefill_attention_reference`).

    q: [B, Hq, T, D]; k, v: [B, Hkv, T, D]; lengths int [B]; vl_idx int32
    [B, Hkv, Kmax] sorted ascending, the first vl_count[b] valid (from
    `vertical_token_identification`). QK format from `config.prefill_qk`.
    pv_format "fp8" also runs P.V of the quantized segment in fp8 e4m3 (one
    scale per channel of V; not in the reference, an option for speed).
    tuning: the launch (None: `PrefillTuning()`'s defaults).
    Returns [B, Hq, T, D] in q.dtype; rows at positions >= lengths are 0.
    """
    _check(q, k, v, lengths)
    _check_pv_format(pv_format)
    _check_vl(q, k, vl_idx, vl_count)
    bq, bk, nw, ns = triton_launch(q.shape[-1], config, check_tuning(tuning) or PrefillTuning())
    return _prefill(q, k, v, lengths, vl_idx.astype(jnp.int32), vl_count.astype(jnp.int32), config=config,
                    interpret=interpret, scale=scale, uniform=False, qk_format=config.prefill_qk,
                    pv_format=pv_format, block_q=bq, block_k=bk, num_warps=nw, num_stages=ns)


def uniform_prefill_attention(q, k, v, lengths, qk_format: str = "int8", interpret: bool = False,
                              scale: float | None = None, *, pv_format: str = "bf16",
                              tuning: PrefillTuning | None = None):
    """SageAttention-style baseline on the same kernel: every causal key through
    quantized Q.K (no VL, no window; matches `reference.uniform_quantized_prefill_reference`)."""
    _check(q, k, v, lengths)
    _check_pv_format(pv_format)
    tuning = check_tuning(tuning) or PrefillTuning()
    config = _uniform_config(qk_format, q.shape[-1], tuning)
    bq, bk, nw, ns = triton_launch(q.shape[-1], config, tuning)
    b, hkv = k.shape[:2]
    empty = jnp.zeros((b, hkv, 0), jnp.int32)
    return _prefill(q, k, v, lengths, empty, jnp.zeros((b,), jnp.int32), config=config, interpret=interpret,
                    scale=scale, uniform=True, qk_format=qk_format, pv_format=pv_format, block_q=bq,
                    block_k=bk, num_warps=nw, num_stages=ns)


# ----------------------------------------------------------------------------- the Mosaic kernel's launch

@partial(jax.jit, static_argnames=("config", "interpret", "scale", "compute_wgs", "block_kv", "stages",
                                   "pingpong", "approx_math", "skip_masks", "magic_convert", "pv_fp8"))
def _prefill_mgpu(q, k, v, lengths, vl_idx, vl_count, *, config: HyQuantConfig, interpret, scale, compute_wgs,
                  block_kv, stages, pingpong, approx_math, skip_masks, magic_convert, pv_fp8):
    args, scale = _prepare(q, k, v, lengths, vl_idx, vl_count, config=config, scale=scale, uniform=False,
                           qk_format="int8", pv_format="bf16", block_q=_mgpu.BLOCK,
                           block_k=max(block_kv, _mgpu.BLOCK * compute_wgs))
    if pv_fp8:
        args = args[:7] + _mgpu.fp8_values(args[7]) + args[9:]
    out = _mgpu.hybrid_prefill_mgpu(*args, scale=scale, compute_wgs=compute_wgs, block_kv=block_kv, stages=stages,
                                    pingpong=pingpong, approx_math=approx_math, skip_masks=skip_masks,
                                    magic_convert=magic_convert, pv_fp8=pv_fp8, interpret=interpret)
    return out[:, :, :q.shape[2]].astype(q.dtype)


def prefill_attention_mgpu(q, k, v, lengths, vl_idx, vl_count, config: HyQuantConfig, interpret: bool = False,
                           scale: float | None = None, *, tuning: PrefillTuning | None = None):
    """`prefill_attention` through the Mosaic GPU kernel (`pallas_kernels.prefill_mgpu`, Hopper; interpret mode
    simulates it on a CPU).

    Same arguments, result and reference as `prefill_attention`. Scope: INT8 Q.K
    (`config.prefill_qk == "int8"`), bf16 P.V, head_dim 64 or 128, `config.prefill_block` a multiple of 64
    (`mosaic_unfit`). tuning: the launch (None: `PrefillTuning()`'s defaults; see its Mosaic fields).
    """
    _check(q, k, v, lengths)
    problems = mosaic_unfit(q.shape[-1], config)
    if problems:
        raise ValueError("the Mosaic GPU prefill kernel needs " + "; ".join(problems))
    _check_vl(q, k, vl_idx, vl_count)
    return _prefill_mgpu(q, k, v, lengths, vl_idx.astype(jnp.int32), vl_count.astype(jnp.int32), config=config,
                         interpret=interpret, scale=scale, **(check_tuning(tuning) or PrefillTuning()).mosaic())
