"""Reference attention (reference.py) and its entry points (attention.py) against the oracle.

Comparisons allow float32 rounding (see hq_helpers) plus the oracle's rigorous bound
for rare float32-vs-float64 quantization rounding ties, which is 0 almost everywhere.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyquant_jax import attention
from hyquant_jax.cache import accumulate_ring_scores, append, freeze
from hyquant_jax.reference import (
    exact_attention,
    hybrid_decode_attention_reference,
    hybrid_prefill_attention_reference,
    uniform_quantized_attention,
    uniform_quantized_prefill_reference,
)
from hyquant_jax.vti import tail_queries, tail_query_count, vertical_token_identification
from tests.helpers import oracle
from tests.helpers.hq_helpers import Harness, assert_close, config, grid_normal, j32, ji32, normal, rng, vl_sets

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)
SCHEMES = ["token_sym", "token_asym", "channel_key"]


def check_decode(h: Harness, q, what=""):
    """Library decode over h.cache vs the oracle's hybrid decode over h.sim's regions."""
    out, lse = hybrid_decode_attention_reference(j32(q), h.cache, h.cfg)
    assert out.dtype == jnp.float32 and lse.dtype == jnp.float32 and out.shape == q.shape
    o, l, ob, lb = oracle.hybrid_decode(q, h.k, h.v, h.sim, h.cfg)
    assert_close(out, o, ob, scale_ref=h.v, what=what + " out")
    assert_close(lse, l, lb, rtol=1e-5, atol=1e-4, what=what + " lse")
    return np.asarray(out), np.asarray(lse)


# --------------------------------------------------------------------------- the oracle's own error bound


@pytest.mark.parametrize("seed", range(3))
def test_oracle_perturbation_bound_is_sound_and_tight(seed):
    """softmax_rows' bound really bounds perturbed attention, and is small for small perturbations."""
    gen = rng(seed)
    t, s, d = 6, 50, 16
    logits = gen.standard_normal((t, s)) * 3
    logits[:, gen.random(s) < 0.2] = -np.inf
    v = gen.standard_normal((s, d))
    eps = np.where(gen.random((t, s)) < 0.1, gen.random((t, s)) * 0.3, 0.0)
    verr = np.where(gen.random((s, d)) < 0.1, gen.random((s, d)) * 0.2, 0.0)
    o, lse, ob, lb = oracle.softmax_rows(logits, v, eps, verr)
    for _ in range(20):
        dl = eps * gen.choice([-1.0, 1.0], eps.shape) * gen.random(eps.shape)
        dv = verr * gen.uniform(-1, 1, verr.shape)
        o2, lse2, _, _ = oracle.softmax_rows(logits + dl, v + dv)
        assert np.all(np.abs(o2 - o) <= ob + 1e-12) and np.all(np.abs(lse2 - lse) <= lb + 1e-12)
    # the bound shrinks linearly with the perturbation and vanishes without one
    _, _, ob_small, _ = oracle.softmax_rows(logits, v, eps * 1e-3, verr * 1e-3)
    assert np.all(ob_small <= 2e-3 * ob)
    _, _, ob0, lb0 = oracle.softmax_rows(logits, v)
    assert not ob0.any() and not lb0.any()


# --------------------------------------------------------------------------- exact


@SETTINGS
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.sampled_from([1, 3, 4, 8]), d=st.sampled_from([64, 128]),
       t=st.sampled_from([1, 7]), s=st.sampled_from([40, 130]), causal=st.booleans(), seed=st.integers(0, 2**31))
