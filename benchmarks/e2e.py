"""End-to-end decode benchmark: Qwen3-8B/32B-shaped model with random bf16 weights, bf16 vs HyQuant vs KIVI.

The same model code and the same jitted `hyquant_jax.generate.decode` loop
(`lax.while_loop`, per-layer caches donated and updated in place) run with
each KV cache; only the cache and its attention differ:
  bf16     exact attention over a preallocated bf16 cache (XLA einsum decode)
  hyquant  HybridKVCache + hyquant_jax.decode_step (Pallas kernel on GPU)
  kivi4/kivi2/uniform4  quantized HybridKVCache, dequantize then attend (XLA)

Sections (each method runs in its own subprocess, so peak memory is per
method and an out-of-memory error ends only that method's sweep):
  b1       B = 1 decode at each of --prefixes (paper Table 8)
  batch    decode at --batch-prefix for B = --batches until out of memory,
           with peak GPU memory (paper Table 6)
  prefill  time of `hyquant_jax.generate.prefill` (B = 1) at --prefill-prefixes,
           the whole prompt at once (hyquant: hybrid prefill + Freeze) or
           with --prefill-chunk in chunks (every method: exact attention over
           the prompt so far, then VTI + Freeze for hyquant)
Decode caches are built directly from random keys/values (Freeze for the
quantized caches, sized for prompts of the prefix's length, `freeze(...,
min_length=prefix)`, as bf16's is sized for prefix + steps; a batch tiles
one sequence's cache), not by running the
prefill, so every prefix costs one decode compilation only. Each decode
config runs --steps steps once to compile and warm up, then --reps timed
loops of --steps steps; per-step time = median loop time / steps (inside
jit, no dispatch gaps). The median leaves out a once-per-call cost: with the
Mosaic kernel in the graph, the first timed call runs slower than the next
ones (docs/design.md, "Device loops and command buffers"); `step_ms_mean`,
the mean over all timed steps, keeps it. A cache with a window ring
(hyquant, KIVI, uniform) flushes each sequence's oldest block every
block_size steps (64 for hyquant): --steps should be a multiple of that, so
that every timed loop holds the same number of flushes (a warning
otherwise). The byte floor of a step is (weights read + KV cache
bytes) / --bandwidth-tbs: weights are every parameter except the embedding
table (only B rows of it are read); KV bytes are the cache's used bytes
(bf16: 2 * layers * Hkv * D * 2 bytes per token).

Several GPUs (--mesh data=D,model=M, `hyquant_jax.sharding`): weights are
split Megatron-style over M GPUs (attention by KV heads) and created
directly in that layout, caches are split by batch over D and by KV heads
over M, and every layer's attention (the Pallas kernels included) runs per
shard under shard_map. Each section then runs B = D sequences where it says
B = 1 (one per data shard); batch sizes must be multiples of D. Weights read
per step and the byte floor are per device: (the device's weight shards +
KV bytes / (D * M)) / bandwidth; all-reduce time is not in the floor. Peak
memory is the largest over the mesh's devices.

Writes OUT/e2e_<device>.json and .png (--name changes the stem; OUT is benchmarks/results by default).
Run on the GPU box from the repository root (the package need not be installed):
  python -m benchmarks.e2e --out benchmarks/results
Every decode config compiles the 36-layer decode loop once (tens of seconds),
so the whole default sweep takes well over 10 minutes; split it with
--sections / --methods / --prefixes / --batches, e.g. a short run:
  python -m benchmarks.e2e --out $OUT --name part1 --sections b1,prefill --prefixes 1024,32768 \\
      --prefill-prefixes 32768 --steps 32 --reps 2
  python -m benchmarks.e2e --out $OUT --name part2 --sections batch --batches 1,16,32 \\
      --no-until-oom --steps 16 --reps 2
then merge the parts (here, on any machine):
  python -m benchmarks.e2e --out benchmarks/results --combine part1.json part2.json
Qwen3-32B shape (64 layers, hidden 5120, 64/8 heads, FFN 25600) on 2 GPUs, e.g.:
  python -m benchmarks.e2e --out $OUT --name q32_tp2_b1 --model qwen3-32b --mesh data=1,model=2 \
      --sections b1 --prefixes 32768 --methods bf16,hyquant --steps 32 --reps 2
CPU check that the script works: python -m benchmarks.e2e --smoke --out /tmp/e2e
(add --mesh data=2,model=2: the smoke run then asks XLA for 4 virtual CPU devices)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.cases import MODELS, SMOKE_MODEL

METHODS = ("bf16", "hyquant", "kivi4", "kivi2", "uniform4")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="folder for the JSON and the plot (default: benchmarks/results; a "
                                                 "temporary folder with --smoke)")
    p.add_argument("--name", default=None, help="file stem of the JSON and PNG (default: e2e_<device>, e.g. e2e_h100, "
                                                "e2e_h200x2 with a mesh of two)")
    p.add_argument("--sections", default="b1,batch,prefill", help="comma list of b1, batch, prefill")
    p.add_argument("--methods", default="bf16,hyquant,kivi4", help=f"comma list from {METHODS}")
    p.add_argument("--prefixes", default="1024,2048,4096,8192,16384,32768,131072",
                   help="cached tokens per sequence for the B=1 decode section")
    p.add_argument("--batch-prefix", type=int, default=32768, help="cached tokens per sequence of the batch sweep")
    p.add_argument("--batches", default="1,4,8,16,32,48,64",
                   help="batch sizes of the sweep, ascending; with --until-oom it goes on past the last one in "
                        "steps of the last gap until out of memory or --max-batch")
    p.add_argument("--until-oom", action=argparse.BooleanOptionalAction, default=True,
                   help="continue the batch sweep past --batches until out of memory")
    p.add_argument("--max-batch", type=int, default=512, help="stop the batch sweep here even without OOM")
    p.add_argument("--prefill-prefixes", default="4096,32768", help="prompt lengths of the prefill section")
    p.add_argument("--prefill-chunk", type=int, default=0,
                   help="prefill section: run the prompt in chunks of this many tokens (chunked prefill, "
                        "`generate(prefill_chunk=...)`; must divide every --prefill-prefixes); 0: the whole prompt "
                        "in one call")
    p.add_argument("--chunk-impl", default="auto", choices=("auto", "xla", "triton"),
                   help="chunked prefill's attention for bf16 and hyquant (their `chunk_impl`): XLA's online "
                        "softmax over key blocks, the fused Pallas kernel (`pallas_kernels/prefix.py`), or auto "
                        "(the library's default: the kernel on a GPU); rows record the one that ran")
    p.add_argument("--steps", type=int, default=64, help="decode steps per timed loop")
    p.add_argument("--reps", type=int, default=3, help="timed loops per config (median)")
    p.add_argument("--model", default="qwen3-8b", choices=sorted(MODELS),
                   help="model shape (random bf16 weights): qwen3-8b (36 layers) or qwen3-32b (64 layers, hidden 5120, "
                        "64/8 heads, FFN 25600)")
    p.add_argument("--mesh", default=None, metavar="data=D,model=M",
                   help="shard over D*M GPUs: batch over D, weights and KV heads over M (M must divide the 8 KV heads)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the layer count (faster compiles; results then are not the full model's)")
    from hyquant_jax.backends import BACKENDS  # jax import only: no device is initialised

    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="HyQuant decode backend (auto: Pallas on GPU; mosaic decodes as pallas)")
    p.add_argument("--prefill-backend", default=None, choices=BACKENDS,
                   help="HyQuant prefill backend (default: --backend; mosaic needs a --prefill-block multiple of 64)")
    p.add_argument("--prefill-block", type=int, default=64, help="HyQuantConfig.prefill_block (must divide --window)")
    p.add_argument("--mosaic-blocks-per-sm", type=int, default=None,
                   help="HyQuant decode: the Mosaic low-bit kernel's blocks per multiprocessor (DecodeTuning; "
                        "default: the library's, 2)")
    p.add_argument("--mosaic-splits", type=int, default=None,
                   help="HyQuant decode: a fixed split count per (sequence, KV head) for the Mosaic low-bit kernel "
                        "(DecodeTuning.mosaic_splits, overrides --mosaic-blocks-per-sm; default: "
                        "decode_launch.mosaic_splits)")
    p.add_argument("--key-bits", type=int, default=4)
    p.add_argument("--value-bits", type=int, default=4)
    from hyquant_jax.config import SCHEMES, HyQuantConfig  # jax import only: no device is initialised

    p.add_argument("--scheme", default=HyQuantConfig.scheme, choices=SCHEMES)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--rho", type=float, default=0.05)
    p.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM bandwidth for the byte floor (H200: 4.8)")
    p.add_argument("--layer-kernels", default="auto", choices=("auto", "xla"),
                   help="decode steps' norms and RoPE: Pallas kernels where they fit (auto) or XLA ops")
    p.add_argument("--stop-token", action="store_true",
                   help="decode with a stop token that never occurs (id = vocab size) as `generate` decodes with "
                        "EOS ids: the loops then stop on data, so XLA does not know their trip count")
    p.add_argument("--fresh-states", action="store_true",
                   help="give every timed loop a copy of the states in new buffers (the previous ones kept "
                        "alive), as each request's prefill gives `generate` new caches: XLA then updates its "
                        "CUDA graphs for new addresses in every timed call")
    p.add_argument("--in-place", action="store_true",
                   help="time `generate.decode_in_place` (first, lengths and the previous call's tokens and step "
                        "count donated too) instead of `decode`: every buffer of a call, inputs and outputs, then "
                        "stays where the previous call's was, as a server keeping its decode buffers would")
    p.add_argument("--mem-fraction", default="0.95", help="XLA_PYTHON_CLIENT_MEM_FRACTION of the workers")
    p.add_argument("--smoke", action="store_true", help="tiny model and prefixes: a CPU check that the script runs")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                   help="run nothing: merge the rows of these result files (of earlier, partial runs) into "
                        "OUT/NAME.json and redraw the plot")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: JSON spec of one worker
    args = p.parse_args(argv)
    if args.smoke:
        args.prefixes, args.batch_prefix, args.batches = "256,512", 512, "1,2"
        args.prefill_prefixes, args.steps, args.reps, args.until_oom = "256", 4, 1, False
    for m in args.methods.split(","):
        if m not in METHODS:
            p.error(f"--methods: unknown method {m!r}; choose from {METHODS}")
    for s in args.sections.split(","):
        if s not in ("b1", "batch", "prefill"):
            p.error(f"--sections: unknown section {s!r}")
    bad = [n for n in _ints(args.prefill_prefixes) if args.prefill_chunk and n % args.prefill_chunk]
    if args.prefill_chunk < 0 or bad:
        p.error(f"--prefill-chunk must be 0 or divide every --prefill-prefixes, got {args.prefill_chunk} for {bad}")
    for flag, value in (("--mosaic-blocks-per-sm", args.mosaic_blocks_per_sm), ("--mosaic-splits", args.mosaic_splits)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    if args.mesh:
        from hyquant_jax.sharding import check_model_fits, parse_mesh_shape  # no device is initialised

        try:
            check_model_fits(_model(args), parse_mesh_shape(args.mesh)["model"])
        except ValueError as e:
            p.error(f"--mesh: {e}")
    return args


# --------------------------------------------------------------------------- worker (one section, one method)


def _model(args):
    from models import ModelConfig

    shape = dict(SMOKE_MODEL if args.smoke else MODELS[args.model])
    if args.layers:
        shape["num_layers"] = args.layers
    return ModelConfig(**shape)


def _attention(args, method):
    import jax.numpy as jnp

    from hyquant_jax import HyQuantConfig, make_attention

    hq = HyQuantConfig(key_bits=args.key_bits, value_bits=args.value_bits, scheme=args.scheme, window=args.window,
                       rho=args.rho, prefill_block=args.prefill_block)
    tuning = None
    knobs = dict(mosaic_blocks_per_sm=args.mosaic_blocks_per_sm, mosaic_splits=args.mosaic_splits)
    if any(v is not None for v in knobs.values()):
        from hyquant_jax.decode_launch import DecodeTuning

        tuning = DecodeTuning(**{k: v for k, v in knobs.items() if v is not None})
    attention = make_attention(method, hq, backend=args.backend, prefill_backend=args.prefill_backend,
                               cache_dtype=jnp.bfloat16, decode_tuning=tuning)
    if hasattr(attention, "chunk_impl"):  # bf16 and hyquant (the quantized baselines' chunks stay XLA)
        attention = dataclasses.replace(attention, chunk_impl=args.chunk_impl)
    return attention, hq


def _is_oom(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def _mesh(args):
    """The worker's device mesh (None: one device)."""
    if not args.mesh:
        return None
    from hyquant_jax.sharding import make_mesh

    return make_mesh(args.mesh)


