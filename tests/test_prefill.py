"""Hybrid prefill kernel (pallas_kernels/prefill.py via hyquant_jax.prefill_launch).

CPU (CI): the kernel in Pallas interpret mode against the jnp references, on
small shapes. GPU (`pytest -m gpu`): the compiled Triton kernel against the
references over several shapes, incl. non-power-of-two lengths and ragged
batches.

Inputs are "lossy" on purpose: one key channel is a +-100 outlier (and the
matching query channel is 0), so per-token int8 Q.K loses most of the other
channels. Quantized and exact logits then differ a lot, and a key put in the
wrong segment (or a band off by one block) moves the output far more than the
kernel's own rounding (bf16 P in P.V); `test_segments_are_distinguished`
checks exactly that.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyquant_jax import attention, reference, vti
from hyquant_jax import prefill_launch as pk
from hyquant_jax.config import HyQuantConfig, num_vl_tokens
from hyquant_jax.prefill_launch import PrefillTuning

TOL = 4e-3  # relative L2 error kernel vs reference (bf16 P.V rounding is ~1.5e-3)
# fp8 e4m3 P.V: P and V each carry a relative rounding error of up to 2**-4 (rms ~3.6%), so the output error
# is a few percent; 5e-2 stays below the e4m3 unit roundoff 6.25%. Measured on the H200: 2.8e-2 (uniform, T=1000).
PV_FP8_TOL = 5e-2


def rel_err(a, b) -> float:
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def make_inputs(seed, b, hq, hkv, t, d, heavy=6, dtype=jnp.bfloat16):
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    u = jax.random.normal(ks[0], (d,)).at[0].set(0.0)
    u = u / jnp.linalg.norm(u)
    q = 1.5 * jax.random.normal(ks[1], (b, hq, t, d)) + 3.0 * u
    q = q.at[..., 0].set(0.0)
    k = jax.random.normal(ks[2], (b, hkv, t, d))
    k = k.at[..., 0].set(100.0 * jnp.sign(jax.random.normal(ks[3], (b, hkv, t))))
    pos = jax.random.choice(ks[4], t, (min(heavy, t),), replace=False)
    k = k.at[:, :, pos, :].add(12.0 * u)  # planted heavy columns
    v = jax.random.normal(ks[5], (b, hkv, t, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def random_vl(seed, b, hkv, t, lengths, config):
    """A random VL set with VTI's shapes and counts (sorted, -1 padded)."""
    rng = np.random.default_rng(seed)
    kmax = vti.max_vl_count(t, config)
    idx = np.full((b, hkv, kmax), -1, np.int32)
    counts = np.zeros((b,), np.int32)
    for i, n in enumerate(np.asarray(lengths)):
        prefix = max(int(n) - config.window, 0)
        c = num_vl_tokens(prefix, config.rho_fraction)
        counts[i] = c
        for h in range(hkv):
            idx[i, h, :c] = np.sort(rng.choice(prefix, c, replace=False))
    return jnp.asarray(idx), jnp.asarray(counts)


def vti_vl(q, k, lengths, config):
    q_tail = vti.tail_queries(q, lengths, vti.tail_query_count(config))
    return vti.vertical_token_identification(q_tail, k, lengths, config)


def check_output(out, ref, lengths, tol):
    out = np.asarray(out, np.float32)
    assert out.shape == ref.shape
    assert not np.isnan(out).any()
    t = out.shape[2]
    pad = np.arange(t)[None, :] >= np.asarray(lengths)[:, None]  # [B, T]
    assert np.all(out.transpose(0, 2, 1, 3)[pad] == 0.0), "padded query rows must be 0"
    err = rel_err(out, ref)
    assert err < tol, f"relative error {err:.2e} >= {tol:.0e}"
    return err


def _cfg(**kw):
    kw.setdefault("block_size", 16)
    return HyQuantConfig(**kw)