def test_exact_attention_matches_oracle(b, hkv, g, d, t, s, causal, seed):
    gen = rng(seed)
    q, k, v = normal(gen, (b, hkv * g, t, d), 2.0), normal(gen, (b, hkv, s, d)), normal(gen, (b, hkv, s, d))
    lengths = gen.integers(0, s + 1, b)
    pos = np.sort(gen.integers(-1, s, (b, t)), axis=1) if causal else None
    k_bad, v_bad = k.copy(), v.copy()
    for bi, n in enumerate(lengths):  # padding must not matter
        k_bad[bi, :, n:] = np.nan
        v_bad[bi, :, n:] = np.inf
    out, lse = exact_attention(j32(q), j32(k_bad), j32(v_bad), ji32(lengths), None if pos is None else ji32(pos))
    o, l = oracle.exact_attention(q, k, v, lengths, pos)
    assert_close(out, o, scale_ref=v, what="out")
    assert_close(lse, l, rtol=1e-5, atol=1e-4, what="lse")
    empty = np.isneginf(l)
    assert not np.asarray(out)[empty].any()  # no key at all: output 0, lse -inf


# --------------------------------------------------------------------------- hybrid decode


@SETTINGS
@given(
    scheme=st.sampled_from(SCHEMES),
    bits=st.sampled_from([(4, 4), (2, 4), (8, 8), (4, 2), (16, 4), (4, 16)]),
    group=st.sampled_from([None, 32]),
    hkv=st.integers(1, 2),
    g=st.sampled_from([1, 3, 4, 8]),
    d=st.sampled_from([64, 128]),
    rho=st.sampled_from([0.0, 0.05, 0.3]),
    promote=st.booleans(),
    steps=st.sampled_from([0, 5, 40]),
    seed=st.integers(0, 2**31),
)
def test_hybrid_decode_matches_oracle(scheme, bits, group, hkv, g, d, rho, promote, steps, seed):
    cfg = config(window=32, block_size=16, rho=rho, scheme=scheme, key_bits=bits[0], value_bits=bits[1],
                 group_size=group, promote_flushed=promote)
    gen = rng(seed)
    lengths = [gen.integers(0, 100), 100]
    h = Harness(gen, cfg, 2, hkv, g, 100, d, lengths, 100 + steps, garbage=np.nan)
    for i in range(steps):
        h.append(random_scores=i % 4 == 0)
    check_decode(h, normal(gen, (2, hkv * g, d), 2.0))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kind", ["rho=1", "W>=N", "bits=16"])
def test_decode_is_exact_when_nothing_is_quantized(scheme, kind):
    """rho = 1 (every prefix token VL), W >= N (all in the window), or 16 bits: exact attention."""
    kw = dict(scheme=scheme, key_bits=2, value_bits=4, rho=0.05)
    if kind == "rho=1":
        kw["rho"] = 1.0
    elif kind == "bits=16":
        kw.update(key_bits=16, value_bits=16)
    n = 64 if kind == "W>=N" else 120
    cfg = config(window=64 if kind == "W>=N" else 32, **kw)
    gen = rng(11)
    h = Harness(gen, cfg, 3, 2, 3, n, 64, [n, n - 21, 0], n + 1, garbage=np.inf)
    if kind != "bits=16":
        assert not np.asarray(h.cache.page_count).any()  # nothing low-bit
    q = normal(gen, (3, 6, 64), 2.0)
    out, lse = hybrid_decode_attention_reference(j32(q), h.cache, cfg)
    o, l = oracle.exact_attention(q[:, :, None], h.k[:, :, :n], h.v[:, :, :n], h.lengths)
    assert_close(out, o[:, :, 0], scale_ref=h.v, what="out")
    assert_close(lse, l[:, :, 0], rtol=1e-5, atol=1e-4, what="lse")
    assert not np.asarray(out)[2].any() and np.isneginf(np.asarray(lse)[2]).all()  # empty sequence