def _data_size(mesh) -> int:
    if mesh is None:
        return 1
    from hyquant_jax.sharding import mesh_sizes

    return mesh_sizes(mesh)[0]


def _devices(mesh) -> list:
    import jax

    return [jax.devices()[0]] if mesh is None else list(mesh.devices.flat)


def _peak_bytes(mesh=None) -> int | None:
    """Peak memory in use, the largest over the devices (None when the platform does not report it)."""
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in _devices(mesh)]
    peaks = [p for p in peaks if p is not None]
    return max(peaks) if peaks else None


def _put(x, mesh, batch_axis=True):
    """x on the mesh: split over "data" along axis 0 (or replicated); as is without a mesh."""
    if mesh is None:
        return x
    from hyquant_jax import sharding

    return sharding.put_batch(x, mesh) if batch_axis else sharding.put_replicated(x, mesh)


def _layer_cache(attention, config, key, prefix, max_len):
    """One layer's decode state holding `prefix` random tokens for one sequence."""
    import jax
    import jax.numpy as jnp

    from hyquant_jax import freeze
    from hyquant_jax.model_attention import HybridAttention
    from models import KVBuffer
    from models.attention import cache_slots

    kk, kv, kq = jax.random.split(key, 3)
    shape = (1, config.num_kv_heads, prefix, config.head_dim)
    k = jax.random.normal(kk, shape, jnp.bfloat16)
    v = jax.random.normal(kv, shape, jnp.bfloat16)
    lengths = jnp.array([prefix], jnp.int32)
    if not hasattr(attention, "config"):  # bf16
        pad = ((0, 0), (0, 0), (0, cache_slots(max_len) - prefix), (0, 0))
        return KVBuffer(jnp.pad(k, pad), jnp.pad(v, pad))
    if isinstance(attention, HybridAttention):
        from hyquant_jax.vti import tail_query_count

        q_tail = jax.random.normal(kq, (1, config.num_heads, tail_query_count(attention.config), config.head_dim),
                                   jnp.bfloat16)
        return freeze(k, v, lengths, q_tail, attention.config, max_len, min_length=prefix)
    empty = (jnp.zeros((1, config.num_kv_heads, 0), jnp.int32), jnp.zeros((1,), jnp.int32))
    return freeze(k, v, lengths, None, attention.config, max_len, vl=empty, min_length=prefix)


