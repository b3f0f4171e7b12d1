"""Where the time of one end-to-end decode step (or prefill) goes: a GPU kernel breakdown from the JAX profiler.

Builds the e2e benchmark's model (random weights, `benchmarks.e2e`) and
decode states, runs the jitted decode loop once to compile, then once more
under `jax.profiler.trace`, and reads the trace's GPU kernel events: per
kernel name, launches and microseconds per decode step, plus the share of the
loop's wall time during which no kernel ran (launch gaps). `--sections
prefill` does the same for one whole-prompt prefill (+ Freeze) of B = 1
prompt: the "per step" fields are then per prefill call. Writes
OUT/NAME.json. On the GPU box, from the repository root:
  python -m benchmarks.profile_e2e --out $OUT --methods bf16,hyquant --prefixes 1024,32768
  python -m benchmarks.profile_e2e --out $OUT --sections prefill --prefixes 4096 \
      --prefill-backend mosaic --prefill-block 128
"""

from __future__ import annotations

import argparse
import gzip
import json
import os

from benchmarks.cases import MODELS
from benchmarks.common import check_out, environment, run_script, write_json
from benchmarks.e2e import options
from benchmarks.e2e.states import decode_states
from benchmarks.trace import breakdown, profiled


def profile_config(args, model, attention, method, prefix, batch) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hyquant_jax import SamplingConfig
    from hyquant_jax.generate import decode
    from models import split_model

    config = model.config
    model_def, weights = split_model(model)
    max_len = prefix + 2 * args.steps + 8
    states = decode_states(attention, config, prefix, batch, max_len)
    lengths = jnp.full((batch,), prefix, jnp.int32)
    first = jax.random.randint(jax.random.PRNGKey(1), (batch,), 0, config.vocab_size, jnp.int32)
    key = jax.random.PRNGKey(2)
    static = dict(attention=attention, sampling=SamplingConfig(), max_new_tokens=args.steps + 1, eos_ids=(), pad_id=0,
                  layer_kernels=args.layer_kernels)
    states_shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), states)
    states, out, _, lengths, _ = decode(model_def, weights, states, first, lengths, key, **static)
    jax.block_until_ready(out)
    (states, out, _, lengths, n), wall, events = profiled(
        lambda s=states, last=out[:, -1], n=lengths: jax.block_until_ready(
            decode(model_def, weights, s, last, n, key, **static)))
    steps = int(n)
    del states
    if args.dump_events:
        stem = os.path.join(args.out, f"{args.name}_%s_{method}_{prefix}")
        _dump_events(events, stem % "events" + ".json.gz")
        hlo = decode.lower(model_def, weights, states_shapes, first, lengths, key, **static).compile().as_text()
        with gzip.open(stem % "hlo" + ".txt.gz", "wt") as f:
            f.write(hlo)
    return dict(section="decode", method=method, prefix=prefix, batch=batch, steps=steps,
                wall_ms_per_step=1e3 * wall / steps,
                **breakdown(events, steps, args.top), lengths=np.asarray(lengths).tolist())


def profile_prefill(args, model, attention, method, prefix) -> dict:
    import jax
    import jax.numpy as jnp

    from hyquant_jax import SamplingConfig
    from hyquant_jax.generate import prefill
    from models import split_model

    config = model.config
    model_def, weights = split_model(model)
    tokens = jax.random.randint(jax.random.PRNGKey(3), (1, prefix), 0, config.vocab_size, jnp.int32)
    lengths = jnp.full((1,), prefix, jnp.int32)
    static = dict(attention=attention, sampling=SamplingConfig(), chunk=prefix, max_len=prefix + 8)
    compiled = prefill.lower(model_def, weights, tokens, lengths, jax.random.PRNGKey(0), **static).compile()
    jax.block_until_ready(compiled(weights, tokens, lengths, jax.random.PRNGKey(0)))
    _, wall, events = profiled(
        lambda: jax.block_until_ready(compiled(weights, tokens, lengths, jax.random.PRNGKey(1))))
    return dict(section="prefill", method=method, prefix=prefix, batch=1, steps=1, wall_ms_per_step=1e3 * wall,
                **breakdown(events, 1, args.top))


