"""A/B of the Mosaic low-bit decode kernel against an earlier copy of its module, one process, same inputs.

For kernel changes that should not change results much and must be timed against the kernel before them
on the same machine: the low-bit kernel alone (q preparation and merge included, `default_splits`), Qwen3-8B
heads, K4V4 channel_key, in the order previous / current / previous again for each split setting, ms per
call in a jitted loop and the largest difference to the first output of the case (the first module at the
first split setting) relative to its largest value.

  cp pallas_kernels/decode_mgpu.py /tmp/prev.py   # before the change
  PYTHONPATH=. python benchmarks/decode_mgpu_ab.py --prev /tmp/prev.py --out DIR --name NAME

or several variants of the module against the current one (each a full copy of the module, e.g. built from a
patch by `benchmarks/prepare_decode_variants.sh`), in the order current / variants... / current again:

  PYTHONPATH=. python benchmarks/decode_mgpu_ab.py --variant .gpu_run/variants/a.py --variant ... --out DIR

or the current module with several `pages_per_copy`, and with --wide each also with `wide=True` (current /
current_wide / current_ppc2 / current_ppc2_wide / ... / current again):

  PYTHONPATH=. python benchmarks/decode_mgpu_ab.py --pages-per-copy 1,2,4 --wide --out DIR

--interleave adds each module with `interleave=True` at one page a copy (name suffix _il).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import environment, load_module, time_in_loop  # noqa: E402
from pallas_kernels import decode_mgpu as current  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prev", help="path of the earlier decode_mgpu.py (timed first and last)")
    p.add_argument("--variant", action="append", default=[],
                   help="path of a variant of decode_mgpu.py, named by its file name (repeatable)")
    p.add_argument("--out", default=".")
    p.add_argument("--name", default="decode_mgpu_ab")
    p.add_argument("--cases", default="16x32768,1x131072,1x32768", help="BxS list")
    p.add_argument("--per-sm", default="2", help="comma list: blocks per multiprocessor for default_splits")
    p.add_argument("--pages-per-copy", default="1",
                   help="comma list: `low_bit_splits(pages_per_copy=...)` for each module (those that take it)")
    p.add_argument("--wide", action="store_true", help="also time each module and pages_per_copy with wide=True")
    p.add_argument("--interleave", action="store_true",
                   help="also time each module with interleave=True (one page a copy, wide or not)")
    args = p.parse_args()
    from benchmarks.decode_kernel import CONFIG, make_inputs

    per_copy = [int(x) for x in args.pages_per_copy.split(",")]
    if not args.prev and not args.variant and len(per_copy) < 2 and not args.wide and not args.interleave:
        p.error("give --prev, at least one --variant, --wide, --interleave, or two or more --pages-per-copy")
    modules = [("previous", load_module(args.prev, "decode_mgpu_previous"))] if args.prev else []
    modules.append(("current", current))
    for path in args.variant:
        name = os.path.splitext(os.path.basename(path))[0]
        modules.append((name, load_module(path, "decode_mgpu_" + name)))
    kernels = [(name + (f"_ppc{n}" if n > 1 else "") + ("_wide" if wide else "") + ("_il" if il else ""), mod, n,
                wide, il)
               for name, mod in modules for n in per_copy for wide in ((False, True) if args.wide else (False,))
               for il in ((False, True) if args.interleave and n == 1 else (False,))]
    kernels.append((modules[0][0] + "_again", modules[0][1], 1, False, False))
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for item in args.cases.split(","):
        batch, context = (int(x) for x in item.split("x"))
        inp = make_inputs(batch, 32, 8, 128, context, CONFIG)
        c = inp.cache
        ops = (c.k_codes, c.k_scale, c.k_zero, c.v_codes, c.v_scale[..., 0], c.v_zero[..., 0], c.page_count,
               c.num_pages)
        iters = int(max(20, min(400, 4e6 / (context * batch))))
        ref = None
        for per_sm in (int(x) for x in args.per_sm.split(",")):
            splits = current.default_splits(c.batch, 8, c.page_count.shape[1], per_sm=per_sm)
            for name, mod, n, wide, il in kernels:
                # earlier modules take none of these arguments
                extra = {**(dict(pages_per_copy=n) if n > 1 else {}), **(dict(wide=True) if wide else {}),
                         **(dict(interleave=True) if il else {})}

                def fn(q, *operands, mod=mod, splits=splits, extra=extra):
                    o, m, l = mod.low_bit_splits(mod.kernel_query(q, 8, 1 / math.sqrt(128)), *operands,
                                                 num_splits=splits, **extra)
                    return mod.merge(o, m, l)[:, :, :4].reshape(q.shape).astype(q.dtype)

                got = np.asarray(jax.jit(fn)(inp.q, *ops), np.float64)
                ref = got if ref is None else ref
                row = dict(batch=batch, context=context, per_sm=per_sm, splits=splits, kernel=name, pages_per_copy=n,
                           wide=wide, interleave=il,
                           ms=1e3 * time_in_loop(fn, inp.q, ops, iters, 5),
                           max_rel_diff_vs_first=float(np.abs(got - ref).max() / np.abs(ref).max()))
                print(json.dumps(row), flush=True)
                rows.append(row)
        del inp, ops
    with open(os.path.join(args.out, args.name + ".json"), "w") as f:
        json.dump(dict(environment=environment(), command=" ".join(sys.argv), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
