"""The decode step's norm and RoPE kernels (`pallas_kernels.norm_rope`) against the model's reference math
(`models.layers.rms_norm`, `apply_rope`) and a float64 NumPy oracle, in interpret mode here and compiled on a
GPU (`pytest -m gpu`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.layers import apply_rope, rms_norm
from pallas_kernels.norm_rope import add_rms_norm, fits, qk_norm_rope
from tests.helpers.hq_helpers import rng

EPS = 1e-6


def oracle_rms_norm(x, w, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(w, np.float64)


def oracle_rope(x, cos, sin):
    """x [B, H, D], cos/sin [B, D] (float64), rotate-half."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def ulps(got, want, dtype):
    """|got - want| in units of the dtype's spacing at want (bf16: 2^-8 relative)."""
    eps = float(jnp.finfo(dtype).eps)
    want = np.asarray(want, np.float64)
    return np.abs(np.asarray(got, np.float64) - want) / (eps * np.maximum(np.abs(want), 1e-30))


def steps(dtype):
    """Tolerance in units of `ulps`: bf16 results are rounded once from float32; float32 ones differ in the sum
    order and the rounding of a few float32 operations."""
    return 1.0 if dtype == jnp.bfloat16 else 8.0


def rope_tables(gen, b, d):
    pos = gen.integers(0, 40000, b).astype(np.float32)
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float32) / d))
    ang = np.concatenate([pos[:, None] * inv, pos[:, None] * inv], axis=-1)
    return jnp.asarray(np.cos(ang)), jnp.asarray(np.sin(ang))


def check_add_rms_norm(gen, n, e, dtype, with_delta, interpret):
    x = jnp.asarray(gen.standard_normal((n, e)) * 3, dtype)
    delta = jnp.asarray(gen.standard_normal((n, e)), dtype) if with_delta else None
    w = jnp.asarray(1 + 0.1 * gen.standard_normal(e), dtype)
    total, normed = add_rms_norm(x, delta, w, EPS, interpret=interpret)
    want_total = x if delta is None else x + delta  # XLA's add in the dtype
    np.testing.assert_array_equal(np.asarray(total, np.float32), np.asarray(want_total, np.float32))
    reference = rms_norm(want_total, w, EPS)
    assert normed.shape == (n, e) and normed.dtype == dtype
    # Only the float32 sum order differs from the reference: one rounding step of bf16 apart at most, a few
    # float32 ones.
    assert ulps(normed, reference, dtype).max() <= steps(dtype)
    oracle = oracle_rms_norm(np.asarray(want_total, np.float64), np.asarray(w, np.float64), EPS)
    assert ulps(normed, oracle, dtype).max() <= steps(dtype)


def check_qk_norm_rope(gen, b, hq, hkv, d, dtype, norm, interpret):
    q = jnp.asarray(gen.standard_normal((b, hq, d)) * 2, dtype)
    k = jnp.asarray(gen.standard_normal((b, hkv, d)) * 2, dtype)
    cos, sin = rope_tables(gen, b, d)
    qw = jnp.asarray(1 + 0.1 * gen.standard_normal(d), dtype) if norm else None
    kw = jnp.asarray(1 + 0.1 * gen.standard_normal(d), dtype) if norm else None
    got_q, got_k = qk_norm_rope(q, k, cos, sin, qw, kw, EPS, interpret=interpret)
    for got, x, w in ((got_q, q, qw), (got_k, k, kw)):
        assert got.shape == x.shape and got.dtype == dtype
        normed = rms_norm(x, w, EPS) if norm else x
        reference = apply_rope(normed[:, :, None], cos[:, None, None], sin[:, None, None])[:, :, 0]
        # The normalised value may differ by one rounding step from the reference's (sum order); RoPE mixes
        # two such values, so compare in absolute terms against the row's scale.
        err = np.abs(np.asarray(got, np.float64) - np.asarray(reference, np.float64))
        scale = np.max(np.abs(np.asarray(reference, np.float64)), axis=-1, keepdims=True)
        assert (err <= 2 * steps(dtype) * float(jnp.finfo(dtype).eps) * scale).all()
        expect = oracle_rope(oracle_rms_norm(x, w, EPS) if norm else np.asarray(x, np.float64),
                             np.asarray(cos, np.float64), np.asarray(sin, np.float64))
        np.testing.assert_allclose(np.asarray(got, np.float64), expect, rtol=0,
                                   atol=4 * steps(dtype) * float(jnp.finfo(dtype).eps) * np.abs(expect).max())


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), e=st.sampled_from([32, 64, 256]), bf16=st.booleans(), with_delta=st.booleans(),
       seed=st.integers(0, 2**16))
def test_add_rms_norm_matches_reference(n, e, bf16, with_delta, seed):
    check_add_rms_norm(rng(seed), n, e, jnp.bfloat16 if bf16 else jnp.float32, with_delta, interpret=True)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), hkv=st.integers(1, 3), group=st.integers(1, 4), d=st.sampled_from([32, 64, 128]),
       bf16=st.booleans(), norm=st.booleans(), seed=st.integers(0, 2**16))
