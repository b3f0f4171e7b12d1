"""Session 45's figures that no GPU call wrote as JSON, derived from committed files of real runs:

* the launch and copy counts of the decode loop (4 layers, B1 32K, H200) for main and the stacked flush, parsed
  from decode_memory_flush_{main,stacked}_s45.log (decode_memory.py's output; its JSON did not come back from
  the device);
* medians over all layers of session 43's graph profile (profile_graphs_s43_events_hyquant_32768.json.gz) and
  session 36's bf16 one: the o projection, the ring-score fusion, the merge and the Mosaic kernel, in us.

  python benchmarks/results/s45_derived.py   # writes benchmarks/results/s45_derived.json
"""

import gzip
import json
import os
import re

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def loop_counts(log: str) -> dict:
    text = open(os.path.join(HERE, log)).read()
    copies = re.search(r"copies in the loop bodies: (\d+) (\{.*\})", text)
    bodies = {}
    for name, n, rest in re.findall(r"loop body (%\S+): (\d+) launches(?:; conditionals (.*))?", text):
        branches = dict((b, int(k)) for b, k in re.findall(r"(%[\w.\-]+) (\d+)", rest.split(": ", 1)[1])) if rest else {}
        bodies[name] = {"launches": int(n), "conditional_branch_launches": branches}
    return {"log": log, "loop_copies": int(copies.group(1)), "loop_copies_by_shape": copies.group(2),
            "loop_bodies": bodies}


def events(name: str) -> list:
    ev = json.load(gzip.open(os.path.join(HERE, name)))["events"]  # [name, stream, start_us, dur_us]
    return sorted(ev, key=lambda e: e[2])


def first_gemm_after(ev: list, kernel: str) -> list:
    out = []
    for i, e in enumerate(ev):
        if e[0] == kernel:
            out += [f[3] for f in ev[i + 1:i + 6] if f[0].startswith("gemm_fusion")][:1]
    return out


def main():
    hq = events("profile_graphs_s43_events_hyquant_32768.json.gz")
    bf = events("profile_graphs_s36_events_bf16_32768.json.gz")
    dur = lambda ev, k: float(np.median([e[3] for e in ev if e[0] == k]))  # noqa: E731
    result = {
        "flush_launches_4_layers": {"main": loop_counts("decode_memory_flush_main_s45.log"),
                                    "stacked": loop_counts("decode_memory_flush_stacked_s45.log")},
        "profile_medians_us_32k": {
            "hyquant_o_projection": float(np.median(first_gemm_after(hq, "hyquant_merge_splits"))),
            "bf16_o_projection": float(np.median(first_gemm_after(bf, "input_reduce_fusion_108"))),
            "hyquant_ring_score_fusion": dur(hq, "loop_add_fusion_35"),
            "hyquant_merge_kernel": dur(hq, "hyquant_merge_splits"),
            "hyquant_mosaic_kernel": dur(hq, "anonymous_mosaic_gpu_kernel"),
        },
    }
    with open(os.path.join(HERE, "s45_derived.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
