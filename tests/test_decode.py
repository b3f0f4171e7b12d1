"""The Pallas decode kernel against the jnp reference on the same hybrid cache.

CPU: interpret mode on small shapes (CI). GPU (`pytest -m gpu`): the compiled
kernel over a grid of batch sizes, head counts and head dims.
"""

import itertools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hyquant_jax as hq
from hyquant_jax.cache import accumulate_ring_scores, append, flush_full_rings, ring_valid
from hyquant_jax.decode_launch import IMPLEMENTATIONS, DecodeTuning, mosaic_splits, plan, resolve
from hyquant_jax.decode_launch import decode_attention as kernel_decode
from hyquant_jax.reference import hybrid_decode_attention_reference


def _cache(key, batch, q_heads, kv_heads, head_dim, lengths, config, appends=0, max_len=None, dtype=jnp.float32):
    n = max(lengths)
    ks = jax.random.split(key, 4 + appends)
    q = jax.random.normal(ks[0], (batch, q_heads, n, head_dim), dtype)
    k = jax.random.normal(ks[1], (batch, kv_heads, n, head_dim), dtype)
    v = jax.random.normal(ks[2], (batch, kv_heads, n, head_dim), dtype)
    lens = jnp.asarray(lengths, jnp.int32)
    tail = hq.tail_queries(q, lens, config.window or config.block_size)
    cache = hq.freeze(k, v, lens, tail, config, max_len=max_len or n + appends + 1)
    for i in range(appends):
        kn, vn = jax.random.normal(ks[4 + i], (2, batch, kv_heads, head_dim), dtype)
        cache = append(cache, kn, vn, config)
        cache = accumulate_ring_scores(cache, q[:, :, -1], jnp.zeros((batch, q_heads)), config)
    qd = jax.random.normal(ks[3], (batch, q_heads, head_dim), dtype)
    return qd, cache


def _check(qd, cache, config, interpret, tol=1e-2, tuning=DecodeTuning()):
    ref, ref_lse = hybrid_decode_attention_reference(qd.astype(jnp.float32), cache, config)
    out, lse = kernel_decode(qd, cache, config, interpret=interpret, tuning=tuning)
    out = np.asarray(out, np.float32)
    assert np.all(np.isfinite(out)) and out.shape == ref.shape
    err = np.linalg.norm(out - np.asarray(ref)) / max(np.linalg.norm(np.asarray(ref)), 1e-30)
    assert err < tol, f"relative error {err:.3g}"
    finite = np.isfinite(np.asarray(ref_lse))
    assert np.array_equal(finite, np.isfinite(np.asarray(lse)))
    np.testing.assert_allclose(np.asarray(lse)[finite], np.asarray(ref_lse)[finite], atol=2e-2)
    return err


# ----------------------------------------------------------------- CPU interpret mode (CI)

SMALL = dict(window=32, block_size=16, prefill_block=16)


@pytest.mark.parametrize(
    "scheme,key_bits,value_bits",
    [("token_sym", 4, 4), ("token_asym", 2, 4), ("channel_key", 4, 2), ("token_sym", 8, 8),
     ("token_asym", 16, 4), ("channel_key", 4, 16)],
)
def test_interpret_matches_reference(scheme, key_bits, value_bits):
    config = hq.HyQuantConfig(scheme=scheme, key_bits=key_bits, value_bits=value_bits, **SMALL)
    qd, cache = _cache(jax.random.PRNGKey(1), 2, 4, 2, 64, [150, 41], config, appends=20)
    _check(qd, cache, config, interpret=True, tuning=DecodeTuning(n_low=2, n_vl=2))


@pytest.mark.parametrize("convert,pages_per_tile", [("cast", 1), ("magic", 2), ("asm", 2), ("magic", 1)])
def test_interpret_tile_and_convert_variants(convert, pages_per_tile):
    config = hq.HyQuantConfig(scheme="token_asym", group_size=32, **SMALL)
    qd, cache = _cache(jax.random.PRNGKey(2), 1, 3, 1, 64, [200], config, appends=5)
    _check(qd, cache, config, interpret=True, tuning=DecodeTuning(
        n_low=3, n_vl=1, pages_per_tile=pages_per_tile, convert=convert))


