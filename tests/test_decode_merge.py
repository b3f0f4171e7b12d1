"""The split-merge kernel (`pallas_kernels.decode_merge`) against a float64 oracle and XLA's merge."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pallas_kernels import decode_merge as dmg
from pallas_kernels import decode_mgpu as dm
from pallas_kernels.decode import merge_splits


def _splits(seed, b, h, ns, rows, nm, group, empty=0.3, garbage=True, d=128):
    """Random splits of both launches: some without keys (Triton m = -inf, Mosaic m = NEG_INIT, l = 0; their o
    NaN, which the merge must drop), maxima far apart (weights that underflow), NaN in the rows past the group
    when `garbage`. Returns (o, m, l, mosaic_o, mosaic_ml), the Mosaic set packed as its kernel writes it, or
    None and None when nm = 0 (the Triton launch alone)."""
    rng = np.random.default_rng(seed)
    o = rng.normal(size=(b, h, ns, rows, d)).astype(np.float32)
    m = (rng.normal(size=(b, h, ns, rows)) * 30).astype(np.float32)
    l = rng.uniform(0.5, 3.0, size=(b, h, ns, rows)).astype(np.float32)
    mo = rng.normal(size=(b, h, nm, 128, dm.ROWS)).astype(np.float32)
    mm = (rng.normal(size=(b, h, nm, dm.ROWS)) * 40).astype(np.float32)
    ml = rng.uniform(0.5, 3.0, size=(b, h, nm, dm.ROWS)).astype(np.float32)
    t_empty = rng.random((b, h, ns)) < empty
    m_empty = rng.random((b, h, nm)) < empty
    m[t_empty], l[t_empty], o[t_empty] = -np.inf, 0.0, np.nan if garbage else 0.0
    mm[m_empty], ml[m_empty], mo[m_empty] = dm.NEG_INIT, 0.0, np.nan if garbage else 0.0
    if garbage:
        o[:, :, :, group:], m[:, :, :, group:], l[:, :, :, group:] = np.nan, np.nan, np.nan
        mo[..., group:], mm[..., group:], ml[..., group:] = np.nan, np.nan, np.nan
    if nm == 0:
        return o, m, l, None, None
    return o, m, l, mo, np.stack([mm, ml], axis=-2)


def _token(seed, b, h, rows, absent=0.3, d=128):
    """The decode step's own token: logits [b, h, rows] (-inf where it is not attended: a share `absent` of
    the sequences and heads, NaN-free), v [b, h, d]."""
    rng = np.random.default_rng(seed + 1)
    tm = (rng.normal(size=(b, h, rows)) * 30).astype(np.float32)
    tm[rng.random((b, h)) < absent] = -np.inf
    return tm, rng.normal(size=(b, h, d)).astype(np.float32)


def _xla_merge(o, m, l, mo, mml, group, token=None):
    """What decode_launch did before the kernel: natural_splits of the Mosaic set (if any), concatenated,
    merge_splits."""
    both = [jnp.asarray(x) for x in (o, m, l)]
    if mo is not None:
        low = dm.natural_splits(jnp.swapaxes(jnp.asarray(mo), -1, -2), jnp.asarray(mml[..., 0, :]),
                                jnp.asarray(mml[..., 1, :]))
        both = [jnp.concatenate([x, y], axis=2) for x, y in zip(both, low)]
    return merge_splits(*both, group, None if token is None else tuple(jnp.asarray(x) for x in token))


def _merge(args, token, group, **kw):
    """merge_hybrid_splits of NumPy arguments (None for an absent Mosaic set)."""
    return dmg.merge_hybrid_splits(*(None if x is None else jnp.asarray(x) for x in args), _jnp(token),
                                   group=group, **kw)


CASES = [  # b, h, ns, rows (the Triton launch's: max(16, group rounded up to a power of two)), nm, group
    (1, 8, 5, 16, 33, 4),  # Qwen3-8B at B=1 32K: 5 Triton splits, 33 Mosaic splits, GQA 4
    (2, 3, 1, 16, 7, 5),  # a group that is not a power of two, one Triton split
    (3, 2, 6, 16, 2, 1),  # MHA (one row)
    (1, 1, 3, 16, 1, 16),  # a full Mosaic group of 16
    (1, 8, 41, 16, 0, 4),  # Qwen3-8B at B=1 4K: the Triton launch alone, 41 splits
    (2, 2, 7, 32, 0, 24),  # the Triton launch alone, a group of 24 in 32 rows
]


def _jnp(token):
    return None if token is None else tuple(jnp.asarray(x) for x in token)


@pytest.mark.parametrize("with_token", [False, True])
@pytest.mark.parametrize("b,h,ns,rows,nm,group", CASES)
def test_merge_matches_oracle_and_xla(b, h, ns, rows, nm, group, with_token):
    args = _splits(b * 100 + ns, b, h, ns, rows, nm, group)
    token = _token(b * 100 + ns, b, h, rows) if with_token else None
    out, lse = _merge(args, token, group, interpret=True)
    ref_out, ref_lse = dmg.reference_merge(*args, group, token)
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=1e-6, atol=1e-5)
    clean = _splits(b * 100 + ns, b, h, ns, rows, nm, group, garbage=False)  # XLA's merge reads every row
    xla_out, xla_lse = _xla_merge(*clean, group, token)
    out, lse = _merge(clean, token, group, interpret=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(xla_out), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(xla_lse), rtol=1e-6, atol=1e-5)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), h=st.integers(1, 3), ns=st.integers(1, 9), nm=st.integers(1, 40),
       group=st.integers(1, 16), empty=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 2**16),
       token=st.sampled_from([None, 0.0, 0.5, 1.0]))
def test_merge_matches_oracle_on_random_shapes(b, h, ns, nm, group, empty, seed, token):
    """Any split counts (powers of two or not, a single split), any GQA group up to 16 rows, none to all splits
    without keys (NaN in their outputs and in the rows past the group), no step token or one that is absent
    for none, half or all of the heads: the oracle's output and lse."""
    args = _splits(seed, b, h, ns, 16, nm, group, empty=empty)
    token = None if token is None else _token(seed, b, h, 16, absent=token)
    out, lse = _merge(args, token, group, interpret=True)
    ref_out, ref_lse = dmg.reference_merge(*args, group, token)
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=1e-6, atol=1e-5)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), h=st.integers(1, 3), ns=st.integers(1, 70), group=st.integers(1, 32),
       d=st.sampled_from([64, 128, 256]), empty=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 2**16),
       token=st.sampled_from([None, 0.0, 0.5, 1.0]))