@pytest.mark.parametrize("scheme", ["token_asym", "channel_key"])
def test_decode_stays_exact_after_appends_when_every_flushed_token_is_promoted(scheme):
    cfg = config(window=16, block_size=16, rho=1.0, promote_flushed=True, scheme=scheme, key_bits=2, value_bits=2)
    assert cfg.flush_vl_count == cfg.block_size
    gen = rng(12)
    h = Harness(gen, cfg, 2, 1, 4, 40, 64, [40, 7], 110)
    for i in range(70):
        h.append(active=[True, i % 2 == 0], random_scores=i % 5 == 0)
    assert not np.asarray(h.cache.page_count).any()
    q = normal(gen, (2, 4, 64), 2.0)
    out, lse = hybrid_decode_attention_reference(j32(q), h.cache, cfg)
    o, l = oracle.exact_attention(q[:, :, None], h.k, h.v, h.sim.length)
    assert_close(out, o[:, :, 0], scale_ref=h.v, what="out")
    assert_close(lse, l[:, :, 0], rtol=1e-5, atol=1e-4, what="lse")


def test_decode_padding_never_changes_outputs():
    cfg = config(scheme="channel_key", key_bits=4, value_bits=4, rho=0.1)
    outs = []
    for garbage in (None, np.nan, np.inf, -1e30):
        h = Harness(rng(13), cfg, 3, 2, 2, 90, 64, [90, 50, 3], 120, garbage=garbage)
        for _ in range(12):
            h.append()
        outs.append(hybrid_decode_attention_reference(j32(normal(rng(14), (3, 4, 64))), h.cache, cfg))
    for out, lse in outs[1:]:
        np.testing.assert_array_equal(np.asarray(out), np.asarray(outs[0][0]))
        np.testing.assert_array_equal(np.asarray(lse), np.asarray(outs[0][1]))
    assert np.isfinite(np.asarray(outs[0][0])).all()


def test_empty_segments_give_no_nan():
    gen = rng(15)
    # lengths: empty, shorter than W (no VL, no pages), exactly W, one token of prefix
    for rho in (0.0, 0.05):
        cfg = config(window=32, rho=rho, scheme="token_asym")
        h = Harness(gen, cfg, 4, 2, 2, 40, 64, [0, 20, 32, 33], 60)
        assert np.asarray(h.cache.num_pages).tolist() == [0, 0, 0, 0 if rho else 1]
        assert np.asarray(h.cache.num_vl).tolist() == [0, 0, 0, 1 if rho else 0]
        q = normal(gen, (4, 4, 64))
        out, lse = check_decode(h, q)
        assert np.isfinite(out).all() and not out[0].any() and np.isneginf(lse[0]).all()
        assert np.isfinite(lse[1:]).all()
        h.append(active=[True, False, False, False])  # first token of the empty sequence
        out, lse = check_decode(h, q)
        assert np.isfinite(lse).all()
        np.testing.assert_allclose(out[0], np.repeat(h.v[0, :, 0], 2, axis=0), rtol=1e-6)  # one key: its value


def relative_error(out, ref):
    return float(np.sum((np.asarray(out, np.float64) - ref) ** 2) / np.sum(ref**2))


def decode_errors(cfgs, gen, n=256, length=None, planted_cols=None, b=2, hkv=2, g=4, d=64, queries=4):
    """Relative squared error of hybrid decode and of the uniform baseline vs exact, per config."""
    length = length or [n] * b
    k, v = normal(gen, (b, hkv, n, d)), normal(gen, (b, hkv, n, d))
    q = normal(gen, (b, hkv * g, n + queries, d))
    if planted_cols is not None:
        direction = normal(gen, (b, hkv, 1, d))
        direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
        q = q + 2.0 * np.repeat(direction, g, axis=1)
        k[:, :, planted_cols] += 2.0 * np.sqrt(d) * direction
    lengths = ji32(length)
    q_tail = tail_queries(j32(q[:, :, :n]), lengths, 32)
    results, vls = [], []
    for cfg in cfgs:
        vl = vertical_token_identification(q_tail, j32(k), lengths, cfg)
        vls.append(vl_sets(*vl))
        cache = freeze(j32(k), j32(v), lengths, q_tail, cfg, n, vl=vl)
        hyb, uni = [], []
        refs = []
        for i in range(queries):
            qi = q[:, :, n + i]
            ref, _ = oracle.exact_attention(qi[:, :, None], k, v, length)
            refs.append(ref[:, :, 0])
            hyb.append(np.asarray(hybrid_decode_attention_reference(j32(qi), cache, cfg)[0]))
            uni.append(np.asarray(uniform_quantized_attention(j32(qi[:, :, None]), j32(k), j32(v), lengths,
                                                              cfg)[0][:, :, 0]))
        ref = np.stack(refs)
        results.append((relative_error(np.stack(hyb), ref), relative_error(np.stack(uni), ref)))
    return results, vls