# name, (B, Hq, Hkv, T, D), lengths, config, kernel kwargs, vl source
CPU_CASES = [
    ("int8_gqa_ragged_pad", (2, 4, 2, 200, 64), [200, 137],
     _cfg(window=64, prefill_block=32, rho=0.1), dict(block_k=32), "vti"),
    ("fp8_bk16", (1, 2, 1, 100, 128), [100],
     _cfg(window=32, prefill_block=32, rho=0.1, prefill_qk="fp8"), dict(block_k=16), "random"),
    ("int8_subblock_bk_gt_bq", (2, 2, 2, 256, 64), [256, 1],
     _cfg(window=64, prefill_block=64, rho=0.05), dict(block_q=32, block_k=64), "random"),
    ("bf16_no_window", (2, 4, 1, 96, 64), [96, 50],
     _cfg(window=0, prefill_block=16, rho=0.1, prefill_qk="bf16"), dict(block_k=16), "random"),
    ("int8_no_vl_d256", (1, 2, 2, 80, 256), [77],
     _cfg(window=32, prefill_block=16, rho=0.0), {}, "random"),
    ("int8_empty_sequence", (2, 2, 1, 64, 64), [0, 64],
     _cfg(window=16, prefill_block=16, rho=0.2), dict(block_k=16), "random"),
]


def run_against_reference(attend, shape, lengths, config, vl_source, seed=0):
    """(out, ref, lengths): attend(q, k, v, lengths, vl_idx, vl_count, config) and the jnp reference on the same
    `make_inputs`, with the VL set from VTI (vl_source "vti") or random ("random")."""
    b, hq, hkv, t, d = shape
    q, k, v = make_inputs(seed, b, hq, hkv, t, d)
    lengths = jnp.asarray(lengths, jnp.int32)
    if vl_source == "vti":
        vl_idx, vl_count = vti_vl(q, k, lengths, config)
    else:
        vl_idx, vl_count = random_vl(seed, b, hkv, t, lengths, config)
    ref = reference.hybrid_prefill_attention_reference(q, k, v, lengths, vl_idx, vl_count, config)
    out = attend(q, k, v, lengths, vl_idx, vl_count, config)
    assert out.dtype == q.dtype
    return out, ref, lengths


def _run_case(shape, lengths, config, kwargs, vl_source, interpret, seed=0):
    """kwargs: `PrefillTuning` fields and pv_format."""
    kwargs = dict(kwargs)
    pv_format = kwargs.pop("pv_format", "bf16")

    def attend(*args):
        return pk.prefill_attention(*args, interpret=interpret, pv_format=pv_format, tuning=PrefillTuning(**kwargs))

    return run_against_reference(attend, shape, lengths, config, vl_source, seed)


@pytest.mark.parametrize("name,shape,lengths,config,kwargs,vl_source", CPU_CASES, ids=[c[0] for c in CPU_CASES])
def test_hybrid_interpret_matches_reference(name, shape, lengths, config, kwargs, vl_source):
    out, ref, lengths = _run_case(shape, lengths, config, kwargs, vl_source, interpret=True)
    check_output(out, ref, lengths, TOL)


