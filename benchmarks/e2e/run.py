"""The end-to-end benchmark's parent process: one worker per section and method, their rows combined into
OUT/NAME.json; `--combine` merges the files of earlier partial runs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import ROOT, host_environment, module_command, module_env, output_folder, slug, write_json
from benchmarks.e2e.options import method_attention, model_config, parse_args
from benchmarks.e2e.tables import plot, print_tables
from benchmarks.e2e.worker import run_worker


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        run_worker(args.worker)
        return
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
    config = model_config(args)
    _, hq = method_attention(args, "hyquant")
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
                    path = os.path.join(args.out, f"{args.name or default_name(results)}.json")
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
    env = module_env(dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="true",
                          XLA_PYTHON_CLIENT_MEM_FRACTION=args.mem_fraction))
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "hyquant_e2e_jax_cache"))
    return env


def _host_environment(argv) -> dict:
    """`common.environment` without the device: this process never initialises one (the workers report it)."""
    return {"device": None, "platform": None, **host_environment("benchmarks.e2e", argv)}


def default_name(results) -> str:
    """e2e_<device>, the canonical results name (several devices: e.g. e2e_h200x2)."""
    env, mesh = results["environment"], results.get("mesh")
    count = mesh["data"] * mesh["model"] if mesh else 1
    return f"e2e_{slug(env['device'] or 'unknown', env.get('platform') or 'gpu', count)}"


def combine(args) -> None:
    """Merge partial result files (sections or methods run in separate calls): environment and settings of the
    first, rows of all (later wins per key), and each part's command, date and device in `combined_from`."""
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
    path = os.path.join(args.out, f"{args.name or default_name(merged)}.json")
    write_json(path, merged)
    print_tables(merged)
    print(f"wrote {path}")
    if not args.no_plot:
        plot(merged, path[:-len(".json")] + ".png")