@pytest.mark.parametrize("scheme,bits", [("token_sym", 4), ("channel_key", 2), ("token_sym", 8)])
def test_interpret_magic_conversion(scheme, bits):
    """The bf16 "magic" conversion with its excess terms, for every scheme (the default is "asm")."""
    config = hq.HyQuantConfig(scheme=scheme, key_bits=bits, value_bits=bits, **SMALL)
    qd, cache = _cache(jax.random.PRNGKey(9), 1, 4, 2, 64, [180], config, appends=3)
    _check(qd, cache, config, interpret=True, tuning=DecodeTuning(n_low=2, convert="magic"))


def _run_ptx(asm: str, word: int) -> list[float]:
    """Execute the few PTX instructions `_asm_unpack` emits on one 32-bit input; returns the 4 fp16 outputs."""
    regs = {"$2": word}

    def val(x):
        x = x.strip().rstrip(";")
        return regs[x] if x in regs else int(x, 0)

    def halves(x):
        return np.array([x & 0xFFFF, x >> 16], np.uint16).view(np.float16)

    for line in asm.strip("{}\n").split("\n"):
        op, _, rest = line.strip().partition(" ")
        args = [a.strip() for a in rest.rstrip(";").split(",")]
        if op in ("", ".reg"):
            continue
        if op == "prmt.b32":  # default mode: byte k of d = byte (selector nibble k) of {b, a}
            src = val(args[1]) | val(args[2]) << 32
            sel = val(args[3])
            regs[args[0]] = sum(((src >> (8 * ((sel >> (4 * k)) & 7))) & 0xFF) << (8 * k) for k in range(4))
        elif op == "lop3.b32":  # bitwise function given by the 8-bit truth table over (a=0xF0, b=0xCC, c=0xAA)
            a, b, c, lut = (val(x) for x in args[1:])
            regs[args[0]] = sum(((lut >> (((a >> i) & 1) << 2 | ((b >> i) & 1) << 1 | ((c >> i) & 1))) & 1) << i
                                for i in range(32))
        elif op == "mov.b32":
            regs[args[0]] = val(args[1])
        elif op == "sub.f16x2":
            d = (halves(val(args[1])) - halves(val(args[2]))).astype(np.float16).view(np.uint16)
            regs[args[0]] = int(d[0]) | int(d[1]) << 16
        else:
            raise AssertionError(f"unexpected PTX instruction {op!r}")
    return [float(x) for r in ("$0", "$1") for x in halves(regs[r])]


@pytest.mark.parametrize("bits,half", [(4, 8.0), (4, 0.0), (2, 2.0), (2, 0.0), (8, 128.0), (8, 0.0)])
def test_ptx_unpack_matches_interpret_values(bits, half):
    """The inline PTX of the "asm" conversion, executed instruction by instruction on every byte value
    (4 bytes per word, every code position), equals the values the interpret path computes."""
    from pallas_kernels.decode import _asm_unpack, _Codes, _unpack

    all_bytes = np.arange(256, dtype=np.uint8)
    words = all_bytes.reshape(64, 4)
    for shift in range(0, 8, bits):
        c = _Codes(shift, bits, half, "asm")
        want = np.asarray(_unpack(jnp.asarray(all_bytes), c, interpret=True), np.float32).reshape(64, 4)
        codes = ((all_bytes >> shift) & ((1 << bits) - 1)).astype(np.float32).reshape(64, 4)
        np.testing.assert_array_equal(want, (2.0 ** shift) * (codes - half))
        asm = _asm_unpack(c)
        got = np.array([_run_ptx(asm, int(w.view(np.uint32)[0])) for w in words])
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("batch,capacity_tokens,n_low", [
    (1, 32768, 64),    # small batch: splits fill the GPU (4 blocks per SM)
    (16, 32768, 8),    # large batch: splits of at most 4K tokens
    (64, 32768, 8),
    (1, 131072, 64),
    (64, 2048, 1),     # short cache: one split, 512 blocks still fit in one wave
])
def test_split_heuristic(batch, capacity_tokens, n_low):
    """Splits per KV head chosen from the H200 sweeps (Qwen3-8B heads, 132 SMs)."""
    from hyquant_jax.decode_launch import MAX_SPLIT_TOKENS, decode_layout

    config = hq.HyQuantConfig()
    pages = capacity_tokens // config.block_size
    cache = jax.eval_shape(lambda: hq.freeze(
        jnp.zeros((batch, 8, 256, 128), jnp.bfloat16), jnp.zeros((batch, 8, 256, 128), jnp.bfloat16),
        jnp.full((batch,), 256, jnp.int32), jnp.zeros((batch, 32, 128, 128), jnp.bfloat16), config,
        max_len=capacity_tokens))
    assert cache.page_count.shape[1] >= pages
    lay = decode_layout(cache, config, 32)
    assert lay.n_low == n_low
    if batch * 8 * n_low > 4 * 132:  # past the fill regime every split covers at most MAX_SPLIT_TOKENS
        assert cache.page_count.shape[1] * config.block_size / lay.n_low <= MAX_SPLIT_TOKENS


