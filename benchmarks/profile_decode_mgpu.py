"""Where the Mosaic low-bit decode kernel's time goes: its loop regions from Mosaic GPU's own profiler.

`pallas_kernels.decode_mgpu.low_bit_splits(profile_dir=...)` writes one Chrome-trace JSON per call with a begin
and an end event per region and page for every block (warpgroup thread 0's clock): wait (the page's copies),
keys (key parameters to f16 + key unpack), qk_values (Q.K wgmma, the value unpack that overlaps it, the wait),
softmax (mask, exp against the lazy running max, P to shared memory, page mark), commit (fence + barrier),
redo (reading the mark; a marked page's exact maximum and rescale), pv (P.V wgmma + wait). This script runs
the kernel once per case on a frozen Qwen3-8B-shaped cache and prints, per region, the time summed over
blocks, its share, and the mean per page; it writes the summary as JSON. ncu segfaults on this kernel right
after connecting (on the H200, at B1 128K and B16 32K alike), hence this route.

  python -m benchmarks.profile_decode_mgpu --out DIR [--contexts 16x32768,1x32768]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import tempfile

REGIONS = ("wait", "keys", "qk_values", "softmax", "commit", "redo", "pv")


def summarize(trace: dict) -> dict:
    """Per region name: total duration over all blocks (trace time units), count, mean; plus each region's share
    of the summed regions and the number of blocks. Events of one block (tid) nest as begin/end pairs."""
    by_block = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        by_block[(e["pid"], e["tid"])].append(e)
    total = collections.Counter()
    count = collections.Counter()
    for events in by_block.values():
        open_regions = []
        for e in events:
            if e["ph"] == "B":
                open_regions.append(e)
            else:
                begin = open_regions.pop()
                if begin["name"] != e["name"]:
                    raise ValueError(f"unbalanced trace: {begin['name']!r} closed by {e['name']!r}")
                total[e["name"]] += e["ts"] - begin["ts"]
                count[e["name"]] += 1
        if open_regions:
            raise ValueError(f"unbalanced trace: {[e['name'] for e in open_regions]} never closed")
    loop = sum(total[r] for r in REGIONS)
    return {"blocks": len(by_block),
            "regions": {name: {"total": total[name], "count": count[name], "mean": total[name] / count[name],
                               "share_of_loop": total[name] / loop if loop else 0.0}
                        for name in sorted(total, key=total.get, reverse=True)}}


def timeline(trace: dict) -> dict:
    """How the blocks spread over the call (is there a tail?): each block's start, from the GPU's global timer
    (microseconds after the first block's), and its duration from its first to its last event (its SM clock,
    in thousands of cycles: the trace's time unit inside a block), as min / p10 / p50 / p90 / max, and the
    number of SMs with each count of blocks."""
    import numpy as np

    first, last = {}, {}
    for e in trace["traceEvents"]:
        key = (e["pid"], e["tid"])
        first[key] = min(first.get(key, e["ts"]), e["ts"])
        last[key] = max(last.get(key, e["ts"]), e["ts"])
    # ts = (global timer at the block's start in ns + clock cycles since its first event) / 1e3, so the first
    # event's ts is the block's start in microseconds
    starts = np.array([first[k] for k in first])
    durations = np.array([last[k] - first[k] for k in first])
    q = lambda x: {name: float(np.percentile(x, p)) for name, p in  # noqa: E731
                   (("min", 0), ("p10", 10), ("p50", 50), ("p90", 90), ("max", 100))}
    per_sm = collections.Counter(collections.Counter(pid for pid, _ in first).values())
    return {"start_us": q(starts - starts.min()), "duration_kcycles": q(durations),
            "sms_by_blocks": {str(k): v for k, v in sorted(per_sm.items())}}


def profile_case(batch: int, context: int, out_dir: str) -> dict:
    import jax
    import numpy as np

    from benchmarks.cases import DECODE_CONFIG, QWEN3_8B_HEADS
    from benchmarks.decode_kernel import make_inputs
    from hyquant_jax import decode_launch
    from hyquant_jax.backends import multiprocessor_count
    from pallas_kernels import decode_mgpu as dm

    inp = make_inputs(batch, *QWEN3_8B_HEADS, context, DECODE_CONFIG)
    c = inp.cache
    b, h = c.batch, c.num_kv_heads
    q = dm.kernel_query(decode_launch.query_groups(inp.q, h, 1.0 / np.sqrt(128.0)))
    ops = (c.k_codes, c.k_scale, c.k_zero, c.v_codes, c.v_scale[..., 0], c.v_zero[..., 0], c.page_count,
           c.num_pages)
    splits = decode_launch.mosaic_splits(b, h, c.page_count.shape[1], multiprocessor_count())  # as its plan
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        jax.block_until_ready(dm.low_bit_splits(q, *ops, num_splits=splits, profile_dir=tmp))
        jax.effects_barrier()  # the trace is written by a host callback
        [path] = glob.glob(os.path.join(tmp, "*-trace.json"))
        with open(path) as f:
            trace = json.load(f)
        summary = summarize(trace)
        summary["timeline"] = timeline(trace)
    pages = int(np.asarray(c.num_pages).sum()) * h
    summary.update(batch=batch, context=context, splits=splits, pages=pages)
    for r in summary["regions"].values():
        r["per_page"] = r["total"] / pages
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--contexts", default="16x32768,1x32768", help="BxS list")
    p.add_argument("--name", default="profile_decode_mgpu")
    args = p.parse_args()
    from benchmarks.common import check_out, command_line, environment, write_json

    check_out(args.out)

    result = {"environment": environment(), "command": command_line(), "cases": []}
    for item in args.contexts.split(","):
        batch, context = (int(x) for x in item.split("x"))
        case = profile_case(batch, context, args.out)
        result["cases"].append(case)
        print(f"B{batch} {context}: {case['blocks']} blocks, {case['pages']} pages, {case['splits']} splits")
        for name, r in case["regions"].items():
            print(f"  {name:<10} share {100 * r['share_of_loop']:5.1f}%  mean {r['mean']:.3f}  per page "
                  f"{r['per_page']:.3f}  (trace time units, summed over blocks)")
        t = case["timeline"]
        print("  block starts (us after the first): " + ", ".join(f"{k} {v:.2f}" for k, v in t["start_us"].items()))
        print("  block durations (kcycles): " + ", ".join(f"{k} {v:.2f}" for k, v in t["duration_kcycles"].items()))
        print(f"  SMs by blocks: {t['sms_by_blocks']}")
    write_json(os.path.join(args.out, args.name + ".json"), result)


if __name__ == "__main__":
    from benchmarks.common import run_script

    run_script(main)
