"""Shared helpers of the foundation tests: data, configs, tolerant comparisons, cache reading.

Tolerances. Library math runs in float32 (unit roundoff u = 2**-24 ~ 6e-8), the
oracle in float64. A dot product of D <= 128 terms and a softmax-weighted sum
of S <= ~400 values each lose at most ~(D + S) u ~ 3e-5 relative to the
magnitudes involved (|q||k| scale for logits, max|v| for outputs); a logit
error e moves an output by at most ~2e max|v|. With |q.k| scale <~ 10 that
gives ~1e-4 max|v|: `F32_ATOL_REL` and `F32_RTOL` below. Quantization
ambiguity (float32 vs float64 rounding at ties) is accounted separately by the
oracle's per-element bounds.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax.cache import HybridKVCache, append, freeze, low_bit_valid, ring_valid, vl_valid
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.vti import tail_queries, tail_query_count, vertical_token_identification
from tests.helpers import oracle

F32_RTOL = 1e-4
F32_ATOL_REL = 1e-4

ID_SCALE = 2.0**-10  # token id t is stored as (t + 1) * ID_SCALE in channel 0 (exact in float32)


def rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


def j32(x) -> jax.Array:
    return jnp.asarray(np.asarray(x, np.float32))


def ji32(x) -> jax.Array:
    return jnp.asarray(np.asarray(x, np.int32))


def normal(gen, shape, scale=1.0):
    return (gen.standard_normal(shape) * scale).astype(np.float32)


def grid_normal(gen, shape, step=2.0**-12):
    """Normal values rounded to a grid so that sums over <= 4096 of them are exact in float32."""
    return (np.round(gen.standard_normal(shape) / step) * step).astype(np.float32)


def assert_close(actual, expected, bound=0.0, *, rtol=F32_RTOL, atol=None, scale_ref=None, what=""):
    """|actual - expected| <= atol + rtol |expected| + bound elementwise (NaN fails).

    atol defaults to F32_ATOL_REL * max|scale_ref| (scale_ref defaults to expected).
    """
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    if atol is None:
        ref = e if scale_ref is None else np.asarray(scale_ref, np.float64)
        atol = F32_ATOL_REL * float(np.max(np.abs(ref), initial=0.0)) + 1e-30
    tol = atol + rtol * np.abs(e) + bound
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - e)
    bad = ~(diff <= tol)
    both_inf = np.isinf(a) & np.isinf(e) & (np.sign(a) == np.sign(e))
    bad &= ~both_inf
    if bad.any():
        idx = tuple(int(i[0]) for i in np.nonzero(bad))
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.size} elements out of tolerance; first at {idx}: "
            f"actual={a[idx]!r} expected={e[idx]!r} tol={tol[idx] if np.ndim(tol) else tol!r}; "
            f"max excess {np.nanmax(np.where(bad, diff - tol, -np.inf))}"
        )


# --------------------------------------------------------------------------- configs


def config(**kw) -> HyQuantConfig:
    """A small-shape config: window 32, block 16, prefill block 16 unless overridden."""
    base = dict(window=32, block_size=16, prefill_block=16)
    base.update(kw)
    return HyQuantConfig(**base)


# --------------------------------------------------------------------------- tokens with ids


def id_tokens(gen, batch, heads, n, d):
    """Random k, v [B, H, n, D] float32 whose channels 0/1 identify (token, b, h) exactly."""
    k = normal(gen, (batch, heads, n, d))
    v = normal(gen, (batch, heads, n, d))
    ids = (np.arange(n) + 1) * ID_SCALE
    tag = 16 * np.arange(batch)[:, None, None] + np.arange(heads)[None, :, None]
    for x in (k, v):
        x[..., 0] = ids
        x[..., 1] = np.broadcast_to(tag, (batch, heads, n))
    return k, v


def decode_id(row) -> int:
    t = float(row[0]) / ID_SCALE - 1
    assert t == int(t), f"not an id row: {row[:2]}"
    return int(t)


# --------------------------------------------------------------------------- reading a cache


def host(cache: HybridKVCache) -> dict:
    return {f.name: (None if getattr(cache, f.name) is None else np.asarray(getattr(cache, f.name)))
            for f in dataclasses.fields(cache) if f.name != "max_len"}


def regions(cache: HybridKVCache, config: HyQuantConfig):
    """Per (b, h): dict with 'low' = [(page, slot)], 'vl' = [slot], 'ring' = [slot] (oldest first).

    Reads the layout through the library's own validity helpers and, independently,
    from the documented fields; asserts both agree.
    """
    c = host(cache)
    bs = config.block_size
    low_ok = np.asarray(low_bit_valid(cache, bs))
    vl_ok = np.asarray(vl_valid(cache))
    ring_ok = np.asarray(ring_valid(cache))
    r = c["ring_k"].shape[2]
    out = []
    for bi in range(cache.batch):
        low = [(p, p * bs + s) for p in range(int(c["num_pages"][bi])) for s in range(int(c["page_count"][bi, p]))]
        vl = list(range(int(c["num_vl"][bi])))
        ring = [(int(c["ring_start"][bi]) + i) % r for i in range(int(c["ring_len"][bi]))]
        assert sorted(s for _, s in low) == list(np.nonzero(low_ok[bi])[0]), "low_bit_valid disagrees with pages"
        assert vl == list(np.nonzero(vl_ok[bi])[0]), "vl_valid disagrees with num_vl"
        assert sorted(ring) == list(np.nonzero(ring_ok[bi])[0]), "ring_valid disagrees with ring_start/len"
        out.append([{"low": low, "vl": vl, "ring": ring} for _ in range(cache.num_kv_heads)])
    return out


def dequantized_low_bit(cache: HybridKVCache, config: HyQuantConfig):
    """Oracle reading of the low-bit region: (k, v) float64 [B, H, S, D] from the stored codes."""
    c = host(cache)
    d = cache.head_dim
    bs = config.block_size

    def read(codes, scale, zero, bits, channel):
        if bits == 16:
            return codes.astype(np.float64)
        u = oracle.unpack(codes, bits)
        assert u.shape[-1] == d
        if channel:
            b, h, s, _ = u.shape
            x = oracle.dequantize_channels(u.reshape(b, h, s // bs, bs, d), scale.astype(np.float64),
                                           zero.astype(np.float64))
            return x.reshape(b, h, s, d)
        return oracle.dequantize_tokens(u, scale.astype(np.float64),
                                        None if zero is None else zero.astype(np.float64), bits)

    k = read(c["k_codes"], c["k_scale"], c["k_zero"], config.key_bits, config.scheme == "channel_key")
    v = read(c["v_codes"], c["v_scale"], c["v_zero"], config.value_bits, False)
    return k, v


def region_ids(cache: HybridKVCache, config: HyQuantConfig):
    """For key_bits = value_bits = 16 caches of `id_tokens`: per (b, h) the token ids of each region.

    Checks that k and v of every stored row carry the same id and the right (b, h) tag.
    """
    assert config.key_bits == 16 and config.value_bits == 16
    c = host(cache)
    layout = regions(cache, config)
    out = []
    for bi in range(cache.batch):
        row = []
        for h in range(cache.num_kv_heads):
            reg = layout[bi][h]
            ids = {}
            for name, kbuf, vbuf, slots in (
                ("low", c["k_codes"], c["v_codes"], [s for _, s in reg["low"]]),
                ("vl", c["vl_k"], c["vl_v"], reg["vl"]),
                ("ring", c["ring_k"], c["ring_v"], reg["ring"]),
            ):
                got = []
                for s in slots:
                    tk, tv = decode_id(kbuf[bi, h, s]), decode_id(vbuf[bi, h, s])
                    assert tk == tv, f"k/v of a stored row disagree: {tk} vs {tv}"
                    assert kbuf[bi, h, s, 1] == 16 * bi + h and vbuf[bi, h, s, 1] == 16 * bi + h, "wrong (b, h) tag"
                    got.append(tk)
                ids[name] = got
            ids["pages"] = [[decode_id(c["k_codes"][bi, h, p * config.block_size + s])
                             for s in range(int(c["page_count"][bi, p]))]
                            for p in range(int(c["num_pages"][bi]))]
            row.append(ids)
        out.append(row)
    return out


def vl_sets(vl_idx, vl_count):
    """(indices [B, H, K], count [B]) -> per (b, h) list of VL positions."""
    idx, cnt = np.asarray(vl_idx), np.asarray(vl_count)
    return [[list(int(x) for x in idx[bi, h, : cnt[bi]]) for h in range(idx.shape[1])] for bi in range(idx.shape[0])]


def with_ring_score(cache: HybridKVCache, score) -> HybridKVCache:
    return dataclasses.replace(cache, ring_score=jnp.asarray(np.asarray(score, np.float32)))


# --------------------------------------------------------------------------- cache vs simulation


def _match_quantized(stored_codes, stored_scale, stored_zero, o: oracle.Quantized, what):
    """Stored codes/params equal the oracle's, except where it flags float32 rounding ambiguity."""
    codes = np.asarray(stored_codes).astype(np.int64)
    assert codes.shape == o.codes.shape, what
    bad = codes != o.codes
    assert not (bad & ~o.code_amb).any(), f"{what}: codes differ where the oracle is unambiguous"
    scale = np.asarray(stored_scale, np.float64)
    assert not ((scale != o.scale) & ~o.param_amb).any(), f"{what}: scales differ"
    if o.zero is None:
        assert stored_zero is None, what
    else:
        np.testing.assert_array_equal(np.asarray(stored_zero, np.float64), o.zero, err_msg=what)