@pytest.mark.parametrize("scheme", ["token_asym", "channel_key"])
def test_more_bits_less_error(scheme):
    cfgs = [config(window=32, rho=0.05, scheme=scheme, key_bits=kb, value_bits=kb) for kb in (8, 4, 2)]
    ((h8, u8), (h4, u4), (h2, u2)), _ = decode_errors(cfgs, rng(16))
    # one bit less roughly doubles the step, i.e. x4 squared error; demand well below that per 2 bits (x16)
    assert h8 * 16 < h4 and h4 * 4 < h2, (h8, h4, h2)
    assert u8 * 16 < u4 and u4 * 4 < u2, (u8, u4, u2)
    assert h2 < u2 and h4 < u4  # the full-precision window and VL tokens only help


@pytest.mark.parametrize("scheme", ["token_sym", "channel_key"])
def test_hybrid_beats_uniform_on_planted_vertical_lines(scheme):
    n = 256
    cols = [5, 40, 41, 100, 150, 151, 200, 210]  # 8 heavy columns in the prefix of 224 -> k = 12 VL slots
    cfg = config(window=32, rho=0.05, scheme=scheme, key_bits=4, value_bits=4)
    ((hyb, uni),), (vl,) = decode_errors([cfg], rng(17), n=n, planted_cols=cols)
    assert all(set(cols) <= set(heads) for row in vl for heads in row), "VTI must find the planted columns"
    # they take about half the attention mass; uniform 4-bit quantizes them, hybrid keeps them exact
    # (measured: 50-130x lower error over seeds and schemes)
    assert hyb < 0.1 * uni, (hyb, uni)


# --------------------------------------------------------------------------- uniform baseline


@SETTINGS
@given(scheme=st.sampled_from(SCHEMES), bits=st.sampled_from([(2, 2), (4, 4), (8, 4), (4, 16)]),
       group=st.sampled_from([None, 16]), g=st.sampled_from([1, 4]), s=st.sampled_from([40, 100]),
       causal=st.booleans(), seed=st.integers(0, 2**31))
def test_uniform_quantized_attention_matches_oracle(scheme, bits, group, g, s, causal, seed):
    cfg = config(scheme=scheme, key_bits=bits[0], value_bits=bits[1], group_size=group)
    gen = rng(seed)
    b, hkv, t, d = 2, 2, 5, 64
    q, k, v = normal(gen, (b, hkv * g, t, d), 2.0), normal(gen, (b, hkv, s, d)), normal(gen, (b, hkv, s, d))
    lengths = np.array([s, gen.integers(0, s)])
    pos = np.sort(gen.integers(0, s, (b, t)), axis=1) if causal else None
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[1, :, lengths[1]:] = np.nan
    v_bad[1, :, lengths[1]:] = np.nan
    out, lse = uniform_quantized_attention(j32(q), j32(k_bad), j32(v_bad), ji32(lengths), cfg,
                                           q_positions=None if pos is None else ji32(pos))
    o, l, ob, lb = oracle.uniform_quantized_attention(q, k, v, lengths, cfg, pos)
    assert_close(out, o, ob, scale_ref=v, what="out")
    assert_close(lse, l, lb, rtol=1e-5, atol=1e-4, what="lse")


# --------------------------------------------------------------------------- prefill