def test_split_heuristic_reads_the_multiprocessor_count(monkeypatch):
    """DecodeTuning() fills the multiprocessors `backends.multiprocessor_count()` reports (132 off-GPU);
    DecodeTuning(sm_count=...) overrides it."""
    from hyquant_jax import backends
    from hyquant_jax.decode_launch import decode_layout

    config = hq.HyQuantConfig()
    cache = jax.eval_shape(lambda: hq.freeze(
        jnp.zeros((1, 8, 256, 128), jnp.bfloat16), jnp.zeros((1, 8, 256, 128), jnp.bfloat16),
        jnp.full((1,), 256, jnp.int32), jnp.zeros((1, 32, 128, 128), jnp.bfloat16), config, max_len=32768))
    assert decode_layout(cache, config, 32).n_low == 64  # B1 32K on 132 multiprocessors
    monkeypatch.setattr(backends, "multiprocessor_count", lambda device=None, default=132: 66)
    assert decode_layout(cache, config, 32).n_low == 32
    assert decode_layout(cache, config, 32, DecodeTuning(sm_count=132)).n_low == 64


def test_launch_defaults_and_overrides():
    """The plan's Triton launch: 4 warps / 3 stages unless the tuning sets them."""
    config = hq.HyQuantConfig(**SMALL)
    _, cache = _cache(jax.random.PRNGKey(5), 1, 2, 1, 64, [64], config)

    def launch(tuning):
        p = plan(cache, config, 2, tuning)
        return p.num_warps, p.num_stages

    assert launch(None) == launch(DecodeTuning()) == (4, 3)
    assert launch(DecodeTuning(num_warps=2)) == (2, 3)
    assert launch(DecodeTuning(num_warps=8, num_stages=2)) == (8, 2)


def test_interpret_short_and_empty_sequences():
    """Lengths below W (no low-bit pages, no VL) and an empty sequence give no NaN."""
    config = hq.HyQuantConfig(**SMALL)
    qd, cache = _cache(jax.random.PRNGKey(3), 3, 2, 1, 64, [5, 31, 0], config, max_len=96)
    ref, ref_lse = hybrid_decode_attention_reference(qd, cache, config)
    out, lse = kernel_decode(qd, cache, config, interpret=True)
    assert np.all(np.isfinite(np.asarray(out)))
    np.testing.assert_allclose(np.asarray(out)[:2], np.asarray(ref)[:2], rtol=2e-2, atol=2e-2)
    assert np.all(np.asarray(out)[2] == 0) and np.all(np.isneginf(np.asarray(lse)[2]))
    _, _, ring_logits = kernel_decode(qd, cache, config, interpret=True, ring_logits=True)
    assert np.all(np.isneginf(np.asarray(ring_logits)[2])) and np.isfinite(np.asarray(ring_logits)[0]).any()