def _states(attention, config, prefix, batch, max_len, seed=0, mesh=None):
    """Per-layer decode states: one random sequence's cache tiled to `batch` (split over the mesh when given)."""
    import jax
    import jax.numpy as jnp

    def tile(one):
        return jax.tree_util.tree_map(lambda x: jnp.repeat(x, batch, axis=0), one)

    tiled = None
    states = []
    for i in range(config.num_layers):
        one = _layer_cache(attention, config, jax.random.PRNGKey(seed * 1000 + i), prefix, max_len)
        if mesh is not None:
            if tiled is None:  # one compiled tiling for every layer, written straight into the shards
                from hyquant_jax.sharding import named, state_specs

                tiled = jax.jit(tile, out_shardings=named(mesh, state_specs(one)))
            one = tiled(one)
        elif batch > 1:
            one = tile(one)
        states.append(jax.block_until_ready(one))
    return tuple(states)


def flush_period(attention) -> int | None:
    """Steps between two window flushes of one sequence (the ring's block size), None without a ring."""
    inner = getattr(attention, "inner", attention)
    config = getattr(inner, "config", None)
    if config is None or not hasattr(inner, "begin_decode_step"):
        return None
    return config.block_size


def _decode_config(args, model, attention, method, prefix, batch, mesh=None):
    """Time the decode loop for one (prefix, batch); returns a result dict.

    model: a `models.Decoder` (on the mesh when given); attention: the (possibly sharded) attention of the
    decode loop; the states are built with the unsharded one inside it.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hyquant_jax import SamplingConfig
    from hyquant_jax.generate import decode, decode_in_place, kv_cache_bytes, last_tokens
    from hyquant_jax.sharding import check_batch_fits, shard_bytes
    from models import split_model

    config = model.config
    model_def, weights = split_model(model)
    check_batch_fits(batch, _data_size(mesh))
    steps = args.steps
    period = flush_period(attention)
    if period and steps % period:
        print(f"warning: {method}: --steps {steps} is not a multiple of the window flush period ({period} steps); "
              "timed loops then differ in their flushes and the median need not amortize them", flush=True)
    max_len = prefix + (args.reps + 1) * steps + 8
    states = _states(getattr(attention, "inner", attention), config, prefix, batch, max_len, mesh=mesh)
    lengths = _put(jnp.full((batch,), prefix, jnp.int32), mesh)
    first = _put(jax.random.randint(jax.random.PRNGKey(1), (batch,), 0, config.vocab_size, jnp.int32), mesh)
    key = _put(jax.random.PRNGKey(2), mesh, batch_axis=False)
    static = dict(attention=attention, sampling=SamplingConfig(), max_new_tokens=steps + 1,
                  eos_ids=(config.vocab_size,) if args.stop_token else (), pad_id=0,
                  layer_kernels=args.layer_kernels)
    kv_start = kv_cache_bytes(attention, states, np.asarray(jnp.copy(lengths)))  # a copy: lengths may be donated
    out = n = None  # in place: the previous call's tokens and step count, whose buffers receive this call's
    if args.in_place:
        out = _put(jnp.zeros((batch, steps + 1), jnp.int32), mesh)
        n = _put(jnp.zeros((), jnp.int32), mesh, batch_axis=False)

    def call(states, first, lengths, out, n):
        if args.in_place:
            return decode_in_place(model_def, weights, states, first, lengths, key, (out, n), **static)
        return decode(model_def, weights, states, first, lengths, key, **static)

    t0 = time.perf_counter()
    states, out, counts, lengths, n = call(states, first, lengths, out, n)
    jax.block_until_ready(out)
    compile_s = time.perf_counter() - t0
    times, kept = [], None
    for _ in range(args.reps):
        first = last_tokens(out, counts) if args.in_place else out[:, -1]  # in place: in the counts' buffer
        if args.fresh_states:
            kept = states  # alive through this call, so the copies cannot take its addresses
            states = jax.block_until_ready(jax.tree_util.tree_map(jnp.copy, states))
        t0 = time.perf_counter()
        states, out, counts, lengths, n = call(states, first, lengths, out, n)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    assert int(n) == steps, (int(n), steps)
    # after the timing, on arrays alive now (in place, first was donated; counts has its shape): a cache hit
    temp = _temp_bytes(decode_in_place if args.in_place else decode,
                       (model_def, weights, states, counts, lengths, key) + (((out, n),) if args.in_place else ()),
                       static)
    kv_end = kv_cache_bytes(attention, states, np.asarray(lengths))
    step_s = statistics.median(times) / steps
    devices = len(_devices(mesh))
    read = shard_bytes(weights) - shard_bytes(weights["embed"])  # per device (the whole model on one device)
    kv = float((kv_start.sum() + kv_end.sum()) / 2)
    floor_s = (read + kv / devices) / (args.bandwidth_tbs * 1e12)
    del states, out, kept
    gc.collect()
    return {"method": method, "prefix": prefix, "batch": batch, "step_ms": 1e3 * step_s,
            "tokens_per_s": batch / step_s, "loop_seconds": times,
            "step_ms_mean": 1e3 * sum(times) / (len(times) * steps), "flush_period_steps": period,
            "compile_and_warmup_s": compile_s,
            "devices": devices, "weights_bytes_read": int(read), "kv_bytes_read": int(kv),
            "kv_bytes_read_per_device": int(kv / devices),
            "kv_bytes_per_sequence": int(kv / batch), "floor_ms": 1e3 * floor_s,
            "floor_over_step": floor_s / step_s, "peak_bytes": _peak_bytes(mesh), "decode_temp_bytes": temp}


def _temp_bytes(fn, args, static) -> int | None:
    """Temporary memory of the compiled `fn` (XLA's memory analysis; None where the platform gives none).

    `peak_bytes` is the process's peak since it started, which also holds the weights' initialization; this is
    what the decode loop itself allocates beyond its arguments. Called after the timed calls, whose executable
    JAX's compilation cache (`worker_env`) then returns instead of compiling again."""
    try:
        analysis = fn.lower(*args, **static).compile().memory_analysis()
    except Exception:  # noqa: BLE001 - a diagnostic: the timing must not fail for it
        return None
    return None if analysis is None else int(analysis.temp_size_in_bytes)


def _prefill_config(args, model, attention, method, prefix, mesh=None):
    """Time the prefill (+ Freeze) of B = 1 prompt per data shard: whole, or in chunks of --prefill-chunk."""
    import jax
    import jax.numpy as jnp

    from hyquant_jax import SamplingConfig
    from hyquant_jax.generate import prefill
    from models import split_model

    config = model.config
    model_def, weights = split_model(model)

    batch = _data_size(mesh)
    tokens = _put(jax.random.randint(jax.random.PRNGKey(3), (batch, prefix), 0, config.vocab_size, jnp.int32), mesh)
    lengths = _put(jnp.full((batch,), prefix, jnp.int32), mesh)
    chunk = args.prefill_chunk or prefix
    static = dict(attention=attention, sampling=SamplingConfig(), chunk=chunk, max_len=prefix + 8)
    t0 = time.perf_counter()
    key0 = _put(jax.random.PRNGKey(0), mesh, batch_axis=False)
    compiled = prefill.lower(model_def, weights, tokens, lengths, key0, **static).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(args.reps + 1):
        key = _put(jax.random.PRNGKey(r), mesh, batch_axis=False)
        t0 = time.perf_counter()
        first, _, states = compiled(weights, tokens, lengths, key)
        jax.block_until_ready((first, states))
        times.append(time.perf_counter() - t0)
        del states
    seconds = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {"method": method, "prefix": prefix, "batch": batch, "chunk": chunk,
            "chunk_impl": _chunk_impl_run(attention, config, prefix), "seconds": seconds,
            "tokens_per_s": batch * prefix / seconds, "compile_s": compile_s, "peak_bytes": _peak_bytes(mesh)}


def run_worker(spec_path: str) -> None:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from models import init_model

    spec = json.loads(open(spec_path).read())
    args = parse_args(spec["argv"])
    section, method = spec["section"], spec["method"]
    config = _model(args)
    attention, _ = _attention(args, method)
    mesh = _mesh(args)
    if mesh is None:
        model = init_model(jax.random.PRNGKey(0), config, jnp.bfloat16)
    else:
        from hyquant_jax.sharding import ShardedAttention, describe_mesh, init_model_sharded

        model = init_model_sharded(jax.random.PRNGKey(0), config, mesh, jnp.bfloat16)
        attention = ShardedAttention(attention, mesh)
        print(f"mesh: {describe_mesh(mesh)}", flush=True)
    jax.block_until_ready(nnx.state(model))
    init_peak = _peak_bytes(mesh)  # the weights and their initialization's temporaries (`peak_bytes` includes them)
    rows = []
    with open(spec["device_out"], "w") as f:
        dev = jax.devices()[0]
        json.dump({"device": dev.device_kind, "platform": dev.platform, "device_count": jax.device_count(),
                   "mesh_devices": len(_devices(mesh))}, f)

    def save():
        for row in rows:
            row.setdefault("peak_after_init_bytes", init_peak)
        with open(spec["out"], "w") as f:
            json.dump(rows, f)

    if section == "prefill":
        for prefix in _ints(args.prefill_prefixes):
            rows.append(_guarded(lambda: _prefill_config(args, model, attention, method, prefix, mesh),
                                 method=method, prefix=prefix))
            save()
        return
    if section == "b1":
        for prefix in _ints(args.prefixes):
            b1 = _data_size(mesh)  # one sequence per data shard
            rows.append(_guarded(lambda: _decode_config(args, model, attention, method, prefix, b1, mesh),
                                 method=method, prefix=prefix, batch=b1))
            save()
        return
    for batch in _batch_sizes(args, _data_size(mesh)):
        row = _guarded(lambda: _decode_config(args, model, attention, method, args.batch_prefix, batch, mesh),
                       method=method, prefix=args.batch_prefix, batch=batch)
        rows.append(row)
        save()
        if row.get("oom"):
            break


def _batch_sizes(args, data: int = 1):
    """Batch sizes of the sweep: --batches, then (with --until-oom) steps of the last gap; multiples of data only."""
    yield from (b for b in _batch_sizes_all(args) if b % data == 0)


def _batch_sizes_all(args):
    sizes = _ints(args.batches)
    yield from sizes
    if args.until_oom and sizes:
        gap = sizes[-1] - sizes[-2] if len(sizes) > 1 else sizes[-1]
        b = sizes[-1] + gap
        while b <= args.max_batch:
            yield b
            b += gap


def _guarded(fn, **ident):
    try:
        row = fn()
    except Exception as e:  # an OOM ends a sweep; other errors are recorded, the rest goes on
        gc.collect()
        row = dict(ident, oom=_is_oom(e), error=f"{type(e).__name__}: {str(e)[:400]}")
    print(json.dumps(row), flush=True)
    return row


# --------------------------------------------------------------------------- parent


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        run_worker(args.worker)
        return
    from benchmarks.common import ROOT, module_command, output_folder, write_json

    args.out = output_folder(args.out, args.smoke)
    if args.combine:
        combine(args)
        return
    # This process never touches the device (it would hold GPU memory the workers need):
    # the workers report the device, and _host_environment() is built without jax.devices().

    argv = list(sys.argv[1:] if argv is None else argv)
    env = worker_env(args)
    mesh_shape = None
    if args.mesh:
        from hyquant_jax.sharding import parse_mesh_shape

        mesh_shape = parse_mesh_shape(args.mesh)
        if args.smoke:  # CPU check: enough virtual host devices for the mesh
            count = mesh_shape["data"] * mesh_shape["model"]
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()
    config = _model(args)
    _, hq = _attention(args, "hyquant")
    results = {"environment": _host_environment(argv), "model": dataclasses.asdict(config),
               "model_name": "smoke" if args.smoke else args.model, "mesh": mesh_shape,
               "params": config.num_params(), "hyquant_config": dataclasses.asdict(hq),
               "bandwidth_tbs": args.bandwidth_tbs, "steps": args.steps, "reps": args.reps,
               "layer_kernels": args.layer_kernels, "stop_token": args.stop_token,
               "b1": [], "batch": [], "prefill": []}
    path = None  # e2e_<device> once a worker has said which device it ran on (this process never asks)
    with tempfile.TemporaryDirectory() as tmp:
        results["environment"]["compilation_cache"] = env["JAX_COMPILATION_CACHE_DIR"]
        for section in args.sections.split(","):
            for method in args.methods.split(","):
                spec = os.path.join(tmp, f"{section}_{method}.json")
                out = os.path.join(tmp, f"{section}_{method}_rows.json")
                device_out = os.path.join(tmp, f"{section}_{method}_device.json")
                with open(spec, "w") as f:
                    json.dump({"argv": argv, "section": section, "method": method, "out": out,
                               "device_out": device_out}, f)
                print(f"== {section} / {method}", flush=True)
                t0 = time.perf_counter()
                rc = subprocess.call(module_command("benchmarks.e2e", "--worker", spec), env=env, cwd=ROOT)
                rows = json.load(open(out)) if os.path.exists(out) else []
                if os.path.exists(device_out):
                    results["environment"].update(json.load(open(device_out)))
                if path is None and (args.name or results["environment"]["device"]):
                    path = os.path.join(args.out, f"{args.name or _default_name(results)}.json")
                if rc != 0:
                    rows.append({"method": method, "error": f"worker exited with code {rc}"})
                results[section].extend(rows)
                print(f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
                if path is not None:
                    write_json(path, results)
    print_tables(results)
    if path is None:
        print("no worker ran: nothing written")
        return
    print(f"wrote {path}")
    if not args.no_plot:
        png = path[:-len(".json")] + ".png"
        plot(results, png)
        print(f"wrote {png}")


def worker_env(args) -> dict:
    """The workers' environment: preallocated GPU memory, and one JAX compilation cache for every run on
    the machine (unless JAX_COMPILATION_CACHE_DIR is set already).

    With the compilation cache on, JAX also points XLA's per-fusion autotune cache into it (its setting
    jax_persistent_cache_enable_xla_caches; this overrides --xla_gpu_per_fusion_autotune_cache_dir), so every
    worker, method and variant in one GPU call runs the GEMM kernels the first compile picked for each fusion.
    Across calls (a fresh machine) the picks may differ: one call took cuBLAS for the MLP's gate/up projections,
    another the Triton GEMM, and the step time moved with the pick.
    """
    from benchmarks.common import module_env

    env = module_env(dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="true",
                          XLA_PYTHON_CLIENT_MEM_FRACTION=args.mem_fraction))
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "hyquant_e2e_jax_cache"))
    return env


