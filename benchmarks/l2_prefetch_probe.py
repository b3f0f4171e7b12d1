"""Does a weight prefetched into L2 make the next GEMV faster? A probe for the B=1 decode step (session 52).

At B=1 a hybrid layer's low-bit attention kernel streams its pages at ~2.3 TB/s (128K, `profile_graphs_128k_s40`),
well under what HBM gives, and the o projection that follows reads its 33.5 MB weight (Qwen3-8B: [4096, 4096]
bf16) from HBM in ~10 us. If the attention kernel's last microseconds prefetched that weight into L2 (50 MB on
the H100/H200), the o projection could read it from L2; the same for bf16 would not help as much, since its
attention already streams near the HBM speed. This probe measures the premise, apart from the model:

  flush      a sum over a `--flush-mb` array, so no part of the weight stays in L2 from the last iteration;
  prefetch   a Mosaic GPU kernel that issues TMA prefetches (`plgpu.async_prefetch`) of every [256, 256] box
             of the weight into L2 and exits;
  busy       what runs between the prefetch and the GEMV, as the end of the attention kernel would: `spin{us}`,
             a kernel that computes for about that long without memory traffic, or `read{MB}`, a sum over an
             array of that many MB (L2 traffic that may evict the prefetched lines);
  gemv       x [1, K] @ weight [K, N] (XLA's dot, bf16), as the o projection.

Each variant is one jitted loop of its stages in order (each stage takes a token of the previous one, so
they neither overlap nor reorder) and is timed per iteration (`time_in_loop`); the GEMV's own time is the
difference to the same variant without it. `warm` is the GEMV alone in a loop (its weight stays in L2 when
it fits): the fastest the GEMV can be. Prints and writes, per busy phase, the GEMV's time cold, after the
prefetch, and warm.

  PYTHONPATH=. python benchmarks/l2_prefetch_probe.py --out DIR [--busy spin2,spin5,read8,read32] [--cols 4096]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BOX = 256  # rows and columns of one TMA prefetch box (a box dimension has at most 256 elements)


def prefetch_l2(w: jax.Array, after: jax.Array, *, blocks: int = 132) -> jax.Array:
    """Issue TMA prefetches of every [256, 256] box of w (2-D, both dims multiples of 256) into L2; returns
    f32 [blocks, 128] zeros once every box is issued (not landed). after: any array, not read: it only orders
    the launch after its producer."""
    if w.ndim != 2 or w.shape[0] % BOX or w.shape[1] % BOX:
        raise ValueError(f"prefetch_l2: w must be 2-D with both dims multiples of {BOX}, got shape {w.shape}")
    rows, cols = w.shape
    per_row, boxes = cols // BOX, (rows // BOX) * (cols // BOX)

    def kernel(w_ref, after_ref, o_ref, o_s):
        del after_ref
        i = lax.axis_index("blocks")

        def body(k, carry):  # box k of the row-major [256, 256] boxes by block k mod blocks
            box = i + k * blocks

            @pl.when(box < boxes)
            def _():
                plgpu.async_prefetch(w_ref.at[pl.ds((box // per_row) * BOX, BOX), pl.ds((box % per_row) * BOX, BOX)])

            return carry

        lax.fori_loop(0, (boxes + blocks - 1) // blocks, body, 0)
        o_s[...] = jnp.zeros((128,), jnp.float32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s, o_ref.at[i])
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((blocks, 128), jnp.float32), grid=(blocks,),
                        grid_names=("blocks",), scratch_types=[plgpu.SMEM((128,), jnp.float32)])(w, after)


def spin(after: jax.Array, *, iters: int, blocks: int = 132) -> jax.Array:
    """A kernel that computes a chain of `iters` dependent multiply-adds per thread and touches no memory
    beyond its f32 [blocks, 128] output (about 4 cycles a step). after: read (one element), for the order."""

    def kernel(a_ref, o_ref, o_s):
        i = lax.axis_index("blocks")
        start = plgpu.load(a_ref.at[i, 0])  # 0 from the previous stage: the chain depends on it
        x = lax.fori_loop(0, iters, lambda _, v: v * 0.999 + 1e-3, start)
        o_s[...] = jnp.full((128,), x * 0.0, jnp.float32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s, o_ref.at[i])
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((blocks, 128), jnp.float32), grid=(blocks,),
                        grid_names=("blocks",), scratch_types=[plgpu.SMEM((128,), jnp.float32)])(after)


def parse_busy(name: str) -> tuple[str, float]:
    """'spin5' -> ("spin", 5.0) (microseconds), 'read32' -> ("read", 32.0) (MB), 'none'; ValueError names the rule."""
    if name == "none":
        return "none", 0.0
    for kind in ("spin", "read"):
        if name.startswith(kind):
            try:
                value = float(name[len(kind):])
            except ValueError:
                break
            if value > 0:
                return kind, value
    raise ValueError(f"busy phase must be none, spin{{us}} or read{{MB}} with a positive number, got {name!r}")


def stages(busy: str, *, prefetch: bool, gemv: bool, spin_iters_per_us: float, blocks: int):
    """fn(q, x, w, flush_array, read_array) running flush -> [prefetch] -> busy -> [gemv] in order; returns a
    value shaped like q that depends on every stage."""
    kind, amount = parse_busy(busy)

    def fn(q, x, w, flush, read):
        # Every stage reads a token of the one before (times 1e-30, which XLA cannot fold away as it could a
        # 0), so none is hoisted out of the loop or reordered; the first reads the previous iteration's q.
        token = jnp.sum(flush.astype(jnp.float32) + q[0, 0] * 1e-30)  # the flush
        tok = jnp.full((blocks, 128), token * 1e-30, jnp.float32)
        if prefetch:
            tok = prefetch_l2(w, tok, blocks=blocks)
        if kind == "spin":
            tok = spin(tok, iters=max(1, int(amount * spin_iters_per_us)), blocks=blocks)
        elif kind == "read":
            tok = tok + jnp.sum(read.astype(jnp.float32) + tok[0, 0]) * 1e-30
        x2 = x + (tok[0, 0] * 1e-30).astype(x.dtype)  # orders the GEMV after the busy phase
        if not gemv:
            return q + (tok[0, 0] * 1e-30).astype(q.dtype)
        y = x2 @ w
        return q + (1e-6 * jnp.sum(y.astype(jnp.float32))).astype(q.dtype)

    return fn


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--name", default="l2_prefetch_probe")
    p.add_argument("--rows", type=int, default=4096, help="K of the GEMV (Qwen3-8B's o projection: 4096)")
    p.add_argument("--cols", type=int, default=4096, help="N of the GEMV")
    p.add_argument("--busy", default="none,spin2,spin5,spin10,read8,read32,read64",
                   help="comma list of busy phases between prefetch and GEMV: none, spin{us}, read{MB}")
    p.add_argument("--flush-mb", type=float, default=256.0)
    p.add_argument("--iters", type=int, default=100)
    args = p.parse_args()
    from benchmarks.common import environment, sm_count, time_in_loop, write_json

    busy_list = [b for b in args.busy.split(",") if b]
    for b in busy_list:
        parse_busy(b)
    blocks = sm_count()
    key = jax.random.PRNGKey(0)
    w = (jax.random.normal(key, (args.rows, args.cols), jnp.float32) * args.rows ** -0.5).astype(jnp.bfloat16)
    x = jnp.ones((1, args.rows), jnp.bfloat16)
    flush = jnp.ones((int(args.flush_mb * 2 ** 20) // 2,), jnp.bfloat16)
    read_arrays = {}
    q = jnp.zeros((8, 128), jnp.float32)

    def timed(fn, read):
        return time_in_loop(lambda q, *o: fn(q, *o), q, (x, w, flush, read), args.iters, feedback=lambda q, out: out)

    # Calibrate the spin: its steps a microsecond, from 10000 steps against none (the flush subtracted).
    base = timed(stages("none", prefetch=False, gemv=False, spin_iters_per_us=1, blocks=blocks), flush[:1])
    long = timed(stages("spin1000", prefetch=False, gemv=False, spin_iters_per_us=10, blocks=blocks), flush[:1])
    per_us = 10000 / max((long - base) * 1e6, 1e-3)  # steps a microsecond
    print(f"spin: {per_us:.1f} steps a microsecond (10000 steps took {(long - base) * 1e6:.2f} us)", flush=True)

    def gemv_only(q, x, w):
        y = (x + (q[0, 0] * 1e-30).astype(x.dtype)) @ w
        return q + (1e-6 * jnp.sum(y.astype(jnp.float32))).astype(q.dtype)

    warm = time_in_loop(gemv_only, q, (x, w), args.iters, feedback=lambda q, out: out)
    nbytes = args.rows * args.cols * 2
    print(f"GEMV [1, {args.rows}] x [{args.rows}, {args.cols}] warm (weight in L2 if it fits): {warm * 1e6:.2f} us, "
          f"{nbytes / warm / 1e12:.2f} TB/s", flush=True)
    rows = []
    for b in busy_list:
        kind, amount = parse_busy(b)
        read = flush[:1]
        if kind == "read":
            read = read_arrays.setdefault(amount, jnp.ones((int(amount * 2 ** 20) // 2,), jnp.bfloat16))
        row = {"busy": b}
        for name, pf, gemv in (("cold", False, True), ("cold_base", False, False), ("prefetched", True, True),
                               ("prefetched_base", True, False)):
            row[name + "_us"] = timed(stages(b, prefetch=pf, gemv=gemv, spin_iters_per_us=per_us, blocks=blocks),
                                      read) * 1e6
        row["gemv_cold_us"] = row["cold_us"] - row["cold_base_us"]
        row["gemv_prefetched_us"] = row["prefetched_us"] - row["prefetched_base_us"]
        row["prefetch_cost_us"] = row["prefetched_base_us"] - row["cold_base_us"]
        print(f"busy {b:<8}: GEMV cold {row['gemv_cold_us']:.2f} us, after the prefetch "
              f"{row['gemv_prefetched_us']:.2f} us; the prefetch kernel itself +{row['prefetch_cost_us']:.2f} us; "
              f"whole iteration {row['cold_us']:.2f} -> {row['prefetched_us']:.2f} us", flush=True)
        rows.append(row)
    write_json(os.path.join(args.out, args.name + ".json"),
               {"environment": environment(), "args": vars(args), "spin_steps_per_us": per_us,
                "gemv_warm_us": warm * 1e6, "gemv_bytes": nbytes, "rows": rows})


if __name__ == "__main__":
    main()