@pytest.mark.parametrize("n_low,pallas_merge", [(2, True), (250, False)])
def test_interpret_triton_only_merge_paths(n_low, pallas_merge):
    """The Triton launch alone merges its splits in the merge kernel while every split's rows fit one of its
    programs (`decode_merge.fits`) and through XLA past that; both give the reference."""
    config = hq.HyQuantConfig(**SMALL)
    qd, cache = _cache(jax.random.PRNGKey(8), 1, 16, 1, 64, [100], config)  # 16 rows: 256 splits fit, 512 not
    tuning = DecodeTuning(n_low=n_low, n_vl=10)
    jaxpr = jax.make_jaxpr(lambda q, c: kernel_decode(q, c, config, interpret=True, tuning=tuning))(qd, cache)
    assert ("hyquant_merge_splits" in str(jaxpr)) == pallas_merge
    _check(qd, cache, config, interpret=True, tuning=tuning)


def test_backend_dispatch_interpret():
    config = hq.HyQuantConfig(**SMALL)
    qd, cache = _cache(jax.random.PRNGKey(4), 1, 2, 1, 64, [100], config)
    out, _ = hq.decode_attention(qd, cache, config, backend="interpret")
    ref, _ = hq.decode_attention(qd, cache, config, backend="reference")
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="backend"):
        hq.decode_attention(qd, cache, config, backend="cuda")


def _check_ring_logits(qd, cache, config, interpret, tuning=DecodeTuning()):
    """ring_logits=True: the same output and lse as without, and q . k * scale of every ring slot (-inf where
    the slot is empty, padded GQA rows not returned) within the bf16 rounding of q * scale and the keys."""
    out, lse, logits = kernel_decode(qd, cache, config, interpret=interpret, tuning=tuning, ring_logits=True)
    plain_out, plain_lse = kernel_decode(qd, cache, config, interpret=interpret, tuning=tuning)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(plain_out))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(plain_lse))
    b, q_heads, d = qd.shape
    h, r = cache.num_kv_heads, cache.ring_k.shape[2]
    assert logits.shape == (b, q_heads, r) and logits.dtype == jnp.float32
    q64 = np.asarray(qd.astype(jnp.float32), np.float64).reshape(b, h, q_heads // h, d)
    k64 = np.asarray(cache.ring_k.astype(jnp.float32), np.float64)
    want = np.einsum("bhgd,bhrd->bhgr", q64, k64).reshape(b, q_heads, r) / np.sqrt(d)
    valid = np.broadcast_to(np.asarray(ring_valid(cache))[:, None, :], (b, q_heads, r))  # slots of each sequence
    assert valid.any() and not valid.all()
    got = np.asarray(logits, np.float64)
    assert np.all(np.isneginf(got[~valid]))
    np.testing.assert_allclose(got[valid], want[valid], rtol=0, atol=2e-2 * np.abs(want[valid]).max())


def test_interpret_ring_logits_match_float_logits():
    """Rings partly filled after flushes; a GQA group of 3 (13 padded rows)."""
    config = hq.HyQuantConfig(**SMALL)
    qd, cache = _cache(jax.random.PRNGKey(6), 3, 6, 2, 64, [150, 70, 0], config, appends=13, max_len=200)
    _check_ring_logits(qd, cache, config, interpret=True)


def test_interpret_decode_step_ring_scores_match_reference():
    """decode_step on the kernel backend takes the ring scores from the kernel's logits: same ring scores as
    the reference backend's float32 recomputation, within the bf16 rounding of the logits."""
    config = hq.HyQuantConfig(**SMALL)
    qd, cache = _cache(jax.random.PRNGKey(7), 2, 4, 2, 64, [130, 45], config, appends=5, max_len=200)
    k, v = jax.random.normal(jax.random.PRNGKey(8), (2, 2, 2, 64))
    out_k, cache_k = hq.decode_step(qd, k, v, cache, config, backend="interpret")
    out_r, cache_r = hq.decode_step(qd, k, v, cache, config, backend="reference")
    np.testing.assert_allclose(np.asarray(out_k), np.asarray(out_r), rtol=2e-2, atol=2e-2)
    before = np.asarray(cache.ring_score)
    got, want = np.asarray(cache_k.ring_score) - before, np.asarray(cache_r.ring_score) - before
    assert np.abs(want).max() > 0.1  # this step's mass
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-6)  # measured: 0.64% at most
    with pytest.raises(ValueError, match="ring_logits"):
        accumulate_ring_scores(cache, qd, jnp.zeros((2, 4)), config, ring_logits=jnp.zeros((2, 4, 5)))


