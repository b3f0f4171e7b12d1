"""Where each layer's hybrid attention launches sit against each other, from `profile_e2e.py --dump-events`.

For every Mosaic low-bit launch in the dump (one per layer and step), it finds the same layer's q/k norm +
RoPE kernel before it, the Triton VL/ring launch and the split merge after it, and reports the medians over all
layers (us): the gap from the RoPE kernel's end to the Mosaic start, both kernels' durations, the Triton
launch's start and end against the Mosaic kernel's, and the gap before the merge. Session 46 used it to see
that under the profiler the Triton launch started ~11 us into the Mosaic kernel at B=1 32K and ended ~11 us
after it (in session 43's profile it ran inside it). Profiler timings only: an unprofiled A/B decides.
  python benchmarks/layer_timeline.py benchmarks/results/profile_static_s46_events_hyquant_32768.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics

MOSAIC = "anonymous_mosaic_gpu_kernel"
TRITON = "hyquant_decode"
MERGE = "hyquant_merge_splits"
ROPE = "hyquant_qk_norm_rope"
WINDOW = 40  # events searched on each side of a Mosaic launch


def layer_offsets(events: list[list]) -> list[dict]:
    """events: [name, stream, start_us, dur_us] rows (the dump's "events"). One dict of offsets (us) per Mosaic
    launch that has a RoPE kernel before it and a Triton launch and a merge near it."""
    ev = sorted(events, key=lambda e: e[2])
    rows = []
    for i, (name, _, start, dur) in enumerate(ev):
        if name != MOSAIC:
            continue
        end = start + dur
        near = ev[max(0, i - WINDOW):i + WINDOW]
        rope = [e for e in ev[max(0, i - WINDOW):i] if e[0] == ROPE]
        triton = [e for e in near if e[0] == TRITON]
        merge = [e for e in ev[i:i + WINDOW] if e[0] == MERGE]
        if not (rope and triton and merge):
            continue
        t = min(triton, key=lambda e: abs(e[2] - start))
        t_end = t[2] + t[3]
        rows.append({
            "rope_end_to_mosaic": start - (rope[-1][2] + rope[-1][3]),
            "mosaic_us": dur,
            "triton_start_after_mosaic_start": t[2] - start,
            "triton_us": t[3],
            "triton_end_after_mosaic_end": t_end - end,
            "merge_gap": merge[0][2] - max(end, t_end),
        })
    return rows


def summary(rows: list[dict]) -> dict:
    """Median of each offset over the layers, and their count."""
    if not rows:
        return {"layers": 0}
    return {"layers": len(rows), **{k: statistics.median(r[k] for r in rows) for k in rows[0]}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("events", nargs="+", help="OUT/NAME_events_METHOD_PREFIX.json.gz files of profile_e2e.py")
    args = p.parse_args(argv)
    for path in args.events:
        with gzip.open(path, "rt") as f:
            events = json.load(f)["events"]
        print(path, json.dumps({k: round(v, 2) for k, v in summary(layer_offsets(events)).items()}))


if __name__ == "__main__":
    main()
