"""Feasibility probe for an INT8 decode route: Q.K of one 64-token tile of 4-bit keys on INT8 tensor cores.

Not a kernel of the library (benchmarks/NOTES.md, "Where the decode kernel stands"). The tile is the
cache's own packing: byte i of a token holds the code of dim i in its low nibble and of dim 64 + i in its
high nibble (D = 128). Two bitwise ops per 4 bytes turn it into INT8 wgmma operands, with no conversion:

  lo = x & 0x0F          = u_lo              (codes of dims 0..63, 0..15)
  hi = (x ^ 0x80) & 0xF0 = 16 * (u_hi - 8)   (codes of dims 64..127, centred and scaled by 16)
  logits^T [64 tokens, 16 rows] = lo . q_lo^T + hi . q_hi^T    (int32, exact)

with the code tiles as the *register* A operand of `wgmma` (s8 x s8 -> s32) and the INT8 queries
(GQA rows padded to 16) in SMEM as the transposed B operand. A decode kernel would then fold the offsets
and scales per row and token as the Triton kernel does.

On any machine the probe lowers the tile for CUDA and counts the bitwise ops of Mosaic GPU's lowered module
by their operand type: `vector<4xi8>` means one op per 32-bit register, i.e. 4 bytes (8 codes) per
instruction before ptxas fuses the xor and the and. The module is read by wrapping Mosaic GPU's internal
`lower_mgpu_module` (inspection only; jax is pinned). On a Hopper GPU it also runs the tile and compares
it with an int64 NumPy oracle (exact). Result on the H200: exact, and the PTX unpack is 24 32-bit
and/xor ops per thread for the tile (`benchmarks/results/int8_probe_h200.{log,ptx,ptxas.txt}`).

  python benchmarks/mosaic_int8_tile_probe.py          # CPU: lowering and op counts
  PYTHONPATH=. python benchmarks/mosaic_int8_tile_probe.py   # GPU: also run and check
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pallas_kernels.prefill_mgpu import _swizzled  # noqa: E402  (SMEM tiling + swizzle for a matrix operand)

TOKENS, BYTES, ROWS = 64, 64, 16  # tokens per tile, packed bytes per token (D = 128), padded query rows


def _kernel(codes, q_lo, q_hi, out, codes_s, q_lo_s, q_hi_s, out_s, barriers):
    for i, (src, dst) in enumerate([(codes, codes_s), (q_lo, q_lo_s), (q_hi, q_hi_s)]):
        plgpu.copy_gmem_to_smem(src, dst, barriers.at[i])
    for i in range(3):
        plgpu.barrier_wait(barriers.at[i])
    x = plgpu.load(codes_s, layout=plgpu.Layout.WGMMA_8BIT)
    lo = lax.bitcast_convert_type(x & 0x0F, jnp.int8)
    hi = lax.bitcast_convert_type((x ^ 0x80) & 0xF0, jnp.int8)

    def qk(acc):
        plgpu.wgmma(acc, lo, q_lo_s.T)
        plgpu.wgmma(acc, hi, q_hi_s.T)
        return acc[...]

    out_s[...] = pl.run_scoped(qk, plgpu.ACC((TOKENS, ROWS), jnp.int32))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_s, out)
    plgpu.wait_smem_to_gmem(0)


def tile_kernel():
    return plgpu.kernel(
        _kernel,
        out_type=jax.ShapeDtypeStruct((TOKENS, ROWS), jnp.int32),
        scratch_types=[
            plgpu.SMEM((TOKENS, BYTES), jnp.uint8, transforms=_swizzled(jnp.uint8, BYTES)),
            plgpu.SMEM((ROWS, BYTES), jnp.int8, transforms=_swizzled(jnp.int8, BYTES)),
            plgpu.SMEM((ROWS, BYTES), jnp.int8, transforms=_swizzled(jnp.int8, BYTES)),
            plgpu.SMEM((TOKENS, ROWS), jnp.int32),
            plgpu.Barrier(num_barriers=3),
        ],
    )


def inputs(seed: int = 0):
    """(codes uint8 [64, 64], q_lo, q_hi int8 [16, 64])."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (TOKENS, BYTES), dtype=np.uint8),
            rng.integers(-127, 128, (ROWS, BYTES), dtype=np.int8),
            rng.integers(-127, 128, (ROWS, BYTES), dtype=np.int8))


def oracle(codes, q_lo, q_hi):
    """int64 logits^T [64, 16]: the low nibbles as codes 0..15, the high nibbles as 16 * (code - 8)."""
    u_lo = (codes & 0x0F).astype(np.int64)
    u_hi = (codes >> 4).astype(np.int64)
    return u_lo @ q_lo.astype(np.int64).T + (16 * (u_hi - 8)) @ q_hi.astype(np.int64).T


def lowered_module(args) -> str:
    """Mosaic GPU's module after its Python lowering (vector and LLVM dialects), as text."""
    from jax.experimental.mosaic.gpu import core

    modules = []
    lower = core.lower_mgpu_module

    def keep(module, *a, **k):
        result = lower(module, *a, **k)
        modules.append(str(module))
        return result

    core.lower_mgpu_module = keep
    try:
        jax.jit(tile_kernel()).trace(*args).lower(lowering_platforms=("cuda",))
    finally:
        core.lower_mgpu_module = lower
    return modules[-1]


def bitwise_ops(module: str) -> collections.Counter:
    """Counts of (op, operand type) for the and/xor ops of the lowered module."""
    return collections.Counter(re.findall(r"(arith\.andi|arith\.xori) [^\n]*: (\S+)\n", module))


def main():
    args = inputs()
    module = lowered_module(args)
    print("wgmma instructions:", sorted(set(re.findall(r"wgmma\.mma_async[\w.]+", module))))
    for (op, ty), n in sorted(bitwise_ops(module).items()):
        print(f"{n:4d} x {op} on {ty}")
    if jax.default_backend() != "gpu":
        return
    got = np.asarray(jax.block_until_ready(tile_kernel()(*args)), np.int64)
    want = oracle(*args)
    print(f"GPU result equals the int64 oracle: {np.array_equal(got, want)} (max |diff| {np.abs(got - want).max()})")


if __name__ == "__main__":
    main()
