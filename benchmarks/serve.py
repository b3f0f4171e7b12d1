"""Serving throughput and latency of the continuous-batching engine, bf16 cache against HyQuant, in one process.

A fixed random workload (prompt lengths drawn uniformly from --prompt-lengths, --max-tokens new tokens each,
Poisson arrivals at --rate requests per second, or all at once) runs through `hyquant_jax.serving.Engine` for
each method on the same model (random weights of the e2e benchmark's shape). Every prompt size and the decode
step are compiled in a warm-up pass first. Slots: --slots each, or with --cache-gib as many as that much cache
memory holds for the method (a slot's bytes are measured on a one-slot engine): the memory-bound comparison a
server makes. Per method: output tokens/s over the run, requests/s, time to first token and inter-token gaps
(p50/p90/p99), mean running slots, cache bytes.

  python -m benchmarks.serve --context 32768 --cache-gib 40 --requests 64 --prompt-lengths 2048:16384 --out $OUT
  CPU check: python -m benchmarks.serve --smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

from benchmarks.cases import MODELS, SMOKE_MODEL

METHODS = ("bf16", "hyquant")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    p.add_argument("--model", default="qwen3-8b", choices=sorted(MODELS), help="model shape (random bf16 weights)")
    p.add_argument("--layers", type=int, default=None, help="override the layer count (faster compiles)")
    p.add_argument("--requests", type=int, default=32, help="requests in the workload")
    p.add_argument("--prompt-lengths", default="1024:8192", metavar="MIN:MAX", help="prompt tokens, uniform")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per request")
    p.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    p.add_argument("--context", type=int, default=16384, help="tokens per slot (prompt + max tokens)")
    p.add_argument("--slots", type=int, default=8, help="slots per method (ignored with --cache-gib)")
    p.add_argument("--cache-gib", type=float, default=None, help="cache memory per method: slots = what fits")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="prompts longer than this prefill in chunks")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload")
    p.add_argument("--smoke", action="store_true", help="tiny model and workload: a CPU check that the script runs")
    p.add_argument("--out", default=None, help="folder of serve_<device>.json and its plot (default: "
                                                "benchmarks/results; --smoke: a temporary folder)")
    p.add_argument("--no-plot", action="store_true")
    if p.parse_known_args(argv)[0].smoke:  # the smoke workload, where the command line does not set it
        p.set_defaults(requests=6, prompt_lengths="20:300", max_tokens=8, context=512, slots=2, prefill_chunk=128,
                       layers=2)
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in args.methods:
        if m not in METHODS:
            p.error(f"--methods: unknown method {m!r}; choose from {', '.join(METHODS)}")
    try:
        low, high = (int(x) for x in args.prompt_lengths.split(":"))
    except ValueError:
        p.error(f"--prompt-lengths must be MIN:MAX (integers), got {args.prompt_lengths!r}")
    if not 1 <= low <= high or high + args.max_tokens > args.context:
        p.error(f"--prompt-lengths {low}:{high} with --max-tokens {args.max_tokens} must satisfy 1 <= MIN <= MAX and "
                f"MAX + max tokens <= --context ({args.context})")
    args.prompt_range = (low, high)
    for name in ("requests", "max_tokens", "slots", "prefill_chunk"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.rate < 0 or (args.cache_gib is not None and args.cache_gib <= 0):
        p.error("--rate must be >= 0 and --cache-gib > 0")
    return args


@dataclasses.dataclass(frozen=True)
class Arrival:
    at: float  # seconds after the start
    prompt: list[int]


def workload(args, vocab_size: int) -> list[Arrival]:
    """The requests of a run: random prompts of uniform lengths, Poisson arrival times (all 0 at --rate 0)."""
    import numpy as np

    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(args.prompt_range[0], args.prompt_range[1] + 1, args.requests)
    gaps = rng.exponential(1 / args.rate, args.requests) if args.rate > 0 else np.zeros(args.requests)
    times = np.cumsum(gaps) - gaps[0]
    return [Arrival(float(t), rng.integers(0, vocab_size, int(n)).tolist()) for t, n in zip(times, lengths)]


def percentiles(values, qs=(50, 90, 99)) -> dict:
    import numpy as np

    return {f"p{q}": float(np.percentile(values, q)) if len(values) else None for q in qs}


def replay(engine, arrivals: list[Arrival], max_tokens: int) -> dict:
    """Run the workload through the engine in wall-clock time; per-request token times -> the row's metrics."""
    pending, added, times, running = list(arrivals), {}, {}, []
    t0 = time.perf_counter()
    while pending or engine.busy:
        now = time.perf_counter() - t0
        while pending and pending[0].at <= now:
            request = pending.pop(0)
            added[engine.add_request(request.prompt, max_tokens=max_tokens)] = request.at
        if not engine.busy:
            time.sleep(max(0.0, pending[0].at - (time.perf_counter() - t0)))
            continue
        updates = engine.step()
        now = time.perf_counter() - t0
        running.append(engine.running)
        for rid, update in updates.items():
            times.setdefault(rid, []).extend([now] * len(update.tokens))
    makespan = time.perf_counter() - t0
    results = engine.run()
    tokens = sum(len(r.tokens) for r in results.values())
    ttft = [times[rid][0] - added[rid] for rid in added if times.get(rid)]
    gaps = [b - a for rid in added for a, b in zip(times.get(rid, []), times.get(rid, [])[1:]) if b > a]
    return dict(requests=len(added), output_tokens=tokens, seconds=makespan, tokens_per_s=tokens / makespan,
                requests_per_s=len(added) / makespan, ttft_s=percentiles(ttft), inter_token_s=percentiles(gaps),
                mean_running=sum(running) / max(len(running), 1))