def _segment_shadows(q, k, v, lengths, vl_idx, vl_count, config):
    """References that differ from the true one by one segment rule each."""
    pb, w = config.prefill_block, config.window
    # Drop the lowest-position VL token: more query blocks see it outside their band than any other VL token,
    # so the shadow differs for any VL selection (dropping the highest one can land inside every band).
    fewer = jnp.concatenate([vl_idx[..., 1:], jnp.full_like(vl_idx[..., :1], -1)], axis=-1)
    yield "one VL fewer", reference.hybrid_prefill_attention_reference(
        q, k, v, lengths, fewer, jnp.maximum(vl_count - 1, 0), config)
    yield "band one block shorter", reference.hybrid_prefill_attention_reference(
        q, k, v, lengths, vl_idx, vl_count, dataclasses.replace(config, window=w - pb))
    yield "half-size query blocks", reference.hybrid_prefill_attention_reference(
        q, k, v, lengths, vl_idx, vl_count, dataclasses.replace(config, prefill_block=pb // 2))
    yield "uniform int8", reference.uniform_quantized_prefill_reference(q, k, v, lengths, config.prefill_qk)


def _distinguish(interpret, shape=(2, 4, 2, 200, 64), lengths=(200, 137), block_k=32):
    config = _cfg(window=64, prefill_block=32, rho=0.1)
    b, hq, hkv, t, d = shape
    q, k, v = make_inputs(1, b, hq, hkv, t, d)
    lengths = jnp.asarray(lengths, jnp.int32)
    vl_idx, vl_count = vti_vl(q, k, lengths, config)
    ref = reference.hybrid_prefill_attention_reference(q, k, v, lengths, vl_idx, vl_count, config)
    out = pk.prefill_attention(q, k, v, lengths, vl_idx, vl_count, config, interpret=interpret,
                               tuning=PrefillTuning(block_k=block_k))
    err = rel_err(out, ref)
    for what, shadow in _segment_shadows(q, k, v, lengths, vl_idx, vl_count, config):
        gap = rel_err(shadow, ref)
        assert err < 0.5 * gap, f"kernel error {err:.2e} not well below the '{what}' gap {gap:.2e}"


def test_segments_are_distinguished():
    _distinguish(interpret=True)


@pytest.mark.parametrize("qk_format", ["int8", "fp8"])
def test_uniform_interpret_matches_reference(qk_format):
    q, k, v = make_inputs(2, 2, 4, 2, 112, 64)
    lengths = jnp.asarray([112, 61], jnp.int32)
    ref = reference.uniform_quantized_prefill_reference(q, k, v, lengths, qk_format)
    out = pk.uniform_prefill_attention(q, k, v, lengths, qk_format, interpret=True,
                                       tuning=PrefillTuning(block_q=32, block_k=32))
    check_output(out, ref, lengths, TOL)


def test_pv_fp8_interpret_close_to_reference():
    config = _cfg(window=64, prefill_block=32, rho=0.1)
    out, ref, lengths = _run_case((2, 4, 2, 200, 64), [200, 137], config, dict(block_k=32, pv_format="fp8"),
                                  "vti", interpret=True)
    check_output(out, ref, lengths, PV_FP8_TOL)


def test_attention_dispatch_interpret():
    config = _cfg(window=64, prefill_block=32, rho=0.1)
    q, k, v = make_inputs(3, 2, 4, 2, 200, 64)
    lengths = jnp.asarray([200, 137], jnp.int32)
    out_ref, vl_ref = attention.prefill_attention(q, k, v, lengths, config, backend="reference")
    out, vl = attention.prefill_attention(q, k, v, lengths, config, backend="interpret")
    np.testing.assert_array_equal(np.asarray(vl[0]), np.asarray(vl_ref[0]))
    np.testing.assert_array_equal(np.asarray(vl[1]), np.asarray(vl_ref[1]))
    check_output(out, np.asarray(out_ref, np.float32), lengths, TOL)


def poison_padding(q, k, v, lengths):
    """q, k, v [B, H, T, D] with NaN (q, v) and inf (k) at the positions >= lengths."""
    pad = (jnp.arange(q.shape[2])[None, :] >= lengths[:, None])[:, None, :, None]
    return (jnp.where(pad, jnp.asarray(bad, x.dtype), x) for x, bad in ((q, jnp.nan), (k, jnp.inf), (v, jnp.nan)))


def test_padding_garbage_never_leaks():
    """NaN/inf in q, k, v beyond `lengths` must not reach any valid row (and padded rows stay 0)."""
    config = _cfg(window=64, prefill_block=32, rho=0.1)
    q, k, v = make_inputs(0, 2, 4, 2, 200, 64)
    lengths = jnp.asarray([200, 137], jnp.int32)
    vl_idx, vl_count = vti_vl(q, k, lengths, config)
    ref = reference.hybrid_prefill_attention_reference(q, k, v, lengths, vl_idx, vl_count, config)
    q, k, v = poison_padding(q, k, v, lengths)
    out = pk.prefill_attention(q, k, v, lengths, vl_idx, vl_count, config, interpret=True,
                               tuning=PrefillTuning(block_k=32))
    check_output(out, ref, lengths, TOL)


def test_argument_checks():
    q, k, v = make_inputs(0, 1, 2, 1, 32, 64)
    lengths = jnp.asarray([32], jnp.int32)
    config = _cfg(window=32, prefill_block=32, rho=0.1)
    vl_idx, vl_count = random_vl(0, 1, 1, 32, lengths, config)
    with pytest.raises(ValueError, match="block_q"):
        pk.prefill_attention(q, k, v, lengths, vl_idx, vl_count, config, interpret=True,
                             tuning=PrefillTuning(block_q=64))
    with pytest.raises(ValueError, match="pv_format"):
        pk.prefill_attention(q, k, v, lengths, vl_idx, vl_count, config, interpret=True, pv_format="int4")
    with pytest.raises(ValueError, match="head_dim"):
        pk.prefill_attention(q[..., :48], k[..., :48], v[..., :48], lengths, vl_idx, vl_count, config,
                             interpret=True)


# --------------------------------------------------------------------------- GPU (compiled)

GPU_CASES = [
    ("d128_int8_default", (2, 8, 2, 1000, 128), [1000, 613], _cfg(window=128, prefill_block=64), {}, "vti"),
    ("d128_fp8", (2, 8, 2, 1000, 128), [1000, 613], _cfg(window=128, prefill_block=64, prefill_qk="fp8"), {},
     "vti"),
    ("d128_bf16", (1, 8, 2, 777, 128), [777], _cfg(window=128, prefill_block=64, prefill_qk="bf16"), {}, "random"),
    ("d128_bq128_bk128", (2, 8, 2, 1300, 128), [1300, 1029], _cfg(window=128, prefill_block=128),
     dict(block_q=128, block_k=128), "vti"),
    ("d128_bq64_bk32_w4", (1, 8, 2, 1100, 128), [1100], _cfg(window=128, prefill_block=128),
     dict(block_q=64, block_k=32, num_warps=4, num_stages=3), "random"),
    ("d64_smollm_heads", (2, 9, 3, 777, 64), [777, 300], _cfg(window=128, prefill_block=64, rho=0.1), {}, "vti"),
    ("d256", (2, 4, 4, 520, 256), [520, 129], _cfg(window=64, prefill_block=64), {}, "random"),
    ("d256_fp8", (1, 4, 2, 333, 256), [333], _cfg(window=64, prefill_block=32, prefill_qk="fp8"), {}, "random"),
    ("no_window_rho0", (2, 4, 2, 500, 128), [500, 17], _cfg(window=0, prefill_block=32, rho=0.0), {}, "random"),
    ("long_4k", (1, 8, 2, 4096, 128), [4096], _cfg(window=128, prefill_block=128), {}, "vti"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,shape,lengths,config,kwargs,vl_source", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_hybrid_gpu_matches_reference(name, shape, lengths, config, kwargs, vl_source):
    out, ref, lengths = _run_case(shape, lengths, config, kwargs, vl_source, interpret=False)
    check_output(out, ref, lengths, TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("pv_format", ["bf16", "fp8"])
@pytest.mark.parametrize("qk_format", ["int8", "fp8"])
def test_uniform_gpu_matches_reference(qk_format, pv_format):
    q, k, v = make_inputs(2, 2, 8, 2, 1000, 128)
    lengths = jnp.asarray([1000, 555], jnp.int32)
    ref = reference.uniform_quantized_prefill_reference(q, k, v, lengths, qk_format)
    out = pk.uniform_prefill_attention(q, k, v, lengths, qk_format, pv_format=pv_format)
    check_output(out, ref, lengths, TOL if pv_format == "bf16" else PV_FP8_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("qk_format", ["int8", "fp8"])
def test_pv_fp8_gpu_close_to_reference(qk_format):
    config = _cfg(window=128, prefill_block=64, prefill_qk=qk_format)
    out, ref, lengths = _run_case((2, 8, 2, 1000, 128), [1000, 613], config, dict(pv_format="fp8"), "vti",
                                  interpret=False)
    check_output(out, ref, lengths, PV_FP8_TOL)


@pytest.mark.gpu
def test_segments_are_distinguished_gpu():
    _distinguish(interpret=False, shape=(2, 8, 2, 600, 128), lengths=(600, 411), block_k=64)


@pytest.mark.gpu
def test_attention_dispatch_gpu():
    config = _cfg(window=128, prefill_block=64)
    q, k, v = make_inputs(3, 2, 8, 2, 900, 128)
    lengths = jnp.asarray([900, 701], jnp.int32)
    out_ref, vl_ref = attention.prefill_attention(q, k, v, lengths, config, backend="reference")
    out, vl = attention.prefill_attention(q, k, v, lengths, config, backend="triton")
    np.testing.assert_array_equal(np.asarray(vl[0]), np.asarray(vl_ref[0]))
    check_output(out, np.asarray(out_ref, np.float32), lengths, TOL)


# --------------------------------------------------------------------------- the op: tuning, implementations

@pytest.mark.parametrize("field,value", [
    ("block_q", 24), ("block_k", 8), ("num_warps", 3), ("num_stages", 0), ("compute_wgs", 3), ("block_kv", 32),
    ("stages", 1), ("pingpong", 1), ("approx_math", None), ("skip_masks", "yes"), ("magic_convert", 0),
])
def test_tuning_rejects_bad_fields_by_name(field, value):
    with pytest.raises(ValueError, match=rf"PrefillTuning\.{field} must be"):
        PrefillTuning(**{field: value})


def test_tuning_defaults_and_triton_launch():
    """One set of defaults: the Triton launch from `default_blocks` where the tuning leaves it open, the Mosaic
    launch as measured fastest; a wrong type is an error naming the argument."""
    config = _cfg(window=128, prefill_block=128)
    assert pk.triton_launch(128, config, PrefillTuning()) == pk.default_blocks(128, 128) == (128, 64, 8, 2)
    assert pk.triton_launch(256, config, PrefillTuning()) == pk.default_blocks(256, 128) == (64, 32, 8, 2)
    assert pk.triton_launch(128, config, PrefillTuning(block_q=64)) == (64, 64, 4, 2)  # warps for that block_q
    assert pk.triton_launch(128, config, PrefillTuning(block_k=32, num_warps=2, num_stages=3)) == (128, 32, 2, 3)
    with pytest.raises(ValueError, match="must divide config.prefill_block"):
        pk.triton_launch(128, config, PrefillTuning(block_q=256))
    assert PrefillTuning().mosaic() == dict(compute_wgs=2, block_kv=128, stages=2, pingpong=True, approx_math=True,
                                            skip_masks=True, magic_convert=True, pv_fp8=False)
    q, k, v = make_inputs(0, 1, 2, 1, 32, 64)
    lengths = jnp.asarray([32], jnp.int32)
    vl_idx, vl_count = random_vl(0, 1, 1, 32, lengths, config)
    with pytest.raises(ValueError, match="tuning must be None or a hyquant_jax.prefill_launch.PrefillTuning"):
        pk.prefill_attention(q, k, v, lengths, vl_idx, vl_count, config, interpret=True, tuning={"block_q": 64})


def test_implementations_say_where_they_run():
    """Each implementation's `supported(device, head_dim, config, interpret)` on fake devices."""
    from types import SimpleNamespace

    h100 = SimpleNamespace(platform="gpu", compute_capability="9.0", device_kind="NVIDIA H100")
    a100 = SimpleNamespace(platform="gpu", compute_capability="8.0", device_kind="NVIDIA A100")
    cpu = SimpleNamespace(platform="cpu", device_kind="cpu")
    config = _cfg(window=128, prefill_block=64)
    mosaic, triton, reference_ = (pk.IMPLEMENTATIONS[n] for n in ("mosaic", "triton", "reference"))
    assert list(pk.IMPLEMENTATIONS) == ["mosaic", "triton", "reference"]  # "auto"'s order
    assert mosaic.supported(h100, 128, config) and mosaic.supported(h100, 64, config)
    assert mosaic.supported(cpu, 128, config, True)  # GPU interpret mode simulates it
    assert not mosaic.supported(a100, 128, config) and not mosaic.supported(cpu, 128, config)
    assert not mosaic.supported(h100, 256, config)
    assert "prefill_qk 'int8'" in mosaic.unsupported(h100, 128, dataclasses.replace(config, prefill_qk="fp8"))
    assert "multiple of 64" in mosaic.unsupported(h100, 128, _cfg(window=128, prefill_block=32))
    assert triton.supported(a100, 256, config) and triton.supported(cpu, 64, config, True)
    assert not triton.supported(cpu, 64, config) and not triton.supported(a100, 96, config)
    assert all(reference_.supported(d, 96, config) for d in (h100, a100, cpu))
