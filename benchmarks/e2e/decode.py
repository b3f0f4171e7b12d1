"""The decode sections of the end-to-end benchmark (b1 and batch): the jitted decode loop timed for one
(prefix, batch)."""

from __future__ import annotations

import gc
import statistics

from benchmarks.common import timed
from benchmarks.e2e.placement import data_size, mesh_devices, peak_bytes, put
from benchmarks.e2e.states import decode_states


def flush_period(attention) -> int | None:
    """Steps between two window flushes of one sequence (the ring's block size), None without a ring."""
    inner = getattr(attention, "inner", attention)
    config = getattr(inner, "config", None)
    if config is None or not hasattr(inner, "begin_decode_step"):
        return None
    return config.block_size


def decode_config(args, model, attention, method, prefix, batch, mesh=None):
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
    check_batch_fits(batch, data_size(mesh))
    steps = args.steps
    period = flush_period(attention)
    if period and steps % period:
        print(f"warning: {method}: --steps {steps} is not a multiple of the window flush period ({period} steps); "
              "timed loops then differ in their flushes and the median need not amortize them", flush=True)
    max_len = prefix + (args.reps + 1) * steps + 8
    states = decode_states(getattr(attention, "inner", attention), config, prefix, batch, max_len, mesh=mesh)
    lengths = put(jnp.full((batch,), prefix, jnp.int32), mesh)
    first = put(jax.random.randint(jax.random.PRNGKey(1), (batch,), 0, config.vocab_size, jnp.int32), mesh)
    key = put(jax.random.PRNGKey(2), mesh, batch_axis=False)
    static = dict(attention=attention, sampling=SamplingConfig(), max_new_tokens=steps + 1,
                  eos_ids=(config.vocab_size,) if args.stop_token else (), pad_id=0,
                  layer_kernels=args.layer_kernels)
    kv_start = kv_cache_bytes(attention, states, np.asarray(jnp.copy(lengths)))  # a copy: lengths may be donated
    out = n = None  # in place: the previous call's tokens and step count, whose buffers receive this call's
    if args.in_place:
        out = put(jnp.zeros((batch, steps + 1), jnp.int32), mesh)
        n = put(jnp.zeros((), jnp.int32), mesh, batch_axis=False)

    def call(states, first, lengths, out, n):
        if args.in_place:
            return decode_in_place(model_def, weights, states, first, lengths, key, (out, n), **static)
        return decode(model_def, weights, states, first, lengths, key, **static)

    def tokens(result):  # the tokens: the last output the loop writes
        return result[1]

    (states, out, counts, lengths, n), compile_s = timed(call, states, first, lengths, out, n, ready=tokens)
    times, kept = [], None
    for _ in range(args.reps):
        first = last_tokens(out, counts) if args.in_place else out[:, -1]  # in place: in the counts' buffer
        if args.fresh_states:
            kept = states  # alive through this call, so the copies cannot take its addresses
            states = jax.block_until_ready(jax.tree_util.tree_map(jnp.copy, states))
        (states, out, counts, lengths, n), seconds = timed(call, states, first, lengths, out, n, ready=tokens)
        times.append(seconds)
    assert int(n) == steps, (int(n), steps)
    # after the timing, on arrays alive now (in place, first was donated; counts has its shape): a cache hit
    temp = _temp_bytes(decode_in_place if args.in_place else decode,
                       (model_def, weights, states, counts, lengths, key) + (((out, n),) if args.in_place else ()),
                       static)
    kv_end = kv_cache_bytes(attention, states, np.asarray(lengths))
    step_s = statistics.median(times) / steps
    devices = len(mesh_devices(mesh))
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
            "floor_over_step": floor_s / step_s, "peak_bytes": peak_bytes(mesh), "decode_temp_bytes": temp}


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