def _new_token(seed, cache):
    k, v = jax.random.normal(jax.random.PRNGKey(seed), (2, cache.batch, cache.num_kv_heads, cache.head_dim))
    return k.astype(cache.dtype), v.astype(cache.dtype)


def _check_new_token(qd, cache, config, interpret, active, tuning=DecodeTuning()):
    """decode_attention(cache, new_token=(k, v, active)) attends as over append(cache, k, v, active): the same
    lse and ring logits (the token's at the slot append fills; -inf there for an inactive sequence), and the
    output up to the kernel's bf16 rounding of the probabilities it multiplies with V (the token's own split
    has weight 1 and V as it is); the reference's output and lse on the appended cache."""
    (cache,) = flush_full_rings((cache,), config, jnp.ones((cache.batch,), bool))
    k, v = _new_token(21, cache)
    out, lse, logits = kernel_decode(qd, cache, config, interpret=interpret, ring_logits=True,
                                     new_token=(k, v, active), tuning=tuning)
    appended = append(cache, k, v, config, active=active, flush=False)
    want_out, want_lse, want_logits = kernel_decode(qd, appended, config, interpret=interpret, ring_logits=True,
                                                    tuning=tuning)
    out, want_out = np.asarray(out, np.float32), np.asarray(want_out, np.float32)
    assert np.linalg.norm(out - want_out) < 4e-3 * np.linalg.norm(want_out)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(want_lse), rtol=1e-6, atol=1e-5)
    # the other slots as the kernel computed them; the token's slot as the float64 q . k of the bf16 operands
    # (on the H200, with the Mosaic launch, XLA can drop the bf16 rounding of q there, ~1e-3 off: see token_logits)
    b, q_heads, d = qd.shape
    h, r = cache.num_kv_heads, cache.ring_k.shape[2]
    slot = np.asarray((cache.ring_start + cache.ring_len) % r)
    at = (np.arange(r)[None, :] == slot[:, None]) & np.asarray(active)[:, None]  # [B, R]
    at = np.broadcast_to(at[:, None, :], (b, q_heads, r))
    logits, want_logits = np.asarray(logits), np.asarray(want_logits)
    np.testing.assert_allclose(logits[~at], want_logits[~at], rtol=1e-6, atol=1e-5)
    scale = 1.0 / np.sqrt(d)
    q64 = np.asarray((qd.astype(jnp.float32) * scale).astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    k64 = np.asarray(k.astype(jnp.float32), np.float64)
    exact = np.einsum("bhgd,bhd->bhg", q64.reshape(b, h, q_heads // h, d), k64).reshape(b, q_heads)
    np.testing.assert_allclose(logits[at], np.broadcast_to(exact[:, :, None], at.shape)[at], rtol=1e-5, atol=1e-5)
    ref, ref_lse = hybrid_decode_attention_reference(qd.astype(jnp.float32), appended, config)
    assert np.linalg.norm(out - np.asarray(ref)) < 1e-2 * np.linalg.norm(np.asarray(ref))  # as `_check`
    # the slot as decode_step passes it, from the appended cache: the same ring logits bit for bit
    token_slot = (appended.ring_start + appended.ring_len - 1) % r
    _, _, slotted = kernel_decode(qd, cache, config, interpret=interpret, ring_logits=True,
                                  new_token=(k, v, active), tuning=tuning, token_slot=token_slot)
    np.testing.assert_array_equal(np.asarray(slotted), logits)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), atol=2e-2)
    return k, v


@pytest.mark.parametrize("appends", [0, 13])
def test_interpret_new_token_equals_appending_first(appends):
    """Rings after flushes or not yet flushed, a sequence without prompt tokens, one inactive sequence."""
    config = hq.HyQuantConfig(**SMALL)
    qd, cache = _cache(jax.random.PRNGKey(20 + appends), 3, 6, 2, 64, [150, 70, 0], config, appends=appends,
                       max_len=200, dtype=jnp.bfloat16)
    active = jnp.asarray([True, False, True])
    k, v = _check_new_token(qd, cache, config, True, active)
    with pytest.raises(ValueError, match="new_token must be"):
        kernel_decode(qd, cache, config, interpret=True, new_token=(k[:, :1], v, jnp.ones((3,), bool)))
    slot = jnp.zeros((3,), jnp.int32)
    def run(**kw):
        return kernel_decode(qd, cache, config, interpret=True, ring_logits=True, **kw)

    with pytest.raises(ValueError, match=r"token_slot must be int32 \[B\]=\(3,\)"):
        run(new_token=(k, v, active), token_slot=slot[:2])
    with pytest.raises(ValueError, match="without new_token"):
        run(token_slot=slot)


def test_decode_step_attends_before_it_appends():
    """On the kernel backends decode_step's attention launches read the cache as it was: nothing they read
    comes from the step's ring append, so XLA may run the append after them (off the path from q to out)."""
    config = hq.HyQuantConfig(**SMALL)
    qd, cache = _cache(jax.random.PRNGKey(22), 1, 4, 2, 64, [100], config, appends=1)
    k, v = _new_token(23, cache)
    jaxpr = jax.make_jaxpr(lambda *a: hq.decode_step(*a, config, backend="interpret", flush=False))(
        qd, k, v, cache).jaxpr
    names = [str(e.params.get("name", "")) for e in jaxpr.eqns]
    assert "_run" in names and "_append" in names
    written = set()  # every variable computed from the append's outputs
    for eqn in jaxpr.eqns:
        reads = {x for x in eqn.invars if isinstance(x, jax.extend.core.Var)}
        if str(eqn.params.get("name", "")) == "_append" or reads & written:
            written |= set(eqn.outvars)
        if str(eqn.params.get("name", "")) == "_run":
            assert not reads & written
            attention = eqn
    append = next(e for e in jaxpr.eqns if str(e.params.get("name", "")) == "_append")
    assert set(attention.outvars).isdisjoint(append.invars)  # and the append does not wait for attention


def test_unsupported_group_size_is_a_clear_error():
    config = hq.HyQuantConfig(group_size=8, **SMALL)
    qd, cache = _cache(jax.random.PRNGKey(5), 1, 2, 1, 64, [64], config)
    with pytest.raises(NotImplementedError, match="group_size"):
        kernel_decode(qd, cache, config, interpret=True)


def test_unknown_conversion_is_rejected():
    with pytest.raises(ValueError, match="DecodeTuning.convert must be one of"):
        DecodeTuning(convert="int")


# ----------------------------------------------------------------- GPU: the compiled kernel

GPU_HEADS = [(32, 8), (9, 3), (8, 8), (64, 8)]


@pytest.mark.gpu
@pytest.mark.parametrize("batch,heads,head_dim", list(itertools.product([1, 3, 16], GPU_HEADS, [64, 128])))
def test_gpu_shapes(batch, heads, head_dim):
    config = hq.HyQuantConfig()
    rng = np.random.default_rng(batch * 1000 + heads[0] * 10 + head_dim)
    if batch == 1:
        lengths = [int(rng.integers(1000, 3000))]
    else:  # ragged, incl. lengths below W and non-powers of two
        lengths = [int(x) for x in rng.integers(1, 2500, size=batch)]
        lengths[0] = 77
    qd, cache = _cache(jax.random.PRNGKey(batch + head_dim), batch, heads[0], heads[1], head_dim, lengths, config,
                       appends=3, dtype=jnp.bfloat16)
    _check(qd, cache, config, interpret=False)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "scheme,key_bits,value_bits,group_size,head_dim",
    [("token_sym", 4, 4, None, 256), ("token_asym", 4, 4, 32, 128), ("token_asym", 2, 2, None, 128),
     ("token_sym", 8, 8, None, 128), ("channel_key", 4, 4, None, 128), ("channel_key", 2, 4, None, 64),
     ("token_asym", 4, 2, None, 64), ("token_sym", 16, 4, None, 128), ("channel_key", 4, 16, None, 128)],
)
def test_gpu_schemes_and_bits(scheme, key_bits, value_bits, group_size, head_dim):
    config = hq.HyQuantConfig(scheme=scheme, key_bits=key_bits, value_bits=value_bits, group_size=group_size)
    qd, cache = _cache(jax.random.PRNGKey(7), 2, 8, 2, head_dim, [3001, 1500], config, appends=70,
                       dtype=jnp.bfloat16)
    _check(qd, cache, config, interpret=False)


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [DecodeTuning(convert="cast"), DecodeTuning(convert="magic"),
                                    DecodeTuning(pages_per_tile=1, n_low=7),
                                    DecodeTuning(pages_per_tile=4, num_warps=8, num_stages=3),
                                    DecodeTuning(pages_per_tile=4, num_warps=2, num_stages=4),
                                    DecodeTuning(low_bit="triton"),
                                    DecodeTuning(low_bit="mosaic", mosaic_blocks_per_sm=1, mosaic_stages=3),
                                    DecodeTuning(low_bit="mosaic", mosaic_blocks_per_sm=16, mosaic_stages=1),
                                    DecodeTuning(low_bit="mosaic", mosaic_splits=5)])
