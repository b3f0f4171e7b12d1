"""GPU kernel events of a JAX profiler trace, and a per-kernel breakdown of them (used by the profile scripts)."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import tempfile
import time

import jax


def profiled(run):
    """run() under the JAX profiler (run must block until its result is ready): (result, wall seconds, the
    trace's GPU kernel events)."""
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            t0 = time.perf_counter()
            result = run()
            wall = time.perf_counter() - t0
        return result, wall, kernel_events(tmp)


def kernel_events(trace_dir: str) -> list[dict]:
    """'X' events of the trace's GPU streams (kernels and memcpys), sorted by start time."""
    path = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz")))[-1]
    with gzip.open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    gpu_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                and "/device:GPU" in str(e.get("args", {}).get("name", ""))}
    out = [e for e in events if e.get("ph") == "X" and e.get("pid") in gpu_pids and e.get("dur", 0) > 0]
    return sorted(out, key=lambda e: e["ts"])


def busy_time(events: list[dict]) -> float:
    """Microseconds during which at least one kernel ran (union of intervals)."""
    total, end = 0.0, None
    for e in events:
        s, t = e["ts"], e["ts"] + e["dur"]
        if end is None or s >= end:
            total += e["dur"]
            end = t
        elif t > end:
            total += t - end
            end = t
    return total


def idle_gaps(events: list[dict]) -> dict[str, list[float]]:
    """Idle stretches (no kernel running) by the kernel that ends them: name -> [count, total us].

    Says which launches the GPU waits for (host work, synchronization, launches outside a command buffer)."""
    out = collections.defaultdict(lambda: [0, 0.0])
    end = None
    for e in events:
        if end is not None and e["ts"] > end:
            row = out[e["name"]]
            row[0] += 1
            row[1] += e["ts"] - end
        t = e["ts"] + e["dur"]
        end = t if end is None else max(end, t)
    return out


def breakdown(events: list[dict], steps: int, top: int) -> dict:
    per_name = collections.defaultdict(lambda: [0, 0.0, ""])
    for e in events:
        row = per_name[e["name"]]
        row[0] += 1
        row[1] += e["dur"]
        row[2] = row[2] or str(e.get("args", {}).get("hlo_op", ""))
    rows = sorted(per_name.items(), key=lambda kv: -kv[1][1])
    # The span ends at the latest end: the kernel that starts last need not end last (streams overlap).
    span = (max(e["ts"] + e["dur"] for e in events) - events[0]["ts"]) if events else 0.0
    busy = busy_time(events)
    return {"kernels_per_step": len(events) / steps, "kernel_us_per_step": sum(e["dur"] for e in events) / steps,
            "busy_us_per_step": busy / steps, "span_us_per_step": span / steps,
            "idle_share": 1 - busy / span if span else None,
            "idle_before": [{"name": n[:160], "gaps_per_step": c / steps, "idle_us_per_step": g / steps}
                            for n, (c, g) in sorted(idle_gaps(events).items(), key=lambda kv: -kv[1][1])[:top]],
            "top": [{"name": n[:160], "hlo_op": op, "launches_per_step": c / steps, "us_per_step": d / steps,
                     "us_per_launch": d / c} for n, (c, d, op) in rows[:top]]}
