"""The GEMV probe's kernel (benchmarks/gemv_probe.py) against a float64 oracle, in interpret mode."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from benchmarks.gemv_probe import gemv, split_choices


@pytest.mark.parametrize("k,n,block_n,block_k,splits", [(64, 32, 16, 16, 1), (96, 48, 16, 8, 3), (128, 64, 32, 16, 4)])
def test_gemv_matches_float64(k, n, block_n, block_k, splits):
    kx, kw = jax.random.split(jax.random.PRNGKey(k + n))
    x = jax.random.normal(kx, (1, k), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(kw, (k, n), jnp.float32).astype(jnp.bfloat16)
    got = np.asarray(gemv(x, w, block_n=block_n, block_k=block_k, splits=splits, interpret=True), np.float64)
    expect = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    # f32 accumulation, one bf16 rounding of the result
    np.testing.assert_allclose(got, expect, rtol=1e-2, atol=1e-2 * np.abs(expect).max())


def test_gemv_rejects_bad_tiling():
    x = jnp.zeros((1, 96), jnp.bfloat16)
    w = jnp.zeros((96, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="power of two"):
        gemv(x, w, block_n=16, block_k=16, splits=1)  # 96 rows per split is not a power of two
    with pytest.raises(ValueError, match="x: expected shape"):
        gemv(jnp.zeros((2, 96), jnp.bfloat16), w, block_n=16, block_k=16, splits=3)


def test_split_choices_give_power_of_two_rows():
    for k, n, bn, bk in [(4096, 4096, 128, 32), (12288, 4096, 64, 64), (4096, 1024, 256, 32)]:
        for s in split_choices(k, n, bn, bk):
            rows = k // s
            assert rows * s == k and rows & (rows - 1) == 0 and rows >= bk
