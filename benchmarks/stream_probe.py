"""How fast can a Mosaic GPU kernel stream the low-bit decode pages? A copy-only kernel, swept over copy shapes.

Session 38 measured the low-bit decode kernel's own streaming floor (its copies, slots and barriers, no work:
`mosaic_ablation_variants.py copy_only`) at ~2.9 TB/s at B1 128K, and ~3.1 TB/s with wider TMA boxes, where
plain XLA reads reach ~4.3 TB/s (`read_bandwidth.py`). Four slots in flight did not raise it, so it is not
the bytes in flight per block. This probe asks which copy shape would: it streams arrays of the cache's
shapes (`decode_mgpu.low_bit_splits`' operands: uint8 key and value codes [B, H, S, 64], bf16 key scales
and zero points [B, H, S / 64, 128], bf16 value scales and zero points [B, H, S]) with the kernel's grid
(B, H, splits), `default_splits`, and its loop (wait for a slot's copies, one warpgroup barrier, warp 0
refills the slot), varying

  width    bytes per TMA box row for the codes: 64 (the cache's rows, as the kernel copies them) or 128 / 256
           (the same bytes reshaped for free to wider rows); the value codes keep the kernel's swizzle where
           the row allows one (64 or 128 bytes), none at 256;
  pages    pages per slot, i.e. per copy of each array (one box of pages * 4096 code bytes);
  stages   slots in flight per block;
  small    whether the four small copies (key scales and zeros, value scales and zeros) are made.

A suffix _i (session 53) interleaves the splits: split s of a head streams chunks s, s + splits, s + 2 splits,
..., instead of a contiguous run, so that at any moment a head's blocks read neighbouring chunks of its arrays
(a few wide streams in memory instead of one per block; does DRAM locality bound the stream?). Any order is
valid for the kernel: its split merge is order-free.

A config is named w{width}_p{pages}_s{stages}[_codes][_i]. A second family, t{depth}[_i] (session 52), moves the codes
without TMA: each of the warpgroup's 128 threads loads 64 bytes of a page's codes from global memory with four
16-byte `ld.global.nc` loads into registers (each warp's load covers 512 contiguous bytes), keeping `depth` pages
in flight (the load of page c + depth reuses the registers of page c once they are consumed; the loop is unrolled
by depth, so no register moves wait for a load); the small copies are not made, so a t config compares with the
w.._codes ones. It asks whether thread loads stream faster than the TMA copies at this grid; the decode kernel's
key codes, which it uses as register operands, could come that way. Each t row is checked exact on the GPU
(`threads_reference`).

It prints ms per call (in a jitted loop, as `decode_mgpu_ab.py` times the kernel) and TB/s over the streamed
bytes; with two or more contexts at B=1 it also gives the slope between the shortest and longest (bytes over the
time difference, without the fixed cost of a call). Caveat (session 53): at B1 32K the pages (37 MB) fit in
L2 (50 MB) and the loop reads the same arrays every call; on an H100 the step from 32K to 64K cost more per
byte than the steps above 64K, as if the 32K row were partly served from L2 (results/stream_probe_sizes_s53.json),
so take slopes between contexts of 128K and more (e.g. --cases 1x131072,1x262144). w64_p1_s2 is the kernel's
streaming as it is. If a config streams much faster, the decode kernel could take its pages in that shape (the
floor bounds the B1 128K kernel: benchmarks/NOTES.md, session 38). None does: on an H100 every config streams the
134 MB of B1 128K about as fast as an XLA read of that many bytes (results/read_bandwidth_0.125gib_s53.json).

  PYTHONPATH=. python benchmarks/stream_probe.py --out DIR [--cases 1x32768,1x131072,16x32768] [--configs ...]
  (offline, no GPU: python benchmarks/mosaic_sass.py stream --config NAME --out DIR compiles one config to SASS)
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax._src.lib.mlir import ir  # Mosaic GPU's MLIR bindings, for the thread loads (jax is pinned)
from jax._src.lib.mlir.dialects import arith, llvm, vector
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pallas_kernels.decode_mgpu import (BYTES, HEAD_DIM, PAGE, default_splits, interleaved_pages,  # noqa: E402
                                        split_pages)
from pallas_kernels.prefill_mgpu import _swizzled  # noqa: E402

DEFAULT_CONFIGS = ("w64_p1_s2,w64_p1_s4,w64_p2_s2,w64_p4_s2,w64_p4_s3,w128_p1_s2,w128_p4_s2,w256_p1_s2,"
                   "w256_p2_s2,w256_p4_s2,w256_p4_s3,w64_p1_s2_codes,w256_p4_s2_codes,t1,t2,t4,t8")
PAGE_BYTES = 2 * PAGE * BYTES + 2 * HEAD_DIM * 2 + 2 * PAGE * 2  # 8960: codes, key parameters, value parameters
CODE_BYTES = 2 * PAGE * BYTES
THREAD_WORDS = CODE_BYTES // 128 // 4  # i32 words a thread loads per page in a t config: 16
MAX_DEPTH = 8


def parse_config(name: str) -> dict:
    """'w256_p4_s2[_codes]' -> dict(width=256, pages=4, stages=2, small=True/False); 't4' -> dict(depth=4)
    (thread loads, codes only); ValueError names the rule."""
    interleave = name.endswith("_i")
    base = name[:-2] if interleave else name
    if base.startswith("t"):
        try:
            depth = int(base[1:])
        except ValueError as err:
            raise ValueError(f"config must be t{{depth}}[_i] with depth 1..{MAX_DEPTH}, got {name!r}") from err
        if not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"config {name!r}: depth must be 1..{MAX_DEPTH}")
        return dict(depth=depth, interleave=interleave)
    parts = base.split("_")
    small = parts[-1] != "codes"
    parts = parts if small else parts[:-1]
    try:
        width, pages, stages = (int(p[1:]) for p, tag in zip(parts, "wps", strict=True) if p[0] == tag)
    except (ValueError, TypeError) as err:
        raise ValueError(f"config must be w{{64|128|256}}_p{{pages}}_s{{stages}}[_codes][_i], got {name!r}") from err
    if width not in (64, 128, 256) or pages < 1 or stages < 1:
        raise ValueError(f"config {name!r}: width must be 64, 128 or 256, pages and stages >= 1")
    if pages * PAGE > 256 or pages * PAGE * BYTES // width > 256:
        raise ValueError(f"config {name!r}: a TMA box has at most 256 rows (pages * 64 value parameters, "
                         f"pages * 4096 / width code rows)")
    return dict(width=width, pages=pages, stages=stages, small=small, interleave=interleave)


def split_chunks(chunks, split, splits: int, interleave: bool):
    """(count, chunk): how many of `chunks` chunks split `split` streams, and its i-th chunk (0 <= i < count).
    Contiguous (the decode kernel's `split_pages`): a run of ceil(chunks / splits); interleaved: split,
    split + splits, split + 2 splits, ..., so that at any moment the splits of one head read neighbouring
    chunks. Ints or traced int32."""
    if interleave:
        return interleaved_pages(chunks, split, splits)
    first, stop = split_pages(chunks, split, splits)[2:]
    return stop - first, lambda i: first + i


def _kernel(q_ref, kc_ref, vc_ref, ks_ref, kz_ref, vs_ref, vz_ref, o_ref,
            kc_s, vc_s, ks_s, kz_s, vs_s, vz_s, o_s, full, *, splits: int, pages: int, stages: int, rows: int,
            small: bool, chunks: int, interleave: bool):
    del q_ref  # only orders the calls of the timing loop
    b, h, split = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("splits")
    count, chunk = split_chunks(chunks, split, splits, interleave)

    def issue(c, slot):
        bar = full.at[slot]
        plgpu.copy_gmem_to_smem(kc_ref.at[b, h, pl.ds(c * rows, rows)], kc_s.at[slot], bar)
        plgpu.copy_gmem_to_smem(vc_ref.at[b, h, pl.ds(c * rows, rows)], vc_s.at[slot], bar)
        if small:
            plgpu.copy_gmem_to_smem(ks_ref.at[b, h, pl.ds(c * pages, pages)], ks_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(kz_ref.at[b, h, pl.ds(c * pages, pages)], kz_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(vs_ref.at[b, h, pl.ds(c * pages * PAGE, pages * PAGE)], vs_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(vz_ref.at[b, h, pl.ds(c * pages * PAGE, pages * PAGE)], vz_s.at[slot], bar)

    for k in range(stages):
        @pl.when(k < count)
        def _prologue(k=k):
            issue(chunk(k), k)

    def body(i, carry):
        slot = i % stages
        plgpu.barrier_wait(full.at[slot])
        plgpu.commit_smem()  # as the kernel's commit: every thread is past the slot before its refill

        @pl.when(i + stages < count)
        def _refill():
            @plgpu.warp_map
            def _(warp):
                @pl.when(warp == 0)
                def _():
                    issue(chunk(i + stages), slot)

        return carry

    lax.fori_loop(0, count, body, 0)
    o_s[...] = jnp.zeros((128,), jnp.float32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_ref.at[b, h, split])
    plgpu.wait_smem_to_gmem(0)


def stream(q, k_codes, v_codes, k_scale, k_zero, v_scale, v_zero, *, width: int, pages: int, stages: int,
           small: bool, splits: int, interleave: bool = False):
    """Stream every page of the operands once (their shapes are `low_bit_splits`'); returns zeros f32
    [B, H, splits, 128]. q (any small array) only orders the calls of a timing loop."""
    bsz, heads, slots, _ = k_codes.shape
    total_pages = slots // PAGE
    if total_pages % pages:
        raise ValueError(f"pages per slot ({pages}) must divide the {total_pages} pages")
    rows = pages * PAGE * BYTES // width
    kc = k_codes.reshape(bsz, heads, slots * BYTES // width, width)  # the same bytes in wider rows
    vc = v_codes.reshape(bsz, heads, slots * BYTES // width, width)
    u8, bf16 = jnp.uint8, jnp.bfloat16
    value_transforms = _swizzled(u8, width) if width <= 128 else ()
    copies = 6 if small else 2
    kernel = plgpu.kernel(
        functools.partial(_kernel, splits=splits, pages=pages, stages=stages, rows=rows, small=small,
                          chunks=total_pages // pages, interleave=interleave),
        out_type=jax.ShapeDtypeStruct((bsz, heads, splits, 128), jnp.float32),
        grid=(bsz, heads, splits),
        grid_names=("batch", "heads", "splits"),
        scratch_types=[
            plgpu.SMEM((stages, rows, width), u8),
            plgpu.SMEM((stages, rows, width), u8, transforms=value_transforms),
            plgpu.SMEM((stages, pages, HEAD_DIM), bf16),
            plgpu.SMEM((stages, pages, HEAD_DIM), bf16),
            plgpu.SMEM((stages, pages * PAGE), bf16),
            plgpu.SMEM((stages, pages * PAGE), bf16),
            plgpu.SMEM((128,), jnp.float32),
            plgpu.Barrier(num_arrivals=copies, num_barriers=stages),
        ],
        compiler_params=plgpu.CompilerParams(unsafe_no_auto_barriers=True),
    )
    return kernel(q, kc, vc, k_scale, k_zero, v_scale, v_zero)


# Four 16-byte loads of one thread, or zeros where $5 (valid) is 0. $4 is a generic address of global memory.
_LOAD_PTX = ("{ .reg .pred p; .reg .u64 g; setp.ne.b32 p, $5, 0; cvta.to.global.u64 g, $4; mov.b32 $0, 0; "
             "mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; @p ld.global.nc.v4.u32 {$0, $1, $2, $3}, [g]; }")


def _strided(n: int, vec: int):
    return plgpu.Layout.WG_STRIDED((n,), vec_size=vec)


def _load_page(ctx, k_codes, v_codes, page):
    """This thread's THREAD_WORDS words of page `page` of one head's key and value codes, from global memory:
    bytes 16 t + 2048 k .. + 15 (k = 0, 1) of each array's 4096-byte page, so a warp's load is 512 contiguous
    bytes; zeros where page < 0 (no load).

    k_codes, v_codes: uint8 [S, 64] in global memory; page: i32 [128] WG_STRIDED, one value in every thread.
    Returns i32 [128 * THREAD_WORDS] WG_STRIDED, thread t holding its words in order."""
    del ctx
    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    c = lambda x: arith.constant(i32, x)  # noqa: E731
    tid = arith.remui(mgpu_utils.thread_idx(), c(128))
    p = vector.extract(page.registers.flat[0], dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([0]))
    have = arith.cmpi(arith.CmpIPredicate.sge, p, c(0))
    safe = arith.select(have, p, c(0))
    valid = arith.extui(i32, have)
    v4 = ir.VectorType.get((4,), i32)
    words = []
    for ref in (k_codes, v_codes):
        base = mgpu_utils.memref_ptr(ref)
        for k in range(2):  # in 16-byte units: page * 256 + t + 128 k
            index = arith.addi(arith.addi(arith.muli(safe, c(CODE_BYTES // 2 // 16)), tid), c(128 * k))
            addr = llvm.ptrtoint(i64, mgpu_utils.getelementptr(base, [arith.extui(i64, index)], v4))
            words += mgpu_utils.inline_ptx(_LOAD_PTX, addr, valid, result_types=[i32] * 4)
    regs = np.array([vector.from_elements(ir.VectorType.get((THREAD_WORDS,), i32), words)], dtype=object)
    return mgpu.FragmentedArray(_registers=regs, _layout=mgpu.WGStridedFragLayout((128 * THREAD_WORDS,),
                                                                                   THREAD_WORDS), _is_signed=True)


def _fold(ctx, words):
    """xor of each thread's THREAD_WORDS words: i32 [128 * THREAD_WORDS] -> [128] (WG_STRIDED)."""
    del ctx
    vec = words.registers.flat[0]
    out = None
    for n in range(THREAD_WORDS):
        w = vector.extract(vec, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([n]))
        out = w if out is None else arith.xori(out, w)
    regs = np.array([vector.from_elements(ir.VectorType.get((1,), out.type), [out])], dtype=object)
    return mgpu.FragmentedArray(_registers=regs, _layout=mgpu.WGStridedFragLayout((128,), 1), _is_signed=True)


def _thread_kernel(q_ref, kc_ref, vc_ref, o_ref, o_s, *, splits: int, depth: int, chunks: int, interleave: bool):
    del q_ref  # only orders the calls of the timing loop
    b, h, split = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("splits")
    count, chunk = split_chunks(chunks, split, splits, interleave)
    wide, one = _strided(128 * THREAD_WORDS, THREAD_WORDS), _strided(128, 1)
    load = plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType(), one),
                             return_type=plgpu.ShapeDtypeStruct((128 * THREAD_WORDS,), jnp.int32, layout=wide))(
        _load_page)
    kc, vc = kc_ref.at[b, h], vc_ref.at[b, h]

    def page_arg(i):
        return plgpu.layout_cast(jnp.full((128,), jnp.where(i < count, chunk(i), -1), jnp.int32), one)

    def body(group, carry):
        # Slot k holds the split's page depth * group + k; it is consumed, then refilled in place with the page
        # `depth` later, so no register moves between slots (a move would wait for its load).
        acc, *words = carry
        for k in range(depth):
            acc = acc ^ words[k]
            words[k] = load(kc, vc, page_arg(depth * (group + 1) + k))
        return (acc, *words)

    carry = (plgpu.layout_cast(jnp.zeros((128 * THREAD_WORDS,), jnp.int32), wide),
             *(load(kc, vc, page_arg(k)) for k in range(depth)))
    acc = lax.fori_loop(0, (count + depth - 1) // depth, body, carry)[0]
    fold = plgpu.inline_mgpu(arg_types=(wide,), return_type=plgpu.ShapeDtypeStruct((128,), jnp.int32, layout=one))
    o_s[...] = (fold(_fold)(acc) & 255).astype(jnp.float32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_ref.at[b, h, split])
    plgpu.wait_smem_to_gmem(0)


def stream_threads(q, k_codes, v_codes, *, depth: int, splits: int, interleave: bool = False):
    """Load every page of the key and value codes once by thread loads, `depth` pages in flight (the codes
    only: CODE_BYTES a page); returns f32 [B, H, splits, 128] (a fold of the loaded bytes, so no load is dead).
    q (any small array) only orders the calls of a timing loop."""
    bsz, heads, slots, _ = k_codes.shape
    kernel = plgpu.kernel(
        functools.partial(_thread_kernel, splits=splits, depth=depth, chunks=slots // PAGE, interleave=interleave),
        out_type=jax.ShapeDtypeStruct((bsz, heads, splits, 128), jnp.float32),
        grid=(bsz, heads, splits),
        grid_names=("batch", "heads", "splits"),
        scratch_types=[plgpu.SMEM((128,), jnp.float32)],
    )
    return kernel(q, k_codes, v_codes)


def threads_reference(k_codes, v_codes, splits: int, interleave: bool = False) -> np.ndarray:
    """What `stream_threads` returns, in NumPy: per (batch, head, split) and thread t, the low byte of the xor
    of every word thread t loaded (the low bytes of the words: bytes 16 t + 2048 m + 4 i of each page of both
    arrays, m = 0, 1, i = 0..3), over the split's pages, as float32 [B, H, splits, 128]."""
    bsz, heads, slots, _ = k_codes.shape
    pages = slots // PAGE
    low = [np.bitwise_xor.reduce(np.asarray(x).reshape(bsz, heads, pages, 2, 128, 16)[..., 0::4], axis=(3, 5))
           for x in (k_codes, v_codes)]
    each = low[0] ^ low[1]  # [B, H, pages, 128]
    out = np.zeros((bsz, heads, splits, 128), np.uint8)
    for sp in range(splits):
        count, chunk = split_chunks(pages, sp, splits, interleave)
        taken = [int(chunk(i)) for i in range(int(count))]
        if taken:
            out[:, :, sp] = np.bitwise_xor.reduce(each[:, :, taken], axis=2)
    return out.astype(np.float32)


def operands(batch: int, heads: int, context: int):
    """Random operands of `low_bit_splits`' shapes (the values do not matter to a copy)."""
    pages = context // PAGE
    key = jax.random.PRNGKey(0)
    codes = jax.random.randint(key, (2, batch, heads, context, BYTES), 0, 256, jnp.int32).astype(jnp.uint8)
    ks, kz = (jnp.ones((batch, heads, pages, HEAD_DIM), jnp.bfloat16) for _ in range(2))
    vs, vz = (jnp.ones((batch, heads, context), jnp.bfloat16) for _ in range(2))
    return codes[0], codes[1], ks, kz, vs, vz


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--name", default="stream_probe")
    p.add_argument("--cases", default="1x32768,1x131072,16x32768", help="BxS list (Qwen3-8B's 8 KV heads)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help="comma list of w{width}_p{pages}_s{stages}[_codes] and t{depth}")
    p.add_argument("--per-sm", type=int, default=2, help="blocks per multiprocessor for default_splits")
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args()
    from benchmarks.common import add_output_sum, environment, sm_count, time_in_loop, write_json

    configs = {name: parse_config(name) for name in args.configs.split(",") if name}
    path = os.path.join(args.out, args.name + ".json")
    heads, rows = 8, []
    for item in args.cases.split(","):
        batch, context = (int(x) for x in item.split("x"))
        ops = operands(batch, heads, context)
        pages = context // PAGE
        splits = default_splits(batch, heads, pages, sms=sm_count(), per_sm=args.per_sm)
        q = jnp.zeros((16,), jnp.float32)
        want = {}  # threads_reference of this case, computed once per split pattern
        for name, cfg in configs.items():
            nbytes = batch * heads * pages * (PAGE_BYTES if cfg.get("small") else CODE_BYTES)
            row = {"batch": batch, "context": context, "config": name, **cfg, "splits": splits, "bytes": nbytes}
            try:
                if "depth" in cfg:
                    fn = lambda q, kc, vc, *_, cfg=cfg: stream_threads(q, kc, vc, splits=splits, **cfg)  # noqa: E731
                    got = np.asarray(jax.jit(fn)(q, *ops))  # every byte was loaded: the fold is exact
                    if cfg["interleave"] not in want:
                        want[cfg["interleave"]] = threads_reference(ops[0], ops[1], splits, cfg["interleave"])
                    row["exact"] = bool(np.array_equal(got, want[cfg["interleave"]]))
                else:
                    fn = functools.partial(stream, splits=splits, **cfg)
                sec = time_in_loop(lambda q, *o, fn=fn: fn(q, *o), q, ops, args.iters, feedback=add_output_sum)
                row.update(ms=sec * 1e3, tb_s=nbytes / sec / 1e12)
                print(f"B{batch} {context:>6} {name:<18} splits {splits:>3}: {sec * 1e3:.4f} ms, "
                      f"{nbytes / sec / 1e12:.2f} TB/s" + (f", exact {row['exact']}" if "exact" in row else ""),
                      flush=True)
            except Exception as err:  # a shape Mosaic rejects: recorded, the sweep goes on
                row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
                print(f"B{batch} {context:>6} {name:<18} failed: {row['error']}", flush=True)
            rows.append(row)
            write_json(path, {"environment": environment(), "args": vars(args), "rows": rows,
                              "slopes_b1": fixed_cost_slopes(rows)})  # after every row: a cut-off run keeps them
    slopes = fixed_cost_slopes(rows)
    for name, s in slopes.items():
        print(f"slope B1 {name:<18}: {s['tb_s']:.2f} TB/s over {s['contexts']}, fixed cost ~{s['fixed_us']:.1f} us")
    write_json(path, {"environment": environment(), "args": vars(args), "rows": rows, "slopes_b1": slopes})


def fixed_cost_slopes(rows) -> dict:
    """Per config, from the B=1 rows at the shortest and longest context: the streaming rate over the bytes
    between them (TB/s) and the time left at zero bytes (us), i.e. the fixed cost of a call."""
    out = {}
    for name in dict.fromkeys(r["config"] for r in rows):
        b1 = sorted((r for r in rows if r["config"] == name and r["batch"] == 1 and "ms" in r),
                    key=lambda r: r["context"])
        if len(b1) < 2 or b1[-1]["bytes"] == b1[0]["bytes"]:
            continue
        lo, hi = b1[0], b1[-1]
        dt = (hi["ms"] - lo["ms"]) * 1e-3
        rate = (hi["bytes"] - lo["bytes"]) / dt if dt > 0 else float("inf")
        out[name] = {"contexts": [lo["context"], hi["context"]], "tb_s": rate / 1e12,
                     "fixed_us": (lo["ms"] * 1e-3 - lo["bytes"] / rate) * 1e6}
    return out


if __name__ == "__main__":
    main()
