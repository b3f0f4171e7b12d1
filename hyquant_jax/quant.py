"""Low-bit quantization and bit packing (pure jnp, jittable).

Codes are unsigned integers u in [0, 2**bits). Every scheme dequantizes as

    x_hat = u * scale + zero

where a symmetric scheme stores no zero: its zero is -scale * 2**(bits-1), so
u - 2**(bits-1) is the signed code in [-(2**(bits-1) - 1), 2**(bits-1) - 1].

Scales and zero points are stored in bf16. The codes are computed against the
*rounded* bf16 parameters, so storing them in 16 bits adds no error beyond
a possible clip of the extreme elements of a group by < 0.4% of their magnitude
(the largest through a rounded-down scale; for asymmetric schemes also the
smallest, through a zero point rounded upward).

Packing: with n = 8 // bits codes per byte and Dp = D // n bytes per row,
code j of byte i is element j * Dp + i, stored in bits [j*bits, (j+1)*bits).
For 4 bits, byte i holds dims i (low nibble) and i + D/2 (high nibble), so a
GPU kernel unpacks a row into n contiguous slices with shifts and masks only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PARAM_DTYPE = jnp.bfloat16


def codes_per_byte(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8 for packing, got {bits}")
    return 8 // bits


def packed_width(head_dim: int, bits: int) -> int:
    """Bytes per packed row of `head_dim` codes."""
    n = codes_per_byte(bits)
    if head_dim % n:
        raise ValueError(f"head_dim={head_dim} must be a multiple of {n} for {bits}-bit packing")
    return head_dim // n


def pack(codes: jnp.ndarray, bits: int) -> jnp.ndarray:
    """uint8 codes [..., D] with values < 2**bits -> packed uint8 [..., D * bits // 8]."""
    n = codes_per_byte(bits)
    width = packed_width(codes.shape[-1], bits)
    codes = codes.astype(jnp.uint8)
    out = jnp.zeros(codes.shape[:-1] + (width,), jnp.uint8)
    for j in range(n):
        out = out | (codes[..., j * width:(j + 1) * width] << (j * bits)).astype(jnp.uint8)
    return out


def unpack(packed: jnp.ndarray, bits: int) -> jnp.ndarray:
    """Inverse of `pack`: uint8 [..., Dp] -> uint8 codes [..., Dp * 8 // bits]."""
    n = codes_per_byte(bits)
    mask = jnp.uint8((1 << bits) - 1)
    parts = [(packed >> (j * bits)) & mask for j in range(n)]
    return jnp.concatenate(parts, axis=-1).astype(jnp.uint8)


def _round_param(x: jnp.ndarray) -> jnp.ndarray:
    # reduce_precision, not .astype(bf16).astype(f32): XLA (xla_allow_excess_precision, on by
    # default) may drop a convert round trip inside a fusion, so the codes would be computed
    # against the unrounded parameter while the stored bf16 one is rounded.
    return jax.lax.reduce_precision(x.astype(jnp.float32), exponent_bits=8, mantissa_bits=7)


def _symmetric(x, bits, axis, valid):
    qmax = 2 ** (bits - 1) - 1
    absx = jnp.abs(x) if valid is None else jnp.where(valid, jnp.abs(x), 0.0)
    scale = _round_param(jnp.max(absx, axis=axis, keepdims=True) / qmax)
    scale = jnp.where(scale > 0, scale, 1.0)
    signed = jnp.clip(jnp.round(x / scale), -qmax, qmax)
    codes = (signed + 2 ** (bits - 1)).astype(jnp.uint8)
    return codes, scale, None


def _asymmetric(x, bits, axis, valid):
    levels = 2**bits - 1
    lo = x if valid is None else jnp.where(valid, x, jnp.inf)
    hi = x if valid is None else jnp.where(valid, x, -jnp.inf)
    zero = jnp.min(lo, axis=axis, keepdims=True)
    high = jnp.max(hi, axis=axis, keepdims=True)
    # A fully masked group has min=+inf: give it harmless parameters.
    finite = jnp.isfinite(zero)
    zero = _round_param(jnp.where(finite, zero, 0.0))
    scale = _round_param(jnp.where(finite, (high - zero) / levels, 1.0))
    scale = jnp.where(scale > 0, scale, 1.0)
    codes = jnp.clip(jnp.round((x - zero) / scale), 0, levels).astype(jnp.uint8)
    return codes, scale, zero


def quantize_tokens(x, bits: int, *, symmetric: bool, group_size: int | None = None):
    """Per-token quantization over channel groups.

    x: float [..., T, D]. Returns (codes uint8 [..., T, D], scale bf16 [..., T, G],
    zero bf16 [..., T, G] or None), G = D // group_size.
    """
    d = x.shape[-1]
    group = group_size or d
    if d % group:
        raise ValueError(f"group_size={group_size} must divide head_dim={d}")
    xg = x.astype(jnp.float32).reshape(x.shape[:-1] + (d // group, group))
    fn = _symmetric if symmetric else _asymmetric
    codes, scale, zero = fn(xg, bits, -1, None)
    codes = codes.reshape(x.shape)
    scale = scale[..., 0].astype(PARAM_DTYPE)
    zero = None if zero is None else zero[..., 0].astype(PARAM_DTYPE)
    return codes, scale, zero


def dequantize_tokens(codes, scale, zero, bits: int) -> jnp.ndarray:
    """Inverse of `quantize_tokens` in float32: codes [..., T, D], scale/zero [..., T, G]."""
    d = codes.shape[-1]
    groups = scale.shape[-1]
    u = codes.astype(jnp.float32).reshape(codes.shape[:-1] + (groups, d // groups))
    s = scale.astype(jnp.float32)[..., None]
    z = -s * 2 ** (bits - 1) if zero is None else zero.astype(jnp.float32)[..., None]
    return (u * s + z).reshape(codes.shape)


def quantize_channels(x, bits: int, valid=None):
    """Per-channel asymmetric quantization over the token axis (KIVI-style keys).

    x: float [..., T, D]; valid: optional bool [..., T] marking tokens that count
    for the range. Returns (codes uint8 [..., T, D], scale bf16 [..., D], zero bf16 [..., D]).
    """
    mask = None if valid is None else valid[..., None]
    codes, scale, zero = _asymmetric(x.astype(jnp.float32), bits, -2, mask)
    return codes, scale[..., 0, :].astype(PARAM_DTYPE), zero[..., 0, :].astype(PARAM_DTYPE)


def dequantize_channels(codes, scale, zero) -> jnp.ndarray:
    """Inverse of `quantize_channels` in float32: codes [..., T, D], scale/zero [..., D]."""
    s = scale.astype(jnp.float32)[..., None, :]
    z = zero.astype(jnp.float32)[..., None, :]
    return codes.astype(jnp.float32) * s + z


def quantize_int8(x, axis: int = -1):
    """Symmetric int8 with a float32 scale per slice along `axis` (prefill Q/K).

    Returns (int8 values, float32 scale with `axis` kept as size 1).
    """
    x = x.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x), axis=axis, keepdims=True) / 127.0
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.clip(jnp.round(x / scale), -127, 127).astype(jnp.int8), scale


FP8_MAX = 448.0


def quantize_fp8(x, axis: int = -1):
    """float8_e4m3fn with a float32 scale per slice along `axis` (max maps to 448)."""
    x = x.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x), axis=axis, keepdims=True) / FP8_MAX
    scale = jnp.where(scale > 0, scale, 1.0)
    return (x / scale).astype(jnp.float8_e4m3fn), scale


def quantize_fp8_tokens(x):
    """float8_e4m3fn codes with one bf16 scale per token (the last axis): x [..., D] -> (codes [..., D], scale
    bf16 [..., 1]); the token's largest |x| maps to 448 (FP8_MAX).

    As in the low-bit schemes, the codes are computed against the bf16-rounded scale; a scale rounded down can
    push the largest element past 448, so the quotient is clipped to +-448 before the cast (e4m3fn has no
    infinity: an out-of-range cast gives NaN). An all-zero token gets scale 1."""
    x = x.astype(jnp.float32)
    scale = _round_param(jnp.max(jnp.abs(x), axis=-1, keepdims=True) / FP8_MAX)
    scale = jnp.where(scale > 0, scale, 1.0)
    codes = jnp.clip(x / scale, -FP8_MAX, FP8_MAX).astype(jnp.float8_e4m3fn)
    return codes, scale.astype(PARAM_DTYPE)


def dequantize_fp8_tokens(codes, scale, dtype=jnp.float32):
    """Inverse of `quantize_fp8_tokens`: codes [..., D] * scale [..., 1] in float32, cast to dtype."""
    return (codes.astype(jnp.float32) * scale.astype(jnp.float32)).astype(dtype)