def method_attention(method: str):
    import jax.numpy as jnp

    from hyquant_jax import make_attention

    return make_attention(method, cache_dtype=jnp.bfloat16)


def run_method(model, method: str, args, arrivals: list[Arrival]) -> dict:
    from hyquant_jax.serving import Engine

    attention = method_attention(method)
    kw = dict(context=args.context, prefill_chunk=args.prefill_chunk, eos_ids=(), max_queue=args.requests)
    one = Engine(model, attention, max_slots=1, **kw)
    one.compile()
    slot_bytes = one.cache_bytes()
    del one
    slots = args.slots if args.cache_gib is None else max(1, math.floor(args.cache_gib * 2**30 / slot_bytes))
    engine = Engine(model, attention, max_slots=slots, **kw)
    engine.compile()
    sizes = {}
    for a in arrivals:  # one prompt of each padded size compiles its prefill before the timed pass
        sizes.setdefault(engine.padded_size(len(a.prompt)), a.prompt)
    replay(engine, [Arrival(0.0, p) for p in sizes.values()], 2)
    row = dict(method=method, slots=slots, slot_bytes=slot_bytes, cache_bytes=engine.cache_bytes(),
               **replay(engine, arrivals, args.max_tokens))
    print(f"{method:8s} slots {slots:3d}  {row['tokens_per_s']:9.1f} tok/s  TTFT p50 {row['ttft_s']['p50']:.3f} s  "
          f"gap p50 {row['inter_token_s']['p50'] or 0:.4f} s  running {row['mean_running']:.1f}", flush=True)
    return row


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    names = [r["method"] for r in rows]
    for ax, (title, values) in zip(axes, (
            ("output tokens/s", [r["tokens_per_s"] for r in rows]),
            ("time to first token p50 (s)", [r["ttft_s"]["p50"] for r in rows]),
            ("slots", [r["slots"] for r in rows]))):
        ax.bar(names, values, color=["#888", "#2a7"][:len(rows)])
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    from benchmarks.common import default_name, environment, output_folder, write_json

    out = output_folder(args.out, args.smoke)
    import jax
    import jax.numpy as jnp

    from models import ModelConfig, init_model

    shape = dict(SMOKE_MODEL if args.smoke else MODELS[args.model])
    if args.layers:
        shape["num_layers"] = args.layers
    config = ModelConfig(**shape)
    model = init_model(jax.random.PRNGKey(0), config, jnp.float32 if args.smoke else jnp.bfloat16)
    arrivals = workload(args, config.vocab_size)
    rows = [run_method(model, m, args, arrivals) for m in args.methods]
    base = next((r for r in rows if r["method"] == "bf16"), None)
    for r in rows:
        r["tokens_per_s_x_bf16"] = r["tokens_per_s"] / base["tokens_per_s"] if base else None
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "no_plot", "prompt_range")}
    path = os.path.join(out, default_name("serve") + ".json")
    ok = write_json(path, dict(environment(), settings=settings, rows=rows))
    if not args.no_plot:
        plot(rows, path.removesuffix(".json") + ".png")
    print(f"wrote {path}")
    return 0 if ok else 2


if __name__ == "__main__":
    from benchmarks.common import run_script

    run_script(main)