def check_cache_against_sim(cache: HybridKVCache, sim: oracle.CacheSim, k_tok, v_tok, cfg: HyQuantConfig):
    """Every region of `cache` holds exactly the tokens `sim` predicts, stored as the spec says.

    k_tok, v_tok: [B, H, M, D] float32 tokens by id. VL and window rows must be bit-exact;
    low-bit pages must hold the oracle's quantization of the predicted tokens.
    """
    c = host(cache)
    bs = cfg.block_size
    sym = cfg.scheme == "token_sym"
    layout = regions(cache, cfg)
    assert c["length"].tolist() == sim.length, "lengths"
    kc = c["k_codes"] if cfg.key_bits == 16 else oracle.unpack(c["k_codes"], cfg.key_bits)
    vc = c["v_codes"] if cfg.value_bits == 16 else oracle.unpack(c["v_codes"], cfg.value_bits)
    for bi in range(cache.batch):
        for h in range(cache.num_kv_heads):
            reg = layout[bi][h]
            pages = sim.pages[bi][h]
            assert int(c["num_pages"][bi]) == len(pages), f"b={bi}: num_pages"
            assert [int(x) for x in c["page_count"][bi, : len(pages)]] == [len(p) for p in pages], f"b={bi}: page_count"
            assert not c["page_count"][bi, len(pages):].any(), "unused pages must be empty"
            for p, toks in enumerate(pages):
                if not toks:
                    continue
                sl = slice(p * bs, p * bs + len(toks))
                what = f"b={bi} h={h} page {p}"
                kx, vx = k_tok[bi, h, toks], v_tok[bi, h, toks]
                if cfg.key_bits == 16:
                    np.testing.assert_array_equal(kc[bi, h, sl], kx, err_msg=what)
                elif cfg.scheme == "channel_key":
                    o = oracle.quantize_channels(kx, cfg.key_bits)
                    _match_quantized(kc[bi, h, sl], c["k_scale"][bi, h, p].astype(np.float32),
                                     c["k_zero"][bi, h, p].astype(np.float32), o, what + " keys")
                else:
                    o = oracle.quantize_tokens(kx, cfg.key_bits, sym, cfg.group_size)
                    _match_quantized(kc[bi, h, sl], c["k_scale"][bi, h, sl].astype(np.float32),
                                     None if c["k_zero"] is None else c["k_zero"][bi, h, sl].astype(np.float32),
                                     o, what + " keys")
                if cfg.value_bits == 16:
                    np.testing.assert_array_equal(vc[bi, h, sl], vx, err_msg=what)
                else:
                    o = oracle.quantize_tokens(vx, cfg.value_bits, sym, cfg.group_size)
                    _match_quantized(vc[bi, h, sl], c["v_scale"][bi, h, sl].astype(np.float32),
                                     None if c["v_zero"] is None else c["v_zero"][bi, h, sl].astype(np.float32),
                                     o, what + " values")
            vl = sim.vl[bi][h]
            assert len(reg["vl"]) == len(vl), f"b={bi} h={h}: num_vl {len(reg['vl'])} != {len(vl)}"
            np.testing.assert_array_equal(c["vl_k"][bi, h, reg["vl"]], k_tok[bi, h, vl], err_msg="VL keys")
            np.testing.assert_array_equal(c["vl_v"][bi, h, reg["vl"]], v_tok[bi, h, vl], err_msg="VL values")
            ring = sim.ring[bi][h]
            assert len(reg["ring"]) == len(ring), f"b={bi}: ring_len"
            np.testing.assert_array_equal(c["ring_k"][bi, h, reg["ring"]], k_tok[bi, h, ring], err_msg="ring keys")
            np.testing.assert_array_equal(c["ring_v"][bi, h, reg["ring"]], v_tok[bi, h, ring], err_msg="ring values")


