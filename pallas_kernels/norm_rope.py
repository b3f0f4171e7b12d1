"""Pallas GPU (Triton) kernels for the small per-layer work of a decode step: residual add + RMSNorm, and the
q/k RMSNorm + rotary embedding.

At batch 1 a decode step of a 36-layer model is ~25 kernels a layer, most of them tiny: XLA lowers each
RMSNorm to a reduction and a separate normalising kernel, each residual add to its own kernel, and the q/k
norms and RoPE to two kernels per tensor. Every one costs a launch however little it computes
(docs/design.md, "Per-layer kernels").
Here:

* `add_rms_norm`: x + delta and RMSNorm(x + delta) * weight in one launch (one program per row; the row sum
  of squares is a reduction inside the program), replacing XLA's add, reduce and normalise kernels;
* `qk_norm_rope`: the per-head RMSNorm of q and k (Qwen3) and the rotate-half RoPE of both in one launch
  (one program per (sequence, query head); programs below the KV-head count also do that k head).

The math and its rounding points are those of `models.layers.rms_norm` and `apply_rope`, the references
(float32 inside, the norm's output rounded to the input dtype before RoPE); only the order of the float32
sums may differ from XLA's. Row widths must be powers of two (Triton block shapes): `fits`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def fits(*widths: int) -> bool:
    """Whether the kernels take rows of these widths (hidden size, head_dim): powers of two >= 32."""
    return all(w >= 32 and (w & (w - 1)) == 0 for w in widths)


def _normalise(x, w, r):
    """models.layers.rms_norm's last step: (x * r) * w in float32 (x, w float32; r the row's rsqrt)."""
    return x * r * w


def _add_rms_norm_kernel(*refs, has_delta: bool, eps: float):
    if has_delta:
        x_ref, d_ref, w_ref, sum_ref, out_ref = refs
    else:
        x_ref, w_ref, out_ref = refs
    i = pl.program_id(0)
    x = x_ref[i, :]
    if has_delta:
        x = (x.astype(jnp.float32) + d_ref[i, :].astype(jnp.float32)).astype(x_ref.dtype)
        sum_ref[i, :] = x
    x32 = x.astype(jnp.float32)
    r = lax.rsqrt(jnp.sum(x32 * x32) / x32.shape[0] + eps)
    out_ref[i, :] = _normalise(x32, w_ref[:].astype(jnp.float32), r).astype(out_ref.dtype)


def add_rms_norm(x: jax.Array, delta: jax.Array | None, weight: jax.Array, eps: float,
                 interpret: bool = False, num_warps: int = 16):
    """(x + delta, rms_norm(x + delta, weight, eps)) in one launch; without delta, (x, rms_norm(x, ...)).

    x, delta: [N, E] of one float dtype (the sum is rounded to it, as XLA's bf16 add); weight [E].
    Returns two [N, E] arrays of x.dtype. E must satisfy `fits`. num_warps: warps of each row's program (16:
    the fastest measured at E=4096, N=1 and 25; docs/design.md, "Per-layer kernels").
    """
    n, e = x.shape
    if not fits(e):
        raise ValueError(f"add_rms_norm: the row width E must be a power of two >= 32, got x of shape {x.shape}")
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype):
        raise ValueError(f"add_rms_norm: delta must match x ({x.shape}, {x.dtype}), got {delta.shape}, {delta.dtype}")
    if weight.shape != (e,):
        raise ValueError(f"add_rms_norm: weight must be [E]={(e,)}, got {weight.shape}")
    _check_warps(num_warps)
    return _add_rms_norm(x, delta, weight, eps=float(eps), interpret=interpret, num_warps=num_warps)


def _check_warps(num_warps: int):
    if num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be a power of two from 1 to 16, got {num_warps!r}")


@functools.partial(jax.jit, static_argnames=("eps", "interpret", "num_warps"))
def _add_rms_norm(x, delta, weight, eps: float, interpret: bool, num_warps: int):
    row = jax.ShapeDtypeStruct(x.shape, x.dtype)
    has_delta = delta is not None
    out = pl.pallas_call(
        functools.partial(_add_rms_norm_kernel, has_delta=has_delta, eps=eps),
        grid=(x.shape[0],),
        out_shape=[row, row] if has_delta else [row],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="hyquant_add_rms_norm",
    )(*((x, delta, weight) if has_delta else (x, weight)))
    return tuple(out) if has_delta else (x, out[0])


def _qk_norm_rope_kernel(*refs, kv_heads: int, norm: bool, eps: float):
    if norm:
        q_ref, k_ref, cos_ref, sin_ref, qw_ref, kw_ref, q_out, k_out = refs
    else:
        q_ref, k_ref, cos_ref, sin_ref, q_out, k_out = refs
    b, j = pl.program_id(0), pl.program_id(1)
    half = q_ref.shape[-1] // 2
    lo, hi = pl.ds(0, half), pl.ds(half, half)
    cos_lo, cos_hi = cos_ref[b, lo], cos_ref[b, hi]
    sin_lo, sin_hi = sin_ref[b, lo], sin_ref[b, hi]

    def rotate(x_ref, head, w_ref):
        """One head, both halves: (RMSNorm rounded to the dtype, then) rotate-half RoPE, in float32."""
        x_lo, x_hi = x_ref[b, head, lo].astype(jnp.float32), x_ref[b, head, hi].astype(jnp.float32)
        if norm:
            r = lax.rsqrt((jnp.sum(x_lo * x_lo) + jnp.sum(x_hi * x_hi)) / (2 * half) + eps)
            x_lo = _normalise(x_lo, w_ref[lo].astype(jnp.float32), r).astype(x_ref.dtype).astype(jnp.float32)
            x_hi = _normalise(x_hi, w_ref[hi].astype(jnp.float32), r).astype(x_ref.dtype).astype(jnp.float32)
        return x_lo * cos_lo + -x_hi * sin_lo, x_hi * cos_hi + x_lo * sin_hi

    q_lo, q_hi = rotate(q_ref, j, qw_ref if norm else None)
    q_out[b, j, lo] = q_lo.astype(q_out.dtype)
    q_out[b, j, hi] = q_hi.astype(q_out.dtype)
    # Programs j < kv_heads also do k head j; the others recompute the last k head and store nothing.
    kj = jnp.minimum(j, kv_heads - 1)
    k_lo, k_hi = rotate(k_ref, kj, kw_ref if norm else None)
    mine = jnp.full((half,), j < kv_heads)
    plgpu.store(k_out.at[b, kj, lo], k_lo.astype(k_out.dtype), mask=mine)
    plgpu.store(k_out.at[b, kj, hi], k_hi.astype(k_out.dtype), mask=mine)


def qk_norm_rope(q: jax.Array, k: jax.Array, cos: jax.Array, sin: jax.Array, q_weight: jax.Array | None,
                 k_weight: jax.Array | None, eps: float, interpret: bool = False, num_warps: int = 1):
    """RoPE of one decode token's q and k, after their per-head RMSNorm when weights are given.

    q: [B, Hq, D], k: [B, Hkv, D] (Hkv <= Hq) of one float dtype; cos, sin: float32 [B, D] (HF layout,
    halves repeated); q_weight, k_weight: [D] both or neither. Returns (q, k) rotated, in their dtype:
    `apply_rope(rms_norm(x, weight, eps), cos, sin)` per head (`models.layers`). D must satisfy `fits`.
    num_warps: warps of each (sequence, head) program (1: the fastest measured at D=128).
    """
    b, hq, d = q.shape
    if k.ndim != 3 or k.shape[0] != b or k.shape[2] != d or not 1 <= k.shape[1] <= hq or k.dtype != q.dtype:
        raise ValueError(f"qk_norm_rope: k must be [B={b}, Hkv <= {hq}, D={d}] of {q.dtype}, got {k.shape}, {k.dtype}")
    if not fits(d):
        raise ValueError(f"qk_norm_rope: head_dim must be a power of two >= 32, got {d}")
    for name, x in (("cos", cos), ("sin", sin)):
        if x.shape != (b, d):
            raise ValueError(f"qk_norm_rope: {name} must be [B, D]={(b, d)}, got {x.shape}")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("qk_norm_rope: pass both q_weight and k_weight, or neither")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w is not None and w.shape != (d,):
            raise ValueError(f"qk_norm_rope: {name} must be [D]={(d,)}, got {w.shape}")
    _check_warps(num_warps)
    return _qk_norm_rope(q, k, cos.astype(jnp.float32), sin.astype(jnp.float32), q_weight, k_weight,
                         eps=float(eps), interpret=interpret, num_warps=num_warps)


@functools.partial(jax.jit, static_argnames=("eps", "interpret", "num_warps"))
def _qk_norm_rope(q, k, cos, sin, q_weight, k_weight, eps: float, interpret: bool, num_warps: int):
    norm = q_weight is not None
    weights = (q_weight, k_weight) if norm else ()
    q_out, k_out = pl.pallas_call(
        functools.partial(_qk_norm_rope_kernel, kv_heads=k.shape[1], norm=norm, eps=eps),
        grid=(q.shape[0], q.shape[1]),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="hyquant_qk_norm_rope",
    )(q, k, cos, sin, *weights)
    return q_out, k_out
