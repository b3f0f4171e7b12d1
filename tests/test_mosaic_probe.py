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


def test_int8_tile_lowers_with_packed_bitwise_unpack():
    """The INT8 route's Q.K tile (benchmarks/mosaic_int8_tile_probe.py) lowers to an s8 wgmma with the code tile
    as register operand, and its unpack stays on 4 bytes per op (vector<4xi8>): 8 registers of 4 bytes per
    thread, one and for the low nibbles, one xor and one and for the high ones."""
    from benchmarks import mosaic_int8_tile_probe as probe

    module = probe.lowered_module(probe.inputs())
    assert "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8" in module
    ops = probe.bitwise_ops(module)
    assert ops[("arith.andi", "vector<4xi8>")] == 16 and ops[("arith.xori", "vector<4xi8>")] == 8
    assert not any(ty in ("i8", "vector<1xi8>", "vector<2xi8>") for _, ty in ops)


def test_int8_probe_oracle_is_the_centred_dot_product():
    """The oracle equals q . (code - 8) over all 128 dims, up to the known terms: the low half uncentred, the
    high half scaled by 16."""
    import numpy as np

    from benchmarks import mosaic_int8_tile_probe as probe

    codes, q_lo, q_hi = probe.inputs(seed=3)
    got = probe.oracle(codes, q_lo, q_hi)
    dims = np.concatenate([codes & 0x0F, codes >> 4], axis=1).astype(np.int64) - 8  # [64, 128] centred codes
    q = np.concatenate([q_lo, 16 * q_hi.astype(np.int64)], axis=1)  # [16, 128]
    want = dims @ q.T + 8 * q_lo.astype(np.int64).sum(axis=1)[None, :]
    np.testing.assert_array_equal(got, want)
