"""Helpers shared by the Mosaic GPU (Hopper) kernels, `pallas_kernels.decode_mgpu` and
`pallas_kernels.prefill_mgpu`."""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu


def swizzled(dtype, cols: int) -> tuple:
    """The tiling and swizzle transforms of a shared-memory operand with rows of `cols` elements of `dtype`: the
    largest swizzle (128, 64, 32 or 16 bytes) that divides a row, and tiles of 8 rows one swizzle wide, as wgmma
    operands and bulk copies take them (`plgpu.SMEM(shape, dtype, transforms=swizzled(dtype, cols))`)."""
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(cols * bits)
    return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)
