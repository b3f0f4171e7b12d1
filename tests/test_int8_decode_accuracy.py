"""benchmarks/int8_decode_accuracy.py: its float64 'hybrid' path is the library's decode reference, and its INT8
emulation is a per-row int8 round trip (so the accuracy it reports measures the INT8 route and nothing else)."""

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.int8_decode_accuracy import cache_parts, decode_outputs, int8_rows
from hyquant_jax.cache import freeze
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.reference import hybrid_decode_attention_reference
from hyquant_jax.vti import tail_queries, tail_query_count


def test_hybrid_path_matches_the_library_reference():
    config = HyQuantConfig(window=32, block_size=16, prefill_block=16, rho=0.1)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    p, hq, hkv, d = 150, 4, 2, 64
    q = jax.random.normal(keys[0], (1, hq, p + 5, d))
    k = jax.random.normal(keys[1], (1, hkv, p, d)) * jnp.linspace(0.5, 3.0, d)  # channel spread, as real keys
    v = jax.random.normal(keys[2], (1, hkv, p, d))
    lengths = jnp.array([p], jnp.int32)
    cache = freeze(k, v, lengths, tail_queries(q[:, :, :p], lengths, tail_query_count(config)), config,
                   max_len=p + 5)
    qn = np.asarray(q, np.float64)[0, :, p:]
    ours = decode_outputs(qn, cache_parts(cache, config), config.block_size, False, False)
    for i in range(qn.shape[1]):
        ref, _ = hybrid_decode_attention_reference(q[:, :, p + i], cache, config)
        np.testing.assert_allclose(ours[:, i], np.asarray(ref, np.float64)[0], rtol=2e-4, atol=2e-5)
    int8 = decode_outputs(qn, cache_parts(cache, config), config.block_size, True, True)
    err = np.linalg.norm(int8 - ours) / np.linalg.norm(ours)
    assert 0 < err < 0.1


def test_int8_rows_is_a_symmetric_round_trip():
    x = np.random.default_rng(0).normal(size=(5, 64)) * np.array([[1e-3], [1.0], [1e3], [0.0], [7.0]])
    y = int8_rows(x)
    step = np.abs(x).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(y - x) <= step / 2 + 1e-12)
    np.testing.assert_array_equal(y[3], 0.0)
    np.testing.assert_allclose(np.abs(y).max(axis=1), np.abs(x).max(axis=1), rtol=1e-12)
