"""Which decode-state arrays move to another buffer from one `generate.decode` call to the next (session 47).

Runs prefill, then `decode` three times on the states it returned (as e2e.py's timed calls do), on a 2-layer
smoke model, and records per method the state leaves whose device address (`unsafe_buffer_pointer`) changed
between calls. Run it in the working tree and in `.gpu_run/decode_states_last` (the old output order,
`prepare_patched_tree.sh decode_states_last`) to compare; either output order of `decode` is understood:
  PYTHONPATH=. python benchmarks/decode_buffer_moves.py --out benchmarks/results --name decode_buffer_moves_s47
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.common import environment, write_json  # noqa: E402
from hyquant_jax.generate import decode, prefill  # noqa: E402
from hyquant_jax.model_attention import make_attention  # noqa: E402
from hyquant_jax.sampling import SamplingConfig  # noqa: E402
from models import ModelConfig, init_params  # noqa: E402

CONFIG = ModelConfig("llama", vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=32, max_position=4096)


def moved_leaves(method: str, calls: int = 3) -> dict:
    params = init_params(jax.random.PRNGKey(0), CONFIG)
    static = dict(config=CONFIG, attention=make_attention(method), sampling=SamplingConfig())
    key = jax.random.PRNGKey(0)
    lengths = jnp.array([256], jnp.int32)
    first, _, states = prefill(params, jnp.zeros((1, 256), jnp.int32), lengths, key, chunk=2048, max_len=512,
                               min_length=256, **static)
    previous, moved = None, []
    for _ in range(calls):
        result = decode(params, states, first, lengths, key, max_new_tokens=17, eos_ids=(), pad_id=0, **static)
        states_first = isinstance(result[0], tuple)  # the old order returned the tokens first
        states, out = (result[0], result[1]) if states_first else (result[2], result[0])
        lengths, first = result[3], out[:, -1]
        leaves = jax.tree_util.tree_leaves(states)
        now = [x.unsafe_buffer_pointer() for x in leaves]
        if previous is not None:
            moved.append([i for i, (a, b) in enumerate(zip(previous, now)) if a != b])
        previous = now
    return {"method": method, "states_first": states_first, "leaves": len(leaves),
            "leaf_shapes": [f"{x.dtype}{list(x.shape)}" for x in leaves], "moved_per_call": moved}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--name", default="decode_buffer_moves")
    p.add_argument("--methods", default="bf16,hyquant,kivi4,kivi2,uniform4")
    args = p.parse_args()
    rows = [moved_leaves(m) for m in args.methods.split(",")]
    for r in rows:
        print(f"{r['method']:>9} states_first={r['states_first']} moved per call: "
              f"{[len(m) for m in r['moved_per_call']]} of {r['leaves']}")
    write_json(os.path.join(args.out, f"{args.name}.json"), {"environment": environment(), "rows": rows})


if __name__ == "__main__":
    main()