def prefill_inputs(gen, b, hkv, g, t, d, lengths, garbage=None):
    q = normal(gen, (b, hkv * g, t, d), 1.5)
    k = grid_normal(gen, (b, hkv, t, d))  # float32 sums of these are exact: see oracle.hybrid_prefill
    v = normal(gen, (b, hkv, t, d))
    qb, kb, vb = q.copy(), k.copy(), v.copy()
    if garbage is not None:
        for bi, n in enumerate(lengths):
            qb[bi, :, n:] = kb[bi, :, n:] = vb[bi, :, n:] = garbage
    return q, k, v, qb, kb, vb


@SETTINGS
@given(
    fmt=st.sampled_from(["int8", "fp8", "bf16"]),
    wb=st.sampled_from([(0, 16), (16, 16), (32, 16), (32, 32)]),
    rho=st.sampled_from([0.0, 0.05, 0.3]),
    hkv=st.integers(1, 2),
    g=st.sampled_from([1, 3, 4]),
    d=st.sampled_from([64, 128]),
    t=st.sampled_from([48, 100]),
    chunk=st.sampled_from([32, 256]),
    seed=st.integers(0, 2**31),
)
def test_hybrid_prefill_matches_oracle(fmt, wb, rho, hkv, g, d, t, chunk, seed):
    cfg = config(window=wb[0], block_size=16, prefill_block=wb[1], rho=rho, prefill_qk=fmt)
    gen = rng(seed)
    lengths = np.array([t, gen.integers(0, t + 1)])
    q, k, v, qb, kb, vb = prefill_inputs(gen, 2, hkv, g, t, d, lengths, garbage=np.nan)
    vl = vertical_token_identification(tail_queries(j32(q), ji32(lengths), tail_query_count(cfg)), j32(k),
                                      ji32(lengths), cfg)
    out = hybrid_prefill_attention_reference(j32(qb), j32(kb), j32(vb), ji32(lengths), *vl, cfg, query_chunk=chunk)
    assert out.dtype == jnp.float32 and out.shape == q.shape
    o, bound = oracle.hybrid_prefill(q, k, v, lengths, vl_sets(*vl), cfg)
    assert_close(out, o, bound, scale_ref=v, what=f"prefill {fmt}")
    for bi, n in enumerate(lengths):
        assert not np.asarray(out)[bi, :, n:].any(), "padded query rows must be 0"


@SETTINGS
@given(fmt=st.sampled_from(["int8", "fp8", "bf16"]), g=st.sampled_from([1, 4]), t=st.sampled_from([48, 100]),
       seed=st.integers(0, 2**31))
def test_uniform_prefill_matches_oracle(fmt, g, t, seed):
    gen = rng(seed)
    lengths = np.array([gen.integers(0, t + 1), t])
    q, k, v, qb, kb, vb = prefill_inputs(gen, 2, 2, g, t, 64, lengths, garbage=1e30)
    out = uniform_quantized_prefill_reference(j32(qb), j32(kb), j32(vb), ji32(lengths), qk_format=fmt)
    o, bound = oracle.hybrid_prefill(q, k, v, lengths, None, config(), hybrid=False, qk_format=fmt)
    assert_close(out, o, bound, scale_ref=v, what=f"uniform prefill {fmt}")


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
@pytest.mark.parametrize("kind", ["W>=T", "rho=1"])
def test_prefill_is_exact_when_every_key_is_full_precision(fmt, kind):
    t = 96
    cfg = config(window=96 if kind == "W>=T" else 32, prefill_block=16, rho=1.0 if kind == "rho=1" else 0.05,
                 prefill_qk=fmt)
    gen = rng(18)
    lengths = np.array([t, 61, 0])
    q, k, v = normal(gen, (3, 4, t, 64), 1.5), normal(gen, (3, 2, t, 64)), normal(gen, (3, 2, t, 64))
    vl = vertical_token_identification(tail_queries(j32(q), ji32(lengths), 32), j32(k), ji32(lengths), cfg)
    out = hybrid_prefill_attention_reference(j32(q), j32(k), j32(v), ji32(lengths), *vl, cfg)
    pos = np.broadcast_to(np.arange(t), (3, t))
    o, _ = oracle.exact_attention(q, k, v, lengths, pos)
    for bi, n in enumerate(lengths):
        o[bi, :, n:] = 0
    assert_close(out, o, scale_ref=v, what="prefill")
    # while the uniform baseline on the same inputs is not exact
    uni = uniform_quantized_prefill_reference(j32(q), j32(k), j32(v), ji32(lengths), qk_format=fmt)
    assert np.abs(np.asarray(uni) - o).max() > 1e-3


