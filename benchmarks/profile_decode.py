"""Run the hybrid decode kernel a few times on one shape, for a profiler (ncu) to capture.

  PYTHONPATH=. ncu --clock-control none -k regex:hyquant_decode --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight ... python benchmarks/profile_decode.py --batch 16 --context 32768
"""

from __future__ import annotations

import argparse
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.decode_kernel import CONFIG, make_inputs  # noqa: E402
from hyquant_jax.decode_kernel import DecodeTuning, decode_attention  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--transposed", action="store_true")
    p.add_argument("--warps", type=int, default=None, help="DecodeTuning.num_warps (default: heuristic)")
    p.add_argument("--stages", type=int, default=None, help="DecodeTuning.num_stages (default: heuristic)")
    p.add_argument("--pages", type=int, default=None, help="DecodeTuning.pages_per_tile (default: heuristic)")
    args = p.parse_args()
    inp = make_inputs(args.batch, 32, 8, 128, args.context, CONFIG)
    tuning = DecodeTuning(transposed=args.transposed, num_warps=args.warps, num_stages=args.stages,
                          pages_per_tile=args.pages)
    for _ in range(args.calls):
        out, _ = decode_attention(inp.q, inp.cache, CONFIG, tuning=tuning)
        jax.block_until_ready(out)
    print("done", out.shape)


if __name__ == "__main__":
    main()