def _chunk_impl_run(attention, config, slots: int) -> str:
    """The chunk attention a prefill row ran: the attention's `chunk_impl`, with "auto" resolved as
    `models.prefix_attention` resolves it for bf16 staging of `slots` keys (the quantized baselines: XLA)."""
    import jax.numpy as jnp

    from models.attention import fused_chunk_applies

    impl = getattr(attention, "chunk_impl", "xla")
    if impl == "auto":
        return "triton" if fused_chunk_applies(slots, config.head_dim, jnp.bfloat16, False) else "xla"
    return impl


def _host_environment(argv) -> dict:
    from benchmarks.common import host_environment  # jax's version only: no backend is initialised here

    return {"device": None, "platform": None, **host_environment("benchmarks.e2e", argv)}


def _default_name(results) -> str:
    """e2e_<device>, the canonical results name (several devices: e.g. e2e_h200x2)."""
    from benchmarks.common import slug

    env, mesh = results["environment"], results.get("mesh")
    count = mesh["data"] * mesh["model"] if mesh else 1
    return f"e2e_{slug(env['device'] or 'unknown', env.get('platform') or 'gpu', count)}"


def combine(args) -> None:
    """Merge partial result files (sections or methods run in separate calls): environment and settings of the
    first, rows of all (later wins per key), and each part's command, date and device in `combined_from`."""
    from benchmarks.common import write_json

    parts = [json.load(open(path)) for path in args.combine]
    merged = dict(parts[0])
    keys = {"b1": ("method", "prefix"), "batch": ("method", "batch"), "prefill": ("method", "prefix")}
    for section, key in keys.items():
        rows = {}
        for part in parts:
            for r in part.get(section, []):
                rows[tuple(r.get(k) for k in key)] = r
        merged[section] = sorted(rows.values(), key=lambda r: (str(r.get("method")),) + tuple(
            r.get(k) or 0 for k in key[1:]))
    merged["combined_from"] = [{key: p["environment"].get(key) for key in ("command", "date", "device")}
                               for p in parts]
    path = os.path.join(args.out, f"{args.name or _default_name(merged)}.json")
    write_json(path, merged)
    print_tables(merged)
    print(f"wrote {path}")
    if not args.no_plot:
        plot(merged, path[:-len(".json")] + ".png")


