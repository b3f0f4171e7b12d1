"""Would fused projections make the decode step's matrix-vector products faster? (issue 5's bf16 floor)

Times, on one GPU inside a jitted loop, the Qwen3-8B layer's projections at decode batch sizes as the model
runs them now (q, k, v as three matmuls; gate and up as two) and fused (one [E, (Hq + 2 Hkv) D] matmul; one
[E, 2F] matmul whose halves are split after), with the SwiGLU and the down projection after both MLP forms,
bf16 weights. Prints and writes microseconds per call and the bandwidth over the weight bytes. The B=1
profile (NOTES, "End-to-end decode step") has the k and v products at ~2.9 TB/s and q/o at ~3.1 TB/s
against ~4.1-4.5 for the largest; fusing pays only if the fused products run nearer the latter.

  PYTHONPATH=. python benchmarks/projection_probe.py --out DIR [--batches 1,16,64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import environment, time_in_loop, write_json  # noqa: E402

E, F, HQ, HKV, D = 4096, 12288, 32, 8, 128  # Qwen3-8B


def attention_separate(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv
    return q.at[:, :HKV * D].add(k + v)  # [B, E]: every product feeds the result


def attention_fused(x, wqkv):
    y = x @ wqkv
    q, k, v = y[:, :HQ * D], y[:, HQ * D:(HQ + HKV) * D], y[:, (HQ + HKV) * D:]
    return q.at[:, :HKV * D].add(k + v)


def mlp_separate(x, w_gate, w_up, w_down):
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def mlp_fused(x, w_gate_up, w_down):
    y = x @ w_gate_up
    return (jax.nn.silu(y[:, :F]) * y[:, F:]) @ w_down


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--name", default="projection_probe_h200")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--iters", type=int, default=200)
    args = p.parse_args()
    key = jax.random.split(jax.random.PRNGKey(0), 8)
    bf = jnp.bfloat16
    w = lambda k, shape: (jax.random.normal(k, shape, jnp.float32) / shape[0] ** 0.5).astype(bf)  # noqa: E731
    wq, wk, wv = w(key[0], (E, HQ * D)), w(key[1], (E, HKV * D)), w(key[2], (E, HKV * D))
    w_gate, w_up, w_down = w(key[3], (E, F)), w(key[4], (E, F)), w(key[5], (F, E))
    wqkv = jnp.concatenate([wq, wk, wv], axis=1)
    w_gate_up = jnp.concatenate([w_gate, w_up], axis=1)
    cases = [("attention_projections", "separate", attention_separate, (wq, wk, wv)),
             ("attention_projections", "fused", attention_fused, (wqkv,)),
             ("mlp", "separate", mlp_separate, (w_gate, w_up, w_down)),
             ("mlp", "fused", mlp_fused, (w_gate_up, w_down))]
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        x = jax.random.normal(key[6], (batch, E), jnp.float32).astype(bf)
        for part, form, fn, weights in cases:
            seconds = time_in_loop(fn, x, weights, args.iters)
            nbytes = sum(a.nbytes for a in weights)
            row = dict(batch=batch, part=part, form=form, us=1e6 * seconds, weight_bytes=nbytes,
                       tb_per_s=nbytes / seconds / 1e12)
            print(json.dumps(row), flush=True)
            rows.append(row)
    write_json(os.path.join(args.out, args.name + ".json"),
               dict(environment=environment(), command=" ".join(sys.argv), rows=rows))


if __name__ == "__main__":
    main()
