"""Chunked prefill's fused attention kernel (pallas_kernels/prefix.py).

CPU (CI): the kernel in Pallas interpret mode against the float64 oracle and against the XLA path of
`models.prefix_attention`, on small shapes. GPU (`pytest -m gpu`): the compiled Triton kernel at the
Qwen3-8B head shape against the XLA path and the oracle.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.attention import prefix_attention as xla_prefix_attention
from pallas_kernels.prefix import prefix_attention
from tests.helpers import oracle


def _inputs(rng, b, hq, hkv, t, s, d, dtype=np.float32):
    q = rng.standard_normal((b, hq, t, d)).astype(dtype)
    k, v = (rng.standard_normal((b, hkv, s, d)).astype(dtype) for _ in range(2))
    return q, k, v


def _oracle(q, k, v, q_pos):
    b = q.shape[0]
    want, _ = oracle.exact_attention(np.asarray(q, np.float64), np.asarray(k, np.float64),
                                     np.asarray(v, np.float64), [k.shape[2]] * b,
                                     q_positions=np.tile(q_pos, (b, 1)))
    return want


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.sampled_from([1, 2, 3, 4]), t=st.integers(1, 40),
       offset=st.integers(0, 50), tiles=st.integers(0, 2), block_q=st.sampled_from([16, 32]),
       seed=st.integers(0, 2**16))
def test_interpret_matches_float64_oracle(b, hkv, g, t, offset, tiles, block_q, seed):
    """Queries at offset .. offset + T - 1 over a staging buffer with slots past the chunk's end (S a multiple
    of block_k = 16), in one query block or several (T padded to block_q), tiles seen whole and masked."""
    rng = np.random.default_rng(seed)
    s = 16 * (-(-(offset + t) // 16) + tiles)
    q, k, v = _inputs(rng, b, hkv * g, hkv, t, s, 16)
    q_pos = offset + np.arange(t, dtype=np.int32)
    got = prefix_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(q_pos), block_q=block_q,
                           block_k=16, interpret=True)
    assert got.shape == q.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), _oracle(q, k, v, q_pos), rtol=2e-5, atol=2e-5)


def test_interpret_reads_no_tile_past_the_block():
    """NaN keys and values in the tiles past each query block's last position are never read: the output stays
    finite and equal to the oracle over clean keys. Rows at positions past S - 1 see every slot; a row at a
    negative position sees none and gives 0."""
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, 2, 4, 2, 32, 96, 16)
    q_pos = np.concatenate([20 + np.arange(16), 40 + np.arange(16)]).astype(np.int32)  # two blocks of 16
    want = _oracle(q, k, v, q_pos)
    k[:, :, 64:], v[:, :, 64:] = np.nan, np.nan  # the last block reads tiles up to slot 63
    got = prefix_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(q_pos), block_q=16,
                           block_k=16, interpret=True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)

    q_pos = np.array([-1, 0, 95, 500], np.int32)
    q, k, v = _inputs(rng, 1, 2, 1, 4, 96, 16)
    got = np.asarray(prefix_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(q_pos),
                                      block_q=16, block_k=16, interpret=True))
    assert np.all(got[:, :, 0] == 0)
    want = _oracle(q, k, v, np.minimum(np.maximum(q_pos, 0), 95))
    np.testing.assert_allclose(got[:, :, 1:], want[:, :, 1:], rtol=2e-5, atol=2e-5)


def test_interpret_bf16_matches_xla_path():
    """bf16 inputs (P.V in bf16 in both): the kernel and `models.prefix_attention(impl="xla")` agree to bf16
    rounding, and `impl="triton"` runs the kernel."""
    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(a, jnp.bfloat16) for a in _inputs(rng, 1, 4, 2, 48, 128, 32))
    q_pos = 60 + jnp.arange(48, dtype=jnp.int32)
    want = xla_prefix_attention(q, k, v, q_pos)
    got = prefix_attention(q, k, v, q_pos, block_q=16, block_k=16, interpret=True)
    assert got.dtype == jnp.bfloat16
    err = np.linalg.norm(np.asarray(got, np.float32) - np.asarray(want, np.float32)) / np.linalg.norm(
        np.asarray(want, np.float32))
    assert err < 1e-2, err
    via = xla_prefix_attention(q, k, v, q_pos, impl="triton")
    np.testing.assert_allclose(np.asarray(via, np.float32), np.asarray(want, np.float32), rtol=5e-2, atol=5e-2)


def test_bad_inputs_name_the_argument():
    q = jnp.zeros((1, 4, 8, 16))
    kv = jnp.zeros((1, 2, 32, 16))
    pos = jnp.arange(8)
    with pytest.raises(ValueError, match="q_pos must be integer"):
        prefix_attention(q, kv, kv, jnp.arange(9), interpret=True)
    with pytest.raises(ValueError, match="q_pos must be integer"):
        prefix_attention(q, kv, kv, pos.astype(jnp.float32), interpret=True)
    with pytest.raises(ValueError, match="multiple of block_k=16"):
        prefix_attention(q, jnp.zeros((1, 2, 40, 16)), jnp.zeros((1, 2, 40, 16)), pos, block_k=16, interpret=True)
    with pytest.raises(ValueError, match="block_q must be a power of two"):
        prefix_attention(q, kv, kv, pos, block_q=24, interpret=True)
    with pytest.raises(ValueError, match="divide its 4 heads"):
        prefix_attention(q, jnp.zeros((1, 3, 32, 16)), jnp.zeros((1, 3, 32, 16)), pos, interpret=True)
    with pytest.raises(ValueError, match="k, v equal"):
        prefix_attention(q, kv, jnp.zeros((1, 2, 16, 16)), pos, interpret=True)
    half = kv.astype(jnp.bfloat16)
    with pytest.raises(ValueError, match="f32_probs with a non-float32 v needs impl='xla'"):
        xla_prefix_attention(q.astype(jnp.bfloat16), half, half, pos, f32_probs=True, impl="triton")
    with pytest.raises(ValueError, match="impl must be one of"):
        xla_prefix_attention(q, kv, kv, pos, impl="cudnn")
    with pytest.raises(ValueError, match="key slots S=40 to be a multiple of 16"):
        xla_prefix_attention(q, jnp.zeros((1, 2, 40, 16)), jnp.zeros((1, 2, 40, 16)), pos, impl="triton")


def test_auto_takes_the_kernel_only_where_it_applies(monkeypatch):
    """chunk_impl "auto": off the GPU it is the XLA path (bit for bit); on a GPU (the backend faked here, the
    rule only) the kernel needs bf16/fp16 values without f32_probs, S a multiple of 16 and a power-of-two
    head_dim."""
    import models.attention as attention

    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(a, jnp.bfloat16) for a in _inputs(rng, 1, 4, 2, 24, 48, 16))
    pos = 20 + jnp.arange(24, dtype=jnp.int32)
    assert np.array_equal(np.asarray(xla_prefix_attention(q, k, v, pos, impl="auto"), np.float32),
                          np.asarray(xla_prefix_attention(q, k, v, pos, impl="xla"), np.float32))
    assert not attention.fused_chunk_applies(48, 16, jnp.bfloat16, False)  # the CPU backend
    monkeypatch.setattr(attention.jax, "default_backend", lambda: "gpu")
    assert attention.fused_chunk_applies(48, 16, jnp.bfloat16, False)
    assert attention.fused_chunk_applies(4096, 128, jnp.float16, False)
    for slots, head_dim, dtype, f32_probs in ((40, 16, jnp.bfloat16, False), (48, 96, jnp.bfloat16, False),
                                               (48, 16, jnp.float32, False), (48, 16, jnp.bfloat16, True)):
        assert not attention.fused_chunk_applies(slots, head_dim, dtype, f32_probs)


@pytest.mark.gpu
def test_gpu_auto_is_the_kernel():
    """On the GPU, chunk_impl "auto" at the Qwen3-8B head shape runs the fused kernel (the same bits)."""
    rng = np.random.default_rng(11)
    q, k, v = (jnp.asarray(a, jnp.bfloat16) for a in _inputs(rng, 1, 32, 8, 512, 2048, 128))
    q_pos = 1024 + jnp.arange(512, dtype=jnp.int32)
    auto = xla_prefix_attention(q, k, v, q_pos, impl="auto")
    assert np.array_equal(np.asarray(auto, np.float32), np.asarray(prefix_attention(q, k, v, q_pos), np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("block_q", [64, 128])
@pytest.mark.parametrize("offset,t,s", [(0, 2048, 4096), (6144, 2048, 8192), (1000, 777, 2048)])
def test_gpu_kernel_matches_xla_and_oracle(offset, t, s, block_q):
    """The compiled kernel at the Qwen3-8B head shape (32 / 8 heads, head_dim 128, bf16) against the XLA path
    (bf16 rounding) and, for two query heads, the float64 oracle; the default launch and 128 rows."""
    _check_gpu_kernel(32, 8, 128, offset, t, s, block_q)


@pytest.mark.gpu
@pytest.mark.parametrize("offset,t,s", [(0, 1024, 2048), (1000, 777, 2048)])
def test_gpu_kernel_head_dim_64(offset, t, s):
    """SmolLM2-135M's head shape (9 / 3 heads, head_dim 64), with the default launch (128 rows a program)."""
    _check_gpu_kernel(9, 3, 64, offset, t, s, None)


def _check_gpu_kernel(hq, hkv, d, offset, t, s, block_q):
    rng = np.random.default_rng(offset + t)
    q, k, v = (jnp.asarray(a, jnp.bfloat16) for a in _inputs(rng, 1, hq, hkv, t, s, d))
    q_pos = offset + jnp.arange(t, dtype=jnp.int32)
    got = np.asarray(prefix_attention(q, k, v, q_pos, block_q=block_q), np.float32)
    want = np.asarray(xla_prefix_attention(q, k, v, q_pos), np.float32)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    exact = _oracle(np.asarray(q[:, :2], np.float32), np.asarray(k[:, :1], np.float32),
                    np.asarray(v[:, :1], np.float32), np.asarray(q_pos))
    assert np.linalg.norm(got[:, :2] - exact) / np.linalg.norm(exact) < 1e-2
