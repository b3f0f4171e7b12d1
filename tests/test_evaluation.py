"""hyquant_jax.eval (shared prefills, teacher forcing, operators, the sparse ablation) on small random inputs
and a tiny random model.

The accuracy benchmark (benchmarks/accuracy/) rests on these: the causal-skipping
hybrid prefill equals the library reference, shared prefills build the same decode
states as each method's own prefill, teacher forcing scores exactly what a full
forward pass scores, and the vertical-only sparse ablation attends over exactly
the VL + window keys.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyquant_jax import HyQuantConfig
from hyquant_jax.cache import freeze, ring_valid
from hyquant_jax.eval import (
    SharedPrefill,
    VerticalSparseAttention,
    column_mass,
    decode_operator,
    decode_operator_reference,
    decode_states,
    exact_causal_attention,
    hybrid_prefill,
    hybrid_prefill_causal,
    prefill_flavor,
    relative_mse,
    run_prefill,
    teacher_forced_nll,
    vertical_sparse_decode_reference,
    vertical_sparse_prefill_reference,
)
from hyquant_jax.model_attention import HybridAttention, make_attention
from hyquant_jax.reference import hybrid_prefill_attention_reference
from hyquant_jax.vti import tail_queries, tail_query_count, vertical_token_identification
from models import BF16Attention, ModelConfig, PrefillContext, init_model, split_model

SMALL = HyQuantConfig(window=32, block_size=16, prefill_block=16, rho=0.1)
CONFIG = ModelConfig("llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=32, max_position=1024)


def _qkv(seed, b=2, hq=4, hkv=2, t=200, d=16):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(keys[0], (b, hq, t, d))
    k = jax.random.normal(keys[1], (b, hkv, t, d)) + 0.5  # a shared offset: mean-smoothing matters
    v = jax.random.normal(keys[2], (b, hkv, t, d))
    return q, k, v


def _vl(q, k, lengths, config):
    return vertical_token_identification(tail_queries(q, lengths, tail_query_count(config)), k, lengths, config)


def _valid_rows(x, lengths):
    return [np.asarray(x[b, :, :n]) for b, n in enumerate(np.asarray(lengths))]


@pytest.mark.parametrize("qk_format", ["int8", "fp8", "bf16"])
def test_causal_hybrid_prefill_equals_reference(qk_format):
    config = dataclasses.replace(SMALL, prefill_qk=qk_format)
    q, k, v = _qkv(0)
    lengths = jnp.array([200, 137], jnp.int32)
    vl = _vl(q, k, lengths, config)
    want = hybrid_prefill_attention_reference(q, k, v, lengths, *vl, config)
    for chunk in (48, 16, 256):  # 5 uneven, 13 and 1 query chunks
        got = hybrid_prefill_causal(q, k, v, lengths, *vl, config, query_chunk=chunk)
        for a, b in zip(_valid_rows(got, lengths), _valid_rows(want, lengths)):
            np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    out, vl2 = hybrid_prefill(q, k, v, lengths, config, query_chunk=64)
    assert np.array_equal(np.asarray(vl2[0]), np.asarray(vl[0]))
    np.testing.assert_allclose(np.asarray(out), np.asarray(got), atol=2e-5)


@pytest.mark.parametrize("t,chunk", [(75, 16), (64, 16), (40, 64), (1, 8)])
def test_exact_causal_attention_matches_float64(t, chunk):
    q, k, v = _qkv(3, t=t)
    got = np.asarray(exact_causal_attention(q, k, v, chunk))
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    for b in range(2):
        for h in range(4):
            logits = q64[b, h] @ k64[b, h // 2].T / 4.0  # D = 16
            logits[np.triu_indices(t, 1)] = -np.inf
            p = np.exp(logits - logits.max(1, keepdims=True))
            np.testing.assert_allclose(got[b, h], (p / p.sum(1, keepdims=True)) @ v64[b, h // 2], atol=2e-5)


def _brute_sparse(q, k, v, n, vl_idx, vl_count, config):
    """float64 attention of each valid query over keys j <= i in its band or in the VL set."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    hq, hkv, d = q.shape[0], k.shape[0], q.shape[-1]
    out = np.zeros((hq, n, d))
    for h in range(hq):
        kv = h // (hq // hkv)
        vl = set(np.asarray(vl_idx[kv, :int(vl_count)]).tolist())
        for i in range(n):
            lo = (i // config.prefill_block) * config.prefill_block - config.window
            keys = [j for j in range(i + 1) if j >= lo or j in vl]
            logits = k[kv, keys] @ q[h, i] / math.sqrt(d)
            p = np.exp(logits - logits.max())
            out[h, i] = (p / p.sum()) @ v[kv, keys]
    return out


def test_sparse_prefill_matches_brute_force():
    q, k, v = _qkv(1, t=120)
    lengths = jnp.array([120, 97], jnp.int32)
    vl = _vl(q, k, lengths, SMALL)
    got = vertical_sparse_prefill_reference(q, k, v, lengths, *vl, SMALL, query_chunk=40)
    for b, n in enumerate([120, 97]):
        want = _brute_sparse(q[b], k[b], v[b], n, vl[0][b], vl[1][b], SMALL)
        np.testing.assert_allclose(np.asarray(got[b, :, :n]), want, atol=3e-5)
        assert np.all(np.asarray(got[b, :, n:]) == 0)


def test_sparse_decode_reads_only_vl_and_window():
    q, k, v = _qkv(2, t=150)
    lengths = jnp.array([150, 110], jnp.int32)
    vl = _vl(q, k, lengths, SMALL)
    cache = freeze(k, v, lengths, None, SMALL, 160, vl=vl)
    qd = q[:, :, -1]
    out, lse = vertical_sparse_decode_reference(qd, cache, SMALL)
    ring_ok = np.asarray(ring_valid(cache))
    for b in range(2):
        nvl = int(cache.num_vl[b])
        keys = np.concatenate([np.asarray(cache.vl_k[b, :, :nvl]), np.asarray(cache.ring_k[b][:, ring_ok[b]])], 1)
        vals = np.concatenate([np.asarray(cache.vl_v[b, :, :nvl]), np.asarray(cache.ring_v[b][:, ring_ok[b]])], 1)
        for h in range(4):
            logits = keys[h // 2] @ np.asarray(qd[b, h], np.float64) / 4.0
            p = np.exp(logits - logits.max())
            np.testing.assert_allclose(np.asarray(out[b, h]), (p / p.sum()) @ vals[h // 2], atol=2e-5)
            np.testing.assert_allclose(float(lse[b, h]), np.log(p.sum()) + logits.max(), rtol=1e-5)


def test_sparse_attention_needs_whole_prefill_and_matching_shapes():
    with pytest.raises(ValueError, match="whole-prompt prefill"):
        VerticalSparseAttention(SMALL).prefill_state(CONFIG, 1, 64, 64, jnp.float32, whole=False)
    q, k, v = _qkv(8, t=64)
    lengths = jnp.array([64, 64], jnp.int32)
    vl = _vl(q, k, lengths, SMALL)
    with pytest.raises(ValueError, match="does not match"):
        vertical_sparse_prefill_reference(q, k[:, :, :32], v[:, :, :32], lengths, *vl, SMALL)
    with pytest.raises(ValueError, match="does not match"):
        hybrid_prefill_causal(q[:, :3], k, v, lengths, *vl, SMALL)


def test_shared_prefill_rejects_bad_flavors():
    with pytest.raises(ValueError, match="flavor"):
        SharedPrefill("quantized")
    with pytest.raises(ValueError, match="must be a HyQuantConfig"):
        SharedPrefill("hybrid", None)


@pytest.fixture(scope="module")
def model():
    return init_model(jax.random.PRNGKey(0), CONFIG, jnp.float32)


def _tokens(seed, b, t):
    return jnp.asarray(np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (b, t)), jnp.int32)


def _own_prefill(model, tokens, lengths, attention, max_len):
    states = tuple(attention.prefill_state(CONFIG, tokens.shape[0], tokens.shape[1], max_len, jnp.float32, True)
                   for _ in range(CONFIG.num_layers))
    ctx = PrefillContext(jnp.int32(0), lengths, max_len, whole=True)
    return model(tokens, ctx, states, attention=attention, output_index=lengths - 1)


@pytest.mark.parametrize("kind", ["bf16", "hyquant", "kivi4", "uniform4", "sparse"])
def test_shared_prefill_builds_the_methods_own_decode_state(model, kind):
    attention = (VerticalSparseAttention(SMALL) if kind == "sparse"
                 else make_attention(kind, SMALL, backend="reference"))
    tokens = _tokens(3, 2, 96)
    lengths = jnp.array([96, 71], jnp.int32)
    max_len = 128
    want_logits, want = _own_prefill(model, tokens, lengths, attention, max_len)
    logits, kvs = run_prefill(*split_model(model), tokens, lengths, prefill=prefill_flavor(attention))
    got = decode_states(attention, kvs, lengths, max_len)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), atol=2e-4, rtol=2e-4)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert a.shape == b.shape and a.dtype == b.dtype
        if jnp.issubdtype(a.dtype, jnp.integer):
            # quantized codes may differ by one step where a value sits on a rounding boundary
            assert np.mean(np.asarray(a) != np.asarray(b)) < 1e-3, kind
        else:
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=2e-3, rtol=2e-2)


