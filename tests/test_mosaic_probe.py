"""The Mosaic GPU building blocks of the planned decode kernel lower for CUDA (no GPU needed; see the probe's docstring)."""

import jax

from benchmarks.mosaic_decode_tile_probe import inputs, oracle, tile_kernel


def test_transposed_decode_tile_lowers_for_cuda():
    lowered = jax.jit(tile_kernel()).trace(*inputs()).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


def test_probe_oracle_is_a_softmax_weighted_sum():
    k_codes, k_scale, q_t, v_codes_t, v_scale = inputs()
    out_t, m, l = oracle(k_codes, k_scale, q_t, v_codes_t, v_scale)
    assert out_t.shape == (64, 16) and m.shape == l.shape == (16,)
    assert (l >= 1.0).all()  # the largest logit contributes exp(0) = 1 to every row's sum