def test_gpu_tunings(tuning):
    config = hq.HyQuantConfig()
    qd, cache = _cache(jax.random.PRNGKey(8), 2, 32, 8, 128, [4097, 999], config, dtype=jnp.bfloat16)
    _check(qd, cache, config, interpret=False, tuning=tuning)


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [DecodeTuning(low_bit="triton"), DecodeTuning(low_bit="mosaic")])
def test_gpu_ring_logits(tuning):
    config = hq.HyQuantConfig()
    qd, cache = _cache(jax.random.PRNGKey(9), 2, 32, 8, 128, [4097, 999], config, appends=37, dtype=jnp.bfloat16)
    _check_ring_logits(qd, cache, config, interpret=False, tuning=tuning)


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [DecodeTuning(low_bit="triton"), DecodeTuning(low_bit="mosaic")])
def test_gpu_new_token(tuning):
    """The step's own token as one more split, through the compiled kernels (the merge kernel with Mosaic)."""
    config = hq.HyQuantConfig()
    qd, cache = _cache(jax.random.PRNGKey(10), 3, 32, 8, 128, [4097, 999, 60], config, appends=64,
                       dtype=jnp.bfloat16)
    _check_new_token(qd, cache, config, False, jnp.asarray([True, True, False]), tuning=tuning)