def _b1(results) -> str:
    """Label of the 'B = 1' sections: one sequence per data shard with a mesh."""
    mesh = results.get("mesh")
    return f"{mesh['data']} (1 per data shard)" if mesh and mesh["data"] > 1 else "1"


def _ratio(row) -> str:
    """x bf16 column: same-config bf16 step time over this one's ('-' without a bf16 row)."""
    x = row.get("speedup_vs_bf16")
    return f"{x:6.2f}" if x is not None else "     -"


def print_tables(results) -> None:
    def speedups(rows, keys):
        base = {tuple(r[k] for k in keys): r for r in rows if r.get("method") == "bf16" and "step_ms" in r}
        for r in rows:
            b = base.get(tuple(r.get(k) for k in keys))
            if b and "step_ms" in r:
                r["speedup_vs_bf16"] = b["step_ms"] / r["step_ms"]

    speedups(results["b1"], ("prefix",))
    speedups(results["batch"], ("batch",))
    if results["b1"]:
        print(f"\nB={_b1(results)} decode: prefix, method, ms/step, tokens/s, floor ms, floor/step, x bf16")
        for r in results["b1"]:
            if "step_ms" in r:
                print(f"  {r['prefix']:>7} {r['method']:>8} {r['step_ms']:8.2f} {r['tokens_per_s']:9.1f} "
                      f"{r['floor_ms']:8.2f} {r['floor_over_step']:6.2f} {_ratio(r)}")
            else:
                print(f"  {r.get('prefix', '-'):>7} {r['method']:>8} {r.get('error', '')[:80]}")
    if results["batch"]:
        print("\nbatch sweep: batch, method, ms/step, tokens/s, peak GiB, floor/step, x bf16")
        for r in results["batch"]:
            if "step_ms" in r:
                peak = (r["peak_bytes"] or 0) / 2**30
                print(f"  {r['batch']:>5} {r['method']:>8} {r['step_ms']:8.2f} {r['tokens_per_s']:9.1f} "
                      f"{peak:8.1f} {r['floor_over_step']:6.2f} {_ratio(r)}")
            else:
                what = "OOM" if r.get("oom") else r.get("error", "")[:80]
                print(f"  {r.get('batch', '-'):>5} {r['method']:>8} {what}")
    if results["prefill"]:
        print(f"\nprefill (B={_b1(results)}): prefix, method, seconds, tokens/s, chunk, chunk attention")
        for r in results["prefill"]:
            if "seconds" in r:
                print(f"  {r['prefix']:>7} {r['method']:>8} {r['seconds']:8.3f} {r['tokens_per_s']:10.0f} "
                      f"{r.get('chunk', r['prefix']):>7} {r.get('chunk_impl', 'xla'):>6}")
            else:
                print(f"  {r.get('prefix', '-'):>7} {r['method']:>8} {r.get('error', '')[:80]}")


