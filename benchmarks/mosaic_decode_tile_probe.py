"""Feasibility probe for a Mosaic GPU decode kernel: one 64-token tile of transposed hybrid decode attention.

Not a kernel of the library. It checks, on any machine, that the building
blocks of the design in `benchmarks/NOTES.md` ("Mosaic GPU route") lower
through Pallas Mosaic GPU in jax 0.11.2, and on an H100/H200 it also runs the
tile and compares it with a NumPy oracle:

  logits^T [64 tokens, 16 rows] = K [64, 64] . q^T [64, 16]
      K: 4-bit codes loaded from a uint8 SMEM tile, unpacked and converted in
      registers, times a per-channel scale: the *register* A operand of wgmma;
      q^T: bf16 in SMEM (B operand; 16 rows because a 16-byte bf16 row has no
      supported swizzle, so GQA groups pad to 16 as in the Triton kernel)
  m, l: max and sum over the tokens (axis 0: a reduction across the 4 warps)
  P^T [64, 16]: exp(logits^T - m), stored to SMEM (B operand)
  out^T [64 dims, 16] = V^T [64 dims, 64 tokens] . P^T
      V^T: codes stored channels x tokens, times a per-token scale broadcast
      along the columns: again a register A operand

Cross-platform lowering runs Mosaic GPU's layout inference and its lowering
to LLVM in Python, so `--lower-only` (the default without a GPU) needs no GPU.

  python benchmarks/mosaic_decode_tile_probe.py            # CPU: lowering only
  PYTHONPATH=. python benchmarks/mosaic_decode_tile_probe.py   # GPU: also run and check
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

TOKENS, HALF_DIM, ROWS = 64, 64, 16  # tokens per tile, dims per nibble half (D = 128), padded query rows


def _swizzled(dtype, cols: int):
    """Tiling + swizzle transforms for an SMEM matrix operand with `cols` columns of `dtype`."""
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(cols * bits)
    return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)


def _kernel(k_codes, k_scale, q_t, v_codes_t, v_scale, o_out, m_out, l_out,
            q_smem, k_smem, v_smem, ks_smem, vs_smem, p_smem, o_smem, m_smem, l_smem, barriers):
    for i, (src, dst) in enumerate([(q_t, q_smem), (k_codes, k_smem), (v_codes_t, v_smem), (k_scale, ks_smem),
                                    (v_scale, vs_smem)]):
        plgpu.copy_gmem_to_smem(src, dst, barriers.at[i])
    for i in range(5):
        plgpu.barrier_wait(barriers.at[i])

    ks = plgpu.load(ks_smem, layout=plgpu.Layout.WGMMA.reduce(0))  # per channel: a vector over columns
    k = (k_smem[...] & 0xF).astype(jnp.float32) * lax.broadcast_in_dim(ks, (TOKENS, HALF_DIM), [1])
    k = k.astype(jnp.bfloat16)

    def qk(acc):
        plgpu.wgmma(acc, k, q_smem)
        return acc[...]

    s = pl.run_scoped(qk, plgpu.ACC((TOKENS, ROWS), jnp.float32))
    m = s.max(axis=0)
    p = jnp.exp(s - lax.broadcast_in_dim(m, (TOKENS, ROWS), [1]))
    l = p.sum(axis=0)
    p_smem[...] = p.astype(jnp.bfloat16)

    vs = plgpu.load(vs_smem, layout=plgpu.Layout.WGMMA.reduce(0))  # per token: columns of V^T
    v_t = (v_smem[...] & 0xF).astype(jnp.float32) * lax.broadcast_in_dim(vs, (HALF_DIM, TOKENS), [1])
    v_t = v_t.astype(jnp.bfloat16)
    plgpu.commit_smem()

    def pv(acc):
        plgpu.wgmma(acc, v_t, p_smem)
        return acc[...]

    o_smem[...] = pl.run_scoped(pv, plgpu.ACC((HALF_DIM, ROWS), jnp.float32))
    m_smem[...] = m
    l_smem[...] = l
    plgpu.commit_smem()
    for src, dst in ((o_smem, o_out), (m_smem, m_out), (l_smem, l_out)):
        plgpu.copy_smem_to_gmem(src, dst)
    plgpu.wait_smem_to_gmem(0)


def tile_kernel():
    f32 = jnp.float32
    return plgpu.kernel(
        _kernel,
        out_type=(jax.ShapeDtypeStruct((HALF_DIM, ROWS), f32), jax.ShapeDtypeStruct((ROWS,), f32),
                  jax.ShapeDtypeStruct((ROWS,), f32)),
        scratch_types=[
            plgpu.SMEM((HALF_DIM, ROWS), jnp.bfloat16, transforms=_swizzled(jnp.bfloat16, ROWS)),
            plgpu.SMEM((TOKENS, HALF_DIM), jnp.uint8, transforms=_swizzled(jnp.uint8, HALF_DIM)),
            plgpu.SMEM((HALF_DIM, TOKENS), jnp.uint8, transforms=_swizzled(jnp.uint8, TOKENS)),
            plgpu.SMEM((HALF_DIM,), f32), plgpu.SMEM((TOKENS,), f32),
            plgpu.SMEM((TOKENS, ROWS), jnp.bfloat16, transforms=_swizzled(jnp.bfloat16, ROWS)),
            plgpu.SMEM((HALF_DIM, ROWS), f32), plgpu.SMEM((ROWS,), f32), plgpu.SMEM((ROWS,), f32),
            plgpu.Barrier(num_barriers=5),
        ],
    )


def inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (TOKENS, HALF_DIM), dtype=np.uint8),
            rng.uniform(0.05, 0.2, HALF_DIM).astype(np.float32),
            rng.normal(size=(HALF_DIM, ROWS)).astype(jnp.bfloat16),
            rng.integers(0, 256, (HALF_DIM, TOKENS), dtype=np.uint8),
            rng.uniform(0.05, 0.2, TOKENS).astype(np.float32))


def oracle(k_codes, k_scale, q_t, v_codes_t, v_scale):
    """float64 NumPy result on the same bf16-rounded operands."""
    bf = lambda x: np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16), np.float64)  # noqa: E731
    k = bf((k_codes & 0xF) * k_scale[None, :])
    s = k @ np.asarray(q_t, np.float64)
    m = s.max(axis=0)
    p = np.exp(s - m)
    v_t = bf((v_codes_t & 0xF) * v_scale[None, :])
    return v_t @ bf(p), m, p.sum(axis=0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lower-only", action="store_true", help="only lower for CUDA (the default without a GPU)")
    args = p.parse_args()
    args_in = inputs()
    lowered = jax.jit(tile_kernel()).trace(*args_in).lower(lowering_platforms=("cuda",))
    print(f"lowered for cuda: {len(lowered.as_text())} characters of StableHLO with the Mosaic GPU module")
    if args.lower_only or jax.default_backend() != "gpu":
        return
    out = [np.asarray(x, np.float64) for x in jax.block_until_ready(tile_kernel()(*args_in))]
    for name, got, want in zip(("out^T", "m", "l"), out, oracle(*args_in)):
        err = np.abs(got - want).max() / np.abs(want).max()
        print(f"{name}: max relative error {err:.2e}")


if __name__ == "__main__":
    main()