# ----------------------------------------------------------------- the op: tuning, plan, implementations

H100 = SimpleNamespace(platform="gpu", compute_capability="9.0", core_count=132, device_kind="NVIDIA H100")
A100 = SimpleNamespace(platform="gpu", compute_capability="8.0", core_count=108, device_kind="NVIDIA A100")
CPU = SimpleNamespace(platform="cpu", device_kind="cpu")


@pytest.mark.parametrize("field,value", [
    ("n_low", 0), ("n_vl", -1), ("pages_per_tile", 1.5), ("num_stages", 0), ("sm_count", True),
    ("mosaic_splits", 0), ("mosaic_blocks_per_sm", None), ("mosaic_stages", 0), ("num_warps", 3),
    ("num_warps", 64), ("convert", "int"), ("low_bit", "cuda"),
])
def test_tuning_rejects_bad_fields_by_name(field, value):
    with pytest.raises(ValueError, match=rf"DecodeTuning\.{field} must be"):
        DecodeTuning(**{field: value})


def test_tuning_accepts_every_documented_value():
    for convert in ("asm", "magic", "cast"):
        for low_bit in ("auto", "mosaic", "triton"):
            DecodeTuning(convert=convert, low_bit=low_bit, n_low=1, n_vl=3, pages_per_tile=2, num_warps=8,
                         num_stages=4, sm_count=66, mosaic_blocks_per_sm=1, mosaic_stages=3, mosaic_splits=5)
    with pytest.raises(ValueError, match="tuning must be None or a"):
        hq.decode_attention(*_cache(jax.random.PRNGKey(5), 1, 2, 1, 64, [64], hq.HyQuantConfig(**SMALL)),
                            hq.HyQuantConfig(**SMALL), tuning={"n_low": 2})


def _shapes(batch, q_heads, kv_heads, head_dim, capacity, config):
    """A cache's array shapes only (`plan` reads no data)."""
    return jax.eval_shape(lambda: hq.freeze(
        jnp.zeros((batch, kv_heads, 256, head_dim), jnp.bfloat16),
        jnp.zeros((batch, kv_heads, 256, head_dim), jnp.bfloat16), jnp.full((batch,), 256, jnp.int32),
        jnp.zeros((batch, q_heads, config.window, head_dim), jnp.bfloat16), config, max_len=capacity))


