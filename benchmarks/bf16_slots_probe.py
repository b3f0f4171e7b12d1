"""Does the bf16 baseline's decode attention depend on the cache's slot count? (issue 5: a fast bf16 baseline)

The bf16 decode step attends over all S slots of its cache (`models.attention.grouped_attention`, keys masked
to positions <= the step's); S = `cache_slots(max_len)`, max_len rounded up to SLOT_ALIGN. With SLOT_ALIGN
256, the whole-model bf16 step at a 128K prefix took 16.2 ms with S = 131328 (= 256 x 513; `e2e.py --steps
32`) and 10.3 ms with S = 131584 (= 512 x 257; `--steps 64`), while hyquant took 8.0-8.2 ms either way, and
at 1K / 32K the same two choices of --steps changed nothing (`results/e2e_h200_b1_slots_s25_steps{32,64}.json`).
SLOT_ALIGN is now 512, which puts every e2e configuration on a slot count measured fast. This script times the
attention alone (one layer: B=1, Qwen3-8B heads 32 / 8, head_dim 128, the query at position S - 200) at each
slot count, in one process inside a jitted loop, to find the actual rule (which sizes are slow, and whether
512 avoids all of them).

  python benchmarks/bf16_slots_probe.py --out $OUT [--slots 131072,131328,...]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import environment, time_in_loop, write_json  # noqa: E402
from models.attention import grouped_attention  # noqa: E402

DEFAULT_SLOTS = (32768, 33024, 33280, 65536, 65792, 66048, 131072, 131328, 131584, 131840, 132096, 132608, 133120,
                 135168)


def attention_step(q, k, v, position):
    """The bf16 baseline's decode attention (as `BF16Attention.decode`, without the cache write)."""
    s = k.shape[2]
    mask = (jnp.arange(s)[None, :] <= position[:, None])[:, None, None, None, :]
    return grouped_attention(q[:, :, None], k, v, mask)[:, :, 0]


def probe(slots, q_heads=32, kv_heads=8, head_dim=128, iters=50, reps=5) -> list[dict]:
    """[{"slots", "ms", "tb_per_s"}] for each slot count (bytes = the K and V buffers, read once per call)."""
    rows = []
    for s in slots:
        if s < 256:
            raise ValueError(f"bf16_slots_probe: every slot count must be >= 256, got {s}")
        key = jax.random.PRNGKey(s)
        k, v = (jax.random.normal(kk, (1, kv_heads, s, head_dim), jnp.bfloat16) for kk in jax.random.split(key))
        q = jax.random.normal(key, (1, q_heads, head_dim), jnp.bfloat16)
        position = jnp.array([s - 200], jnp.int32)
        seconds = time_in_loop(lambda q, k, v: attention_step(q, k, v, position), q, (k, v), iters, reps)
        rows.append({"slots": s, "ms": 1e3 * seconds, "tb_per_s": (k.nbytes + v.nbytes) / seconds / 1e12})
        print(rows[-1], flush=True)
        del k, v
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--name", default="bf16_slots_probe_h200")
    p.add_argument("--slots", default=",".join(map(str, DEFAULT_SLOTS)), help="comma-separated slot counts")
    p.add_argument("--smoke", action="store_true", help="small shapes, 2 iterations (CPU check of the script)")
    args = p.parse_args(argv)
    try:
        slots = [int(x) for x in args.slots.split(",") if x.strip()]
    except ValueError:
        p.error(f"--slots must be comma-separated integers, got {args.slots!r}")
    if args.smoke:
        rows = probe([256, 512], q_heads=4, kv_heads=2, head_dim=64, iters=2, reps=1)
    else:
        rows = probe(slots)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, args.name + ".json"), {"env": environment(), "rows": rows})


if __name__ == "__main__":
    main()
