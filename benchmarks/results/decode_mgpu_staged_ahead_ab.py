"""One-off A/B (session 20), kept as the record of how decode_mgpu_staged_ahead_ab_h200.json was made: key
parameters staged one page ahead (decode_mgpu_staged_ahead.patch applied to pallas_kernels/decode_mgpu.py)
against the kernel before it (a copy saved as pallas_kernels/decode_mgpu_prev.py), same process, low-bit
kernel alone. Run from the repository root after `git apply` and the copy: python ab_staging.py"""
import json, math, os, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, ".")
from benchmarks.common import environment, time_in_loop
from benchmarks.decode_kernel import CONFIG, make_inputs
from pallas_kernels import decode_mgpu as new, decode_mgpu_prev as old

out = os.environ.get("OUT", ".")
rows = []
for batch, context in [(16, 32768), (1, 131072), (1, 32768)]:
    inp = make_inputs(batch, 32, 8, 128, context, CONFIG)
    c = inp.cache
    ops = (c.k_codes, c.k_scale, c.k_zero, c.v_codes, c.v_scale[..., 0], c.v_zero[..., 0], c.page_count, c.num_pages)
    splits = new.default_splits(c.batch, 8, int(np.max(np.asarray(c.num_pages))))
    ref = None
    for name, mod in [("prev", old), ("staged_ahead", new), ("prev_again", old)]:
        def fn(q, *operands, mod=mod):
            o, m, l = mod.low_bit_splits(mod.kernel_query(q, 8, 1 / math.sqrt(128)), *operands, num_splits=splits)
            return mod.merge(o, m, l)[:, :, :4].reshape(q.shape).astype(q.dtype)
        got = np.asarray(jax.jit(fn)(inp.q, *ops), np.float64)
        ref = got if ref is None else ref
        diff = float(np.abs(got - ref).max() / np.abs(ref).max())
        ms = 1e3 * time_in_loop(fn, inp.q, ops, int(max(20, min(400, 4e6 / (context * batch)))), 5)
        row = dict(batch=batch, context=context, splits=splits, kernel=name, ms=ms, max_rel_diff_vs_prev=diff)
        print(json.dumps(row), flush=True)
        rows.append(row)
json.dump(dict(environment=environment(), command="python ab_staging.py", rows=rows),
          open(os.path.join(out, "decode_mgpu_staged_ahead_ab_h200.json"), "w"), indent=1)
