"""Can a Pallas (Triton) matrix-vector product read the weights faster than XLA's? (issue 5's bf16 floor)

At B=1 the decode step's matmuls are XLA Triton `gemm_fusion`s reading the weights at 3.1-4.1 TB/s (q/o
10.9 us per 32 MB, k/v 2.9 us per 8 MB, gate/up 27.5 us and down 24.9 us per 100 MB; NOTES, "End-to-end
decode step"), against a ~4.8 TB/s floor. This probe times, per weight shape of a Qwen3-8B layer, XLA's
`x @ w` and `gemv` below over a small grid of tilings, in one process on the same inputs, and checks each
result against the float32 product. A tiling that reads clearly faster than XLA is the case for putting the
kernel into the model's decode projections; otherwise XLA's products stay.

`gemv`: x [1, K] bf16, w [K, N] bf16 -> [1, N] bf16. Program (j, s) owns columns [j BN, (j + 1) BN) and rows
[s K / S, (s + 1) K / S); it accumulates x[k] * w[k, n] elementwise in an f32 [BK, BN] tile (no reduction
inside the loop) and reduces the tile once at the end; the S partial rows are summed by XLA.

  PYTHONPATH=. python benchmarks/gemv_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_output_sum, environment, time_in_loop, write_json  # noqa: E402

SHAPES = {"q_o": (4096, 4096), "k_v": (4096, 1024), "gate_up": (4096, 12288), "down": (12288, 4096)}
TILES = ((64, 32), (64, 64), (64, 128), (128, 32), (128, 64), (256, 32))  # (block_n, block_k)


def gemv(x, w, *, block_n: int, block_k: int, splits: int, num_warps: int = 4, num_stages: int = 3,
         interpret: bool = False):
    """x: [1, K] bf16; w: [K, N] bf16 -> [1, N] bf16, accumulated in f32. K / splits must be a power of two
    and a multiple of block_k; N a multiple of block_n."""
    k, n = w.shape
    if x.shape != (1, k):
        raise ValueError(f"x: expected shape (1, {k}), got {x.shape}")
    rows = k // splits
    if rows * splits != k or rows & (rows - 1) or rows % block_k or n % block_n:
        raise ValueError(f"gemv: K={k} / splits={splits} must be a power of two and a multiple of "
                         f"block_k={block_k}, and N={n} a multiple of block_n={block_n}")

    def kernel(x_ref, w_ref, o_ref):
        def body(i, acc):
            k0 = pl.multiple_of(i * block_k, block_k)
            xs = x_ref[0, pl.ds(k0, block_k)].astype(jnp.float32)
            ws = w_ref[pl.ds(k0, block_k), :].astype(jnp.float32)
            return acc + xs[:, None] * ws

        acc = lax.fori_loop(0, rows // block_k, body, jnp.zeros((block_k, block_n), jnp.float32))
        o_ref[0, 0, :] = jnp.sum(acc, axis=0)

    partial = pl.pallas_call(
        kernel,
        grid=(n // block_n, splits),
        in_specs=[pl.BlockSpec((1, rows), lambda j, s: (0, s)),
                  pl.BlockSpec((rows, block_n), lambda j, s: (s, j))],
        out_specs=pl.BlockSpec((1, 1, block_n), lambda j, s: (s, 0, j)),
        out_shape=jax.ShapeDtypeStruct((splits, 1, n), jnp.float32),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="gemv_probe",
    )(x, w)
    return jnp.sum(partial, axis=0).astype(x.dtype)


def split_choices(k: int, n: int, block_n: int, block_k: int, targets=(264, 528)) -> list[int]:
    """Split counts (K / S a power of two, >= block_k) whose program counts come nearest the targets."""
    valid = [s for s in range(1, k // block_k + 1)
             if k % s == 0 and (k // s) & (k // s - 1) == 0 and k // s >= block_k]
    chosen = {min(valid, key=lambda s: abs(n // block_n * s - t)) for t in targets}
    return sorted(chosen)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--name", default="gemv_probe_h200")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--stages", default="3,4")
    p.add_argument("--warps", default="4")
    args = p.parse_args()
    rows = []
    for name in args.shapes.split(","):
        k, n = SHAPES[name]
        kx, kw = jax.random.split(jax.random.PRNGKey(0))
        x = jax.random.normal(kx, (1, k), jnp.float32).astype(jnp.bfloat16)
        w = (jax.random.normal(kw, (k, n), jnp.float32) / k ** 0.5).astype(jnp.bfloat16)
        expect = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
        xla = lambda x, w: x @ w  # noqa: E731
        seconds = time_in_loop(xla, x, (w,), args.iters, feedback=add_output_sum)
        base = dict(shape=name, k=k, n=n, weight_bytes=w.nbytes)
        row = dict(base, kernel="xla", us=1e6 * seconds, tb_per_s=w.nbytes / seconds / 1e12)
        print(json.dumps(row), flush=True)
        rows.append(row)
        for block_n, block_k in TILES:
            for splits in split_choices(k, n, block_n, block_k):
                for warps in (int(v) for v in args.warps.split(",")):
                    for stages in (int(v) for v in args.stages.split(",")):
                        fn = functools.partial(gemv, block_n=block_n, block_k=block_k, splits=splits,
                                               num_warps=warps, num_stages=stages)
                        tiling = dict(block_n=block_n, block_k=block_k, splits=splits, num_warps=warps,
                                      num_stages=stages)
                        try:
                            got = np.asarray(jax.jit(fn)(x, w), np.float32)
                            seconds = time_in_loop(fn, x, (w,), args.iters, feedback=add_output_sum)
                        except Exception as e:  # a tiling that does not lower is recorded, not fatal
                            row = dict(base, kernel="pallas", **tiling, error=f"{type(e).__name__}: {e}"[:300])
                        else:
                            err = float(np.linalg.norm(got - expect) / np.linalg.norm(expect))
                            row = dict(base, kernel="pallas", **tiling, us=1e6 * seconds,
                                       tb_per_s=w.nbytes / seconds / 1e12, rel_err=err)
                        print(json.dumps(row), flush=True)
                        rows.append(row)
        write_json(os.path.join(args.out, args.name + ".json"),
                   dict(environment=environment(), command=" ".join(sys.argv), rows=rows))


if __name__ == "__main__":
    main()
