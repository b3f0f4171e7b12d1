"""The FP8 (e4m3, per-token scale) K/V cache baseline against float64 NumPy oracles: quantize/dequantize, one
decode step of `FP8CacheAttention`, its byte count, and its decode state built from a shared prefill."""

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax import quant
from hyquant_jax.eval import PromptKV, decode_state, prefill_flavor
from hyquant_jax.model_attention import FP8CacheAttention, FP8KVBuffer, fp8_buffer, make_attention
from models.attention import DecodeContext, KVBuffer


def _round_mantissa(a, bits: int, min_exponent: int):
    """|a| (float64, >= 0) rounded to nearest, ties to even, on a grid with `bits` mantissa bits; exponents
    below min_exponent keep that exponent's spacing (subnormals)."""
    a = np.asarray(a, np.float64)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    step = 2.0 ** (np.maximum(e, min_exponent) - bits)
    return np.where(a > 0, np.round(a / step) * step, 0.0)


def oracle_fp8(x):
    """x float [..., D] -> (dequantized float64 [..., D], scale float64 [..., 1]): bf16 scale max|x| / 448,
    codes e4m3fn (3 mantissa bits, min normal exponent -6, max 448) of x / scale clipped to +-448."""
    x = np.asarray(x, np.float64)
    scale = _round_mantissa(np.abs(x).max(axis=-1, keepdims=True) / 448.0, 7, -126)
    scale = np.where(scale > 0, scale, 1.0)
    y = np.clip(x / scale, -448.0, 448.0)
    return np.sign(y) * _round_mantissa(np.abs(y), 3, -6) * scale, scale


def test_quantize_matches_the_float64_oracle():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 64)) * np.exp(rng.uniform(-8, 8, (3, 5, 1)))
    x[1, 2] = 0.0  # an all-zero token
    x[2, 3, 7] = 1e4  # an outlier that takes the token's scale
    x = x.astype(np.float32)
    codes, scale = quant.quantize_fp8_tokens(jnp.asarray(x))
    assert codes.dtype == jnp.float8_e4m3fn and scale.dtype == jnp.bfloat16 and scale.shape == (3, 5, 1)
    want, want_scale = oracle_fp8(x)
    np.testing.assert_array_equal(np.asarray(scale, np.float64), want_scale)
    got = np.asarray(quant.dequantize_fp8_tokens(codes, scale), np.float64)
    np.testing.assert_array_equal(got, want)
    assert not np.isnan(got).any() and (got[1, 2] == 0).all()
    # the largest element of each token lands at (or, through a bf16 scale rounded down, is clipped to) 448
    top = np.abs(np.asarray(codes.astype(jnp.float32))).max(axis=-1)
    assert np.all((top[x.any(axis=-1)] >= 416) & (top[x.any(axis=-1)] <= 448))


def test_decode_step_matches_attention_over_the_oracle_cache():
    rng = np.random.default_rng(1)
    b, hq, h, s, d, t = 2, 4, 2, 16, 32, 9  # t tokens cached, slots beyond them unused
    k = rng.standard_normal((b, h, s, d)).astype(np.float32)
    v = rng.standard_normal((b, h, s, d)).astype(np.float32)
    q = rng.standard_normal((b, hq, d)).astype(np.float32)
    k_new, v_new = (rng.standard_normal((b, h, d)).astype(np.float32) for _ in range(2))
    att = FP8CacheAttention(cache_dtype=jnp.float32, f32_probs=True)
    state = fp8_buffer(KVBuffer(jnp.asarray(k), jnp.asarray(v)))
    ctx = DecodeContext(jnp.full((b,), t, jnp.int32), jnp.ones((b,), bool))
    out, state = att.decode(0, jnp.asarray(q), jnp.asarray(k_new), jnp.asarray(v_new), state, ctx)
    keys = np.concatenate([k[:, :, :t], k_new[:, :, None]], axis=2)
    values = np.concatenate([v[:, :, :t], v_new[:, :, None]], axis=2)
    kq, vq = oracle_fp8(keys)[0], oracle_fp8(values)[0]
    qg = q.astype(np.float64).reshape(b, h, hq // h, d)
    logits = np.einsum("bhgd,bhsd->bhgs", qg, kq) / np.sqrt(d)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    want = np.einsum("bhgs,bhsd->bhgd", p / p.sum(-1, keepdims=True), vq).reshape(b, hq, d)
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=1e-5, atol=1e-5)
    got_k = np.asarray(quant.dequantize_fp8_tokens(state.k_codes, state.k_scale), np.float64)
    np.testing.assert_array_equal(got_k[:, :, t], kq[:, :, t])  # the step's token went into its slot


def test_bytes_and_shared_prefill_state():
    b, h, t, d, max_len = 1, 2, 40, 32, 64
    key = jax.random.PRNGKey(0)
    k, v = (jax.random.normal(kk, (b, h, t, d), jnp.bfloat16) for kk in jax.random.split(key))
    att = make_attention("fp8", cache_dtype=jnp.bfloat16)
    assert isinstance(att, FP8CacheAttention)
    assert prefill_flavor(att, jnp.bfloat16).flavor == "exact" and prefill_flavor(att, jnp.bfloat16).config is None
    kv = PromptKV(k, v, jnp.zeros((b, h, 0), jnp.int32), jnp.zeros((b,), jnp.int32))
    state = decode_state(att, kv, jnp.array([t], jnp.int32), max_len)
    assert isinstance(state, FP8KVBuffer) and state.k_codes.shape[2] >= max_len
    slots = state.k_codes.shape[2]
    assert att.used_bytes(state, [t])[0] == t * 2 * h * (d + 2)
    assert state.nbytes() == slots * 2 * h * (d + 2)
    np.testing.assert_array_equal(np.asarray(quant.dequantize_fp8_tokens(state.k_codes, state.k_scale))[:, :, :t],
                                  oracle_fp8(np.asarray(k, np.float32))[0])


def test_shared_prefill_gives_the_state_of_its_own_prefill():
    from hyquant_jax.eval import decode_states, run_prefill
    from models import ModelConfig, PrefillContext, init_model, split_model

    config = ModelConfig("llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=32, max_position=512)
    model = init_model(jax.random.PRNGKey(0), config, jnp.float32)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 96, (2, 48)), jnp.int32)
    lengths, max_len = jnp.array([48, 30], jnp.int32), 64
    att = FP8CacheAttention(cache_dtype=jnp.bfloat16)
    ctx = PrefillContext(jnp.int32(0), lengths, max_len, whole=True)
    states = tuple(att.prefill_state(config, 2, 48, max_len, jnp.float32, True) for _ in range(2))
    want_logits, states = model(tokens, ctx, states, attention=att, output_index=lengths - 1)
    want = tuple(att.finish_prefill(i, s, ctx) for i, s in enumerate(states))
    logits, kvs = run_prefill(*split_model(model), tokens, lengths, prefill=prefill_flavor(att, jnp.bfloat16))
    got = decode_states(att, kvs, lengths, max_len)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), atol=2e-4, rtol=2e-4)
    for g, w in zip(got, want):
        assert isinstance(g, FP8KVBuffer)
        for n in range(2):  # valid slots only: padding slots hold whatever the prefill wrote there
            a, b = (np.asarray(quant.dequantize_fp8_tokens(x.k_codes, x.k_scale))[n, :, :int(lengths[n])]
                    for x in (g, w))
            np.testing.assert_allclose(a, b, rtol=0.07, atol=1e-2)  # one e4m3 step where inputs differ by ulps
