"""Hybrid prefill as a Mosaic GPU kernel (pallas_kernels/prefill_mgpu.py via hyquant_jax.prefill_launch).

CPU (CI): GPU interpret mode (one warpgroup per CTA that copies and then computes each step: the
same math and masks, see the kernel's docstring) against the jnp reference on small shapes, in a
child process (`mgpu_interpret_cases.py`), and lowering for CUDA at real shapes (warp-specialized). GPU
(`pytest -m gpu`): the compiled kernel against the reference, incl. non-multiple-of-64 lengths and ragged batches.
Inputs and tolerances as in test_prefill.py (lossy on purpose: a wrong segment shows).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from hyquant_jax.prefill_launch import PrefillTuning
from pallas_kernels.prefill_mgpu import argument_shapes, hybrid_prefill_mgpu
from tests.helpers.mgpu_interpret_cases import ONE_WG, _cfg, _run
from tests.test_prefill import PV_FP8_TOL, TOL, check_output

ROOT = Path(__file__).resolve().parent.parent


def test_interpret_cases_in_own_process():
    """`tests/helpers/mgpu_interpret_cases.py` (interpret mode, input checks, dispatch) in a child pytest process: see
    that file's docstring for why they do not share the suite's process."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/helpers/mgpu_interpret_cases.py"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-3000:]


@pytest.mark.parametrize("d,kernel", [(128, dict(stages=2)), (128, dict(stages=3)), (64, dict(stages=2)),
                                      (128, dict(compute_wgs=2, block_kv=128)),
                                      (128, dict(compute_wgs=2, block_kv=64, stages=3)),
                                      (128, dict(compute_wgs=2, block_kv=128, pingpong=True)),
                                      (128, dict(compute_wgs=2, block_kv=128, approx_math=True)),
                                      (128, dict(compute_wgs=2, block_kv=128, skip_masks=False)),
                                      (128, dict(compute_wgs=2, block_kv=128, magic_convert=True,
                                                 approx_math=True))])
def test_lowers_for_cuda(d, kernel):
    """Qwen3-8B heads at 4K tokens (64 query blocks, 205 VL slots), lowered on CPU for the H200."""
    args = argument_shapes(1, 32, 8, 4096, 256, d)
    fn = jax.jit(lambda *a: hybrid_prefill_mgpu(*a, scale=d ** -0.5, **{**ONE_WG.mosaic(), **kernel}))
    assert "mosaic_gpu" in fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


SHARDED_LOWERING = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from hyquant_jax import prefill_launch as pk
from hyquant_jax.config import HyQuantConfig
mesh = Mesh(np.array(jax.devices()[:2]), ("model",))
attend = lambda *a: pk.prefill_attention_mgpu(*a, HyQuantConfig())
heads = P(None, "model")
fn = jax.shard_map(attend, mesh=mesh, in_specs=(heads, heads, heads, P(), heads, P()), out_specs=heads,
                   check_vma=False)
sd, bf = jax.ShapeDtypeStruct, jnp.bfloat16
args = (sd((1, 8, 512, 128), bf), sd((1, 2, 512, 128), bf), sd((1, 2, 512, 128), bf), sd((1,), jnp.int32),
        sd((1, 2, 16), jnp.int32), sd((1,), jnp.int32))
