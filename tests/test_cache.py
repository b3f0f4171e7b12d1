"""HybridKVCache: Freeze, append, flush with VL promotion, capacities, ring scores (cache.py).

Token accounting is checked against `oracle.CacheSim`, a plain-Python model of the
documented policy, and with key_bits = value_bits = 16 and identifiable tokens
directly: the multiset of valid tokens over the low-bit pages, VL and ring must be
exactly the set of all tokens of each sequence and head.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyquant_jax.cache import (
    accumulate_ring_scores,
    append,
    capacities,
    flush_full_rings,
    freeze,
    steps_until_full,
    worst_history,
)
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.reference import hybrid_decode_attention_reference
from tests.helpers import oracle
from tests.helpers.hq_helpers import Harness, config, j32, ji32, normal, region_ids, rng, with_ring_score

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)


cfg_strategy = st.builds(
    lambda w, bs, rho, promote: config(window=w * bs, block_size=bs, prefill_block=16, rho=rho,
                                       promote_flushed=promote),
    w=st.sampled_from([0, 1, 2]), bs=st.sampled_from([16, 32]), rho=st.sampled_from([0.0, 0.1, 0.3, 1.0]),
    promote=st.booleans(),
)


def check_exactly_once(h: Harness):
    """Ids of all valid stored rows == all token ids of each (sequence, head), each exactly once."""
    ids = region_ids(h.cache, h.cfg)
    w = h.cfg.window
    for bi, length in enumerate(h.sim.length):
        for hi in range(h.cache.num_kv_heads):
            r = ids[bi][hi]
            stored = r["low"] + r["vl"] + r["ring"]
            assert sorted(stored) == list(range(length)), f"b={bi} h={hi}: tokens not stored exactly once"
            # the window: the most recent ring_len >= min(length, W) tokens, oldest first
            assert r["ring"] == list(range(length - len(r["ring"]), length))
            assert len(r["ring"]) >= min(length, w)
            assert len(r["ring"]) <= h.cfg.ring_size
            # and exactly what the documented policy predicts
            assert r["pages"] == h.sim.pages[bi][hi] and r["vl"] == h.sim.vl[bi][hi] and r["ring"] == h.sim.ring[bi][hi]


@SETTINGS
@given(cfg=cfg_strategy, b=st.integers(1, 2), hkv=st.integers(1, 2), n=st.sampled_from([40, 72]),
       steps=st.integers(0, 70), scores=st.booleans(), ragged_active=st.booleans(), seed=st.integers(0, 2**31))
def test_every_token_in_exactly_one_region(cfg, b, hkv, n, steps, scores, ragged_active, seed):
    cfg = dataclasses.replace(cfg, key_bits=16, value_bits=16)
    gen = np.random.default_rng(seed)
    lengths = gen.integers(0, n + 1, b)
    lengths[0] = gen.choice([n, min(n, cfg.window), lengths[0]])
    h = Harness(gen, cfg, b, hkv, 2, n, 64, lengths, n + steps, ids=True, garbage=np.nan)
    check_exactly_once(h)
    for i in range(steps):
        active = gen.random(b) < 0.7 if ragged_active else None
        h.append(active, random_scores=scores and i % 3 == 0)
        if i == steps // 2:
            check_exactly_once(h)
    check_exactly_once(h)
    h.check()


@SETTINGS
@given(
    scheme=st.sampled_from(["token_sym", "token_asym", "channel_key"]),
    kbits=st.sampled_from([2, 4, 8, 16]),
    vbits=st.sampled_from([2, 4, 8]),
    group=st.sampled_from([None, 32]),
    promote=st.booleans(),
    d=st.sampled_from([64, 128]),
    steps=st.integers(0, 40),
    seed=st.integers(0, 2**31),
)
def test_low_bit_pages_hold_the_quantized_tokens(scheme, kbits, vbits, group, promote, d, steps, seed):
    cfg = config(window=16, block_size=16, rho=0.1, scheme=scheme, key_bits=kbits, value_bits=vbits,
                 group_size=group, promote_flushed=promote)
    gen = np.random.default_rng(seed)
    lengths = [gen.integers(0, 80), 80]
    h = Harness(gen, cfg, 2, 2, 1, 80, d, lengths, 80 + steps, key_offset=3.0)
    h.check()
    for i in range(steps):
        h.append(random_scores=i % 2 == 0)
    h.check()


CAPACITY_CONFIGS = [
    dict(window=32, block_size=16, rho=0.1, promote_flushed=True),
    dict(window=0, block_size=16, rho=0.05, promote_flushed=True),
    dict(window=16, block_size=16, rho=0.0, promote_flushed=False),
    dict(window=16, block_size=16, rho=1.0, promote_flushed=True),
    dict(window=64, block_size=32, rho=0.3, promote_flushed=True, prefill_block=32),
]


@pytest.mark.parametrize("min_length,lengths", [(0, [48, 3, 0]), (40, [48, 40, 45])])
@pytest.mark.parametrize("kw", CAPACITY_CONFIGS, ids=[str(i) for i in range(len(CAPACITY_CONFIGS))])
def test_capacities_hold_any_history_up_to_max_len(kw, min_length, lengths):
    """Prompts (of >= min_length tokens, `freeze(min_length=...)`) appended up to max_len stay exact; then full."""
    cfg = config(key_bits=16, value_bits=16, **kw)
    gen = rng(5)
    n, max_len = 48, 200
    pages, vl_cap = capacities(max_len, cfg, min_length)
    if min_length:
        full_pages, full_vl = capacities(max_len, cfg)
        assert pages <= full_pages and vl_cap <= full_vl
    h = Harness(gen, cfg, 3, 1, 1, n, 64, lengths, max_len, ids=True, min_length=min_length)
    assert h.cache.num_slots == pages * cfg.block_size and h.cache.vl_capacity == vl_cap
    h.randomize_scores()
    while max(h.sim.length) < max_len:
        h.append(random_scores=max(h.sim.length) % 7 == 0)
    check_exactly_once(h)
    h.check()
    assert int(np.asarray(h.cache.num_pages).max()) <= pages and int(np.asarray(h.cache.num_vl).max()) <= vl_cap
    h.cache.check_room(0)
    with pytest.raises(ValueError, match=r"overflow.*max_len=200"):
        h.cache.check_room(1)
    k, v, _ = h.step_tokens()
    with pytest.raises(ValueError, match="max_len"):
        append(h.cache, j32(k), j32(v), cfg)


def test_jitted_decode_past_max_len_is_flagged_and_stays_in_bounds():
    """A jitted decode loop that runs past max_len (outside jit `append` refuses) gets `overflowed` set from
    the first token past it; full pages are never overwritten, the ring stays within its size, the newest
    tokens stay in the window and attention stays finite."""
    from hyquant_jax import decode_step

    cfg = config(window=16, block_size=16, rho=0.1)
    gen = rng(9)
    n, max_len = 40, 72
    h = Harness(gen, cfg, 2, 1, 2, n, 64, [40, 33], max_len)
    step = jax.jit(lambda q, k, v, c: decode_step(q, k, v, c, cfg, backend="reference"))
    cache, filled = h.cache, None
    for t in range(6 * max_len):  # the page capacity is padded to 256 slots: go well past it
        k, v = j32(normal(gen, (2, 1, 64))), j32(normal(gen, (2, 1, 64)))
        out, cache = step(j32(normal(gen, (2, 2, 64))), k, v, cache)
        assert np.isfinite(np.asarray(out)).all()
        length = np.asarray(cache.length)
        np.testing.assert_array_equal(np.asarray(cache.overflowed), length > max_len)
        assert (np.asarray(cache.ring_len) <= cfg.ring_size).all()
        assert (np.asarray(cache.num_pages) <= cache.page_count.shape[1]).all()
        if filled is None and (np.asarray(cache.num_pages) == cache.page_count.shape[1]).all():
            filled = np.asarray(cache.k_codes).copy(), np.asarray(cache.num_vl).copy()
    assert np.asarray(cache.overflowed).all() and filled is not None
    np.testing.assert_array_equal(np.asarray(cache.k_codes), filled[0])  # full pages were not overwritten
    np.testing.assert_array_equal(np.asarray(cache.num_vl), filled[1])
    # the last token appended is still in the window ring
    last = (np.asarray(cache.ring_start) + np.asarray(cache.ring_len) - 1) % cfg.ring_size
    np.testing.assert_array_equal(np.asarray(cache.ring_k)[np.arange(2), 0, last], np.asarray(k)[:, 0])


def test_freeze_min_length_is_checked():
    cfg = config()
    k = j32(np.zeros((2, 1, 8, 64), np.float32))
    lengths = np.array([8, 5], np.int32)
    with pytest.raises(ValueError, match=r"every length must be >= min_length=6"):
        freeze(k, k, ji32(lengths), None, cfg, 64, vl=(jnp.zeros((2, 1, 0), jnp.int32), ji32([0, 0])),
               min_length=6)
    for bad in (-1, 65, 2.0, True):
        with pytest.raises(ValueError, match="min_length must be an int in"):
            freeze(k, k, ji32(lengths), None, cfg, 64, min_length=bad)
    # the default config at a 32K prompt (the e2e benchmark's cache): the VL region 2112 -> 1664 slots
    assert capacities(32904, HyQuantConfig(), 32768) == (516, 1664)
    assert capacities(32904, HyQuantConfig()) == (516, 2112)


def test_broken_min_length_promise_quantizes_instead_of_overflowing():
    """Under jit freeze cannot check min_length. A prompt shorter than promised then decodes past what the VL
    region was sized for: flushes that find it full quantize their whole block, and every token stays
    stored exactly once, as the oracle (promotion only while there is room) predicts."""
    cfg = config(key_bits=16, value_bits=16, window=16, block_size=16, rho=0.02, promote_flushed=True)
    max_len, min_length = 1200, 1100  # VL sized for a >= 1100-token prompt: 64 slots; 1 promotion per flush
    assert cfg.flush_vl_count == 1 and capacities(max_len, cfg, min_length)[1] == 64
    h = Harness(rng(11), cfg, 2, 1, 1, 32, 64, [4, 30], max_len, ids=True, min_length=min_length,
                traced_freeze=True)
    assert h.cache.vl_capacity == 64
    while max(h.sim.length) < max_len:
        h.append(random_scores=max(h.sim.length) % 5 == 0)
    check_exactly_once(h)
    h.check()
    num_vl = np.asarray(h.cache.num_vl)
    assert num_vl.tolist() == [64, 64]  # full, never past it
    pages = np.asarray(h.cache.page_count)[:, : int(np.asarray(h.cache.num_pages).max())]
    assert (pages == 16).any() and (pages == 15).any()  # blocks quantized whole after the VL region filled
    # only the VL region depends on min_length: the pages hold any history, so they cannot overflow either
    for kw in CAPACITY_CONFIGS:
        c = config(**kw)
        for n in (0, 37, 200, 777):
            assert {worst_history(n, c, m)[0] for m in range(0, n + 1, 3)} == {worst_history(n, c)[0]}, (kw, n)


def test_capacities_cover_the_worst_split_between_freeze_and_flushes():
    """Brute force over every prompt length: VL count after freeze plus every possible flush fits."""
    for kw in CAPACITY_CONFIGS:
        cfg = config(**kw)
        cases = [(1, 0), (17, 0), (100, 0), (333, 0), (100, 60), (333, 5), (333, 200), (333, 333)]
        cases += [(n, m) for n in range(60, 100) for m in (0, 3, 40)]  # every residue of the block sizes
        for max_len, min_length in cases:
            pages, vl_cap = capacities(max_len, cfg, min_length)
            bs, w = cfg.block_size, cfg.window
            kf = oracle.num_vl_tokens(bs, cfg.rho) if cfg.promote_flushed else 0
            worst_vl = worst_pages = 0
            for length in range(min_length, max_len + 1):
                prefix = max(0, length - w)
                ring = min(length, w)
                flushes = 0
                total = length
                while total < max_len:  # append one token at a time
                    if ring == w + bs:
                        ring -= bs
                        flushes += 1
                    ring += 1
                    total += 1
                vl = oracle.num_vl_tokens(prefix, cfg.rho) + flushes * kf
                used_pages = -(-(prefix - oracle.num_vl_tokens(prefix, cfg.rho)) // bs) + flushes
                assert vl <= vl_cap and used_pages <= pages, (kw, max_len, length)
                worst_vl = max(worst_vl, vl)
                worst_pages = max(worst_pages, 1, -(-prefix // bs) + flushes)  # pages as if no VL left the prefix
            # and no looser than the worst history (before padding to the kernels' tiles)
            assert worst_history(max_len, cfg, min_length) == (worst_pages, worst_vl), (kw, max_len, min_length)


def test_promotion_picks_the_highest_ring_scores():
    cfg = config(window=16, block_size=16, rho=0.25, key_bits=16, value_bits=16)  # 4 of 16 promoted
    gen = rng(6)
    h = Harness(gen, cfg, 1, 2, 1, 32, 64, [32], 64, ids=True)
    for _ in range(16):
        h.append()
    ring_ids = region_ids(h.cache, cfg)[0][0]["ring"]
    assert ring_ids == list(range(16, 48)) and np.asarray(h.cache.ring_len).tolist() == [32]
    score = np.zeros((1, 2, 32), np.float32)
    start = int(h.cache.ring_start[0])
    favourites = {0: [20, 17, 29, 16], 1: [31, 30, 18, 25]}
    for head, toks in favourites.items():
        for rank, tok in enumerate(toks):
            score[0, head, (start + tok - 16) % 32] = 10.0 - rank
    # later (not flushed) slots score even higher: must not matter
    score[0, :, (start + 20) % 32] = 100.0
    h.cache = with_ring_score(h.cache, score)
    before = region_ids(h.cache, cfg)[0]
    h.cache = append(h.cache, *(j32(x) for x in h.step_tokens()[:2]), cfg)
    after = region_ids(h.cache, cfg)[0]
    for head, toks in favourites.items():
        assert after[head]["vl"] == before[head]["vl"] + sorted(toks)
        assert after[head]["pages"][-1] == [t for t in range(16, 32) if t not in toks]
        assert after[head]["ring"] == list(range(32, 49))
    # the flushed block's scores were cleared, the survivors kept theirs
    rs = np.asarray(h.cache.ring_score)
    new_start = int(h.cache.ring_start[0])
    assert new_start == (start + 16) % 32
    assert (rs[0, :, (new_start + 4) % 32] == 100.0).all()  # token 36 is at age 4 of the new ring
    assert not rs[0][:, [(start + i) % 32 for i in range(16)]].any()  # flushed slots (one reused) are 0


def test_without_promotion_flushed_blocks_are_fully_quantized():
    cfg = config(window=16, block_size=16, rho=0.5, promote_flushed=False, key_bits=16, value_bits=16)
    h = Harness(rng(7), cfg, 1, 1, 1, 40, 64, [40], 120, ids=True)
    h.randomize_scores()
    for _ in range(80):
        h.append(random_scores=True)
    ids = region_ids(h.cache, cfg)[0][0]
    assert len(ids["vl"]) == oracle.num_vl_tokens(24, 0.5)  # only the frozen prompt's VL
    assert all(len(p) == 16 for p in ids["pages"][1:])
    check_exactly_once(h)


def test_accumulate_ring_scores_matches_oracle():
    cfg = config(window=16, block_size=16, rho=0.25, scheme="token_asym")
    gen = rng(8)
    b, hkv, g, d = 2, 2, 3, 64
    h = Harness(gen, cfg, b, hkv, g, 40, d, [40, 11], 80)
    for _ in range(5):
        h.append()
    q = normal(gen, (b, hkv * g, d))
    _, lse = hybrid_decode_attention_reference(j32(q), h.cache, cfg)
    c1 = accumulate_ring_scores(h.cache, j32(q), lse, cfg)
    c2 = accumulate_ring_scores(c1, j32(q), lse, cfg)
    mass = oracle.ring_mass(q, h.k, h.sim, np.asarray(lse))
    r = cfg.ring_size
    for bi in range(b):
        start = int(h.cache.ring_start[bi])
        for hi in range(hkv):
            got1 = np.asarray(c1.ring_score)[bi, hi]
            got2 = np.asarray(c2.ring_score)[bi, hi]
            expected = np.zeros(r)
            for age, tok in enumerate(h.sim.ring[bi][hi]):
                expected[(start + age) % r] = mass[bi][hi][tok]
            np.testing.assert_allclose(got1, expected, rtol=1e-4, atol=1e-7)
            np.testing.assert_allclose(got2, 2 * expected, rtol=1e-4, atol=1e-7)
    # ring masses are part of the attention: at most g per KV head
    assert np.asarray(c1.ring_score).sum(-1).max() <= g * (1 + 1e-5)
    # a no-op when nothing will ever be promoted
    for off in (dataclasses.replace(cfg, promote_flushed=False), dataclasses.replace(cfg, rho=0.0)):
        same = accumulate_ring_scores(h.cache, j32(q), lse, off)
        np.testing.assert_array_equal(np.asarray(same.ring_score), np.asarray(h.cache.ring_score))
    # an empty sequence (lse = -inf) accumulates nothing and no NaN
    empty = Harness(gen, cfg, 1, 1, 1, 8, d, [0], 8)
    c = accumulate_ring_scores(empty.cache, jnp.zeros((1, 1, d)), jnp.full((1, 1), -jnp.inf), cfg)
    assert not np.asarray(c.ring_score).any()


# --------------------------------------------------------------------------- errors


def test_freeze_rejects_bad_inputs():
    cfg = config()
    k = jnp.zeros((2, 1, 40, 64))
    q_tail = jnp.zeros((2, 2, 32, 64))
    ok = ji32([40, 3])
    with pytest.raises(ValueError, match=r"\[B, H_kv, N, D\]"):
        freeze(k[0], k[0], ok, q_tail, cfg, 64)
    with pytest.raises(ValueError, match=r"\[B, H_kv, N, D\]"):
        freeze(k, k[:, :, :20], ok, q_tail, cfg, 64)
    with pytest.raises(ValueError, match="lengths"):
        freeze(k, k, ji32([40]), q_tail, cfg, 64)
    with pytest.raises(ValueError, match="lengths"):
        freeze(k, k, jnp.asarray([40.0, 3.0]), q_tail, cfg, 64)
    with pytest.raises(ValueError, match="lengths"):
        freeze(k, k, ji32([41, 3]), q_tail, cfg, 64)
    with pytest.raises(ValueError, match="lengths"):
        freeze(k, k, ji32([-1, 3]), q_tail, cfg, 64)
    with pytest.raises(ValueError, match="max_len"):
        freeze(k, k, ok, q_tail, cfg, 39)
    with pytest.raises(ValueError, match="max_len must be an int"):
        freeze(k, k, ok, q_tail, cfg, 64.0)
    with pytest.raises(ValueError, match="needs q_tail"):
        freeze(k, k, ok, None, cfg, 64)
    with pytest.raises(ValueError, match="head_dim"):
        freeze(jnp.zeros((2, 1, 40, 63)), jnp.zeros((2, 1, 40, 63)), ok, jnp.zeros((2, 2, 32, 63)), cfg, 64)


def test_append_and_decode_reject_mismatches():
    cfg = config()
    h = Harness(rng(9), cfg, 2, 1, 2, 40, 64, [40, 3], 64)
    with pytest.raises(ValueError, match=r"\[B, H_kv, D\]"):
        append(h.cache, jnp.zeros((2, 2, 64)), jnp.zeros((2, 2, 64)), cfg)
    with pytest.raises(ValueError, match="active"):
        append(h.cache, jnp.zeros((2, 1, 64)), jnp.zeros((2, 1, 64)), cfg, active=jnp.ones((3,), bool))
    other = dataclasses.replace(cfg, window=64)
    with pytest.raises(ValueError, match="ring"):
        append(h.cache, jnp.zeros((2, 1, 64)), jnp.zeros((2, 1, 64)), other)
    with pytest.raises(ValueError, match="key_bits"):
        hybrid_decode_attention_reference(jnp.zeros((2, 2, 64)), h.cache, dataclasses.replace(cfg, key_bits=8))
    other_scheme = "token_sym" if cfg.scheme == "channel_key" else "channel_key"
    with pytest.raises(ValueError, match="scheme"):
        hybrid_decode_attention_reference(jnp.zeros((2, 2, 64)), h.cache, dataclasses.replace(cfg, scheme=other_scheme))
    with pytest.raises(ValueError, match="q must be"):
        hybrid_decode_attention_reference(jnp.zeros((2, 3, 32)), h.cache, cfg)  # wrong head_dim
    with pytest.raises(ValueError, match="q must be"):
        hybrid_decode_attention_reference(jnp.zeros((1, 2, 64)), h.cache, cfg)  # wrong batch
    from hyquant_jax import decode_launch

    for attend in (hybrid_decode_attention_reference, partial(decode_launch.decode_attention, interpret=True)):
        with pytest.raises(ValueError, match=r"q must be floating \[B, Hq, D\].*got int32 \(2, 2, 64\)"):
            attend(jnp.zeros((2, 2, 64), jnp.int32), h.cache, cfg)
        with pytest.raises(ValueError, match=r"q must be floating \[B, Hq, D\].*got float32 \(2, 2, 1, 64\)"):
            attend(jnp.zeros((2, 2, 1, 64)), h.cache, cfg)  # a query axis of length 1


def test_inactive_sequences_are_untouched():
    cfg = config(key_bits=4, value_bits=8, scheme="token_asym")
    h = Harness(rng(10), cfg, 2, 2, 1, 48, 64, [48, 30], 120)
    for i in range(40):
        h.append(active=[True, i % 4 == 0])
    before = h.cache
    h.append(active=[False, False])
    for name in ("k_codes", "v_codes", "vl_k", "ring_k", "ring_v", "ring_score", "length", "num_pages", "num_vl"):
        np.testing.assert_array_equal(np.asarray(getattr(before, name)), np.asarray(getattr(h.cache, name)))
    h.check()


@pytest.mark.parametrize("promote", [False, True])
def test_flush_full_rings_then_append_equals_self_flushing_append(promote):
    """The generate loop's path (one flush_full_rings for all layers, then append(flush=False))
    leaves exactly the caches that append's own flush leaves, over several window flushes,
    with ragged lengths and a sequence that pauses."""
    cfg = config(key_bits=4, value_bits=4, scheme="channel_key", window=32, block_size=16, rho=0.1,
                 promote_flushed=promote)
    layers = [Harness(rng(20 + i), cfg, 2, 2, 2, 40, 64, [40, 23], 140) for i in range(2)]
    fused = [h.cache for h in layers]
    for step in range(40):
        active = np.array([True, step % 3 != 0])
        act = jnp.asarray(active)
        for i, h in enumerate(layers):
            h.randomize_scores()  # the same scores go into both paths
            fused[i] = dataclasses.replace(fused[i], ring_score=h.cache.ring_score)
        fused = list(flush_full_rings(tuple(fused), cfg, act))
        for i, h in enumerate(layers):
            k, v, _ = h.step_tokens()
            fused[i] = append(fused[i], j32(k), j32(v), cfg, active=act, flush=False)
            h.append(active)
            for a, b in zip(jax.tree_util.tree_leaves(fused[i]), jax.tree_util.tree_leaves(h.cache)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for h in layers:
        h.check()


@pytest.mark.parametrize("scheme,kbits,vbits,group,promote", [
    ("channel_key", 4, 4, 32, True), ("token_asym", 4, 2, 16, True), ("token_sym", 8, 4, 32, False),
    ("channel_key", 16, 16, 32, True)])
def test_stacked_flush_equals_flushing_each_layer(monkeypatch, scheme, kbits, vbits, group, promote):
    """flush_full_rings quantizes the layers' oldest blocks as one stacked computation (`_flush_stacked`) while
    they are small: the same caches bit for bit as flushing each layer alone (the limit set to 0), with layers
    that differ (lengths, scores, which rings are full) and a sequence whose VL region is full (whole block
    quantized, as under a broken min_length promise)."""
    from hyquant_jax import cache as cache_module

    cfg = config(key_bits=kbits, value_bits=vbits, scheme=scheme, group_size=group, window=32, block_size=16,
                 rho=0.1, promote_flushed=promote)
    layers = [Harness(rng(40 + i), cfg, 3, 2, 2, 48, 64, [48, 31, 40 - 3 * i], 160) for i in range(3)]
    caches = []
    for i, h in enumerate(layers):
        step = 0  # append until sequence 0's ring is full; sequence 1 lags: rings at different fill levels
        while int(h.cache.ring_len[0]) < cfg.ring_size:
            h.append(active=[True, step % (2 + i) == 0, True], random_scores=True)
            step += 1
        c = h.cache
        if promote:  # sequence 0 of layer 1: no VL room left
            c = dataclasses.replace(c, num_vl=c.num_vl.at[0].set(c.vl_capacity if i == 1 else c.num_vl[0]))
        caches.append(c)
    caches = tuple(caches)
    active = jnp.asarray([True, True, False])
    full = [cache_module._full_rings(c, active, cfg) for c in caches]
    assert cache_module._flush_stacked(caches, full, cfg) is not None
    stacked = flush_full_rings(caches, cfg, active)
    per_layer = tuple(cache_module._flush_oldest_block(c, f, cfg) for c, f in zip(caches, full))
    monkeypatch.setattr(cache_module, "STACKED_FLUSH_MAX_BYTES", 0)
    assert cache_module._flush_stacked(caches, full, cfg) is None
    flushed = np.stack([np.asarray(a.num_pages) - np.asarray(c.num_pages) for a, c in zip(per_layer, caches)])
    assert flushed[:, 0].all() and not flushed[:, 2].any() and not flushed.all()  # full, inactive, not full
    for a, b in zip(jax.tree_util.tree_leaves(stacked), jax.tree_util.tree_leaves(per_layer)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_steps_until_full_is_the_smallest_room_of_an_active_ring():
    """min over layers and active sequences of ring_size - ring_len; inactive rings and full-ring
    bookkeeping: after flush_full_rings that many appends without a flush are valid, one more is not."""
    cfg = config(window=32, block_size=16, rho=0.1)
    h = Harness(rng(31), cfg, 3, 2, 1, 48, 64, [40, 23, 47], 160)
    for _ in range(5):
        h.append()
    caches = (h.cache, h.cache)
    room = cfg.ring_size - np.asarray(h.cache.ring_len)
    for active in ([True, True, True], [False, True, True], [True, False, False]):
        act = jnp.asarray(active)
        assert int(steps_until_full(caches, cfg, act)) == room[np.asarray(active)].min()
    assert int(steps_until_full(caches, cfg, jnp.zeros(3, bool))) == cfg.ring_size
    cache = flush_full_rings((h.cache,), cfg, jnp.ones(3, bool))[0]
    n = int(steps_until_full((cache,), cfg, jnp.ones(3, bool)))
    assert n >= 1
    zeros = jnp.zeros((3, 2, cache.head_dim), cache.dtype)
    for _ in range(n):
        cache = append(cache, zeros, zeros, cfg, flush=False)  # raises if a ring were full
    with pytest.raises(ValueError, match="flush_full_rings"):
        append(cache, zeros, zeros, cfg, flush=False)


def test_append_without_flush_rejects_a_full_ring():
    cfg = config(window=32, block_size=16, rho=0.1)
    h = Harness(rng(30), cfg, 1, 2, 1, 40, 64, [40], 120)
    while int(h.cache.ring_len[0]) < cfg.ring_size:
        h.append()
    k, v, _ = h.step_tokens()
    with pytest.raises(ValueError, match="flush_full_rings"):
        append(h.cache, j32(k), j32(v), cfg, flush=False)


@pytest.mark.parametrize("kw", [dict(), dict(scheme="token_asym", group_size=32), dict(key_bits=2, value_bits=4),
                                dict(key_bits=8, value_bits=8, rho=0.2), dict(key_bits=16, value_bits=16),
                                dict(window=32, block_size=16, rho=0.0)])
def test_bytes_after_freeze_is_what_a_frozen_cache_uses(kw):
    """The host-side arithmetic (`bytes_after_freeze`, behind the CLI's size line) equals `used_bytes` of a real
    frozen cache at prompts shorter than the window, around it and past it; the bf16 crossover is the first
    prompt length at which the hybrid cache is smaller."""
    from hyquant_jax.cache import bytes_after_freeze, smaller_than_bf16_from
    from hyquant_jax.vti import tail_queries

    cfg = config(**kw)
    gen = rng(11)
    h, d = 2, 64
    for n in (1, cfg.window, cfg.window + 1, 3 * cfg.window + 17):
        k = j32(normal(gen, (1, h, n, d)))
        q = j32(normal(gen, (1, 2 * h, n, d)))
        lengths = ji32([n])
        cache = freeze(k, k, lengths, tail_queries(q, lengths, 16), cfg, max_len=n + 64)
        assert bytes_after_freeze(n, cfg, h, d, jnp.float32) == int(cache.used_bytes(cfg)[0]), n
    first = smaller_than_bf16_from(cfg, h, d)
    per_token = 2 * h * d * 2
    if cfg.key_bits == cfg.value_bits == 16:  # nothing is quantized: never smaller
        assert first is None and bytes_after_freeze(1 << 16, cfg, h, d) >= (1 << 16) * per_token
        return
    assert bytes_after_freeze(first, cfg, h, d) < first * per_token
    assert bytes_after_freeze(first - 1, cfg, h, d) >= (first - 1) * per_token
