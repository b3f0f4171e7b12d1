"""Chunked prefill's attention over one layer's whole prompt: key blocks up to each chunk's end vs all slots.

A prompt of --prompt tokens is prefilled in chunks of --chunk tokens (as `hyquant_jax.generate.prefill` does
for prompts longer than `prefill_chunk`, a `fori_loop` over chunks); each chunk's queries attend over the
staged keys with `models.prefix_attention`. The ways to compute it, timed in one process:

  blocks     key blocks of `models.attention.KEY_BLOCK` slots, up to the block holding the chunk's last
             position (what `prefix_attention` does);
  all_slots  one key block of all --prompt slots for every chunk, the visible ones masked (what a chunked
             prefill that reads every slot does, with this version's online softmax);
  baseline   with --baseline FILE: `prefix_attention` of another version of `models/attention.py`, e.g.
             `git show 7cbf3c9:models/attention.py > /tmp/attention_old.py`;
  triton     with --triton: `prefix_attention(impl="triton")`, the fused kernel of `pallas_kernels.prefix`
             (GPU; Pallas interpret mode elsewhere, slow). Its relative L2 difference from `blocks` on the
             last chunk is recorded (`triton_rel_diff`);
  triton_qQ_kK_wW_sS  with --triton-launches "Q,K,W,S;...": the kernel with block_q Q, block_k K, W warps and
             S pipeline stages, to pick the default launch (each with its last chunk's difference from XLA).

Reports seconds for the whole prompt (one layer; median of --reps timed calls after a warm-up call) and
the key slots each way reads, summed over chunks (for the kernel, whose query blocks stop at their own last
position, an upper bound). A launch of the sweep that fails records its error and the run goes on.

  python -m benchmarks.chunked_prefill_attention --triton --out benchmarks/results
"""

from __future__ import annotations

import argparse
import os
from functools import partial

import jax
import jax.numpy as jnp

from benchmarks.common import (
    add_output_sum,
    default_name,
    environment,
    load_module,
    output_folder,
    run_script,
    time_in_loop,
    write_json,
)
from models.attention import KEY_BLOCK, prefix_attention
from pallas_kernels.prefix import key_tile
from pallas_kernels.prefix import prefix_attention as fused_prefix_attention


