"""Which arrays move to another buffer from one `generate.decode` call to the next (sessions 47 and 48).

Runs prefill, then `decode` three times on the states it returned (as e2e.py's timed calls do), on a 2-layer
smoke model, and records per method the state leaves whose device address (`unsafe_buffer_pointer`) changed
between calls, and which of the call's other arrays did: its inputs first and lengths, its outputs tokens,
counts, cache lengths and steps. With `--in-place` (session 48) it also runs `decode_in_place` chained with
`last_tokens`, as e2e.py --in-place does. Run it in the working tree and in `.gpu_run/decode_states_last` (the
old output order, `prepare_patched_tree.sh decode_states_last`) to compare; either output order of `decode` is
understood:
  PYTHONPATH=. python benchmarks/decode_buffer_moves.py --out benchmarks/results --name decode_buffer_moves_s48 \
    --in-place
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


IO_NAMES = ("first", "lengths", "tokens", "counts", "cache_lengths", "steps")


def moved_leaves(method: str, calls: int = 3, in_place: bool = False) -> dict:
    from hyquant_jax import generate as _  # noqa: F401 - imports the module (the package exports a function)

    generate = sys.modules["hyquant_jax.generate"]
    params = init_params(jax.random.PRNGKey(0), CONFIG)
    static = dict(config=CONFIG, attention=make_attention(method), sampling=SamplingConfig())
    key = jax.random.PRNGKey(0)
    lengths = jnp.array([256], jnp.int32)
    first, _, states = prefill(params, jnp.zeros((1, 256), jnp.int32), lengths, key, chunk=2048, max_len=512,
                               min_length=256, **static)
    out, steps, counts = jnp.zeros((1, 17), jnp.int32), jnp.zeros((), jnp.int32), None
    loop = dict(max_new_tokens=17, eos_ids=(), pad_id=0, **static)
    previous, moved, io_moved = None, [], []
    for call in range(calls):
        if in_place:
            if call:
                first = generate.last_tokens(out, counts)
            inputs = [first.unsafe_buffer_pointer(), lengths.unsafe_buffer_pointer()]
            result = generate.decode_in_place(params, states, first, lengths, key, (out, steps), **loop)
        else:
            inputs = [first.unsafe_buffer_pointer(), lengths.unsafe_buffer_pointer()]
            result = decode(params, states, first, lengths, key, **loop)
        states_first = isinstance(result[0], tuple)  # the old order returned the tokens first
        if states_first:
            states, out, counts, lengths, steps = result
        else:
            out, counts, states, lengths, steps = result
        if not in_place:
            first = out[:, -1]
        leaves = jax.tree_util.tree_leaves(states)
        now = [x.unsafe_buffer_pointer() for x in leaves]
        io = inputs + [x.unsafe_buffer_pointer() for x in (out, counts, lengths, steps)]
        if previous is not None:
            moved.append([i for i, (a, b) in enumerate(zip(previous[0], now)) if a != b])
            io_moved.append([n for n, a, b in zip(IO_NAMES, previous[1], io) if a != b])
        previous = now, io
    return {"method": method, "function": "decode_in_place" if in_place else "decode",
            "states_first": states_first, "leaves": len(leaves),
            "leaf_shapes": [f"{x.dtype}{list(x.shape)}" for x in leaves], "moved_per_call": moved,
            "io_moved_per_call": io_moved}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--name", default="decode_buffer_moves")
    p.add_argument("--methods", default="bf16,hyquant,kivi4,kivi2,uniform4")
    p.add_argument("--in-place", action="store_true", help="also run generate.decode_in_place")
    args = p.parse_args()
    rows = [moved_leaves(m, in_place=in_place) for in_place in ((False, True) if args.in_place else (False,))
            for m in args.methods.split(",")]
    for r in rows:
        print(f"{r['function']:>15} {r['method']:>9} states_first={r['states_first']} state leaves moved per call: "
              f"{[len(m) for m in r['moved_per_call']]} of {r['leaves']}; other arrays: {r['io_moved_per_call']}")
    write_json(os.path.join(args.out, f"{args.name}.json"), {"environment": environment(), "rows": rows})


if __name__ == "__main__":
    main()
