"""Which kernels run: backend names, their resolution on the device at hand, and device facts.

backend:
  "auto"      the kernels on a GPU (for prefill the Mosaic kernel where it applies, see `prefill_backend`;
              for decode `decode_launch.DecodeTuning.low_bit`), the reference elsewhere;
  "reference" pure jnp (`hyquant_jax.reference`), any device;
  "triton"    the Pallas GPU kernels compiled through the Triton lowering, any recent NVIDIA GPU;
  "mosaic"    Hopper only: prefill through the Mosaic GPU kernel (`pallas_kernels.prefill_mgpu`), decode as
              "triton" (whose low-bit pages go to the Mosaic decode kernel where it fits);
  "interpret" the Pallas kernels in interpret mode (CPU tests).
`cache.append` takes the same names for its ring writes.
"""

from __future__ import annotations

import jax

BACKENDS = ("auto", "reference", "triton", "mosaic", "interpret")


def resolve_backend(backend: str) -> str:
    """"auto" -> "triton" on a GPU, "reference" elsewhere; other names of BACKENDS as they are."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if jax.default_backend() == "gpu" else "reference"
    return backend


def is_hopper(device) -> bool:
    """Whether `device` is a compute-capability-9.x (Hopper) GPU, the one the Mosaic kernels are written for."""
    return device.platform == "gpu" and str(getattr(device, "compute_capability", "")).startswith("9.")


def multiprocessor_count(device=None, default: int = 132) -> int:
    """Streaming multiprocessors of `device` (default: the first JAX device); `default` (an H100/H200 SXM's
    132) where the device does not say, e.g. on a CPU, so that launch plans made there match a Hopper GPU's."""
    device = jax.devices()[0] if device is None else device
    return int(getattr(device, "core_count", 0) or default)


def prefill_backend(backend: str, head_dim: int, config, device=None) -> str:
    """The backend `prefill_attention` runs: `resolve_backend`, except that "auto" on a Hopper GPU takes the
    Mosaic kernel when the config and head_dim fit it (INT8 Q.K, `prefill_block` a multiple of 64, head_dim 64
    or 128): it measured 1.1x-1.3x faster than the Triton kernel from 8K tokens on the H200 and 1.08x at 4K
    (docs/design.md, "Prefill kernels"). config: a `HyQuantConfig`; device: the device to decide for
    (default: the first JAX device)."""
    if backend != "auto":
        return resolve_backend(backend)
    device = jax.devices()[0] if device is None else device
    if device.platform != "gpu":
        return "reference"
    from pallas_kernels.prefill_mgpu import BLOCK, HEAD_DIMS

    fits = config.prefill_qk == "int8" and config.prefill_block % BLOCK == 0 and head_dim in HEAD_DIMS
    return "mosaic" if is_hopper(device) and fits else "triton"
