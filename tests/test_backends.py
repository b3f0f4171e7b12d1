"""Backend names and their resolution (hyquant_jax/backends.py)."""

from types import SimpleNamespace

import pytest

from hyquant_jax import backends, prefill_launch
from hyquant_jax.config import HyQuantConfig


def test_backend_resolution():
    assert backends.resolve_backend("reference") == "reference"
    assert backends.resolve_backend("auto") in ("reference", "triton")
    with pytest.raises(ValueError, match="backend"):
        backends.resolve_backend("cuda")


def test_auto_prefill_backend_takes_the_mosaic_kernel_only_where_it_applies():
    """"auto" prefill: the Mosaic kernel on a Hopper GPU when config and head_dim fit its setting, the Triton
    kernel on other GPUs or configs, the reference off GPU; explicit backends are kept."""
    resolve = prefill_launch.resolve
    h200 = SimpleNamespace(platform="gpu", compute_capability="9.0")
    a100 = SimpleNamespace(platform="gpu", compute_capability="8.0")
    cpu = SimpleNamespace(platform="cpu")
    fits = HyQuantConfig(window=128, prefill_block=128)
    assert resolve("auto", 128, fits, h200) == "mosaic"
    assert resolve("auto", 64, fits, h200) == "mosaic"
    assert resolve("auto", 256, fits, h200) == "triton"  # head_dim the kernel lacks
    assert resolve("auto", 128, HyQuantConfig(window=128, prefill_block=64), h200) == "mosaic"
    assert resolve("auto", 128, HyQuantConfig(window=128, prefill_block=32), h200) == "triton"
    assert resolve("auto", 128, HyQuantConfig(window=128, prefill_block=128, prefill_qk="fp8"), h200) == "triton"
    assert resolve("auto", 128, fits, a100) == "triton"
    assert resolve("auto", 128, fits, cpu) == "reference"
    assert resolve("auto", 96, fits, a100) == "reference"  # no kernel takes head_dim 96
    assert resolve("triton", 128, fits, h200) == "triton"
    assert resolve("reference", 128, fits, h200) == "reference"
    assert resolve("mosaic", 128, fits, cpu) == "mosaic"  # named: lowered for Hopper whatever the host
    with pytest.raises(ValueError, match="backend"):
        resolve("cuda", 128, fits, h200)


def test_first_supported_takes_the_order_given():
    never = backends.Implementation("never", lambda device, *facts: "never runs")
    gpu = backends.Implementation("gpu", lambda device, *facts: None if device.platform == "gpu" else "no GPU")
    always = backends.Implementation("always", lambda device, *facts: None)
    cpu = SimpleNamespace(platform="cpu")
    assert not never.supported(cpu) and always.supported(cpu, 1, 2)
    assert backends.first_supported((never, gpu, always), cpu) == "always"
    assert backends.first_supported((never, gpu, always), SimpleNamespace(platform="gpu")) == "gpu"
    with pytest.raises(ValueError, match="no implementation"):
        backends.first_supported((never,), cpu)


def test_is_hopper_and_multiprocessor_count():
    h100 = SimpleNamespace(platform="gpu", compute_capability="9.0", core_count=132)
    a100 = SimpleNamespace(platform="gpu", compute_capability="8.0", core_count=108)
    cpu = SimpleNamespace(platform="cpu")
    assert backends.is_hopper(h100) and not backends.is_hopper(a100) and not backends.is_hopper(cpu)
    assert backends.multiprocessor_count(a100) == 108
    assert backends.multiprocessor_count(cpu) == 132 and backends.multiprocessor_count(cpu, default=7) == 7
