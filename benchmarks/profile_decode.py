"""Profile the hybrid decode call on the GPU: a kernel breakdown from the JAX profiler, or launches for ncu.

--trace: for each selected case of `benchmarks/decode_kernel.py`, the hybrid
decode and the bf16 baselines (XLA, cuDNN) run in the benchmark's jitted loop
(`common.jitted_loop`) once to compile and once under `jax.profiler.trace`;
per kernel name it reports launches and microseconds per decode call, plus the
share of the loop's span during which no kernel ran (launch gaps). It answers
where the fixed cost of a short-context hybrid decode call goes (kernel,
merge, the XLA work around them, gaps). Writes OUT/NAME.json:
  python -m benchmarks.profile_decode --trace "B1 1K,B1 4K,B1 32K,smollm2" --out $OUT

Without --trace it only runs the decode kernel a few times on one shape, for ncu to capture:
  ncu --clock-control none -k regex:hyquant_decode --launch-skip 2 --launch-count 1 \\
      --section SpeedOfLight ... python -m benchmarks.profile_decode --batch 16 --context 32768
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import jax

from benchmarks.cases import DECODE_CASES, DECODE_CONFIG, DECODE_SMOKE_CASES, QWEN3_8B_HEADS
from benchmarks.common import check_out, environment, jitted_loop, run_script, write_json
from benchmarks.decode_kernel import (
    INTERPRET,
    cudnn_attention,
    hybrid_fn,
    make_inputs,
    xla_attention,
)
from benchmarks.trace import breakdown, profiled
from hyquant_jax.decode_launch import DecodeTuning, decode_attention, decode_layout


def trace_loop(fn, q, operands, iters: int, top: int) -> dict:
    """Kernel breakdown per call of fn(q, *operands) over one run of `jitted_loop` under the profiler."""
    loop = jitted_loop(fn, iters)
    jax.block_until_ready(loop(q, operands))
    _, wall, events = profiled(lambda: jax.block_until_ready(loop(q, operands)))
    return {"iters": iters, "wall_us_per_call": 1e6 * wall / iters, **breakdown(events, iters, top)}


def trace_cases(names: str, iters: int, top: int, smoke: bool, log) -> list[dict]:
    cases = DECODE_SMOKE_CASES if smoke else DECODE_CASES
    selected = [c for c in cases if any(s.strip() and s.strip() in c[0] for s in names.split(","))]
    if not selected:
        raise SystemExit(f"--trace {names!r} selects no case; cases: {[c[0] for c in cases]}")
    rows = []
    for name, b, hq_, hkv, d, s in selected:
        inp = make_inputs(b, hq_, hkv, d, s, DECODE_CONFIG)
        tuning = DecodeTuning()
        lay = decode_layout(inp.cache, DECODE_CONFIG, hq_, tuning)
        row = {"case": name, "batch": b, "heads": [hq_, hkv], "head_dim": d, "context": s,
               "splits": {"n_low": lay.n_low, "n_vl": lay.n_vl, "total": lay.num_splits},
               "hybrid": trace_loop(hybrid_fn(DECODE_CONFIG, tuning), inp.q, (inp.cache,), iters, top),
               "xla": trace_loop(xla_attention, inp.q, (inp.k, inp.v), iters, top)}
        if not INTERPRET:
            row["cudnn"] = trace_loop(cudnn_attention, inp.q, (inp.k, inp.v), iters, top)
        for method in ("hybrid", "xla", "cudnn"):
            if method in row:
                r = row[method]
                log(f"{name} {method}: {r['wall_us_per_call']:.1f} us/call, {r['kernels_per_step']:.1f} kernels "
                    f"{r['kernel_us_per_step']:.1f} us, idle {100 * (r['idle_share'] or 0):.0f}%")
                for k in r["top"][:6]:
                    log(f"    {k['us_per_step']:7.2f} us  x{k['launches_per_step']:.0f}  {k['name'][:90]}")
        rows.append(row)
        del inp
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="", metavar="CASES",
                   help="comma-separated substrings of decode_kernel.py's case names to profile (e.g. 'B1 1K')")
    p.add_argument("--iters", type=int, default=50, help="--trace: decode calls in the traced loop")
    p.add_argument("--top", type=int, default=12, help="--trace: kernels listed per method")
    p.add_argument("--out", required=True, help="folder for the profile (not a results file)")
    p.add_argument("--name", default="profile_decode")
    p.add_argument("--smoke", action="store_true", help="--trace on the tiny case (CPU check of the script)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--warps", type=int, default=None, help="DecodeTuning.num_warps (default: heuristic)")
    p.add_argument("--stages", type=int, default=None, help="DecodeTuning.num_stages (default: heuristic)")
    p.add_argument("--pages", type=int, default=None, help="DecodeTuning.pages_per_tile (default: heuristic)")
    args = p.parse_args()
    check_out(args.out)
    if args.trace or args.smoke:
        log = lambda s: print(s, flush=True)  # noqa: E731
        result = {"env": environment(), "config": dataclasses.asdict(DECODE_CONFIG),
                  "cases": trace_cases(args.trace or "smoke", args.iters, args.top, args.smoke, log)}
        write_json(os.path.join(args.out, args.name + ".json"), result)
        return
    inp = make_inputs(args.batch, *QWEN3_8B_HEADS, args.context, DECODE_CONFIG)
    tuning = DecodeTuning(num_warps=args.warps, num_stages=args.stages, pages_per_tile=args.pages)
    for _ in range(args.calls):
        out, _ = decode_attention(inp.q, inp.cache, DECODE_CONFIG, tuning=tuning)
        jax.block_until_ready(out)
    print("done", out.shape)


if __name__ == "__main__":
    run_script(main)
