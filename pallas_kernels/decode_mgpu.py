"""Mosaic GPU (Hopper) kernel: decode attention over the low-bit region of a hybrid KV cache.

Scope: 4-bit keys under "channel_key" (a scale and zero point per channel and page), 4-bit values with a
scale and zero point per token, head_dim 128, pages of 64 tokens, GQA groups of at most 16 query heads.
One new query token per sequence; the output is the split-K partial state (unnormalized output, running
max and denominator per split), merged by log-sum-exp like the Triton kernel's splits.

Why this kernel exists (docs/design.md, "Two decode kernels"): the Triton kernel spends ~54 warp instructions
per (token, KV head), so it moves 4-bit codes far below the HBM speed.
Here the 4-bit codes become fp16 wgmma operands with one prmt (keys) or shift (values) per 4 codes and one
lop3 and one f16x2 op per 2 codes (keys add their f16x2 dequantizing multiply-add), and no relayout:

* tokens are the M dimension of both products (logits^T = K . q^T, out^T = V^T . P^T), so the code tiles
  are *register* A operands and never go back to shared memory;
* the codes are read in the cache's own layout and used as they are: a thread loads 16 contiguous key
  bytes per token row (one 128-bit shared load) and takes the channels in the order they come, so the
  query's channels are permuted once per call to match (`KEY_CHANNELS`); value tiles are read transposed
  by `ldmatrix.trans` from a 64-byte-swizzled slot, and the output rows come out in `VALUE_CHANNELS`
  order;
* a byte pair becomes two fp16 values with one `prmt` or shift (shared by both nibbles) and one `lop3`:
  0x6400 | u is 1024 + u and 0x6400 | (u << 4) is 1024 + 16 u, exactly; one f16x2 subtract (or
  multiply-add by 1/16 and -64) leaves u, exact; keys then take one f16x2 multiply-add u * scale + zero
  (rounded to fp16, as the Triton kernel's keys are);
* the value scale multiplies the probabilities (P' = p * scale_t) and the value zero point adds
  sum_t p_t * zero_t per row, so the value codes enter the tensor cores as they are.

The softmax runs in base 2 (the caller folds softmax_scale * log2(e) into q) with a lazy running max: a
page whose logits stay within LAZY_MAX_SLACK of the running max needs no cross-warp reduction (only a mark
in shared memory, read after the barrier the page has anyway); a page past it is redone with the exact max.
The denominators and zero-point sums are accumulated per thread and reduced once at the end of a split.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lib.mlir import ir  # Mosaic GPU's MLIR bindings, for the inline-PTX unpack (jax is pinned)
from jax._src.lib.mlir.dialects import arith, llvm, vector
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.decode import merge_splits
from pallas_kernels.mosaic_common import swizzled

PAGE = 64  # tokens per page
HEAD_DIM = 128
BYTES = HEAD_DIM // 2  # packed bytes per token: byte i holds dim i (low nibble) and dim 64 + i (high nibble)
ROWS = 16  # query rows per KV head (the GQA group, zero-padded); wgmma N
RESIDENT_BLOCKS_PER_SM = 3  # blocks a multiprocessor holds at once at the kernel's register count
LN2 = math.log(2.0)
NEG_INIT = -1e30  # finite running-max start: an empty split gives weight exp2(-1e30 - m) = 0 in the merge
LAZY_MAX_SLACK = 8.0  # base-2 logits may exceed the running max by this much before it is updated (p <= 256)
COPIES_PER_PAGE = 6  # bulk copies behind a slot's barrier: key codes, key scale, key zero, value codes,
# value scale, value zero


def _key_channels() -> np.ndarray:
    """KEY_CHANNELS[v] = the head dim held by virtual channel v of the key tile (and of the permuted q).

    Thread (warp w, lane 4g + j) loads bytes 16j .. 16j + 15 of its token rows as 4 words i; word i's bytes
    2r, 2r + 1 give the register of column tile 2c + r (c = 2i + nibble), columns 2j, 2j + 1 of it: the
    virtual channel v = 16c + 8r + 2j + e holds dim 16j + 4i + 2r + e + 64 * nibble.
    """
    v = np.arange(HEAD_DIM)
    c, r, j, e = v // 16, (v // 8) % 2, (v // 2) % 4, v % 2
    return 16 * j + 4 * (c // 2) + 2 * r + e + 64 * (c % 2)


KEY_CHANNELS = _key_channels()


def _f16x2(x):

    return mgpu_utils.bitcast(x, ir.VectorType.get((2,), ir.F16Type.get()))


def _load_words(ref, index, count: int):
    """`count` i32 words from a shared-memory ref, 16-byte aligned vector `index` (i32) onwards."""

    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    v4 = ir.VectorType.get((4,), i32)
    base = mgpu_utils.memref_ptr(ref)
    words = []
    for k in range(count // 4):
        idx = arith.extui(i64, arith.addi(index, arith.constant(i32, k)))
        ptr = mgpu_utils.getelementptr(base, [idx], v4)
        vec = llvm.load(v4, ptr)
        words += [vector.extract(vec, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([n]))
                  for n in range(4)]
    return words


def _thread_coords():
    """(thread t, warp w, row g = lane // 4, column pair j = lane % 4) of this thread in its warpgroup as i32
    values, and a helper making i32 constants."""

    i32 = ir.IntegerType.get_signless(32)
    c = lambda x: arith.constant(i32, x)  # noqa: E731
    tid = arith.remui(mgpu_utils.thread_idx(), c(128))
    lane = arith.remui(tid, c(32))
    return tid, arith.divui(tid, c(32)), arith.divui(lane, c(4)), arith.remui(lane, c(4)), c


# One byte pair (bytes 2r, 2r + 1 of a word, spread to the low bytes of the two halves by prmt) -> two codes.
_LOW_CODES = """{
.reg .b32 h, m;
lop3.b32 h, $1, 0x000F000F, 0x64006400, 0xEA;
mov.b32 m, 0x64006400;
sub.rn.f16x2 $0, h, m;
}"""
_HIGH_CODES = """{
.reg .b32 h, m, n;
lop3.b32 h, $1, 0x00F000F0, 0x64006400, 0xEA;
mov.b32 m, 0x2C002C00;
mov.b32 n, 0xD400D400;
fma.rn.f16x2 $0, h, m, n;
}"""


def _codes(pair, high: bool):

    i32 = ir.IntegerType.get_signless(32)
    return mgpu_utils.inline_ptx(_HIGH_CODES if high else _LOW_CODES, pair, result_types=i32)


def _spread(word, r: int):
    """Bytes 2r and 2r + 1 of `word` into bytes 0 and 2 (the low bytes of the two f16 halves)."""

    i32 = ir.IntegerType.get_signless(32)
    zero = arith.constant(i32, 0)
    return mgpu_utils.prmt(word, zero, arith.constant(i32, 0x4140 if r == 0 else 0x4342))


def _key_tile(ctx, codes, scale, zero, staging):
    """Dequantized key tile: f16 [64 tokens, 128 virtual channels] in the WGMMA layout (A operand).

    codes: uint8 [64, 64]; scale, zero: bf16 [128] (this page's channel parameters); staging: i32 [128],
    where the warpgroup converts the parameters to f16 pairs (threads 0-63 the scales, 64-127 the zeros).
    """
    del ctx
    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    tid, w, g, j, c = _thread_coords()
    # bf16 pairs -> f16 pairs, one pair per thread, through `staging`
    first = arith.cmpi(arith.CmpIPredicate.ult, tid, c(64))
    src = llvm.select(first, mgpu_utils.memref_ptr(scale), mgpu_utils.memref_ptr(zero))
    pair = llvm.load(i32, mgpu_utils.getelementptr(src, [arith.extui(i64, arith.remui(tid, c(64)))], i32))
    f16_pair = mgpu_utils.inline_ptx(
        "{ .reg .b32 lo, hi; shl.b32 lo, $1, 16; and.b32 hi, $1, 0xFFFF0000; cvt.rn.f16x2.f32 $0, hi, lo; }",
        pair, result_types=i32)
    llvm.store(f16_pair, mgpu_utils.getelementptr(mgpu_utils.memref_ptr(staging), [arith.extui(i64, tid)], i32))
    mgpu_utils.warpgroup_barrier()
    # this thread's dims: 16j .. 16j + 15 and 64 + 16j .. (pairs k = 0..7 of each half)
    s_lo = _load_words(staging, arith.muli(j, c(2)), 8)
    s_hi = _load_words(staging, arith.addi(arith.muli(j, c(2)), c(8)), 8)
    z_lo = _load_words(staging, arith.addi(arith.muli(j, c(2)), c(16)), 8)
    z_hi = _load_words(staging, arith.addi(arith.muli(j, c(2)), c(24)), 8)
    layout = mgpu.WGMMA_LAYOUT
    regs = np.empty(layout.registers_shape((PAGE, HEAD_DIM)), dtype=object)
    for h in range(2):
        row = arith.addi(arith.addi(arith.muli(w, c(16)), g), c(8 * h))
        words = _load_words(codes, arith.addi(arith.muli(row, c(4)), j), 4)
        for i in range(4):
            for r in range(2):
                spread = _spread(words[i], r)
                for nibble in range(2):
                    k = 2 * i + r
                    s, z = (s_hi[k], z_hi[k]) if nibble else (s_lo[k], z_lo[k])
                    u = _codes(spread, high=bool(nibble))
                    key = mgpu_utils.inline_ptx("fma.rn.f16x2 $0, $1, $2, $3;", u, s, z, result_types=i32)
                    regs[0, 2 * (2 * i + nibble) + r, 0, 0, h, 0, 0, 0, 0] = _f16x2(key)
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)


def _value_tile(ctx, codes):
    """Value codes as f16 [128, 64 tokens] in the WGMMA layout (A operand of out^T = V^T . P^T), read from the
    cache's own page layout with transposing matrix loads.

    codes: uint8 [64 tokens, 64 bytes] in shared memory with the 64-byte swizzle (the 16-byte chunk c of row
    t sits at chunk c ^ ((t // 2) % 4)). `ldmatrix.trans` on 8 x 8 tiles of 16-bit pairs gives thread
    (warp w, lane 4g + j) bytes 16w + 2g and 16w + 2g + 1 of tokens 8c + 2j and 8c + 2j + 1 for each column
    tile c. The code masks read only the low bytes of the two f16 halves, so byte column 0 is used as loaded
    and byte column 1 after one shift right by 8 (no prmt). Row 64R + 16w + 8h + g of the
    tile is channel VALUE_CHANNELS[row] = 64R + 16w + 2g + h (R: nibble, h: byte of the pair).
    """
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    tid, w, g, j, c = _thread_coords()
    lane = arith.remui(tid, c(32))
    base = llvm.ptrtoint(i32, mgpu_utils.memref_ptr(codes))
    layout = mgpu.WGMMA_LAYOUT
    regs = np.empty(layout.registers_shape((HEAD_DIM, PAGE)), dtype=object)
    for quad in range(2):
        # lane l supplies the address of row l % 8 of tile 4 * quad + l // 8: token 8 * tile + l % 8, chunk w
        token = arith.addi(arith.muli(arith.addi(arith.divui(lane, c(8)), c(4 * quad)), c(8)), arith.remui(lane, c(8)))
        chunk = arith.xori(w, arith.remui(arith.divui(token, c(2)), c(4)))
        addr = arith.addi(base, arith.addi(arith.muli(token, c(PAGE)), arith.muli(chunk, c(16))))
        tiles = mgpu_utils.inline_ptx(
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];", addr,
            result_types=[i32] * 4)
        for k, word in enumerate(tiles):
            for h in range(2):
                spread = word if h == 0 else arith.shrui(word, c(8))  # bytes h, h + 2: both tokens' byte h
                for nibble in range(2):
                    regs[nibble, 4 * quad + k, 0, 0, h, 0, 0, 0, 0] = _f16x2(_codes(spread, high=bool(nibble)))
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)


def _mark_page(ctx, above, mark, flags):
    """If any element of `above` exceeds LAZY_MAX_SLACK, store `mark` (page + 1) into flags[page % 2].

    above: f32 [64, 16] in the WGMMA layout, the logits minus the running max (the exp2 argument of p);
    mark: i32 [64, 16] in the WGMMA layout, page + 1 everywhere; flags: i32 [2] in shared memory. The
    comparisons are or-ed as predicates (no per-element select). Two words alternate so that the next page's
    marks never overwrite a word before every thread has read it (reads follow the commit's barrier)."""
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    slack = arith.constant(ir.F32Type.get(), LAZY_MAX_SLACK)
    over = None
    for a in above.registers.flat:
        for n in range(2):
            x = arith.cmpf(arith.CmpFPredicate.OGT, vector.extract(
                a, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([n])), slack)
            over = x if over is None else arith.ori(over, x)
    value = vector.extract(mark.registers.flat[0], dynamic_position=[],
                           static_position=ir.DenseI64ArrayAttr.get([0]))
    base = llvm.ptrtoint(i32, mgpu_utils.memref_ptr(flags))
    mgpu_utils.inline_ptx(
        "{ .reg .pred p; .reg .b32 a; setp.ne.u32 p, $0, 0; and.b32 a, $1, 1; xor.b32 a, a, 1; "
        "shl.b32 a, a, 2; add.u32 a, a, $2; @p st.shared.u32 [a], $1; }",
        arith.extui(i32, over), value, base, has_side_effects=True)


def _f32_hex(x: float) -> str:
    """A float32 constant as a PTX immediate (0f + its IEEE bits)."""
    return f"0f{int(np.float32(x).view(np.uint32)):08X}"


def _prepare_query(ctx, natural, out, *, group: int, scale: float):
    """The kernel's q from the step's natural one, in shared memory: out[r, v] = f16(q[r, KEY_CHANNELS[v]] *
    scale * (1 / ln 2)) for the group's rows r < group, 0 for r >= group (what `kernel_query` computes in XLA
    from q * scale, with the same two float32 roundings before the f16 one).

    natural: bf16 [group, 128]; out: f16 [16, 128] with the tiling (8, 64) and 128-byte swizzle of q_s (tile
    (r // 8, v // 64) at (2 (r // 8) + v // 64) x 1024 bytes; in it, the 16-byte chunk k of row r sits at chunk
    k ^ (r % 8)). Thread t writes row t // 8, virtual channels 16c .. 16c + 15 (c = t % 8): by KEY_CHANNELS they
    are the natural dims 16j + 4(c // 2) + 64(c % 2) + (0 .. 3) for j = 0 .. 3, one 8-byte load each; the
    load's first bf16 pair becomes pair j of the thread's first 16-byte chunk (channels 16c + 2j, + 1), its
    second pair j of the second chunk (channels 16c + 8 + 2j, + 1).
    """
    del ctx
    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    tid, _, _, _, c = _thread_coords()
    row, blk = arith.divui(tid, c(8)), arith.remui(tid, c(8))
    src = mgpu_utils.memref_ptr(natural)
    base = arith.addi(arith.muli(arith.divui(blk, c(2)), c(4)), arith.muli(arith.remui(blk, c(2)), c(64)))
    have = arith.cmpi(arith.CmpIPredicate.ult, row, c(group))
    safe_row = llvm.select(have, row, c(0))  # rows past the group read row 0 and store zeros
    convert = ("{ .reg .b32 lo, hi; .reg .f32 a, b; shl.b32 lo, $1, 16; and.b32 hi, $1, 0xFFFF0000; "
               f"mul.rn.f32 a, lo, {_f32_hex(scale)}; mul.rn.f32 b, hi, {_f32_hex(scale)}; "
               f"mul.rn.f32 a, a, {_f32_hex(1.0 / LN2)}; mul.rn.f32 b, b, {_f32_hex(1.0 / LN2)}; "
               "cvt.rn.f16x2.f32 $0, b, a; }")
    zero = arith.constant(i32, 0)
    chunks = [[], []]
    v2 = ir.VectorType.get((2,), i32)
    for j in range(4):
        dim = arith.addi(base, c(16 * j))
        index = arith.extui(i64, arith.addi(arith.muli(safe_row, c(HEAD_DIM // 2)), arith.divui(dim, c(2))))
        words = llvm.load(v2, mgpu_utils.getelementptr(src, [index], i32))  # dims dim .. dim + 3 as 2 bf16 pairs
        for k in range(2):
            pair = vector.extract(words, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([k]))
            chunks[k].append(llvm.select(have, mgpu_utils.inline_ptx(convert, pair, result_types=i32), zero))
    dst = mgpu_utils.memref_ptr(out)
    tile = arith.addi(arith.muli(arith.divui(row, c(8)), c(2)), arith.divui(blk, c(4)))
    r8 = arith.remui(row, c(8))
    v4 = ir.VectorType.get((4,), i32)
    for k in range(2):
        chunk = arith.xori(arith.addi(arith.muli(arith.remui(blk, c(4)), c(2)), c(k)), r8)
        offset = arith.addi(arith.addi(arith.muli(tile, c(1024)), arith.muli(r8, c(128))), arith.muli(chunk, c(16)))
        vec = vector.from_elements(v4, chunks[k])
        llvm.store(vec, mgpu_utils.getelementptr(dst, [arith.extui(i64, arith.divui(offset, c(16)))], v4))


def _clear_flags(ctx, flags):
    """flags[0] = flags[1] = 0 (every thread stores a zero into word tid % 2)."""
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    base = llvm.ptrtoint(i32, mgpu_utils.memref_ptr(flags))
    mgpu_utils.inline_ptx(
        "{ .reg .b32 a, t; mov.u32 t, %tid.x; and.b32 t, t, 1; shl.b32 t, t, 2; add.u32 a, t, $0; "
        "st.shared.u32 [a], 0; }", base, has_side_effects=True)


def _value_channels() -> np.ndarray:
    """VALUE_CHANNELS[r] = the head dim held by row r of the value tile (and of the kernel's output rows)."""
    r = np.arange(HEAD_DIM)
    nibble, w, h, g = r // 64, (r // 16) % 4, (r // 8) % 2, r % 8
    return 64 * nibble + 16 * w + 2 * g + h


VALUE_CHANNELS = _value_channels()
NATURAL_FROM_VALUE_ROWS = np.argsort(VALUE_CHANNELS)


def split_pages(num_pages, split, num_splits: int):
    """(first, stop): the pages split `split` attends, first <= page < stop. Splits take contiguous runs of
    ceil(num_pages / num_splits) pages (the last ones fewer or none). Ints or int32 arrays (traced in the
    kernel)."""
    per_split = (num_pages + num_splits - 1) // num_splits
    first = jnp.minimum(split * per_split, num_pages)
    stop = jnp.minimum(first + per_split, num_pages)
    return first, stop


def _kernel(q_ref, kc_ref, ks_ref, kz_ref, vc_ref, vs_ref, vz_ref, cnt_ref, np_ref, o_ref, ml_ref,
            q_s, kc_s, ks_s, kz_s, vc_s, vs_s, vz_s, staging_s, p_s, o_s, ml_s, flag_s, setup_bar, full,
            *query_staging, stages: int, num_splits: int, group: int, query_scale: float | None):
    b, h, split = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("splits")
    if query_scale is None:
        plgpu.copy_gmem_to_smem(q_ref.at[b, h], q_s, setup_bar)
    else:  # the step's q as the model computed it: this KV head's group of rows, prepared after the copy
        plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(h * group, group)], query_staging[0], setup_bar)
    num_pages = plgpu.load(np_ref.at[b])
    first, stop = split_pages(num_pages, split, num_splits)

    def issue(page, slot):
        """Copy page `page` into slot `slot` (COPIES_PER_PAGE bulk copies behind the slot's barrier)."""
        bar = full.at[slot]
        plgpu.copy_gmem_to_smem(kc_ref.at[b, h, pl.ds(page * PAGE, PAGE)], kc_s.at[slot], bar)
        plgpu.copy_gmem_to_smem(ks_ref.at[b, h, page], ks_s.at[slot], bar)
        plgpu.copy_gmem_to_smem(kz_ref.at[b, h, page], kz_s.at[slot], bar)
        plgpu.copy_gmem_to_smem(vc_ref.at[b, h, pl.ds(page * PAGE, PAGE)], vc_s.at[slot], bar)
        plgpu.copy_gmem_to_smem(vs_ref.at[b, h, pl.ds(page * PAGE, PAGE)], vs_s.at[slot], bar)
        plgpu.copy_gmem_to_smem(vz_ref.at[b, h, pl.ds(page * PAGE, PAGE)], vz_s.at[slot], bar)

    for k in range(stages):
        @pl.when(first + k < stop)
        def _prologue(k=k):
            issue(first + k, k)

    plgpu.barrier_wait(setup_bar)
    if query_scale is not None:
        plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType(transforms=swizzled(jnp.float16, HEAD_DIM))))(
            functools.partial(_prepare_query, group=group, scale=query_scale))(query_staging[0], q_s)
        plgpu.commit_smem()  # q visible to the tensor cores
    wg = plgpu.Layout.WGMMA
    key_tile = plgpu.inline_mgpu(
        arg_types=(plgpu.RefType(),) * 4,
        return_type=plgpu.ShapeDtypeStruct((PAGE, HEAD_DIM), jnp.float16, layout=wg))(_key_tile)
    value_tile = plgpu.inline_mgpu(
        arg_types=(plgpu.RefType(transforms=swizzled(jnp.uint8, BYTES)),),
        return_type=plgpu.ShapeDtypeStruct((HEAD_DIM, PAGE), jnp.float16, layout=wg))(_value_tile)
    mark_page = plgpu.inline_mgpu(arg_types=(wg, wg, plgpu.RefType()))(_mark_page)
    # ordered before the first page's marks by the key staging barrier of that page
    plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))(_clear_flags)(flag_s)
    per_token = functools.partial(lax.broadcast_in_dim, shape=(PAGE, ROWS), broadcast_dimensions=[0])
    per_row = functools.partial(lax.broadcast_in_dim, shape=(PAGE, ROWS), broadcast_dimensions=[1])

    def body(page, carry):
        # The named scopes are the regions of the optional trace (`low_bit_splits(profile_dir=...)`); without
        # it they generate no code.
        acc, m, l_part, z_part = carry
        slot = (page - first) % stages
        count = plgpu.load(cnt_ref.at[b, page])  # issued before the wait: its latency hides behind the copy
        with jax.named_scope("wait"):
            plgpu.barrier_wait(full.at[slot])
        with jax.named_scope("keys"):
            keys = key_tile(kc_s.at[slot], ks_s.at[slot], kz_s.at[slot], staging_s)

        def qk(acc_ref):
            plgpu.wgmma(acc_ref, keys, q_s.T)
            values = value_tile(vc_s.at[slot])  # unpacked while the tensor cores run Q.K
            return acc_ref[...], values

        with jax.named_scope("qk_values"):
            s, values = pl.run_scoped(qk, plgpu.ACC((PAGE, ROWS), jnp.float32))
        with jax.named_scope("softmax"):
            tokens = plgpu.broadcasted_iota(jnp.int32, (PAGE, ROWS), 0, layout=wg)
            s = jnp.where(tokens < count, s, -jnp.inf)
            v_scale = plgpu.load(vs_s.at[slot], layout=wg.reduce(1)).astype(jnp.float32)
            v_zero = plgpu.load(vz_s.at[slot], layout=wg.reduce(1)).astype(jnp.float32)

            # Lazy max: the running max m is kept unless a logit of this page exceeds it by more than
            # LAZY_MAX_SLACK, so p = 2^(s - m) <= 2^LAZY_MAX_SLACK and no cross-warp maximum is needed. A thread
            # holding a larger logit marks the page in `flag_s`; all threads read the mark after the commit's
            # barrier (a uniform branch) and a marked page is redone with the exact maximum (the first page of
            # a split always is).
            above = s - per_row(m)  # base-2 log of p: the page is marked where it exceeds the slack
            p = jnp.exp2(above)
            p_s[...] = (p * per_token(v_scale)).astype(jnp.float16)
            mark = plgpu.layout_cast(jnp.full((PAGE, ROWS), page + 1, jnp.int32), wg)
            mark_page(above, mark, flag_s)
        with jax.named_scope("commit"):
            plgpu.commit_smem()  # P visible to the tensor cores; every thread is done reading the slot

        def redo():
            m_new = jnp.maximum(m, s.max(axis=0))
            alpha = jnp.exp2(m - m_new)
            p = jnp.exp2(s - per_row(m_new))
            p_s[...] = (p * per_token(v_scale)).astype(jnp.float16)
            plgpu.commit_smem()
            return (acc * lax.broadcast_in_dim(alpha, acc.shape, [1]), m_new,
                    l_part * per_row(alpha) + p, z_part * per_row(alpha) + p * per_token(v_zero))

        def keep():
            return acc, m, l_part + p, z_part + p * per_token(v_zero)

        with jax.named_scope("redo"):
            acc, m, l_part, z_part = lax.cond(flag_s[page % 2] == page + 1, redo, keep)

        following = page + stages

        @pl.when(following < stop)
        def _refill():
            # One warp issues the slot's copies; the other three skip their address arithmetic.
            @plgpu.warp_map
            def _(warp):
                @pl.when(warp == 0)
                def _():
                    issue(following, slot)

        def pv(acc_ref):
            plgpu.wgmma(acc_ref, values, p_s)
            return acc_ref[...]

        with jax.named_scope("pv"):
            # Each page's P.V starts from zero and is added here: accumulating all pages inside the tensor
            # cores loses precision with the number of pages (on the H200, relative error ~3e-5 per page,
            # 1.4e-2 over 512 pages).
            acc = acc + pl.run_scoped(pv, plgpu.ACC((HEAD_DIM, ROWS), jnp.float32))
        return acc, m, l_part, z_part

    carry = (plgpu.layout_cast(jnp.zeros((HEAD_DIM, ROWS), jnp.float32), wg),
             plgpu.layout_cast(jnp.full((ROWS,), NEG_INIT, jnp.float32), wg.reduce(0)),
             plgpu.layout_cast(jnp.zeros((PAGE, ROWS), jnp.float32), wg),
             plgpu.layout_cast(jnp.zeros((PAGE, ROWS), jnp.float32), wg))
    acc, m, l_part, z_part = lax.fori_loop(first, stop, body, carry)
    o_s[...] = acc + lax.broadcast_in_dim(z_part.sum(axis=0), acc.shape, [1])
    ml_s[0] = m
    ml_s[1] = l_part.sum(axis=0)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_ref.at[b, h, split])
    plgpu.copy_smem_to_gmem(ml_s, ml_ref.at[b, h, split])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("num_splits", "stages", "profile_dir", "packed", "query_scale"))
def low_bit_splits(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, page_count, num_pages, *,
                   num_splits: int, stages: int = 2, profile_dir: str | None = None, packed: bool = False,
                   query_scale: float | None = None):
    """Split-K decode attention over the low-bit pages of each (sequence, KV head), on the cache's own arrays.

    q: f16 [B, H, 16, 128], query rows of each KV head's GQA group (zero rows past the group), channels in
      KEY_CHANNELS order, times softmax_scale * log2(e) (base-2 logits): `kernel_query`'s output. With
      query_scale (softmax_scale, a Python float), q is instead the step's query as the model computed it,
      bf16 [B, H * G, 128] (G <= 16 query heads per KV head), and each block prepares its rows in shared
      memory as `kernel_query` would from q * query_scale grouped by KV head: no separate launch converts q
      before the kernel;
    k_codes, v_codes: uint8 [B, H, S, 64] (the cache's packing); k_scale, k_zero: bf16 [B, H, S // 64, 128]
      per page and channel; v_scale, v_zero: bf16 [B, H, S] per token; page_count: int32 [B, S // 64] tokens
      at the front of each page; num_pages: int32 [B] pages in use.
    Returns (o f32 [B, H, splits, 16, 128] unnormalized, channels in VALUE_CHANNELS order; m f32
    [B, H, splits, 16] the base-2 reference of o and l: the split's logits are at most m + LAZY_MAX_SLACK
    (the lazy running max); l f32 [B, H, splits, 16] denominator, sum of 2^(logit - m)). A split without
    pages has o = 0, m = NEG_INIT and l = 0. `merge` combines the splits.
    profile_dir: also write a trace of every block's loop regions (wait, keys, qk_values, softmax, commit, redo,
    pv per page; Mosaic GPU's profiler, timestamps of warpgroup thread 0) to this folder, one JSON per call
    (`benchmarks/profile_decode_mgpu.py` summarizes it). The profile adds a few cycles per region.
    packed: return (o, ml) as the kernel writes them, o f32 [B, H, splits, 128, 16] and ml f32
    [B, H, splits, 2, 16] (m, l), with no transpose or slice after the kernel (`decode_merge` reads them so).
    Split s attends the contiguous run of pages `split_pages(num_pages, s, num_splits)`, one page a slot and
    `stages` slots in flight (larger copies, wider code rows and interleaved splits measured no faster:
    docs/design.md, "Answered questions").
    """
    bsz, heads, slots, _ = k_codes.shape
    pages = slots // PAGE
    group = q.shape[1] // heads if query_scale is not None and q.ndim == 3 else ROWS
    if query_scale is not None and (q.ndim != 3 or q.shape[1] % heads or not 1 <= group <= ROWS):
        raise ValueError(f"with query_scale, q must be bf16 [B={bsz}, H * G, {HEAD_DIM}] for H={heads} KV heads and "
                         f"1 <= G <= {ROWS}, got {q.dtype} {q.shape}")
    q_shape = (bsz, heads * group, HEAD_DIM) if query_scale is not None else (bsz, heads, ROWS, HEAD_DIM)
    expected = {
        "q": (q, q_shape, jnp.bfloat16 if query_scale is not None else jnp.float16),
        "k_codes": (k_codes, (bsz, heads, pages * PAGE, BYTES), jnp.uint8),
        "k_scale": (k_scale, (bsz, heads, pages, HEAD_DIM), jnp.bfloat16),
        "k_zero": (k_zero, (bsz, heads, pages, HEAD_DIM), jnp.bfloat16),
        "v_codes": (v_codes, (bsz, heads, pages * PAGE, BYTES), jnp.uint8),
        "v_scale": (v_scale, (bsz, heads, pages * PAGE), jnp.bfloat16),
        "v_zero": (v_zero, (bsz, heads, pages * PAGE), jnp.bfloat16),
        "page_count": (page_count, (bsz, pages), jnp.int32),
        "num_pages": (num_pages, (bsz,), jnp.int32),
    }
    for name, (x, shape, dtype) in expected.items():
        if x.shape != shape or x.dtype != dtype:
            raise ValueError(f"{name} must be {jnp.dtype(dtype).name} {shape}, got {x.dtype} {x.shape}")
    if num_splits < 1 or stages < 1:
        raise ValueError(f"num_splits and stages must be >= 1, got {num_splits}, {stages}")
    f32, u8, bf16 = jnp.float32, jnp.uint8, jnp.bfloat16
    kernel = plgpu.kernel(
        functools.partial(_kernel, stages=stages, num_splits=num_splits, group=group,
                          query_scale=None if query_scale is None else float(query_scale)),
        out_type=(jax.ShapeDtypeStruct((bsz, heads, num_splits, HEAD_DIM, ROWS), f32),
                  jax.ShapeDtypeStruct((bsz, heads, num_splits, 2, ROWS), f32)),
        grid=(bsz, heads, num_splits),
        grid_names=("batch", "heads", "splits"),
        scratch_types=[
            plgpu.SMEM((ROWS, HEAD_DIM), jnp.float16, transforms=swizzled(jnp.float16, HEAD_DIM)),
            plgpu.SMEM((stages, PAGE, BYTES), u8),
            plgpu.SMEM((stages, HEAD_DIM), bf16),
            plgpu.SMEM((stages, HEAD_DIM), bf16),
            plgpu.SMEM((stages, PAGE, BYTES), u8, transforms=swizzled(u8, BYTES)),  # 64-byte swizzle
            plgpu.SMEM((stages, PAGE), bf16),
            plgpu.SMEM((stages, PAGE), bf16),
            plgpu.SMEM((HEAD_DIM,), jnp.int32),  # f16 pairs of the key scales and zeros
            plgpu.SMEM((PAGE, ROWS), jnp.float16, transforms=swizzled(jnp.float16, ROWS)),
            plgpu.SMEM((HEAD_DIM, ROWS), f32),
            plgpu.SMEM((2, ROWS), f32),
            plgpu.SMEM((2,), jnp.int32),  # lazy max: pages marked for an exact redo
            plgpu.Barrier(num_arrivals=1),
            plgpu.Barrier(num_arrivals=COPIES_PER_PAGE, num_barriers=stages),
            # the step's q rows as copied, before `_prepare_query` (only with query_scale)
            *([plgpu.SMEM((group, HEAD_DIM), jnp.bfloat16)] if query_scale is not None else []),
        ],
        # Every shared buffer is either written by threads and read by the tensor cores or bulk copies after
        # an explicit commit (P, the output), or filled by bulk copies and read by threads before the commit
        # that precedes its refill (the page slots), or exchanged between threads across an explicit barrier
        # (the key parameters): Pallas's automatic barriers around each store and copy are not needed.
        compiler_params=plgpu.CompilerParams(
            unsafe_no_auto_barriers=True,
            # exp2 as one ex2.approx.ftz (results below 2^-126 flush to 0); without it ptxas wraps each exp2 in
            # a 4-instruction subnormal range fix-up (seen in the kernel's SASS, benchmarks/mosaic_sass.py)
            approx_math=True,
            # regions x (begin, end) per page of the longest split, plus slack; bounds-checked anyway
            **(dict(profile_space=16 * (pages // num_splits + 2), profile_dir=profile_dir,
                    profile_bounds_check=True) if profile_dir else {})),
    )
    o_t, ml = kernel(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, page_count, num_pages)
    if packed:
        return o_t, ml
    return jnp.swapaxes(o_t, -1, -2), ml[..., 0, :], ml[..., 1, :]


def reference_low_bit(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, page_count, num_pages):
    """float64 NumPy oracle of `low_bit_splits` merged over splits: (out [B, H, 16, 128], m, l), where out is
    the softmax-weighted sum (normalized) and q is in the *natural* channel order, base-2 logits."""
    q = np.asarray(q, np.float64)
    bsz, heads, slots, _ = k_codes.shape
    codes = np.asarray(k_codes)
    kq = np.concatenate([codes & 0xF, codes >> 4], axis=-1).astype(np.float64)
    vcodes = np.asarray(v_codes)
    vq = np.concatenate([vcodes & 0xF, vcodes >> 4], axis=-1).astype(np.float64)
    ks = np.repeat(np.asarray(k_scale, np.float64), PAGE, axis=2)
    kz = np.repeat(np.asarray(k_zero, np.float64), PAGE, axis=2)
    keys = kq * ks + kz
    vals = vq * np.asarray(v_scale, np.float64)[..., None] + np.asarray(v_zero, np.float64)[..., None]
    out = np.zeros(q.shape)
    m_all = np.full(q.shape[:3], -np.inf)
    l_all = np.zeros(q.shape[:3])
    for bi in range(bsz):
        valid = np.zeros(slots, bool)
        for p in range(int(num_pages[bi])):
            valid[p * PAGE: p * PAGE + int(page_count[bi, p])] = True
        if not valid.any():
            continue
        for hi in range(heads):
            s = q[bi, hi] @ keys[bi, hi, valid].T
            m = s.max(axis=1)
            p = np.exp2(s - m[:, None])
            out[bi, hi] = p @ vals[bi, hi, valid] / p.sum(axis=1)[:, None]
            m_all[bi, hi], l_all[bi, hi] = m, p.sum(axis=1)
    return out, m_all, l_all


def kernel_query(q_groups):
    """The query rows of each KV head's GQA group times the softmax scale, float32 [B, H, G <= 16, 128] ->
    the kernel's q: f16 [B, H, 16, 128] (zero rows past the group), times 1 / ln 2 (base-2 logits), channels in
    KEY_CHANNELS order."""
    qg = jnp.pad(q_groups, ((0, 0), (0, 0), (0, ROWS - q_groups.shape[2]), (0, 0)))
    return (qg * (1.0 / LN2))[..., KEY_CHANNELS].astype(jnp.float16)


def natural_splits(o, m, l):
    """`low_bit_splits`' outputs in the Triton kernel's split convention (`pallas_kernels.decode.merge_splits`):
    output channels in natural order, natural-log maxima, -inf for a split without keys."""
    return o[..., NATURAL_FROM_VALUE_ROWS], jnp.where(l > 0, m * LN2, -jnp.inf), l


def merge(o, m, l):
    """Merge `low_bit_splits`' partial states into the normalized output [B, H, 16, 128], channels in the
    natural order (0 for a sequence without pages)."""
    out, _ = merge_splits(*natural_splits(o, m, l), ROWS)
    return out.reshape(o.shape[0], o.shape[1], ROWS, HEAD_DIM)
