"""One worker process of the end-to-end benchmark: one section and one method, its rows written as they come."""

from __future__ import annotations

import gc
import json

from benchmarks.e2e.decode import decode_config
from benchmarks.e2e.options import ints, method_attention, model_config, parse_args
from benchmarks.e2e.placement import data_size, device_mesh, mesh_devices, peak_bytes
from benchmarks.e2e.prefill import prefill_config


def run_worker(spec_path: str) -> None:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from models import init_model

    spec = json.loads(open(spec_path).read())
    args = parse_args(spec["argv"])
    section, method = spec["section"], spec["method"]
    config = model_config(args)
    attention, _ = method_attention(args, method)
    mesh = device_mesh(args)
    if mesh is None:
        model = init_model(jax.random.PRNGKey(0), config, jnp.bfloat16)
    else:
        from hyquant_jax.sharding import ShardedAttention, describe_mesh, init_model_sharded

        model = init_model_sharded(jax.random.PRNGKey(0), config, mesh, jnp.bfloat16)
        attention = ShardedAttention(attention, mesh)
        print(f"mesh: {describe_mesh(mesh)}", flush=True)
    jax.block_until_ready(nnx.state(model))
    init_peak = peak_bytes(mesh)  # the weights and their initialization's temporaries (`peak_bytes` includes them)
    rows = []
    with open(spec["device_out"], "w") as f:
        dev = jax.devices()[0]
        json.dump({"device": dev.device_kind, "platform": dev.platform, "device_count": jax.device_count(),
                   "mesh_devices": len(mesh_devices(mesh))}, f)

    def save():
        for row in rows:
            row.setdefault("peak_after_init_bytes", init_peak)
        with open(spec["out"], "w") as f:
            json.dump(rows, f)

    if section == "prefill":
        for prefix in ints(args.prefill_prefixes):
            rows.append(_guarded(lambda: prefill_config(args, model, attention, method, prefix, mesh),
                                 method=method, prefix=prefix))
            save()
        return
    if section == "b1":
        for prefix in ints(args.prefixes):
            b1 = data_size(mesh)  # one sequence per data shard
            rows.append(_guarded(lambda: decode_config(args, model, attention, method, prefix, b1, mesh),
                                 method=method, prefix=prefix, batch=b1))
            save()
        return
    for batch in batch_sizes(args, data_size(mesh)):
        row = _guarded(lambda: decode_config(args, model, attention, method, args.batch_prefix, batch, mesh),
                       method=method, prefix=args.batch_prefix, batch=batch)
        rows.append(row)
        save()
        if row.get("oom"):
            break


def batch_sizes(args, data: int = 1):
    """Batch sizes of the sweep: --batches, then (with --until-oom) steps of the last gap; multiples of data only."""
    yield from (b for b in _batch_sizes_all(args) if b % data == 0)


def _batch_sizes_all(args):
    sizes = ints(args.batches)
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
        row = dict(ident, oom=is_oom(e), error=f"{type(e).__name__}: {str(e)[:400]}")
    print(json.dumps(row), flush=True)
    return row


def is_oom(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text