def test_triton_splits_alone_match_oracle_and_xla(b, h, ns, group, d, empty, seed, token):
    """The Triton launch alone (no Mosaic set), as the decode merges it below MOSAIC_MIN_PAGES or off Hopper:
    1-70 splits (all fit one program up to a group of 32), groups of 1-32 in their padded rows, head_dim
    64/128/256, none to all splits without keys: the oracle's output and lse, and XLA's merge on NaN-free
    splits."""
    assert dmg.fits(ns, group)
    rows = max(16, 1 << (group - 1).bit_length())
    args = _splits(seed, b, h, ns, rows, 0, group, empty=empty, d=d)
    token = None if token is None else _token(seed, b, h, rows, absent=token, d=d)
    out, lse = _merge(args, token, group, interpret=True)
    ref_out, ref_lse = dmg.reference_merge(*args, group, token)
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=1e-6, atol=1e-5)
    clean = _splits(seed, b, h, ns, rows, 0, group, empty=empty, garbage=False, d=d)
    xla_out, xla_lse = _xla_merge(*clean, group, token)
    out, lse = _merge(clean, token, group, interpret=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(xla_out), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(xla_lse), rtol=1e-6, atol=1e-5)


def test_sequence_without_keys_gives_zero_and_minus_inf():
    o, m, l, mo, mml = _splits(7, 2, 2, 3, 16, 5, 4, empty=0.0)
    m[0], l[0], o[0] = -np.inf, 0.0, np.nan
    mml[0, :, :, 0], mml[0, :, :, 1], mo[0] = dm.NEG_INIT, 0.0, np.nan
    out, lse = dmg.merge_hybrid_splits(*(jnp.asarray(x) for x in (o, m, l, mo, mml)), group=4,
                                       out_dtype=jnp.bfloat16, interpret=True)
    assert out.dtype == jnp.bfloat16
    assert np.all(np.asarray(out[0]) == 0) and np.all(np.isneginf(np.asarray(lse[0])))
    assert np.all(np.isfinite(np.asarray(out[1], np.float32))) and np.all(np.isfinite(np.asarray(lse[1])))
    # the step's own token alone (a sequence whose cache holds nothing yet): its value, its logit
    tm, tv = _token(7, 2, 2, 16, absent=0.0)
    out, lse = dmg.merge_hybrid_splits(*(jnp.asarray(x) for x in (o, m, l, mo, mml)), _jnp((tm, tv)), group=4,
                                       interpret=True)
    np.testing.assert_allclose(np.asarray(out[0]).reshape(2, 4, 128), np.broadcast_to(tv[0][:, None], (2, 4, 128)),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(lse[0]), tm[0, :, :4].reshape(8), rtol=1e-6)