def test_exact_flavor_with_config_is_hyquants_chunked_prefill(model):
    """SharedPrefill("exact", config) gives HybridAttention the state its chunked (exact) prefill builds."""
    from hyquant_jax.generate import prefill
    from hyquant_jax.sampling import SamplingConfig

    attention = make_attention("hyquant", SMALL, backend="reference")
    tokens = _tokens(7, 2, 96)
    lengths = jnp.array([96, 80], jnp.int32)
    model_def, weights = split_model(model)
    _, _, want = prefill(model_def, weights, tokens, lengths, jax.random.PRNGKey(0), attention=attention,
                         sampling=SamplingConfig(), chunk=32, max_len=128)
    flavor = prefill_flavor(attention, exact=True)
    assert flavor.flavor == "exact" and flavor.config is not None
    _, kvs = run_prefill(model_def, weights, tokens, lengths, prefill=flavor)
    got = decode_states(attention, kvs, lengths, 128)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        if jnp.issubdtype(a.dtype, jnp.integer):
            assert np.mean(np.asarray(a) != np.asarray(b)) < 1e-3
        else:
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=2e-3, rtol=2e-2)


def test_prefill_flavor_ignores_bit_widths():
    a = prefill_flavor(HybridAttention(HyQuantConfig()))
    b = prefill_flavor(HybridAttention(HyQuantConfig(key_bits=2, scheme="token_sym", promote_flushed=False)))
    c = prefill_flavor(HybridAttention(HyQuantConfig(rho=0.1)))
    assert a == b and a != c and a.flavor == "hybrid"
    assert prefill_flavor(make_attention("kivi2")) == prefill_flavor(BF16Attention())


