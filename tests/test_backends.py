"""Backend names and their resolution (hyquant_jax/backends.py)."""

from types import SimpleNamespace

import pytest

from hyquant_jax import backends
from hyquant_jax.config import HyQuantConfig


def test_backend_resolution():
    assert backends.resolve_backend("reference") == "reference"
    assert backends.resolve_backend("auto") in ("reference", "triton")
    with pytest.raises(ValueError, match="backend"):
        backends.resolve_backend("cuda")


def test_auto_prefill_backend_takes_the_mosaic_kernel_only_where_it_applies():
    """"auto" prefill: the Mosaic kernel on a Hopper GPU when config and head_dim fit its setting, the Triton
    kernel on other GPUs or configs, the reference off GPU; explicit backends are kept."""

    h200 = SimpleNamespace(platform="gpu", compute_capability="9.0")
    a100 = SimpleNamespace(platform="gpu", compute_capability="8.0")
    cpu = SimpleNamespace(platform="cpu")
    fits = HyQuantConfig(window=128, prefill_block=128)
    assert backends.prefill_backend("auto", 128, fits, h200) == "mosaic"
    assert backends.prefill_backend("auto", 64, fits, h200) == "mosaic"
    assert backends.prefill_backend("auto", 256, fits, h200) == "triton"  # head_dim the kernel lacks
    assert backends.prefill_backend("auto", 128, HyQuantConfig(window=128, prefill_block=64), h200) == "mosaic"
    assert backends.prefill_backend("auto", 128, HyQuantConfig(window=128, prefill_block=32), h200) == "triton"
    assert backends.prefill_backend("auto", 128, HyQuantConfig(window=128, prefill_block=128, prefill_qk="fp8"),
                                     h200) == "triton"
    assert backends.prefill_backend("auto", 128, fits, a100) == "triton"
    assert backends.prefill_backend("auto", 128, fits, cpu) == "reference"
    assert backends.prefill_backend("triton", 128, fits, h200) == "triton"
    assert backends.prefill_backend("reference", 128, fits, h200) == "reference"
    with pytest.raises(ValueError, match="backend"):
        backends.prefill_backend("cuda", 128, fits, h200)


def test_is_hopper_and_multiprocessor_count():
    h100 = SimpleNamespace(platform="gpu", compute_capability="9.0", core_count=132)
    a100 = SimpleNamespace(platform="gpu", compute_capability="8.0", core_count=108)
    cpu = SimpleNamespace(platform="cpu")
    assert backends.is_hopper(h100) and not backends.is_hopper(a100) and not backends.is_hopper(cpu)
    assert backends.multiprocessor_count(a100) == 108
    assert backends.multiprocessor_count(cpu) == 132 and backends.multiprocessor_count(cpu, default=7) == 7
