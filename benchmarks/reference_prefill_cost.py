"""Compile time, temporary memory and run time of the reference prefills that evaluations run through.

    python benchmarks/reference_prefill_cost.py [--compile-length 8192 --compile-batch 5]
                                                [--run-length 4096 --run-batch 1] [--flavors bf16,hyquant_k4v4]

`hyquant_jax.evaluation.run_prefill` on SmolLM2-135M (float32 compute, bf16
cache) with the shared prefill flavor of each method (bf16: exact causal
attention; hyquant_k4v4: hybrid INT8-QK prefill), through
`hyquant_jax.causal_chunks`. For each flavor it prints the compile time and
XLA's temporary-buffer size (`memory_analysis`) at the compile shape, and the
median wall time of 2 runs after a warm-up at the run shape. This is what
sized the accuracy benchmark's retrieval section (benchmarks/NOTES.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile-length", type=int, default=8192)
    p.add_argument("--compile-batch", type=int, default=5)
    p.add_argument("--run-length", type=int, default=4096)
    p.add_argument("--run-batch", type=int, default=1)
    p.add_argument("--flavors", default="bf16,hyquant_k4v4", help="methods whose prefill flavor to measure")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.accuracy import make_method
    from hyquant_jax.evaluation import prefill_flavor, run_prefill
    from models.checkpoint import load_model

    cfg, params, _ = load_model(None, jnp.float32)
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}")
    for name in args.flavors.split(","):
        flavor = prefill_flavor(make_method(name, jnp.bfloat16), jnp.bfloat16)
        b, t = args.compile_batch, args.compile_length
        lowered = run_prefill.lower(params, jnp.zeros((b, t), jnp.int32), jnp.full((b,), t, jnp.int32),
                                    config=cfg, prefill=flavor)
        t0 = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - t0
        temp = compiled.memory_analysis().temp_size_in_bytes / 2**30

        b, t = args.run_batch, args.run_length
        tokens, lengths = jnp.ones((b, t), jnp.int32), jnp.full((b,), t, jnp.int32)
        jax.block_until_ready(run_prefill(params, tokens, lengths, config=cfg, prefill=flavor))
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            jax.block_until_ready(run_prefill(params, tokens, lengths, config=cfg, prefill=flavor))
            times.append(time.perf_counter() - t0)
        print(f"{name} ({flavor.flavor} prefill): compile {compile_s:.1f} s and temporary memory {temp:.2f} GiB "
              f"at {args.compile_batch} x {args.compile_length}; run {np.median(times):.2f} s at "
              f"{args.run_batch} x {args.run_length}", flush=True)


if __name__ == "__main__":
    main()