text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
print("mosaic custom calls:", text.count("mosaic_gpu_v2"))
"""


def test_lowers_for_cuda_under_shard_map():
    """The default config's Mosaic prefill (what "auto" picks on Hopper, also for sharded generate) lowers for
    CUDA per shard under shard_map over two devices (virtual CPU devices; own process for the device count)."""
    import os

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", SHARDED_LOWERING], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "mosaic custom calls: 1" in r.stdout, r.stdout


TWO_WGS = dict(compute_wgs=2, block_kv=128)  # with pingpong given per case
DEFAULT = PrefillTuning().mosaic()  # the library's setting (the cases' settings are changes to ONE_WG)
GPU_CASES = [
    ("qwen3_heads_ragged", (2, 32, 8, 1000, 128), [1000, 613], _cfg(window=128, rho=0.05), "vti", {}),
    ("qwen3_heads_4k", (1, 32, 8, 4096, 128), [4096], _cfg(window=128, rho=0.05), "vti", {}),
    ("smollm_heads_d64", (2, 9, 3, 777, 64), [777, 300], _cfg(window=128, rho=0.1), "random", dict(stages=3)),
    ("block128_window_256", (1, 8, 8, 1500, 128), [1437], _cfg(window=256, prefill_block=128, rho=0.05), "random",
     {}),
    ("two_wgs_kv128_ragged", (2, 32, 8, 1000, 128), [1000, 613], _cfg(window=128, prefill_block=128, rho=0.05),
     "vti", dict(pingpong=True, **TWO_WGS)),
    ("two_wgs_kv128_4k", (1, 32, 8, 4096, 128), [4096], _cfg(window=128, prefill_block=128, rho=0.05), "vti",
     dict(pingpong=True, **TWO_WGS)),
    ("two_wgs_kv64_d64", (2, 9, 3, 777, 64), [777, 300], _cfg(window=128, prefill_block=128, rho=0.1), "random",
     dict(compute_wgs=2, block_kv=64, stages=3, pingpong=True)),
    ("one_wg_kv128", (1, 8, 8, 1500, 128), [1437], _cfg(window=64, rho=0.05), "random", dict(block_kv=128)),
    ("two_wgs_no_pingpong", (2, 32, 8, 1000, 128), [1000, 613], _cfg(window=128, prefill_block=128, rho=0.05),
     "vti", dict(pingpong=False, **TWO_WGS)),
    ("two_wgs_approx_math", (2, 32, 8, 1000, 128), [1000, 613], _cfg(window=128, prefill_block=128, rho=0.05),
     "vti", dict(approx_math=True, **TWO_WGS)),
    ("two_wgs_every_step_masked", (1, 32, 8, 4096, 128), [4096], _cfg(window=128, prefill_block=128, rho=0.05),
     "vti", dict(skip_masks=False, **TWO_WGS)),
    ("two_wgs_long_band", (1, 8, 8, 3000, 128), [2900], _cfg(window=1024, prefill_block=128, rho=0.05), "vti",
     TWO_WGS),
    ("two_wgs_magic_convert", (2, 32, 8, 1000, 128), [1000, 613], _cfg(window=128, prefill_block=128, rho=0.05),
     "vti", dict(magic_convert=True, **TWO_WGS)),
    ("two_wgs_magic_approx", (1, 32, 8, 4096, 128), [4096], _cfg(window=128, prefill_block=128, rho=0.05),
     "vti", dict(magic_convert=True, approx_math=True, **TWO_WGS)),
    ("backend_mosaic_setting_ragged", (3, 32, 8, 2100, 128), [2100, 1337, 129],
     _cfg(window=256, prefill_block=128, rho=0.05), "vti", DEFAULT),
    ("mosaic_setting_block64_ragged", (3, 32, 8, 2100, 128), [2100, 1337, 129],
     _cfg(window=128, prefill_block=64, rho=0.05), "vti", DEFAULT),
    ("two_wgs_block64_kv64_d64", (2, 9, 3, 777, 64), [777, 300], _cfg(window=128, prefill_block=64, rho=0.1),
     "random", dict(compute_wgs=2, block_kv=64, stages=3, pingpong=True)),
    # The kernel accumulates P.V in the tensor cores over every key step of a row block (128 steps here). The
    # decode kernel lost ~3e-5 relative per step that way on the H200 (and now adds each page's P.V in
    # registers): a long prompt.
    ("mosaic_setting_16k", (1, 2, 1, 16384, 128), [16384], _cfg(window=128, prefill_block=128, rho=0.05), "vti",
     DEFAULT),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,shape,lengths,config,vl_source,kernel", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_matches_reference(name, shape, lengths, config, vl_source, kernel):
    out, ref, lengths = _run(shape, lengths, config, vl_source, interpret=False, **kernel)
    check_output(out, ref, lengths, TOL)


PV_FP8 = dict(DEFAULT, pv_fp8=True)
PV_FP8_CASES = [
    ("pv_fp8_ragged", (2, 32, 8, 1000, 128), [1000, 613], _cfg(window=128, prefill_block=128, rho=0.05), "vti"),
    ("pv_fp8_block64_ragged", (3, 32, 8, 2100, 128), [2100, 1337, 129], _cfg(window=128, prefill_block=64, rho=0.05),
     "vti"),
    # no VL tokens and a short band: nearly all of P.V in FP8, where a key order that differs between P and the
    # values would show at once
    ("pv_fp8_no_vl_4k", (1, 8, 2, 4096, 128), [4096], _cfg(window=128, prefill_block=128, rho=0.0), "random"),
    ("pv_fp8_16k", (1, 2, 1, 16384, 128), [16384], _cfg(window=128, prefill_block=128, rho=0.05), "vti"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,shape,lengths,config,vl_source", PV_FP8_CASES, ids=[c[0] for c in PV_FP8_CASES])
def test_gpu_pv_fp8_close_to_reference(name, shape, lengths, config, vl_source):
    """The FP8 P.V over the quantized segment within FP8 rounding of the reference (bf16 P.V), as the Triton
    kernel's: values paired with the wrong probabilities would be off by about the output's own size."""
    out, ref, lengths = _run(shape, lengths, config, vl_source, interpret=False, **PV_FP8)
    check_output(out, ref, lengths, PV_FP8_TOL)


@pytest.mark.gpu
def test_gpu_auto_backend_is_the_mosaic_kernel_on_hopper():
    """On the H200, "auto" prefill with a config the Mosaic setting fits runs that kernel: the same output, bit
    for bit, as backend="mosaic" (and the VL set of the same VTI)."""
    from hyquant_jax import attention, backends, prefill_launch

    device = jax.devices()[0]
    if not backends.is_hopper(device):
        pytest.skip(f"not a Hopper GPU: {device.device_kind}")
    config = _cfg(window=128, prefill_block=64, rho=0.05)
    assert prefill_launch.resolve("auto", 128, config) == "mosaic"
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    q = jax.random.normal(keys[0], (2, 8, 700, 128), jnp.bfloat16)
    k = jax.random.normal(keys[1], (2, 2, 700, 128), jnp.bfloat16)
    v = jax.random.normal(keys[2], (2, 2, 700, 128), jnp.bfloat16)
    lengths = jnp.array([700, 333], jnp.int32)
    out_auto, vl_auto = attention.prefill_attention(q, k, v, lengths, config, backend="auto")
    out_mosaic, vl_mosaic = attention.prefill_attention(q, k, v, lengths, config, backend="mosaic")
    assert jnp.array_equal(out_auto, out_mosaic)
    assert all(jnp.array_equal(a, b) for a, b in zip(vl_auto, vl_mosaic))
