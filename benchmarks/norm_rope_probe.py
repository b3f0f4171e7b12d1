"""Warps per program for the decode step's norm/RoPE kernels (`pallas_kernels.norm_rope`), timed on the GPU.

Each loop iteration (`common.time_in_loop`) chains --chain calls, each on the previous call's output, so the
while loop's own ~12 us per iteration (measured: one call per iteration took 12-16 us at every warp count)
is spread over the chain; times are per call, at Qwen3-8B's decode shapes for B = 1 and 25, for every warp
count. Each result is checked against the reference math (`models.layers`). Prints a table and writes JSON.

  PYTHONPATH=. python benchmarks/norm_rope_probe.py --out DIR      (--smoke: tiny shapes, interpret mode)
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import environment, time_in_loop, write_json  # noqa: E402
from models.layers import apply_rope, rms_norm  # noqa: E402
from pallas_kernels.norm_rope import add_rms_norm, qk_norm_rope  # noqa: E402

EPS = 1e-6


def _max_rel_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _chained(fn, chain: int):
    """x -> fn(fn(...fn(x, *rest)...)): `chain` dependent calls (fn returns an array of x's shape)."""

    def run(x, *rest):
        for _ in range(chain):
            x = fn(x, *rest)
        return x

    return run


def add_rms_norm_case(batch: int, hidden: int, warps: int, iters: int, chain: int, interpret: bool) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(batch), 3)
    x = jax.random.normal(keys[0], (batch, hidden), jnp.bfloat16)
    delta = jax.random.normal(keys[1], (batch, hidden), jnp.bfloat16)
    w = (1 + 0.1 * jax.random.normal(keys[2], (hidden,))).astype(jnp.bfloat16)

    def fn(x, delta, w):
        return add_rms_norm(x, delta, w, EPS, interpret=interpret, num_warps=warps)[1]

    error = _max_rel_error(fn(x, delta, w), rms_norm(x + delta, w, EPS))
    seconds = time_in_loop(_chained(fn, chain), x, (delta, w), iters, reps=3) / chain
    return {"kernel": "add_rms_norm", "batch": batch, "width": hidden, "num_warps": warps,
            "us_per_call": seconds * 1e6, "max_rel_error": error}


def qk_norm_rope_case(batch: int, heads: int, kv_heads: int, head_dim: int, warps: int, iters: int, chain: int,
                      interpret: bool) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(batch + 1), 5)
    q = jax.random.normal(keys[0], (batch, heads, head_dim), jnp.bfloat16)
    k = jax.random.normal(keys[1], (batch, kv_heads, head_dim), jnp.bfloat16)
    angle = jax.random.uniform(keys[2], (batch, head_dim // 2), jnp.float32, 0, 100)
    cos, sin = jnp.cos(jnp.tile(angle, 2)), jnp.sin(jnp.tile(angle, 2))
    qw = (1 + 0.1 * jax.random.normal(keys[3], (head_dim,))).astype(jnp.bfloat16)
    kw = (1 + 0.1 * jax.random.normal(keys[4], (head_dim,))).astype(jnp.bfloat16)

    def fn(q, k, cos, sin, qw, kw):
        return qk_norm_rope(q, k, cos, sin, qw, kw, EPS, interpret=interpret, num_warps=warps)[0]

    want = apply_rope(rms_norm(q, qw, EPS)[:, :, None], cos[:, None, None], sin[:, None, None])[:, :, 0]
    error = _max_rel_error(fn(q, k, cos, sin, qw, kw), want)
    seconds = time_in_loop(_chained(fn, chain), q, (k, cos, sin, qw, kw), iters, reps=3) / chain
    return {"kernel": "qk_norm_rope", "batch": batch, "width": head_dim, "num_warps": warps,
            "us_per_call": seconds * 1e6, "max_rel_error": error}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the JSON")
    p.add_argument("--name", default="norm_rope_probe_h200")
    p.add_argument("--iters", type=int, default=200, help="loop iterations per timing")
    p.add_argument("--chain", type=int, default=64, help="dependent kernel calls per loop iteration")
    p.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode: a CPU check of the script")
    args = p.parse_args(argv)
    interpret = args.smoke or jax.default_backend() != "gpu"
    iters, chain = (2, 2) if args.smoke else (args.iters, args.chain)
    batches = (1, 2) if args.smoke else (1, 25)
    hidden, heads, kv_heads, head_dim = (64, 4, 2, 32) if args.smoke else (4096, 32, 8, 128)
    rows = []
    for b in batches:
        for warps in (1, 2, 4, 8, 16):
            rows.append(add_rms_norm_case(b, hidden, warps, iters, chain, interpret))
        for warps in (1, 2, 4):
            rows.append(qk_norm_rope_case(b, heads, kv_heads, head_dim, warps, iters, chain, interpret))
    print("kernel, batch, width, num_warps, us per call (chained in the loop), max relative error")
    for r in rows:
        print(f"{r['kernel']:>13} {r['batch']:>4} {r['width']:>5} {r['num_warps']:>3} {r['us_per_call']:9.2f} "
              f"{r['max_rel_error']:.1e}")
    result = {"environment": environment(), "interpret": interpret, "iters": iters, "chain": chain, "rows": rows}
    path = os.path.join(args.out, f"{args.name}.json")
    write_json(path, result)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
