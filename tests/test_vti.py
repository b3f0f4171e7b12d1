"""Vertical-line token identification (vti.py) against the oracle and by construction."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyquant_jax.vti import max_vl_count, tail_queries, tail_query_count, vertical_token_identification
from tests.helpers import oracle
from tests.helpers.hq_helpers import config, j32, ji32, normal, rng

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)


def check_selection(idx, count, scores, lengths, cfg, n, g):
    """idx/count from the library vs oracle column masses: a valid top-k of the prefix."""
    idx, count = np.asarray(idx), np.asarray(count)
    b, h, kmax = idx.shape
    assert idx.dtype == np.int32 and count.dtype == np.int32
    assert kmax == oracle.num_vl_tokens(max(0, n - cfg.window), cfg.rho)
    # Softmax masses are computed in float32: each is off by at most ~ (D + P) u relative; summed over g heads.
    tol = 1e-5 * g
    for bi in range(b):
        prefix = max(0, int(lengths[bi]) - cfg.window)
        k = oracle.num_vl_tokens(prefix, cfg.rho)
        assert count[bi] == k
        for hi in range(h):
            row = idx[bi, hi]
            assert np.all(row[k:] == -1), "entries after count must be -1"
            sel = row[:k]
            assert np.all(np.diff(sel) > 0), "indices must be sorted ascending and unique"
            assert np.all((sel >= 0) & (sel < prefix)), "only the non-window prefix may be selected"
            if k:
                s = scores[bi][hi]
                kth = np.sort(s)[::-1][k - 1]
                assert s[sel].min() >= kth - tol, (
                    f"not a top-{k} set: min selected mass {s[sel].min()} < k-th largest {kth}")


@SETTINGS
@given(
    b=st.integers(1, 2),
    hkv=st.integers(1, 2),
    g=st.sampled_from([1, 3, 4, 8]),
    d=st.sampled_from([64, 128]),
    n=st.sampled_from([48, 160]),
    window=st.sampled_from([0, 16, 32]),
    rho=st.sampled_from([0.0, 0.05, 0.1, 0.5, 1.0]),
    t=st.sampled_from([16, 32]),
    qscale=st.sampled_from([0.5, 3.0]),
    seed=st.integers(0, 2**31),
)
def test_vti_matches_oracle(b, hkv, g, d, n, window, rho, t, qscale, seed):
    gen = rng(seed)
    cfg = config(window=window, rho=rho)
    lengths = gen.integers(0, n + 1, b)
    lengths[0] = gen.choice([n, min(n, window), max(0, window - 3), lengths[0]])
    q_tail = normal(gen, (b, hkv * g, t, d), qscale)
    k = normal(gen, (b, hkv, n, d))
    scale = None if seed % 2 else 0.07
    idx, count = vertical_token_identification(j32(q_tail), j32(k), ji32(lengths), cfg, scale=scale)
    scores, _ = oracle.vti(q_tail, k, lengths, cfg, scale=scale)
    check_selection(idx, count, scores, lengths, cfg, n, g)


@SETTINGS
@given(b=st.integers(1, 3), hq=st.sampled_from([1, 4]), length=st.sampled_from([8, 40]),
       num=st.sampled_from([1, 16, 64]), seed=st.integers(0, 2**31))
def test_tail_queries_matches_oracle(b, hq, length, num, seed):
    gen = rng(seed)
    q = normal(gen, (b, hq, length, 64))
    lengths = gen.integers(0, length + 1, b)
    out = tail_queries(j32(q), ji32(lengths), num)
    np.testing.assert_array_equal(np.asarray(out), oracle.tail_queries(q, lengths, num).astype(np.float32))


def test_tail_query_count():
    assert tail_query_count(config(window=32)) == 32
    assert tail_query_count(config(window=0, block_size=16)) == 16  # W = 0: fall back to one block


def planted(gen, b, hkv, g, n, d, positions, strength=4.0):
    """Queries along one direction per KV head; keys at `positions` strongly aligned with it."""
    direction = normal(gen, (b, hkv, 1, d))
    direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
    q = normal(gen, (b, hkv * g, 32, d), 0.3) + np.repeat(direction, g, axis=1) * 3.0
    k = normal(gen, (b, hkv, n, d))
    k[:, :, positions] += strength * np.sqrt(d) * direction
    return q.astype(np.float32), k.astype(np.float32)


@pytest.mark.parametrize("g", [1, 4])
def test_vti_finds_planted_vertical_lines(g):
    gen = rng(1)
    cfg = config(window=32, rho=0.05)
    n, length = 160, 132  # prefix P = 100 -> k = 5
    heavy = [3, 17, 40, 41, 99]
    q, k = planted(gen, 2, 2, g, n, 64, heavy)
    # Window tokens aligned even more strongly must not be picked: they are not in the prefix.
    k[:, :, [100, 120, 131]] *= 2
    idx, count = vertical_token_identification(j32(q), j32(k), ji32([length, length]), cfg)
    assert np.asarray(count).tolist() == [5, 5]
    assert np.asarray(idx).tolist() == [[heavy + [-1] * (idx.shape[-1] - 5)] * 2] * 2


def test_vti_gqa_sums_mass_over_query_heads():
    """One query head of a group votes for column A with mass ~1, three others for B with ~0.48 each.

    Summing masses over the group picks B; a per-head maximum would pick A.
    """
    gen = rng(2)
    cfg = config(window=16, rho=0.01)  # P = 48 -> one VL token
    d, n = 64, 64
    k = normal(gen, (1, 1, n, d), 0.1)
    a, bcol = 5, 30
    k[0, 0, a, 0] = k[0, 0, bcol, 1] = 30.0
    q = np.zeros((1, 4, 16, d), np.float32)
    q[0, 0, :, 0] = 2.0  # head 0 puts almost all its mass on A
    q[0, 1:, :, 1] = 1.0  # heads 1..3: logit 3.75 on B against ~47 others near 0 -> mass ~0.48 each
    idx, _ = vertical_token_identification(j32(q), j32(k), ji32([n]), cfg)
    scores, sel = oracle.vti(q, k, [n], cfg)
    mass_a, mass_b = scores[0][0][a], scores[0][0][bcol]
    assert mass_b > mass_a  # the construction works as intended
    assert np.asarray(idx)[0, 0].tolist() == [bcol] == sel[0][0]


@pytest.mark.parametrize("garbage", [np.nan, np.inf, 1e30])
def test_vti_ignores_padding_and_unused_tail_rows(garbage):
    gen = rng(3)
    cfg = config(window=16, rho=0.1)
    b, hkv, g, n, d, t = 2, 2, 3, 96, 64, 32
    lengths = np.array([70, 9])
    q = normal(gen, (b, hkv * g, t, d))
    k = normal(gen, (b, hkv, n, d))
    ref = vertical_token_identification(j32(q), j32(k), ji32(lengths), cfg)
    k_bad, q_bad = k.copy(), q.copy()
    for bi, length in enumerate(lengths):
        k_bad[bi, :, length:] = garbage
        used = min(t, length, tail_query_count(cfg))
        q_bad[bi, :, : t - used] = garbage  # rows before the tail proxy
    out = vertical_token_identification(j32(q_bad), j32(k_bad), ji32(lengths), cfg)
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(ref[0]))
    np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(ref[1]))


def test_vti_empty_prefix_and_rho_zero():
    gen = rng(4)
    q, k = normal(gen, (3, 2, 16, 64)), normal(gen, (3, 1, 40, 64))
    cfg = config(window=32, rho=0.25)
    idx, count = vertical_token_identification(j32(q), j32(k), ji32([0, 32, 33]), cfg)
    assert idx.shape == (3, 1, max_vl_count(40, cfg)) == (3, 1, 2)
    assert np.asarray(count).tolist() == [0, 0, 1]
    assert np.asarray(idx)[:2].tolist() == [[[-1, -1]]] * 2 and np.asarray(idx)[2, 0, 1] == -1
    assert np.asarray(idx)[2, 0, 0] == 0  # the only prefix token
    idx, count = vertical_token_identification(j32(q), j32(k), ji32([40, 40, 40]), config(window=32, rho=0.0))
    assert idx.shape == (3, 1, 0) and not np.asarray(count).any()
    # window 0: every valid token is prefix
    idx, count = vertical_token_identification(j32(q), j32(k), ji32([40, 1, 0]), config(window=0, rho=1.0))
    assert np.asarray(count).tolist() == [40, 1, 0]
    assert np.asarray(idx)[0, 0].tolist() == list(range(40))


def test_vti_rejects_bad_gqa():
    with pytest.raises(ValueError, match="multiple"):
        vertical_token_identification(jnp.zeros((1, 3, 4, 64)), jnp.zeros((1, 2, 8, 64)), ji32([8]), config())