def test_prefill_padding_never_changes_outputs():
    cfg = config(window=32, prefill_block=16, rho=0.1, prefill_qk="int8")
    lengths = np.array([100, 37, 0])
    outs = []
    for garbage in (None, np.nan, np.inf, 1e30):
        q, k, v, qb, kb, vb = prefill_inputs(rng(19), 3, 2, 2, 100, 64, lengths, garbage=garbage)
        vl = vertical_token_identification(tail_queries(j32(qb), ji32(lengths), 32), j32(kb), ji32(lengths), cfg)
        outs.append(np.asarray(hybrid_prefill_attention_reference(j32(qb), j32(kb), j32(vb), ji32(lengths), *vl, cfg)))
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
    assert np.isfinite(outs[0]).all() and not outs[0][2].any()


def test_prefill_rejects_bad_shapes():
    cfg = config()
    z = jnp.zeros((1, 2, 8, 64))
    idx, cnt = jnp.zeros((1, 2, 0), jnp.int32), ji32([8])
    with pytest.raises(ValueError):
        hybrid_prefill_attention_reference(z[0], z, z, ji32([8]), idx, cnt, cfg)
    with pytest.raises(ValueError, match="GQA|match"):
        hybrid_prefill_attention_reference(jnp.zeros((1, 3, 8, 64)), z, z, ji32([8]), idx, cnt, cfg)
    with pytest.raises(ValueError, match="lengths"):
        hybrid_prefill_attention_reference(z, z, z, ji32([8, 8]), idx, cnt, cfg)


def test_prefill_attention_names_bad_arguments_before_any_work():
    """The public entry point checks its arguments first (before VTI, whose errors would name internals)."""
    cfg = config()
    q, kv = jnp.zeros((2, 4, 8, 64)), jnp.zeros((2, 2, 8, 64))
    lengths = ji32([8, 3])
    cases = [
        ((q[0], kv, kv, lengths), r"q must be \[B, Hq, T, D\]"),
        ((q[:, :3], kv, kv, lengths), r"GQA needs Hq % Hkv == 0"),
        ((q, kv[..., :32], kv, lengths), r"k, v \[B, Hkv, T, D\]"),
        ((q, kv, kv, jnp.array([8.0, 3.0])), r"lengths must be int \[B\]=\(2,\), got float32"),
        ((q, kv, kv, lengths[:1]), r"lengths must be int \[B\]=\(2,\), got int32 \[1\]"),
        ((q, kv, kv, ji32([9, 3])), r"lengths must lie in \[0, T=8\], got \[9, 3\]"),
        ((q, kv, kv, ji32([8, -1])), r"lengths must lie in \[0, T=8\]"),
        ((q.astype(jnp.int32), kv, kv, lengths), r"q must be a floating-point array, got int32"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            attention.prefill_attention(*args, cfg, backend="reference")
    out, (idx, count) = attention.prefill_attention(q, kv, kv, ji32([0, 8]), cfg, backend="reference")
    assert np.isfinite(np.asarray(out)).all() and not np.asarray(out)[0].any()  # an empty row: zeros, no NaN


# --------------------------------------------------------------------------- attention.py entry points


def test_decode_step_and_prefill_attention_entry_points():
    cfg = config(window=16, block_size=16, rho=0.2, scheme="token_asym")
    gen = rng(20)
    b, hkv, g, n, d = 2, 2, 2, 48, 64
    lengths = ji32([48, 20])
    q, k, v = normal(gen, (b, hkv * g, n, d)), normal(gen, (b, hkv, n, d)), normal(gen, (b, hkv, n, d))
    out, vl = attention.prefill_attention(j32(q), j32(k), j32(v), lengths, cfg, backend="reference")
    q_tail = tail_queries(j32(q), lengths, tail_query_count(cfg))
    vl_ref = vertical_token_identification(q_tail, j32(k), lengths, cfg)
    np.testing.assert_array_equal(np.asarray(vl[0]), np.asarray(vl_ref[0]))
    ref = hybrid_prefill_attention_reference(j32(q), j32(k), j32(v), lengths, *vl_ref, cfg)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))

    cache = freeze(j32(k), j32(v), lengths, q_tail, cfg, 80, vl=vl)
    manual = cache
    for _ in range(20):  # crosses a flush, so ring scores decide promotions
        qs, ks, vs = normal(gen, (b, hkv * g, d)), normal(gen, (b, hkv, d)), normal(gen, (b, hkv, d))
        out, cache = attention.decode_step(j32(qs), j32(ks), j32(vs), cache, cfg, backend="reference")
        manual = append(manual, j32(ks), j32(vs), cfg)
        ref, lse = attention.decode_attention(j32(qs), manual, cfg, backend="reference")
        manual = accumulate_ring_scores(manual, j32(qs), lse, cfg)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
    for f in dataclasses.fields(cache):
        if f.name != "max_len" and getattr(cache, f.name) is not None:
            np.testing.assert_array_equal(np.asarray(getattr(cache, f.name)), np.asarray(getattr(manual, f.name)))
    assert np.asarray(cache.num_vl).sum() > np.asarray(vl[1]).sum()  # decode tokens were promoted