def test_argument_errors_name_the_argument():
    o, m, l, mo, mml = (jnp.asarray(x) for x in _splits(1, 1, 2, 2, 4, 3, 4))  # 4 Triton rows
    with pytest.raises(ValueError, match="mosaic_o must be float32"):
        dmg.merge_hybrid_splits(o, m, l, mo[..., :8], mml, group=4, interpret=True)
    with pytest.raises(ValueError, match="mosaic_ml must be float32"):
        dmg.merge_hybrid_splits(o, m, l, mo, mml[..., 1, :], group=4, interpret=True)
    with pytest.raises(ValueError, match="l must be float32"):
        dmg.merge_hybrid_splits(o, m, l.astype(jnp.bfloat16), mo, mml, group=4, interpret=True)
    with pytest.raises(ValueError, match="group"):
        dmg.merge_hybrid_splits(o, m, l, mo, mml, group=5, interpret=True)
    with pytest.raises(ValueError, match="mosaic_o must be float32"):
        dmg.merge_hybrid_splits(o, m, l, None, mml, group=4, interpret=True)
    many = jnp.zeros((1, 2, 300, 16, 128), jnp.float32)  # the Triton launch alone, more splits than one program
    with pytest.raises(ValueError, match="next_power_of_2"):
        dmg.merge_hybrid_splits(many, many[..., 0], many[..., 0], group=16, interpret=True)
    tm, tv = (jnp.asarray(x) for x in _token(1, 1, 2, 4))
    with pytest.raises(ValueError, match="token logits must be float32"):
        dmg.merge_hybrid_splits(o, m, l, mo, mml, (tm[..., :2], tv), group=4, interpret=True)
    with pytest.raises(ValueError, match="token v must be a float array"):
        dmg.merge_hybrid_splits(o, m, l, mo, mml, (tm, tv.astype(jnp.int32)), group=4, interpret=True)


@pytest.mark.parametrize("nm", [33, 0])
def test_merge_kernel_lowers_for_hopper(nm, monkeypatch):
    """The kernel (index-array loads, the Mosaic set's channel gather; the Triton set alone) lowers to Triton IR
    for sm_90 without a GPU (compute capability given to Pallas by hand); compiling it to PTX and running it
    needs the GPU test."""
    from jax._src.pallas.triton import pallas_call_registration
    from jax.experimental.pallas import triton as plgpu

    # The lowering asks its module's `gpu_info_lib` for the device (jax._src.pallas.triton.gpu_info up to jax 0.11,
    # jax._src.gpu_info from 0.12); the H200's description comes from the public API of both.
    h200 = plgpu.get_gpu_info_from_version(plgpu.GpuVersion.H200)
    monkeypatch.setattr(pallas_call_registration.gpu_info_lib, "get_gpu_info", lambda: h200)
    args = [None if x is None else jnp.asarray(x) for x in _splits(3, 1, 8, 5, 16, nm, 4, garbage=False)]
    fn = jax.jit(lambda *a: dmg.merge_hybrid_splits(*a, group=4, out_dtype=jnp.bfloat16))
    assert "hyquant_merge_splits" in fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.gpu
@pytest.mark.parametrize("with_token", [False, True])
@pytest.mark.parametrize("b,h,ns,rows,nm,group", CASES)
def test_gpu_merge_matches_oracle(b, h, ns, rows, nm, group, with_token):
    if jax.default_backend() != "gpu":
        pytest.skip("needs a CUDA GPU (run `pytest -m gpu` on the GPU box)")
    args = _splits(b * 100 + ns, b, h, ns, rows, nm, group)
    token = _token(b * 100 + ns, b, h, rows) if with_token else None
    out, lse = _merge(args, token, group)
    ref_out, ref_lse = dmg.reference_merge(*args, group, token)
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=1e-6, atol=1e-5)