LOSSLESS = HyQuantConfig(key_bits=16, value_bits=16, prefill_qk="bf16", window=32, block_size=16,
                         prefill_block=16, rho=0.1)


@pytest.mark.parametrize("kind", ["bf16", "hyquant"])
def test_teacher_forced_nll_matches_a_full_forward(model, kind):
    """bf16, and HyQuant with nothing quantized, score exactly what one forward over all tokens scores."""
    attention = make_attention(kind, LOSSLESS, backend="reference", cache_dtype=jnp.float32)
    tokens = _tokens(4, 2, 80)
    p = 48
    lengths = jnp.full((2,), p, jnp.int32)
    model_def, weights = split_model(model)
    _, kvs = run_prefill(model_def, weights, tokens[:, :p], lengths, prefill=prefill_flavor(attention))
    states = decode_states(attention, kvs, lengths, 80)
    nll, top1, _ = teacher_forced_nll(model_def, weights, states, tokens[:, p:], lengths, attention=attention)
    assert nll.shape == (2, 80 - p - 1) and top1.shape == nll.shape
    ctx = PrefillContext(jnp.int32(0), jnp.full((2,), 80, jnp.int32), 80, whole=True)
    states0 = tuple(BF16Attention().prefill_state(CONFIG, 2, 80, 80, jnp.float32, True) for _ in range(2))
    logits, _ = model(tokens, ctx, states0, attention=BF16Attention())
    logp = jax.nn.log_softmax(logits[:, p:-1], axis=-1)
    want = -np.take_along_axis(np.asarray(logp), np.asarray(tokens[:, p + 1:])[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(nll), want, atol=1e-4, rtol=1e-4)
    assert np.mean(np.asarray(top1) == np.argmax(np.asarray(logits[:, p:-1]), axis=-1)) > 0.95


def test_decode_operator_exact_when_nothing_is_compressed():
    q, k, v = _qkv(5, b=3, t=160)
    ref = decode_operator_reference(q, k, v, 140)
    out = decode_operator(BF16Attention(cache_dtype=jnp.float32), q, k, v, 140)
    assert out.shape == (3, 4, 20, 16)
    assert relative_mse(out, ref).max() < 1e-10
    lossy = decode_operator(make_attention("uniform4"), q, k, v, 140)
    assert 1e-3 < relative_mse(lossy, ref).mean() < 1.0


def test_column_mass_rows_sum_to_one():
    q, k, _ = _qkv(6, b=1, t=128)
    col, win = column_mass(q[0], k[0], window=16, chunk=32)
    np.testing.assert_allclose(np.asarray(col).sum(axis=1), 128.0, rtol=1e-5)
    assert np.all(np.asarray(win) <= np.asarray(col) + 1e-6)
    col2, win2 = column_mass(q[0], k[0], window=128, chunk=64)
    np.testing.assert_allclose(np.asarray(win2), np.asarray(col2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(col2), np.asarray(col), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="multiple of chunk"):
        column_mass(q[0, :, :100], k[0, :, :100], window=16, chunk=32)


def test_retrieval_batches_do_not_change_outputs():
    """The accuracy benchmark's generation.generate_batches: the batch size (incl. copies filling the last batch)
    is invisible."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.accuracy.generation import generate_batches
    from benchmarks.accuracy.tasks import Sample

    class Tok:
        eos_ids, pad_id = (), 0

    model = init_model(jax.random.PRNGKey(4), CONFIG, jnp.float32)
    rng = np.random.default_rng(0)
    samples = [Sample("needle", 48, 0.0, i, rng.integers(1, 96, n).tolist(), ["x"], 5)
               for i, n in enumerate([48, 31, 40, 17, 48])]
    methods = ("bf16", "uniform4")
    one = generate_batches(model, Tok(), samples, methods, jnp.bfloat16, batch=1, desc="b1")
    seen = []
    four = generate_batches(model, Tok(), samples, methods, jnp.bfloat16, batch=4, desc="b4",
                            on_batch=lambda out: seen.append({m: list(rows) for m, rows in out.items()}))
    assert one == four
    # bf16 and uniform4 share EXACT_PREFILL's exact prefill (which also picks a VL set): same outputs
    from benchmarks.accuracy.perplexity import flavor_groups
    from benchmarks.accuracy.settings import EXACT_PREFILL

    assert len(flavor_groups(methods + (EXACT_PREFILL,), jnp.bfloat16)) == 1
    shared = generate_batches(model, Tok(), samples, methods + (EXACT_PREFILL,), jnp.bfloat16, batch=4,
                              desc="shared")
    assert {m: shared[m] for m in methods} == one
    # after each batch: the samples done so far, in the given order, None for the rest
    assert len(seen) == 2 and seen[-1] == four
    assert all(seen[0][m][:4] == four[m][:4] and seen[0][m][4] is None for m in methods)
    assert all(len(ids) == 5 for rows in one.values() for ids in rows)
