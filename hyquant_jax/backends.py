"""Backend names, their resolution on the device at hand, device facts, and the record of an op's implementations.

backend:
  "auto"      the first implementation of the op that runs on the device (`decode_launch.resolve`,
              `prefill_launch.resolve`): the kernels on a GPU where they fit, the reference elsewhere;
  "reference" pure jnp (`hyquant_jax.reference`), any device;
  "triton"    the Pallas GPU kernels compiled through the Triton lowering, any recent NVIDIA GPU;
  "mosaic"    Hopper only: prefill through the Mosaic GPU kernel (`pallas_kernels.prefill_mgpu`), decode as
              "triton" (whose low-bit pages go to the Mosaic decode kernel where `decode_launch.plan` says so);
  "interpret" the Pallas kernels in interpret mode (CPU tests).
`cache.append` takes the same names for its ring writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax

BACKENDS = ("auto", "reference", "triton", "mosaic", "interpret")
TRITON_WARPS = (1, 2, 4, 8, 16, 32)  # warps a Triton program may have (at most 1024 threads)


def resolve_backend(backend: str) -> str:
    """"auto" -> "triton" on a GPU, "reference" elsewhere; other names of BACKENDS as they are."""
    check_backend(backend)
    if backend == "auto":
        return "triton" if jax.default_backend() == "gpu" else "reference"
    return backend


def check_backend(backend: str) -> str:
    """`backend` if it is one of BACKENDS, else a ValueError naming them."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def default_device(device=None):
    """`device`, or where it is None the first JAX device."""
    return jax.devices()[0] if device is None else device


def is_hopper(device) -> bool:
    """Whether `device` is a compute-capability-9.x (Hopper) GPU, the one the Mosaic kernels are written for."""
    return device.platform == "gpu" and str(getattr(device, "compute_capability", "")).startswith("9.")


def multiprocessor_count(device=None, default: int = 132) -> int:
    """Streaming multiprocessors of `device` (default: the first JAX device); `default` (an H100/H200 SXM's
    132) where the device does not say, e.g. on a CPU, so that launch plans made there match a Hopper GPU's."""
    return int(getattr(default_device(device), "core_count", 0) or default)


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One implementation of an op: its name and `unsupported(device, *facts)`, the reason it cannot run on
    `device` for the op's static facts (shapes, config), or None where it can."""

    name: str
    unsupported: Callable[..., str | None]

    def supported(self, device, *facts) -> bool:
        return self.unsupported(device, *facts) is None


def runs_anywhere(device, *facts) -> None:
    """`Implementation.unsupported` of an implementation that runs on any device (the jnp reference)."""
    return None


def needs_gpu(device, interpret: bool, kernel: str) -> str | None:
    """Why `kernel` (a Pallas GPU kernel) cannot run on `device`: it needs a GPU, or interpret mode."""
    if not interpret and device.platform != "gpu":
        return f"the {kernel} needs a GPU (or interpret mode), got a {device.platform} device"
    return None


def first_supported(implementations: Sequence[Implementation], device, *facts) -> str:
    """The name of the first of `implementations` (an op's order of preference) that runs on `device`."""
    for implementation in implementations:
        if implementation.supported(device, *facts):
            return implementation.name
    raise ValueError(f"no implementation of {[i.name for i in implementations]} runs on {device}")