def prompt_attention(q, k, v, chunk: int, attend):
    """Sum of every chunk's attend(q_chunk, k, v, q_pos) output (float32 scalar): q [B, Hq, P, D], k, v
    [B, Hkv, P, D]."""
    prompt = q.shape[2]

    def body(c, total):
        offset = c * chunk
        qc = jax.lax.dynamic_slice_in_dim(q, offset, chunk, axis=2)
        out = attend(qc, k, v, offset + jnp.arange(chunk))
        return total + jnp.sum(out.astype(jnp.float32))

    return jax.lax.fori_loop(0, prompt // chunk, body, jnp.float32(0))


def slots_read(prompt: int, chunk: int, key_block: int) -> int:
    """Key slots read over all chunks (per sequence and KV head)."""
    kb = min(key_block, prompt)
    return sum(min(prompt, -(-(c + chunk) // kb) * kb) for c in range(0, prompt, chunk))


def last_chunk_difference(q, k, v, chunk: int, attend=partial(prefix_attention, impl="triton")) -> float:
    """Relative L2 difference of attend's output (by default the fused kernel's) from the XLA path's on the
    prompt's last chunk."""
    prompt = q.shape[2]
    qc, pos = q[:, :, prompt - chunk:], prompt - chunk + jnp.arange(chunk)
    want = prefix_attention(qc, k, v, pos).astype(jnp.float32)
    got = attend(qc, k, v, pos).astype(jnp.float32)
    return float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="folder for the JSON (default: benchmarks/results)")
    p.add_argument("--name", default=None, help="JSON file stem (default: chunked_prefill_attention_<device>)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32, help="query heads")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--prompt", type=int, default=32768, help="prompt tokens (a multiple of --chunk)")
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--baseline", default=None, metavar="FILE",
                   help="also time `prefix_attention` of this copy of models/attention.py")
    p.add_argument("--triton", action="store_true", help="also time the fused kernel (impl='triton')")
    p.add_argument("--triton-launches", default="", metavar="Q,K,W,S;...",
                   help="also time the kernel with these block_q, block_k, num_warps, num_stages")
    args = p.parse_args(argv)
    if args.chunk < 1 or args.prompt % args.chunk or args.heads % args.kv_heads:
        p.error(f"--prompt ({args.prompt}) must be a multiple of --chunk ({args.chunk}) and --heads "
                f"({args.heads}) of --kv-heads ({args.kv_heads})")
    out = output_folder(args.out)
    try:
        launches = [tuple(int(x) for x in item.split(",")) for item in args.triton_launches.split(";") if item]
        if any(len(launch) != 4 for launch in launches):
            raise ValueError
    except ValueError:
        p.error(f"--triton-launches must be 'Q,K,W,S;...' (four integers each), got {args.triton_launches!r}")
    dtype = jnp.dtype(args.dtype)
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(kq, (args.batch, args.heads, args.prompt, args.head_dim), dtype)
    k = jax.random.normal(kk, (args.batch, args.kv_heads, args.prompt, args.head_dim), dtype)
    v = jax.random.normal(kv, (args.batch, args.kv_heads, args.prompt, args.head_dim), dtype)
    variants = [("blocks", partial(prefix_attention, key_block=KEY_BLOCK), KEY_BLOCK),
                ("all_slots", partial(prefix_attention, key_block=args.prompt), args.prompt)]
    if args.baseline:
        variants.append(("baseline", load_module(args.baseline, "baseline_attention").prefix_attention, args.prompt))
    if args.triton:  # the kernel's key tiles: 64 slots where they divide the prompt (as `prefix_attention`)
        tile = key_tile(args.prompt) or 16
        variants.append(("triton", partial(prefix_attention, impl="triton"), tile))
    for bq, bk, warps, stages in launches:
        variants.append((f"triton_q{bq}_k{bk}_w{warps}_s{stages}",
                         partial(fused_prefix_attention, block_q=bq, block_k=bk, num_warps=warps, num_stages=stages,
                                 interpret=jax.default_backend() != "gpu"), bk))
    rows = []
    for name, attend, key_block in variants:
        def fn(q, k, v, attend=attend):
            return prompt_attention(q, k, v, args.chunk, attend)

        row = {"variant": name, "key_block": min(key_block, args.prompt),
               "slots_read": slots_read(args.prompt, args.chunk, key_block)}
        try:
            row["seconds"] = time_in_loop(fn, q, (k, v), iters=1, reps=args.reps, feedback=add_output_sum)
            if name.startswith("triton_q"):  # a launch is only a candidate if its output is right too
                row["rel_diff_last_chunk"] = last_chunk_difference(q, k, v, args.chunk, attend)
        except Exception as err:  # a launch of the sweep that does not compile (registers, shared memory)
            if not name.startswith("triton_q"):
                raise
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        rows.append(row)
        diff = f", {row['rel_diff_last_chunk']:.2e} from XLA on the last chunk" if "rel_diff_last_chunk" in row else ""
        print(f"{name:26s} key block {row['key_block']:6d}: " + (f"{row['seconds']:.3f} s" if "seconds" in row
              else row["error"][:120]) + f", {row['slots_read']} slots read (at most, for the kernel){diff}")
    blocks = rows[0]["seconds"]
    result = {"environment": environment(), "args": vars(args), "rows": rows,
              "x_blocks": {r["variant"]: r["seconds"] / blocks for r in rows[1:] if "seconds" in r}}
    if args.triton:
        result["triton_rel_diff"] = last_chunk_difference(q, k, v, args.chunk)
        print(f"triton vs blocks, last chunk: relative L2 difference {result['triton_rel_diff']:.2e}")
    print("seconds / blocks' seconds: " + ", ".join(f"{k} {v:.2f}x" for k, v in result["x_blocks"].items()))
    write_json(os.path.join(out, f"{args.name or default_name('chunked_prefill_attention')}.json"),
               result)
    return result


if __name__ == "__main__":
    run_script(main)