def test_qk_norm_rope_matches_reference(b, hkv, group, d, bf16, norm, seed):
    """Random batch, KV heads, GQA groups (every k head written exactly once by the first programs)."""
    check_qk_norm_rope(rng(seed), b, hkv * group, hkv, d, jnp.bfloat16 if bf16 else jnp.float32, norm,
                       interpret=True)


def test_zero_row_gives_zero_not_nan():
    """An all-zero row (padding) normalises to 0 through eps, never NaN."""
    x = jnp.zeros((2, 64), jnp.bfloat16)
    _, normed = add_rms_norm(x, None, jnp.ones((64,), jnp.bfloat16), EPS, interpret=True)
    assert np.array_equal(np.asarray(normed, np.float32), np.zeros((2, 64), np.float32))
    q, k = qk_norm_rope(jnp.zeros((1, 2, 32), jnp.bfloat16), jnp.zeros((1, 1, 32), jnp.bfloat16),
                        jnp.ones((1, 32)), jnp.zeros((1, 32)), jnp.ones((32,), jnp.bfloat16),
                        jnp.ones((32,), jnp.bfloat16), EPS, interpret=True)
    assert not np.isnan(np.asarray(q, np.float32)).any() and not np.isnan(np.asarray(k, np.float32)).any()


def test_fits_and_argument_errors():
    assert fits(4096, 128) and fits(32) and not fits(576) and not fits(16) and not fits(3584, 128)
    x = jnp.zeros((1, 576), jnp.bfloat16)
    with pytest.raises(ValueError, match="power of two"):
        add_rms_norm(x, None, jnp.ones((576,)), EPS)
    x = jnp.zeros((2, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="delta must match x"):
        add_rms_norm(x, jnp.zeros((2, 64), jnp.float32), jnp.ones((64,)), EPS)
    with pytest.raises(ValueError, match=r"weight must be \[E\]"):
        add_rms_norm(x, None, jnp.ones((32,)), EPS)
    q, k = jnp.zeros((1, 4, 64), jnp.bfloat16), jnp.zeros((1, 2, 64), jnp.bfloat16)
    cos = jnp.ones((1, 64))
    with pytest.raises(ValueError, match="k must be"):
        qk_norm_rope(q, jnp.zeros((1, 8, 64), jnp.bfloat16), cos, cos, None, None, EPS)
    with pytest.raises(ValueError, match="cos must be"):
        qk_norm_rope(q, k, jnp.ones((1, 1, 64)), cos, None, None, EPS)
    with pytest.raises(ValueError, match="both q_weight and k_weight"):
        qk_norm_rope(q, k, cos, cos, jnp.ones((64,)), None, EPS)
    with pytest.raises(ValueError, match=r"head_dim must be a power of two"):
        qk_norm_rope(jnp.zeros((1, 4, 48), jnp.bfloat16), jnp.zeros((1, 2, 48), jnp.bfloat16),
                     jnp.ones((1, 48)), jnp.ones((1, 48)), None, None, EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("n,e,with_delta", [(1, 4096, True), (1, 4096, False), (76, 4096, True), (3, 8192, False)])
def test_gpu_add_rms_norm(n, e, with_delta):
    check_add_rms_norm(rng(n + e), n, e, jnp.bfloat16, with_delta, interpret=False)


@pytest.mark.gpu
@pytest.mark.parametrize("b,hq,hkv,d,norm", [(1, 32, 8, 128, True), (1, 32, 8, 128, False),
                                             (24, 64, 8, 128, True), (2, 9, 3, 64, False)])
def test_gpu_qk_norm_rope(b, hq, hkv, d, norm):
    check_qk_norm_rope(rng(b + hq + d), b, hq, hkv, d, jnp.bfloat16, norm, interpret=False)


def test_num_warps_is_checked_and_does_not_change_results():
    gen = rng(5)
    x = jnp.asarray(gen.standard_normal((2, 64)), jnp.bfloat16)
    w = jnp.ones((64,), jnp.bfloat16)
    with pytest.raises(ValueError, match="num_warps must be a power of two from 1 to 16"):
        add_rms_norm(x, None, w, EPS, num_warps=3)
    q, k = jnp.zeros((1, 4, 32), jnp.bfloat16), jnp.zeros((1, 2, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="num_warps"):
        qk_norm_rope(q, k, jnp.ones((1, 32)), jnp.ones((1, 32)), None, None, EPS, num_warps=32)
    a = add_rms_norm(x, x, w, EPS, interpret=True, num_warps=1)
    b = add_rms_norm(x, x, w, EPS, interpret=True, num_warps=16)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(np.asarray(u, np.float32), np.asarray(v, np.float32))

