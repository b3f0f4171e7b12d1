"""What the hybrid decode step's per-step bookkeeping costs at B = 1 (issue 5: hyquant's step is ~0.6 ms longer
than bf16's at 1K, where the KV bytes are negligible).

Times `generate.decode` (e2e.py's model, states and timing, one process) for hyquant as it runs, then without
the window-ring flush (`begin_decode_step` returns the states unchanged: no `lax.cond` in the loop body, no
flush ever, `append(flush=False)`), then also without ring scores (`promote_flushed=False`: no ring logits,
no `accumulate_ring_scores`), then as it runs again (the spread). bf16 runs first as the yardstick.

"no_flush" removes more than the per-step branch: the flushes themselves (one per sequence every block_size =
64 steps) and the flush code from the compiled loop. Session 32 took out the branch alone (the branch only
before the steps that need it, flushes kept: `steps_until_begin`, on main since session 33, so "hyquant" here
now runs that way) and measured no gain on another machine under XLA's LHS scheduling, so most of this
probe's difference was not the branch as such (benchmarks/NOTES.md, session 32).

A measurement only: without the flush the ring overfills after its free slots (the e2e loop appends
(reps + 1) x steps tokens) and attention reads stale ring slots, so the outputs are meaningless; the work
per step is the same, so the timing is not. On the GPU box, from the repository root:
  PYTHONPATH=. python benchmarks/flush_cond_probe.py --out $OUT --prefixes 1024,32768 --steps 32 --reps 3
CPU check that the script runs: python benchmarks/flush_cond_probe.py --smoke --out /tmp/probe
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import e2e  # noqa: E402
from benchmarks.common import environment  # noqa: E402
from hyquant_jax.model_attention import HybridAttention  # noqa: E402


@dataclasses.dataclass(frozen=True)
class NoFlushAttention(HybridAttention):
    """HybridAttention whose once-per-step ring flush does nothing (see the module docstring)."""

    # No flush ever empties a ring: `generate.decode` is to call the (empty) begin every step rather than count
    # the steps until a flush (the count would stay at 1 once a ring is full).
    steps_until_begin = None

    def begin_decode_step(self, states: tuple, ctx) -> tuple:
        return states


def variants(attention: HybridAttention) -> list[tuple[str, object]]:
    """(name, attention) in run order; the first is repeated last for the spread."""
    no_flush = NoFlushAttention(attention.config, attention.backend, attention.prefill_backend,
                                attention.cache_dtype)
    no_scores = dataclasses.replace(no_flush, config=dataclasses.replace(attention.config, promote_flushed=False))
    return [("hyquant", attention), ("no_flush", no_flush), ("no_flush_no_ring_scores", no_scores),
            ("hyquant_again", attention)]


def main(argv=None) -> None:
    import jax
    import jax.numpy as jnp

    from models import init_params

    args = e2e.parse_args(argv)
    config = e2e._model(args)
    params = jax.block_until_ready(init_params(jax.random.PRNGKey(0), config, jnp.bfloat16))
    bf16, _ = e2e._attention(args, "bf16")
    hybrid, _ = e2e._attention(args, "hyquant")
    rows = []
    for prefix in e2e._ints(args.prefixes):
        for name, attention in [("bf16", bf16)] + variants(hybrid):
            row = e2e._guarded(lambda: e2e._decode_config(args, params, config, attention, name, prefix, 1),
                               method=name, prefix=prefix, batch=1)
            rows.append(row)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}.json")
    with open(path, "w") as f:
        json.dump({"environment": environment(), "rows": rows}, f, indent=1)
    for r in rows:
        print(f"{r['prefix']:>7} {r['method']:>24} {r.get('step_ms', float('nan')):8.3f} ms {r.get('error', '')[:80]}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
