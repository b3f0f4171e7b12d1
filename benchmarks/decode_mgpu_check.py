"""H200 speed of the Mosaic GPU low-bit decode kernel (`pallas_kernels/decode_mgpu.py`) alone.

One process, the same frozen cache (Qwen3-8B heads, K4V4 channel_key): the low-bit kernel (q preparation and
merge included) for several split counts and pipeline depths, against the Triton kernel's whole decode and
cuDNN bf16, ms per call in a jitted loop, plus the bytes the low-bit kernel reads, its bandwidth, and its
error against the float64 oracle on the first sequence. Correctness tests: tests/test_decode_mgpu.py.

  PYTHONPATH=. python benchmarks/decode_mgpu_check.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import environment, time_in_loop  # noqa: E402
from pallas_kernels import decode_mgpu as dm  # noqa: E402

def speed(log, contexts, splits_per_sm, stage_list):
    from benchmarks.decode_kernel import CONFIG, cudnn_attention, hybrid_fn, make_inputs
    from hyquant_jax.decode_kernel import DecodeTuning

    rows = []
    for batch, context, explicit_splits in contexts:
        inp = make_inputs(batch, 32, 8, 128, context, CONFIG)
        c = inp.cache
        b, h = c.batch, c.num_kv_heads
        group = 32 // h
        ops = (c.k_codes, c.k_scale, c.k_zero, c.v_codes, c.v_scale[..., 0], c.v_zero[..., 0],
               c.page_count, c.num_pages)
        jax.block_until_ready(ops)
        pages_used = int(np.max(np.asarray(c.num_pages)))
        low_tokens = int(np.asarray(c.page_count).sum())
        nbytes = b * h * pages_used * (dm.PAGE * 2 * dm.BYTES + 2 * dm.HEAD_DIM * 2 + dm.PAGE * 2 * 2)

        def prep(q):
            return dm.kernel_query(q, h, 1.0 / math.sqrt(128))

        def mgpu_fn(splits, stages):
            def fn(q, *operands):
                o, m, l = dm.low_bit_splits(prep(q), *operands, num_splits=splits, stages=stages)
                out = dm.merge(o, m, l)[:, :, :group].reshape(b, 32, 128)
                return out.astype(q.dtype)
            return fn

        # accuracy of the low-bit region on the real cache
        # (the first sequence only: the float64 oracle of B16 32K would take minutes)
        qn = np.asarray(prep(inp.q).astype(jnp.float32))[:1][..., np.argsort(dm.KEY_CHANNELS)]
        want, _, _ = dm.reference_low_bit(qn, *[np.asarray(x)[:1] for x in (
            c.k_codes, c.k_scale, c.k_zero, c.v_codes, c.v_scale[..., 0], c.v_zero[..., 0], c.page_count,
            c.num_pages)])
        iters = int(max(20, min(400, 4e6 / (context * batch))))
        base = dict(batch=batch, context=context, low_bit_tokens_per_head=low_tokens // b, bytes_read=nbytes)
        for name, fn, operands in [("cudnn_bf16", cudnn_attention, (inp.k, inp.v)),
                                   ("triton_whole_decode", hybrid_fn(CONFIG, DecodeTuning(low_bit="triton")), (c,))]:
            try:
                ms = 1e3 * time_in_loop(fn, inp.q, operands, iters, 5)
                row = dict(base, kernel=name, ms=ms)
            except Exception as e:
                row = dict(base, kernel=name, error=f"{type(e).__name__}: {e}"[:500])
            log(json.dumps(row))
            rows.append(row)
        choices = ([(None, s) for s in explicit_splits] if explicit_splits else
                   [(per_sm, dm.default_splits(b, h, pages_used, per_sm=per_sm)) for per_sm in splits_per_sm])
        for per_sm, splits in choices:
            for stages in stage_list:
                try:
                    fn = mgpu_fn(splits, stages)
                    o, m, l = jax.jit(lambda q, *a: dm.low_bit_splits(prep(q), *a, num_splits=splits,
                                                                          stages=stages))(inp.q, *ops)
                    got = np.asarray(dm.merge(o, m, l), np.float64)[:1]
                    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                    ms = 1e3 * time_in_loop(fn, inp.q, ops, iters, 5)
                    row = dict(base, kernel="mosaic_low_bit", splits=splits, per_sm=per_sm, stages=stages, ms=ms,
                               rel_err_vs_oracle=err, tb_per_s=nbytes / (ms * 1e-3) / 1e12)
                except Exception as e:
                    row = dict(base, kernel="mosaic_low_bit", splits=splits, stages=stages,
                               error=f"{type(e).__name__}: {e}"[:1500])
                    traceback.print_exc()
                log(json.dumps(row))
                rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--contexts", default="1x32768,16x32768,1x131072",
                   help="BxS list; BxS:s1/s2/... times those split counts instead of --per-sm's")
    p.add_argument("--per-sm", default="2,4,8")
    p.add_argument("--stages", default="2,3,4")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log_file = open(os.path.join(args.out, "decode_mgpu_check.log"), "w")

    def log(line):
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    result = dict(environment=environment(), command=" ".join(sys.argv))
    contexts = []
    for item in args.contexts.split(","):
        shape, _, splits = item.partition(":")
        batch, context = (int(x) for x in shape.split("x"))
        contexts.append((batch, context, [int(x) for x in splits.split("/")] if splits else []))
    result["speed"] = speed(log, contexts, [int(x) for x in args.per_sm.split(",")],
                            [int(x) for x in args.stages.split(",")])
    with open(os.path.join(args.out, "decode_mgpu_check.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