def plot(results, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4.8))
    methods = sorted({r["method"] for s in ("b1", "batch") for r in results[s] if "step_ms" in r})
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for m in methods:
        rows = [r for r in results["b1"] if r["method"] == m and "step_ms" in r]
        if rows:
            x = [r["prefix"] for r in rows]
            axes[0].plot(x, [r["tokens_per_s"] for r in rows], "o-", color=colors[m], label=m)
            axes[1].plot(x, [r["step_ms"] for r in rows], "o-", color=colors[m], label=f"{m} step")
            axes[1].plot(x, [r["floor_ms"] for r in rows], "--", color=colors[m], label=f"{m} byte floor")
        rows = [r for r in results["batch"] if r["method"] == m and "step_ms" in r]
        if rows:
            axes[2].plot([r["batch"] for r in rows], [r["tokens_per_s"] for r in rows], "o-", color=colors[m], label=m)
            axes[3].plot([r["batch"] for r in rows], [(r["peak_bytes"] or 0) / 2**30 for r in rows], "o-",
                         color=colors[m], label=m)
    prefix = next((r["prefix"] for r in results["batch"] if "prefix" in r), None)
    axes[0].set(xscale="log", xlabel="cached tokens (B=1)", ylabel="decode tokens/s", title="B=1 decode")
    axes[1].set(xscale="log", xlabel="cached tokens (B=1)", ylabel="ms per step",
                title=f"B=1 step time vs byte floor ({results['bandwidth_tbs']} TB/s)")
    axes[2].set(xlabel="batch", ylabel="decode tokens/s", title=f"batch sweep at {prefix} cached tokens")
    axes[3].set(xlabel="batch", ylabel="peak device memory (GiB)", title="peak memory (batch sweep)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    env = results["environment"]
    mesh = results.get("mesh")
    where = f" x{mesh['data'] * mesh['model']} (mesh data={mesh['data']},model={mesh['model']})" if mesh else ""
    fig.suptitle(f"{env['device']}{where}, {results['params'] / 1e9:.2f}B-param Qwen3-shaped model, random bf16 "
                 f"weights, jax {env['jax']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    from benchmarks.common import run_script

    run_script(main)
