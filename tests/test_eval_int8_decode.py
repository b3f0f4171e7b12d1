"""benchmarks/eval_int8_decode.py: with float formats its decode attention is the library's reference (so the
errors it reports come from the INT8/FP8 products alone), and its row quantizers round as specified."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.eval_int8_decode import quantize_rows, route_decode_attention
from hyquant_jax.cache import append, freeze
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.reference import hybrid_decode_attention_reference
from hyquant_jax.vti import tail_queries, tail_query_count


def _cache():
    config = HyQuantConfig(window=32, block_size=16, prefill_block=16, rho=0.1)
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    p, hq, hkv, d = 150, 4, 2, 64
    q = jax.random.normal(keys[0], (2, hq, p, d))
    k = jax.random.normal(keys[1], (2, hkv, p, d)) * jnp.linspace(0.5, 3.0, d)  # channel spread, as real keys
    v = jax.random.normal(keys[2], (2, hkv, p, d))
    lengths = jnp.array([p, 97], jnp.int32)
    cache = freeze(k, v, lengths, tail_queries(q, lengths, tail_query_count(config)), config, max_len=p + 40)
    for i in range(20):  # decode appends: a flushed block, a partly filled ring
        kv = jax.random.normal(jax.random.fold_in(keys[3], i), (2, 2, hkv, d))
        cache = append(cache, kv[0], kv[1], config)
    return cache, config, jax.random.normal(keys[4], (2, hq, d))


def test_float_formats_are_the_library_reference():
    cache, config, q = _cache()
    out, lse = route_decode_attention(q, cache, config)
    ref, ref_lse = hybrid_decode_attention_reference(q, cache, config)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), rtol=1e-5, atol=1e-5)
    for qk, pv in (("int8", None), (None, "fp8"), ("int8", "int8")):
        got, _ = route_decode_attention(q, cache, config, qk, pv)
        err = float(jnp.linalg.norm(got - out) / jnp.linalg.norm(out))
        assert 0 < err < 0.1, (qk, pv, err)


@pytest.mark.parametrize("fmt,top", [("int8", 127), ("fp8", 448)])
def test_quantize_rows(fmt, top):
    x = np.random.default_rng(0).normal(size=(5, 64)) * np.array([[1e-3], [1.0], [1e3], [0.0], [7.0]])
    y = np.asarray(quantize_rows(jnp.asarray(x, jnp.float32), fmt), np.float64)
    peak = np.abs(x).max(axis=1, keepdims=True)
    if fmt == "int8":
        assert np.all(np.abs(y - x) <= peak / top / 2 * (1 + 1e-5) + 1e-30)
    else:  # e4m3: 3 mantissa bits, relative rounding error <= 2**-4 for normal values
        normal = np.abs(x) / np.where(peak > 0, peak, 1) * top >= 2.0 ** -6
        assert np.all(np.abs(y - x)[normal] <= np.abs(x)[normal] * 2.0 ** -4 * (1 + 1e-5))
    np.testing.assert_array_equal(y[3], 0.0)
    np.testing.assert_allclose(np.abs(y).max(axis=1), peak[:, 0], rtol=1e-6)


def test_unsupported_inputs_are_clear_errors():
    cache, config, q = _cache()
    with pytest.raises(ValueError, match="qk must be one of"):
        route_decode_attention(q, cache, config, "int4")
    with pytest.raises(ValueError, match="channel_key"):
        route_decode_attention(q, cache, HyQuantConfig(window=32, block_size=16, prefill_block=16, rho=0.1,
                                                       scheme="token_sym"))