def _dump_events(events: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    t0 = events[0]["ts"] if events else 0.0
    rows = [[e["name"][:80], e.get("tid"), round(e["ts"] - t0, 3), round(e["dur"], 3)] for e in events]
    with gzip.open(path, "wt") as f:
        json.dump({"columns": ["name", "stream", "start_us", "dur_us"], "events": rows}, f)


def _attention(e2e_args, method):
    """benchmarks.e2e's attention of `method`; an unknown name is a ValueError naming the methods."""
    if method not in options.METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {sorted(options.METHODS)}")
    return options.method_attention(e2e_args, method)[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the profile (not a results file)")
    p.add_argument("--name", default="profile_e2e")
    p.add_argument("--methods", default="bf16,hyquant",
                   help="benchmarks.e2e methods, comma-separated")
    p.add_argument("--prefixes", default="1024,32768")
    p.add_argument("--batches", default="1", help="batch sizes, each profiled at every prefix")
    p.add_argument("--model", default="qwen3-8b", choices=sorted(MODELS))
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--top", type=int, default=25, help="kernels listed per config")
    p.add_argument("--sections", default="decode", help="decode and/or prefill, comma-separated")
    p.add_argument("--prefill-backend", default="auto", help="as in benchmarks.e2e")
    p.add_argument("--prefill-block", type=int, default=64, help="as in benchmarks.e2e")
    p.add_argument("--smoke", action="store_true", help="benchmarks.e2e's tiny model (a CPU check of the script)")
    p.add_argument("--dump-events", action="store_true",
                   help="also write each decode config's GPU events in order (name, stream, start, duration in us) "
                        "to OUT/NAME_events_METHOD_PREFIX.json.gz, to see which launches idle gaps sit between, "
                        "and the compiled decode loop's HLO (kernel names = fusion names) to "
                        "OUT/NAME_hlo_METHOD_PREFIX.txt.gz")
    p.add_argument("--layer-kernels", default="auto", choices=("auto", "xla"), help="as in benchmarks.e2e")
    args = p.parse_args()
    check_out(args.out)
    import jax
    import jax.numpy as jnp

    from models import init_model

    e2e_args = options.parse_args(["--model", args.model, "--sections", "b1", "--prefill-backend", args.prefill_backend,
                               "--prefill-block", str(args.prefill_block)]
                              + (["--layers", str(args.layers)] if args.layers else [])
                              + (["--smoke"] if args.smoke else []))
    config = options.model_config(e2e_args)
    model = init_model(jax.random.PRNGKey(0), config, jnp.bfloat16)
    results = {"environment": environment(), "model": args.model,
               "layer_kernels": args.layer_kernels, "configs": []}
    sections = args.sections.split(",")
    for method in args.methods.split(","):
        attention = _attention(e2e_args, method)
        if "prefill" in sections:
            for prefix in options.ints(args.prefixes):
                row = profile_prefill(args, model, attention, method, prefix)
                results["configs"].append(row)
                print(f"== prefill {method} {prefix}: wall {row['wall_ms_per_step']:.2f} ms, kernels "
                      f"{row['kernel_us_per_step'] / 1e3:.2f} ms ({row['kernels_per_step']:.0f} launches)", flush=True)
                for k in row["top"][:20]:
                    print(f"   {k['us_per_step']:8.1f} us  x{k['launches_per_step']:5.1f}  {k['name'][:90]}")
                print(f"   idle {row['idle_share'] or 0:.0%} of the span; idle time by the kernel that ends it:")
                for k in row["idle_before"][:15]:
                    print(f"   {k['idle_us_per_step']:8.1f} us  x{k['gaps_per_step']:5.1f}  {k['name'][:90]}")
        for batch in (options.ints(args.batches) if "decode" in sections else []):
            for prefix in options.ints(args.prefixes):
                row = profile_config(args, model, attention, method, prefix, batch)
                results["configs"].append(row)
                print(f"== {method} B{batch} {prefix}: wall {row['wall_ms_per_step']:.2f} ms/step, kernels "
                      f"{row['kernel_us_per_step'] / 1e3:.2f} ms ({row['kernels_per_step']:.0f} launches), "
                      f"idle {row['idle_share'] or 0:.0%}", flush=True)
                for k in row["top"][:12]:
                    print(f"   {k['us_per_step']:8.1f} us  x{k['launches_per_step']:5.1f}  {k['name'][:90]}")
    path = os.path.join(args.out, f"{args.name}.json")
    write_json(path, results, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    run_script(main)