def test_plan_on_fake_devices():
    """Which kernel scans the low-bit pages, the splits and the merge, for a B1 32K Qwen3-8B cache: the Mosaic
    kernel on Hopper (its splits from the device's multiprocessors), the Triton kernel alone elsewhere and in
    interpret mode; the merge kernel unless the Triton launch's splits are too many for it."""
    config = hq.HyQuantConfig()
    cache = _shapes(1, 32, 8, 128, 32768, config)
    hopper = plan(cache, config, 32, device=H100)
    assert hopper.low_bit == "mosaic" and hopper.layout.n_low == 0 and hopper.merge == "kernel"
    assert hopper.mosaic_splits == mosaic_splits(1, 8, cache.page_count.shape[1], 132) and hopper.mosaic_stages == 2
    for p in (plan(cache, config, 32, device=A100), plan(cache, config, 32, device=CPU),
              plan(cache, config, 32, device=H100, interpret=True)):
        assert p.low_bit == "triton" and p.mosaic_splits is None and p.mosaic_stages is None
        assert p.layout.n_low >= 1 and p.merge == "kernel"
    assert plan(cache, config, 32, device=H100, interpret=True).interpret
    # the splits fill the device's multiprocessors: fewer on the A100 than on a CPU (planned as 132)
    assert plan(cache, config, 32, device=A100).layout.n_low < plan(cache, config, 32, device=CPU).layout.n_low
    # GQA groups of 16 at 512 low-bit splits: the splits' rows do not fit one merge program
    many = plan(_shapes(1, 32, 2, 128, 32768, config), config, 32, DecodeTuning(n_low=512), device=A100)
    assert many.low_bit == "triton" and many.merge == "xla"
    assert plan(cache, hq.HyQuantConfig(scheme="token_sym"), 32, device=H100).low_bit == "triton"
    with pytest.raises(NotImplementedError, match=r"head_dim \(64, 128, 256\)"):
        plan(_shapes(1, 4, 2, 32, 4096, hq.HyQuantConfig()), hq.HyQuantConfig(), 4, device=H100)


def test_implementations_say_where_they_run():
    """Each implementation's `supported(device, cache, config, q_heads, interpret)`, and the backend "auto"
    resolves to: the kernels where one runs, the reference elsewhere."""
    config = hq.HyQuantConfig()
    cache = _shapes(1, 32, 8, 128, 4096, config)
    small_dims = _shapes(1, 4, 2, 32, 4096, config)  # head_dim 32: no Pallas decode kernel
    mosaic, triton, reference = (IMPLEMENTATIONS[n] for n in ("mosaic", "triton", "reference"))
    assert list(IMPLEMENTATIONS) == ["mosaic", "triton", "reference"]  # "auto"'s order
    assert mosaic.supported(H100, cache, config, 32)
    assert not mosaic.supported(A100, cache, config, 32) and not mosaic.supported(H100, cache, config, 32, True)
    assert not mosaic.supported(H100, cache, hq.HyQuantConfig(scheme="token_asym"), 32)
    assert triton.supported(A100, cache, config, 32) and triton.supported(CPU, cache, config, 32, True)
    assert not triton.supported(CPU, cache, config, 32) and not triton.supported(H100, small_dims, config, 4)
    assert "head_dim" in triton.unsupported(H100, small_dims, config, 4)
    assert all(reference.supported(d, small_dims, config, 4) for d in (H100, A100, CPU))
    assert resolve("auto", cache, config, 32, H100) == resolve("auto", cache, config, 32, A100) == "triton"
    assert resolve("auto", cache, config, 32, CPU) == "reference"
    assert resolve("auto", small_dims, config, 4, H100) == "reference"
    assert resolve("mosaic", cache, config, 32, CPU) == "triton"  # decode's low-bit kernel is the plan's choice
    assert [resolve(b, cache, config, 32, CPU) for b in ("reference", "triton", "interpret")] == [
        "reference", "triton", "interpret"]
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve("cuda", cache, config, 32, CPU)
