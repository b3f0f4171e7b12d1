"""Measured HBM read bandwidth: the yardstick for "x% of bandwidth" and for a byte floor at attainable speed.

Every form reads the same bf16 array of --gib GiB once per call, timed inside a jitted loop
(`common.time_in_loop`: each call's input depends on the previous call's output, so every iteration reads the
whole array again and no dispatch gap is counted):

  rows  per-row float32 sums of [R, 8192] times the loop's scalar (a reduction with R outputs);
  gemv  [1, 8192] @ [8192, N] (the decode step's weight reads at B=1);
  gemv_wide  [1, 4096] @ [4096, N] (Qwen3-8B's hidden size).

TB/s = array bytes / seconds per call (the small q and outputs are not counted); `best` is the largest.
One XLA sum of the whole array to a scalar, timed from Python, varied widely from run to run and stayed below
what cuDNN's decode kernel moves, so it is no yardstick.

  python -m benchmarks.read_bandwidth --out benchmarks/results   # writes read_bandwidth_h200.json
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp

from benchmarks.cases import QWEN3_8B
from benchmarks.common import (
    add_output_sum,
    default_name,
    environment,
    output_folder,
    run_script,
    time_in_loop,
    write_json,
)

FORMS = ("rows", "gemv", "gemv_wide")


def _operands(form: str, nbytes: int):
    width = QWEN3_8B["hidden_size"] if form == "gemv_wide" else 8192
    n = max(1, nbytes // (2 * width))
    shape = (n, width) if form == "rows" else (width, n)
    x = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.bfloat16)
    q = jnp.full((1, width), 0.01, jnp.bfloat16)
    return q, x


def _rows(q, x):
    return jnp.sum(x * q[0, 0], axis=1, dtype=jnp.float32)


def _gemv(q, x):
    return q @ x


def read_bandwidth(nbytes: int = 2 << 30, forms=FORMS, iters: int = 20, reps: int = 5) -> dict:
    """{"tb_s": {form: TB/s}, "bytes": {form: array bytes}, "best": the largest TB/s} over arrays of about
    `nbytes` bytes."""
    bad = [f for f in forms if f not in FORMS]
    if bad or not forms:
        raise ValueError(f"read_bandwidth: forms must be a non-empty subset of {FORMS}, got {forms!r}")
    tb_s, sizes = {}, {}
    for form in forms:
        q, x = _operands(form, nbytes)
        seconds = time_in_loop(_rows if form == "rows" else _gemv, q, (x,), iters, reps, feedback=add_output_sum)
        tb_s[form], sizes[form] = x.nbytes / seconds / 1e12, int(x.nbytes)
        del x
    return {"tb_s": tb_s, "bytes": sizes, "best": max(tb_s.values())}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="folder for the JSON (default: benchmarks/results; a temporary "
                                                 "folder with --smoke)")
    p.add_argument("--name", default=None, help="JSON file stem (default: read_bandwidth_<device>)")
    p.add_argument("--gib", type=float, default=2.0, help="array size in GiB (default 2)")
    p.add_argument("--smoke", action="store_true", help="a 4 MiB array, 2 iterations (CPU check of the script)")
    args = p.parse_args(argv)
    if args.gib <= 0:
        p.error(f"--gib must be > 0, got {args.gib}")
    path = os.path.join(output_folder(args.out, args.smoke), f"{args.name or default_name('read_bandwidth')}.json")
    nbytes = 4 << 20 if args.smoke else int(args.gib * 2**30)
    result = {"env": environment(), "read_bandwidth": read_bandwidth(nbytes, iters=2 if args.smoke else 20,
                                                                       reps=1 if args.smoke else 5)}
    print(result)
    write_json(path, result)
    print(f"wrote {path}")


if __name__ == "__main__":
    run_script(main)