def test_entry_points_name_bad_arguments():
    """Lists as lengths are taken; a missing config, a non-cache, float lengths and tail queries of another batch
    are ValueErrors naming the argument (not AttributeErrors from inside)."""
    from hyquant_jax import freeze, tail_queries

    cfg = config(window=16, block_size=16, rho=0.2)
    gen = rng(21)
    q, kv = j32(normal(gen, (2, 4, 40, 16))), j32(normal(gen, (2, 2, 40, 16)))
    out, vl = attention.prefill_attention(q, kv, kv, [40, 23], cfg, backend="reference")
    assert out.shape == q.shape
    cache = freeze(kv, kv, [40, 23], tail_queries(q, [40, 23], 8), cfg, max_len=64, vl=vl)
    np.testing.assert_array_equal(np.asarray(cache.length), [40, 23])
    with pytest.raises(ValueError, match="config must be a hyquant_jax.HyQuantConfig, got NoneType"):
        attention.prefill_attention(q, kv, kv, [40, 23], None)
    with pytest.raises(ValueError, match=r"lengths must be int \[B\]=\(2,\), got float32"):
        attention.prefill_attention(q, kv, kv, [40.0, 2.5], cfg)
    with pytest.raises(ValueError, match=r"lengths must be int \[B\]=\(2,\), got int32 \[3\]"):
        attention.prefill_attention(q, kv, kv, [40, 23, 1], cfg)
    with pytest.raises(ValueError, match=r"q_tail must be \[B=2, Hq, T, D=16\]"):
        freeze(kv, kv, [40, 23], tail_queries(q[:1], [40], 8), cfg, max_len=64)
    with pytest.raises(ValueError, match="cache must be a hyquant_jax.HybridKVCache"):
        attention.decode_step(q[:, :, 0], kv[:, :, 0], kv[:, :, 0], None, cfg)
    with pytest.raises(ValueError, match="config must be a hyquant_jax.HyQuantConfig, got dict"):
        attention.decode_attention(q[:, :, 0], cache, {"window": 16})
    with pytest.raises(ValueError, match="num must be an int >= 1"):
        tail_queries(q, [40, 23], 0)
