"""JAX's own Mosaic GPU flash attention (jax.experimental.pallas.ops.gpu.attention_mgpu) against cuDNN, causal prefill.

A baseline for the prefill issue: it says how fast a Hopper (wgmma, TMA,
warp-specialized) Pallas kernel in jax 0.11.2 runs at our prefill shapes,
next to cuDNN bf16 in the same process, before anyone writes a hybrid prefill
on that stack. B=1, Hq/Hkv 32/8, D 128, T in {4K, 8K, 16K, 32K}, causal.
Times are the median per call inside a jitted loop whose iterations depend
on each other (`benchmarks.common.time_in_loop`). attention_mgpu takes f16
only (bf16 inputs fail to lower) and applies no softmax scale, so q is scaled
by 1/sqrt(D) before the call (inside the timing); its error is reported
against cuDNN's output up to T = 8K.

  PYTHONPATH=. python benchmarks/mosaic_attention_baseline.py --out $OUT
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


def causal_flops(t, hq, d):
    return 4 * t * t * d * hq / 2


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--name", default="mosaic_attention_baseline_h200")
    p.add_argument("--lengths", default="4096,8192,16384,32768")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    from jax.experimental.pallas.ops.gpu import attention_mgpu as mgpu

    env = environment()
    try:
        from jax._src.lib import cuda_versions
        env["cuda_runtime"] = int(cuda_versions.cuda_runtime_get_version())
    except Exception as e:  # report, keep going
        env["cuda_runtime"] = f"unknown: {type(e).__name__}: {e}"
    hq, hkv, d = 32, 8, 128
    rows = []
    for t in (int(x) for x in args.lengths.split(",")):
        ks = jax.random.split(jax.random.PRNGKey(t), 3)
        q, k, v = (jax.random.normal(key, (1, t, h, d), jnp.bfloat16) for key, h in zip(ks, (hq, hkv, hkv)))
        iters = max(3, min(50, int(2e4 // (t / 1024) ** 2)))
        row = {"T": t, "iters": iters}
        def cudnn(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

        row["cudnn_bf16_ms"] = 1e3 * time_in_loop(cudnn, q, (k, v), iters, args.reps)
        ref = np.asarray(cudnn(q, k, v), np.float32) if t <= 8192 else None
        for dtype in (jnp.float16, jnp.bfloat16):
            for block_kv in (128, 64):
                name = f"mgpu_{jnp.dtype(dtype).name}_kv{block_kv}"
                cfg = mgpu.TuningConfig(block_q=64, block_kv=block_kv, max_concurrent_steps=2, causal=True)
                # attention_mgpu applies no softmax scale: scale q so that it computes what cuDNN does
                fn = lambda q, k, v, cfg=cfg: mgpu.attention(q * d ** -0.5, k, v, cfg)  # noqa: E731
                try:
                    qc, kc, vc = (x.astype(dtype) for x in (q, k, v))
                    row[name + "_ms"] = 1e3 * time_in_loop(fn, qc, (kc, vc), iters, args.reps)
                    if ref is not None:
                        got = np.asarray(fn(qc, kc, vc), np.float32)
                        row[name + "_rel_err_vs_cudnn"] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                except Exception as e:  # report, keep going
                    row[name + "_error"] = f"{type(e).__name__}: {str(e)[:400]}"
        for key in [k for k in row if k.endswith("_ms")]:
            row[key.replace("_ms", "_tflops")] = causal_flops(t, hq, d) / (row[key] * 1e-3) / 1e12
        print(row, flush=True)
        rows.append(row)
    write_json(os.path.join(args.out, args.name + ".json"), {"env": env, "rows": rows})


if __name__ == "__main__":
    main()
