"""CPU cases of the Mosaic GPU prefill kernel, run by `test_prefill_mgpu.py` in a pytest process of their own.

GPU interpret mode (warp-specialized kernels simulated on CPU) against the jnp reference on small shapes,
plus the kernel's input checks and the `backend="mosaic"` dispatch. Not collected by the main test run (no
`test_` file prefix): `test_prefill_mgpu.test_interpret_cases_in_own_process` runs them in a child process.
They were moved there when a later XLA:CPU compile in the suite's process segfaulted; the cause turned out
to be the process running out of memory mappings (many cached executables, these cases compile the most),
which `conftest.py` now prevents by clearing JAX's caches after each module. The separate process remains
as extra headroom for the heaviest compiling cases.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyquant_jax import prefill_launch as pk
from hyquant_jax import reference
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.prefill_launch import PrefillTuning
from pallas_kernels.prefill_mgpu import fp8_key_order, fp8_values, int32_to_float_magic
from tests.test_prefill import (
    PV_FP8_TOL,
    TOL,
    check_output,
    make_inputs,
    poison_padding,
    random_vl,
    rel_err,
    run_against_reference,
    vti_vl,
)


def _cfg(**kw):
    kw.setdefault("block_size", 16)
    kw.setdefault("prefill_block", 64)
    return HyQuantConfig(**kw)


# The cases' kernel settings are changes to one compute warpgroup on 64-key steps without the speed options
# (ONE_WG); `PrefillTuning()` is the library's setting.
ONE_WG = PrefillTuning(compute_wgs=1, block_kv=64, pingpong=False, approx_math=False, magic_convert=False)


def _run(shape, lengths, config, vl_source, interpret, seed=0, **kernel):
    def attend(*args):
        return pk.prefill_attention_mgpu(*args, interpret=interpret, tuning=dataclasses.replace(ONE_WG, **kernel))

    return run_against_reference(attend, shape, lengths, config, vl_source, seed)


def test_int32_to_float_magic_is_exact():
    """Every INT8 x INT8 dot over D <= 128 (|x| <= 128**3 = 2**21) and the edges of the valid range."""
    edges = np.array([0, 1, -1, 127 * 127 * 128, -(127 * 127 * 128), 2 ** 21, -(2 ** 21), 2 ** 22 - 1, -(2 ** 22)])
    x = np.concatenate([edges, np.random.default_rng(0).integers(-(2 ** 22), 2 ** 22, 100_000)]).astype(np.int32)
    got = np.asarray(jax.jit(int32_to_float_magic)(jnp.asarray(x)))
    np.testing.assert_array_equal(got, x.astype(np.float32))


# name, (B, Hq, Hkv, T, D), lengths, config, VL source, kernel settings
CPU_CASES = [
    ("gqa_ragged_vti", (2, 4, 2, 200, 64), [200, 137], _cfg(window=64, rho=0.1), "vti", {}),
    ("d128_block128_three_stages", (1, 2, 1, 300, 128), [300], _cfg(window=128, prefill_block=128, rho=0.1),
     "random", dict(stages=3)),
    ("window_192_no_vl", (1, 2, 2, 260, 64), [251], _cfg(window=192, rho=0.0), "random", {}),
    ("empty_and_short_sequences", (3, 2, 1, 128, 64), [0, 5, 128], _cfg(window=64, rho=0.2), "random", {}),
    ("two_row_blocks_kv128", (2, 4, 2, 300, 64), [300, 70], _cfg(window=128, prefill_block=128, rho=0.1), "vti",
     dict(compute_wgs=2, block_kv=128)),
    ("kv128_band_half_step", (1, 2, 1, 200, 128), [200], _cfg(window=64, rho=0.1), "random", dict(block_kv=128)),
    ("every_step_masked", (2, 4, 2, 300, 64), [300, 70], _cfg(window=128, prefill_block=128, rho=0.1), "vti",
     dict(compute_wgs=2, block_kv=128, skip_masks=False)),
    ("long_band_unmasked_steps", (1, 2, 1, 700, 64), [650], _cfg(window=512, prefill_block=128, rho=0.05), "vti",
     dict(compute_wgs=2, block_kv=64)),
    ("magic_int_convert", (2, 4, 2, 300, 128), [300, 70], _cfg(window=128, prefill_block=128, rho=0.1), "vti",
     dict(compute_wgs=2, block_kv=128, magic_convert=True)),
    # prefill_block 64 with two row blocks per CTA: the blocks' band starts, quantized and VL prefixes differ
    # by one block, so each masks the stream's keys that are not its own (lengths ending in either block)
    ("two_row_blocks_block64", (2, 4, 2, 330, 64), [330, 250], _cfg(window=128, prefill_block=64, rho=0.2),
     "vti", dict(compute_wgs=2, block_kv=128)),
    ("two_row_blocks_block64_kv64_masked", (1, 4, 2, 300, 64), [300], _cfg(window=64, prefill_block=64, rho=0.2),
     "random", dict(compute_wgs=2, block_kv=64, skip_masks=False)),
    ("pv_fp8", (2, 4, 2, 300, 64), [300, 70], _cfg(window=128, prefill_block=128, rho=0.1), "vti",
     dict(compute_wgs=2, block_kv=128, pv_fp8=True)),
]


@pytest.mark.parametrize("name,shape,lengths,config,vl_source,kernel", CPU_CASES, ids=[c[0] for c in CPU_CASES])
def test_interpret_matches_reference(name, shape, lengths, config, vl_source, kernel):
    out, ref, lengths = _run(shape, lengths, config, vl_source, interpret=True, **kernel)
    check_output(out, ref, lengths, PV_FP8_TOL if kernel.get("pv_fp8") else TOL)


def test_fp8_key_order_is_the_register_order():
    """fp8_key_order puts key 8a + 2j + r of each group of 16 at 4j + 2a + r: thread j's columns 2j, 2j + 1 of
    two 8-column tiles, packed as they are, are the 8-bit layout's columns 4j .. 4j + 3. fp8_values applies the
    same order to the values (a permutation, so P.V is unchanged)."""
    x = jnp.arange(48)
    got = np.asarray(fp8_key_order(x, 0))
    want = [16 * g + 8 * a + 2 * j + r for g in range(3) for j in range(4) for a in range(2) for r in range(2)]
    np.testing.assert_array_equal(got, want)
    v = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 64, 8))
    codes, vsc = fp8_values(v)
    assert codes.shape == (2, 3, 8, 64) and codes.dtype == jnp.float8_e4m3fn and vsc.shape == (2, 3, 8)
    back = jnp.swapaxes(codes, -1, -2).astype(jnp.float32)
    order = np.asarray(fp8_key_order(jnp.arange(64), 0))
    restored = np.empty(back.shape, np.float32)
    restored[..., order, :] = np.asarray(back)
    np.testing.assert_allclose(restored * np.asarray(vsc)[..., None, :] * 448.0, np.asarray(v), rtol=0.07, atol=1e-6)


def test_interpret_segments_are_distinguished():
    """The kernel is far closer to the reference than to references with one segment rule changed."""
    config = _cfg(window=128, rho=0.1)
    out, ref, lengths = _run((1, 2, 1, 320, 64), [320], config, "vti", interpret=True, seed=1)
    q, k, v = make_inputs(1, 1, 2, 1, 320, 64)
    vl_idx, vl_count = vti_vl(q, k, lengths, config)
    err = rel_err(out, ref)
    shadows = {
        "one VL fewer": reference.hybrid_prefill_attention_reference(
            q, k, v, lengths, jnp.concatenate([vl_idx[..., 1:], jnp.full_like(vl_idx[..., :1], -1)], axis=-1),
            jnp.maximum(vl_count - 1, 0), config),
        "band one block shorter": reference.hybrid_prefill_attention_reference(
            q, k, v, lengths, vl_idx, vl_count, dataclasses.replace(config, window=64)),
        "uniform int8": reference.uniform_quantized_prefill_reference(q, k, v, lengths, "int8"),
    }
    for what, shadow in shadows.items():
        gap = rel_err(shadow, ref)
        assert err < 0.5 * gap, f"kernel error {err:.2e} not well below the '{what}' gap {gap:.2e}"


def test_padding_garbage_never_leaks():
    config = _cfg(window=64, rho=0.1)
    q, k, v = make_inputs(0, 2, 2, 1, 150, 64)
    lengths = jnp.asarray([150, 70], jnp.int32)
    vl_idx, vl_count = vti_vl(q, k, lengths, config)
    ref = reference.hybrid_prefill_attention_reference(q, k, v, lengths, vl_idx, vl_count, config)
    q, k, v = poison_padding(q, k, v, lengths)
    out = pk.prefill_attention_mgpu(q, k, v, lengths, vl_idx, vl_count, config, interpret=True, tuning=ONE_WG)
    check_output(out, ref, lengths, TOL)


@pytest.mark.parametrize("config,d,kernel,match", [
    (_cfg(prefill_qk="fp8"), 64, {}, "prefill_qk 'int8'"),
    (_cfg(prefill_block=32), 64, {}, "multiple of 64"),
    (_cfg(), 256, {}, "head_dim"),
])
def test_unsupported_config_is_a_clear_error(config, d, kernel, match):
    q, k, v = make_inputs(0, 1, 2, 1, 64, d)
    lengths = jnp.asarray([64], jnp.int32)
    vl_idx, vl_count = random_vl(0, 1, 1, 64, lengths, config)
    with pytest.raises(ValueError, match=match):
        pk.prefill_attention_mgpu(q, k, v, lengths, vl_idx, vl_count, config, interpret=True,
                                  tuning=dataclasses.replace(ONE_WG, **kernel))


@pytest.mark.parametrize("prefill_block", [128, 256])
def test_mosaic_backend_dispatch(monkeypatch, prefill_block):
    """backend="mosaic" runs prefill through prefill_attention_mgpu in its default setting (the measured one)
    and passes VTI's VL set through (checked without a GPU by a stand-in kernel)."""
    from hyquant_jax import attention

    calls = []

    def stand_in(q, k, v, lengths, vl_idx, vl_count, config, **kw):
        calls.append((vl_idx, vl_count, kw))
        return jnp.zeros_like(q)

    monkeypatch.setattr(pk, "prefill_attention_mgpu", stand_in)
    config = _cfg(window=2 * prefill_block, prefill_block=prefill_block, rho=0.1)
    q, k, v = make_inputs(0, 1, 2, 1, 600, 64)
    lengths = jnp.asarray([600], jnp.int32)
    out, (vl_idx, vl_count) = attention.prefill_attention(q, k, v, lengths, config, backend="mosaic")
    (got_idx, got_count, kw), = calls
    assert kw == dict(scale=None)
    assert PrefillTuning().mosaic() == dict(compute_wgs=2, block_kv=128, stages=2, pingpong=True, approx_math=True,
                                            skip_masks=True, magic_convert=True, pv_fp8=False)
    np.testing.assert_array_equal(np.asarray(got_idx), np.asarray(vl_idx))
    np.testing.assert_array_equal(np.asarray(got_count), np.asarray(vl_count))
    assert out.shape == q.shape
