"""Packing and quantization (quant.py) against the float64 oracle and exact hand-computed cases.

Code/parameter mismatches are allowed only where the oracle flags float32-vs-float64
rounding ambiguity (a quotient within ~2**-20 relative of a .5 tie or of a bf16
midpoint); tests also check that such flags are rare, so the allowance is not vacuous.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyquant_jax import quant
from tests.helpers import oracle
from tests.helpers.hq_helpers import rng

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)

quantize_tokens = jax.jit(quant.quantize_tokens, static_argnames=("bits", "symmetric", "group_size"))
quantize_channels = jax.jit(quant.quantize_channels, static_argnames=("bits",))
dequantize_tokens = jax.jit(quant.dequantize_tokens, static_argnames=("bits",))
pack = jax.jit(quant.pack, static_argnames=("bits",))
unpack = jax.jit(quant.unpack, static_argnames=("bits",))


def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def sample(gen, shape, kind):
    """Random float32 data of a few kinds (rows along the last two axes)."""
    x = gen.standard_normal(shape) * np.exp(gen.uniform(-3, 3, shape[:-1] + (1,)))
    if kind == "offset":  # values far from 0 relative to their spread (asymmetric ranges)
        x = x + gen.uniform(-50, 50, shape[:-1] + (1,)) * np.abs(x).max(axis=-1, keepdims=True)
    elif kind == "outlier":
        idx = gen.integers(0, shape[-1], shape[:-1])
        np.put_along_axis(x, idx[..., None], 30 * np.take_along_axis(x, idx[..., None], -1), -1)
    elif kind == "degenerate":  # some all-zero and some constant rows
        rows = gen.integers(0, 3, shape[:-1] + (1,))
        x = np.where(rows == 0, 0.0, np.where(rows == 1, x[..., :1], x))
    return x.astype(np.float32)


# --------------------------------------------------------------------------- packing


@SETTINGS
@given(bits=st.sampled_from([2, 4, 8]), d=st.sampled_from([8, 64, 128]), lead=st.integers(1, 5),
       seed=st.integers(0, 2**31))
def test_pack_matches_oracle_and_roundtrips(bits, d, lead, seed):
    gen = rng(seed)
    codes = gen.integers(0, 2**bits, (2, lead, d)).astype(np.uint8)
    packed = pack(jnp.asarray(codes), bits=bits)
    assert packed.dtype == jnp.uint8 and packed.shape == (2, lead, d * bits // 8)
    np.testing.assert_array_equal(np.asarray(packed), oracle.pack(codes, bits))
    np.testing.assert_array_equal(np.asarray(unpack(packed, bits=bits)), codes)
    raw = gen.integers(0, 256, (lead, d * bits // 8)).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(unpack(jnp.asarray(raw), bits=bits)), oracle.unpack(raw, bits))


def test_pack_layout_by_hand():
    # 4 bits: byte i holds element i (low nibble) and element i + D/2 (high nibble).
    assert quant.pack(jnp.asarray([[1, 2, 3, 4]], jnp.uint8), 4).tolist() == [[0x31, 0x42]]
    # 2 bits, D = 4: one byte, element j in bits [2j, 2j + 2).
    assert quant.pack(jnp.asarray([[1, 2, 3, 0]], jnp.uint8), 2).tolist() == [[1 | 2 << 2 | 3 << 4]]
    # 2 bits, D = 8: byte i holds elements i, i + 2, i + 4, i + 6.
    codes = jnp.asarray([[0, 1, 2, 3, 3, 2, 1, 0]], jnp.uint8)
    assert quant.pack(codes, 2).tolist() == [[0 | 2 << 2 | 3 << 4 | 1 << 6, 1 | 3 << 2 | 2 << 4 | 0 << 6]]
    assert quant.pack(jnp.asarray([[7, 200]], jnp.uint8), 8).tolist() == [[7, 200]]


def test_packing_rejects_bad_widths():
    with pytest.raises(ValueError, match="bits"):
        quant.codes_per_byte(16)
    with pytest.raises(ValueError, match="head_dim=6"):
        quant.packed_width(6, 2)
    assert quant.packed_width(6, 4) == 3 and quant.packed_width(64, 2) == 16


# --------------------------------------------------------------------------- per-token quantization


def check_against_oracle(x, codes, scale, zero, o: oracle.Quantized, bits, symmetric, rare=True):
    """Library (codes, scale, zero) vs oracle: equal except where the oracle flags ambiguity.

    rare: also require flags to be rare (not for degenerate data: constant rows put
    their range on a coarse lattice where exact bf16 midpoints are common; they are
    flagged conservatively even though both sides then compute them exactly).
    """
    assert codes.dtype == jnp.uint8 and scale.dtype == jnp.bfloat16
    s = f64(scale)
    assert s.shape == o.scale.shape
    mismatch = s != o.scale
    assert not (mismatch & ~o.param_amb).any(), "scale differs where the oracle is unambiguous"
    # where ambiguous, neighbours on the bf16 grid
    assert np.all(np.abs(s - o.scale) <= 2.0**-7 * np.abs(o.scale))
    if symmetric:
        assert zero is None
    else:
        assert zero.dtype == jnp.bfloat16
        np.testing.assert_array_equal(f64(zero), o.zero)  # bf16(min) has no ambiguity
    c = np.asarray(codes).astype(np.int64)
    bad = c != o.codes
    assert not (bad & ~o.code_amb).any(), (
        f"{int((bad & ~o.code_amb).sum())} codes differ where the oracle is unambiguous")
    if rare:
        assert o.code_amb.mean() < 0.01, "ambiguity flags must be rare for the comparison to mean something"
    if symmetric:
        assert c.min() >= 1 and c.max() <= 2**bits - 1  # signed codes in [-(2^(b-1)-1), 2^(b-1)-1]
    else:
        assert c.max() <= 2**bits - 1


def reconstruction_bound(x, scale_per_elem, symmetric):
    """|x_hat - x| <= scale/2 (rounding) + the clip that bf16 parameters may cause.

    bf16 has 8 significant bits: a rounded scale or zero is off by at most 2**-8
    relative, which can clip the extreme elements of a group by 2**-8 of the
    group's largest magnitude (largest element; for asymmetric also the smallest).
    """
    maxabs = np.abs(x).max(axis=-1, keepdims=True)
    clip = (2.0**-8 if symmetric else 2.0**-7 * (1 + 2.0**-8)) * maxabs
    return scale_per_elem / 2 + clip + 2.0**-22 * np.abs(x)


@SETTINGS
@given(
    bits=st.sampled_from([2, 4, 8]),
    symmetric=st.booleans(),
    d=st.sampled_from([64, 128]),
    group=st.sampled_from([None, 16, 32, 64]),
    t=st.integers(1, 40),
    kind=st.sampled_from(["normal", "offset", "outlier", "degenerate"]),
    seed=st.integers(0, 2**31),
)
def test_quantize_tokens_matches_oracle(bits, symmetric, d, group, t, kind, seed):
    x = sample(rng(seed), (2, 3, t, d), kind)
    codes, scale, zero = quantize_tokens(jnp.asarray(x), bits=bits, symmetric=symmetric, group_size=group)
    g = d // (group or d)
    assert codes.shape == x.shape and scale.shape == (2, 3, t, g)
    o = oracle.quantize_tokens(x, bits, symmetric, group)
    check_against_oracle(x, codes, scale, zero, o, bits, symmetric, rare=kind != "degenerate")

    xhat = dequantize_tokens(codes, scale, zero, bits=bits)
    assert xhat.dtype == jnp.float32
    # Dequantizing the library's own codes: the oracle formula, up to one float32 rounding.
    expected = oracle.dequantize_tokens(np.asarray(codes), f64(scale), None if zero is None else f64(zero), bits)
    np.testing.assert_allclose(np.asarray(xhat, np.float64), expected, rtol=2**-22, atol=1e-30)
    # The oracle's own reconstruction agrees within its per-element ambiguity bound.
    assert np.all(np.abs(np.asarray(xhat, np.float64) - o.xhat) <= o.err + 2**-22 * np.abs(o.xhat))
    # Math property, independent of the oracle: error <= half a step plus the bf16 clip.
    gs = group or d
    step = np.repeat(f64(scale), gs, axis=-1)
    xg = x.astype(np.float64).reshape(x.shape[:-1] + (g, gs))
    bound = reconstruction_bound(xg, step.reshape(xg.shape), symmetric).reshape(x.shape)
    assert np.all(np.abs(np.asarray(xhat, np.float64) - x) <= bound)


def test_quantize_tokens_exact_cases_by_hand():
    # symmetric 4 bit: max 3.5 / 7 = 0.5 exactly, every multiple of 0.5 is representable
    x = jnp.asarray([np.arange(-7, 9) * 0.5], jnp.float32)  # 16 values -3.5 .. 4.0 -> max 4: scale 4/7
    x = x.at[0, -1].set(0.0)
    codes, scale, zero = quant.quantize_tokens(x, 4, symmetric=True)
    assert zero is None and float(scale[0, 0]) == 0.5
    assert np.asarray(codes).tolist() == [list(range(1, 16)) + [8]]
    np.testing.assert_array_equal(quant.dequantize_tokens(codes, scale, None, 4), x)
    # asymmetric 2 bit: min 1, scale (2.5 - 1) / 3 = 0.5
    y = jnp.asarray([[1.0, 1.5, 2.0, 2.5, 2.5, 2.0, 1.5, 1.0]], jnp.float32)
    codes, scale, zero = quant.quantize_tokens(y, 2, symmetric=False)
    assert float(zero[0, 0]) == 1.0 and float(scale[0, 0]) == 0.5
    assert np.asarray(codes).tolist() == [[0, 1, 2, 3, 3, 2, 1, 0]]
    np.testing.assert_array_equal(quant.dequantize_tokens(codes, scale, zero, 2), y)
    # two groups of 4 channels each get their own scale
    codes, scale, zero = quant.quantize_tokens(jnp.asarray([[1.0, -1, 0, 0, 8, 0, 0, -8]]), 8, symmetric=True,
                                               group_size=4)
    assert [float(s) for s in scale[0]] == [float(ml_dtypes.bfloat16(1 / 127)), float(ml_dtypes.bfloat16(8 / 127))]


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_zeros_quantize_to_exact_zero(bits, symmetric):
    codes, scale, zero = quant.quantize_tokens(jnp.zeros((3, 64)), bits, symmetric=symmetric)
    assert np.all(np.asarray(scale, np.float32) > 0)
    assert np.all(np.asarray(codes) == (2 ** (bits - 1) if symmetric else 0))
    assert not np.any(quant.dequantize_tokens(codes, scale, zero, bits))


def test_group_size_must_divide_head_dim():
    with pytest.raises(ValueError, match="group_size"):
        quant.quantize_tokens(jnp.zeros((2, 64)), 4, symmetric=True, group_size=48)


# --------------------------------------------------------------------------- per-channel keys


@SETTINGS
@given(
    bits=st.sampled_from([2, 4, 8]),
    d=st.sampled_from([64, 128]),
    t=st.sampled_from([16, 64]),
    kind=st.sampled_from(["normal", "offset", "outlier"]),
    garbage=st.sampled_from([0.0, 1e30, np.nan]),
    seed=st.integers(0, 2**31),
)
def test_quantize_channels_matches_oracle(bits, d, t, kind, garbage, seed):
    gen = rng(seed)
    x = np.swapaxes(sample(gen, (2, 3, d, t), kind), -1, -2).copy()  # rows along tokens
    valid = np.arange(t)[None, None, :] < gen.integers(0, t + 1, (2, 3, 1))  # includes empty groups
    x_in = np.where(valid[..., None], x, np.float32(garbage))
    codes, scale, zero = quantize_channels(jnp.asarray(x_in), bits=bits, valid=jnp.asarray(valid))
    assert codes.shape == x.shape and scale.shape == zero.shape == (2, 3, d)
    o = oracle.quantize_channels(x, bits, valid)
    vmask = np.broadcast_to(valid[..., None], x.shape)
    s = f64(scale)
    assert not ((s != o.scale) & ~o.param_amb).any()
    np.testing.assert_array_equal(f64(zero), o.zero)
    c = np.asarray(codes).astype(np.int64)
    bad = (c != o.codes) & vmask
    assert not (bad & ~o.code_amb).any()
    assert o.code_amb[vmask].sum() <= 0.01 * vmask.sum()
    xhat = np.asarray(quant.dequantize_channels(codes, scale, zero), np.float64)
    np.testing.assert_allclose(xhat, oracle.dequantize_channels(c, s, f64(zero)), rtol=2**-22, atol=1e-30)
    # math property on valid tokens: half a step plus the bf16 clip of the channel's extremes
    maxabs = np.where(vmask, np.abs(x), 0).max(axis=-2, keepdims=True)
    bound = s[..., None, :] / 2 + 2.0**-7 * (1 + 2.0**-8) * maxabs + 2.0**-22 * np.abs(x)
    assert np.all(np.where(vmask, np.abs(xhat - x) <= bound, True))
    # empty groups get finite, harmless parameters
    assert np.all(np.isfinite(s)) and np.all(s > 0)


# --------------------------------------------------------------------------- prefill Q/K formats


@SETTINGS
@given(fmt=st.sampled_from(["int8", "fp8"]), d=st.sampled_from([64, 128]), t=st.integers(1, 50),
       kind=st.sampled_from(["normal", "outlier", "degenerate"]), seed=st.integers(0, 2**31))
def test_row_quantizers_match_oracle(fmt, d, t, kind, seed):
    x = sample(rng(seed), (2, t, d), kind)
    fn = quant.quantize_int8 if fmt == "int8" else quant.quantize_fp8
    codes, scale = jax.jit(fn)(jnp.asarray(x))
    assert codes.dtype == (jnp.int8 if fmt == "int8" else jnp.float8_e4m3fn)
    assert scale.dtype == jnp.float32 and scale.shape == (2, t, 1)
    o = oracle.quantize_rows(x, fmt)
    np.testing.assert_allclose(np.asarray(scale, np.float64), o.scale, rtol=2**-23)
    c = np.asarray(codes.astype(jnp.float32), np.float64)
    assert np.all(np.abs(c - o.codes) <= o.alt)
    if kind != "degenerate":
        assert (o.alt > 0).mean() < 0.01
    # reconstruction error: half an int8 step, or half an fp8 ulp (3 mantissa bits: <= 2**-4 relative)
    xhat = c * np.asarray(scale, np.float64)
    if fmt == "int8":
        bound = np.asarray(scale, np.float64) * (0.5 + 1e-5)
    else:
        bound = 2.0**-4 * np.abs(x) + 2.0**-9 * np.asarray(scale, np.float64)  # subnormal spacing 2**-9
    assert np.all(np.abs(xhat - x) <= bound * (1 + 1e-5))