# --------------------------------------------------------------------------- harness


class Harness:
    """A frozen cache plus everything needed to predict it: tokens by id, the simulation."""

    def __init__(self, gen, cfg, b, hkv, g, n, d, lengths, max_len, ids=False, garbage=None, q_scale=1.0,
                 key_offset=0.0, min_length=0, traced_freeze=False):
        self.cfg, self.gen = cfg, gen
        if ids:
            self.k, self.v = id_tokens(gen, b, hkv, max_len, d)
        else:
            self.k, self.v = normal(gen, (b, hkv, max_len, d)), normal(gen, (b, hkv, max_len, d))
            # per-channel offsets (outlier channels, as in real keys): ranges that exclude 0
            self.k += (key_offset * normal(gen, (b, hkv, 1, d))).astype(np.float32)
        self.q = normal(gen, (b, hkv * g, max_len, d), q_scale)
        self.lengths = np.asarray(lengths)
        kp, vp = self.k[:, :, :n].copy(), self.v[:, :, :n].copy()
        if garbage is not None:
            for bi, length in enumerate(self.lengths):
                kp[bi, :, length:] = garbage
                vp[bi, :, length:] = garbage
        q_tail = tail_queries(j32(self.q[:, :, :n]), ji32(self.lengths), tail_query_count(cfg))
        self.vl = vertical_token_identification(q_tail, j32(self.k[:, :, :n]), ji32(self.lengths), cfg)
        # traced_freeze: freeze under jit, where min_length is an unchecked promise
        run = jax.jit(freeze, static_argnames=("config", "max_len", "min_length")) if traced_freeze else freeze
        self.cache = run(j32(kp), j32(vp), ji32(self.lengths), q_tail, config=cfg, max_len=max_len, vl=self.vl,
                         min_length=min_length)
        self.sim = oracle.CacheSim(self.lengths, vl_sets(*self.vl), cfg, hkv, vl_capacity=self.cache.vl_capacity)

    def step_tokens(self):
        pos = np.minimum(np.asarray(self.sim.length), self.k.shape[2] - 1)  # (clipped only for overflow tests)
        def take(x):
            return np.take_along_axis(x, pos[:, None, None, None], axis=2)[:, :, 0]

        return take(self.k), take(self.v), pos

    def append(self, active=None, random_scores=False):
        if random_scores:
            self.randomize_scores()
        k, v, _ = self.step_tokens()
        act = None if active is None else jnp.asarray(np.asarray(active, bool))
        self.cache = append(self.cache, j32(k), j32(v), self.cfg, active=act)
        self.sim.append(active)

    def randomize_scores(self):
        """Distinct random ring scores, mirrored into the simulation by ring age."""
        c = self.cache
        b, h, r = c.ring_score.shape
        score = self.gen.permutation(b * h * r).reshape(b, h, r).astype(np.float32) / (b * h * r)
        start = np.asarray(c.ring_start)
        for bi in range(b):
            for hi in range(h):
                for age, tok in enumerate(self.sim.ring[bi][hi]):
                    self.sim.score[bi][hi][tok] = float(score[bi, hi, (start[bi] + age) % r])
        self.cache = with_ring_score(c, score)

    def check(self):
        check_cache_against_sim(self.cache, self.sim, self.k, self.v, self.cfg)
