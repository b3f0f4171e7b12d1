"""Write ablated copies of the Mosaic low-bit decode kernel's module, to find what bounds its page loop.

Each variant is `pallas_kernels/decode_mgpu.py` with one part of the per-page work taken out or doubled. The
outputs of most are meaningless; only their time per call is evidence (`benchmarks/decode_mgpu_ab.py --variant`
times them against the module as it is, one process, same inputs):

  keys_const    the key tile is a constant (no code loads, no parameter staging, no unpack)
  values_const  the value tile is a constant (no ldmatrix, no unpack)
  tiles_const   both
  qk_twice      the Q.K wgmma issued twice per page (the second accumulates on the first)
  pv_twice      the P.V wgmma issued twice per page
  no_redo       no lazy-max mark and no redo branch (the keep branch always; p overflows, timing only)
  stages3/4     three or four page slots in flight instead of two
  copy_only     the loop only waits for each page's copies and refills the slot: the kernel's streaming floor
  copy_only_stages4  the same with four slots
  codes_copies  the whole kernel, but only the two code copies per page (the scales and zero points are read
                from slots never filled)
  copy_only_codes    the streaming floor with only the two code copies per page
  pv_overlap    a candidate, not an ablation (exact): the next page's wait and key unpack run while the tensor
                cores do this page's P.V (the key tile is carried to the next iteration)
  wide_keys     a candidate (exact): a page's key codes copied as a [16, 256]-byte box instead of [64, 64]
                (the same bytes in the same order in shared memory)
  wide          a candidate (exact): wide keys, and the value codes as a [32, 128]-byte box with the 128-byte
                swizzle (two tokens a row; the ldmatrix addresses follow); since session 51 the kernel's own
                `wide` option, made the default here
  copy_only_wide     the streaming floor with the wide boxes
  wide_keys_const    wide, with the key tile a constant (what is left once the keys cost nothing)

If a part bounds the loop, taking it out shortens the call and doubling it lengthens it by about its share.
Run here before a GPU call (the folder is git-ignored and carried): python benchmarks/mosaic_ablation_variants.py
"""

from __future__ import annotations

import argparse
import os

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pallas_kernels",
                      "decode_mgpu.py")

_CONST_TILE = '''

def _const_tile(shape):
    """A WGMMA-layout f16 tile of ones: the tensor cores get an operand without the unpack."""
    i32 = ir.IntegerType.get_signless(32)
    layout = mgpu.WGMMA_LAYOUT
    regs = np.empty(layout.registers_shape(shape), dtype=object)
    one = _f16x2(arith.constant(i32, 0x3C003C00))
    for index in np.ndindex(regs.shape):
        regs[index] = one
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)
'''
_CONST_KEYS = '''

def _key_tile(ctx, codes, scale, zero, staging):
    del ctx, codes, scale, zero, staging
    return _const_tile((PAGE, HEAD_DIM))
'''
_CONST_VALUES = '''

def _value_tile(ctx, codes):
    del ctx, codes
    return _const_tile((HEAD_DIM, PAGE))
'''
QK = "            plgpu.wgmma(acc_ref, keys, q_s.T)\n"
PV = "            plgpu.wgmma(acc_ref, values, p_s)\n"
MARK = "            mark_page(above, mark, flag_s)\n"
COND = "lax.cond(flag_s[page % 2] == page + 1, redo, keep)"
STAGES = "num_splits: int, stages: int = 2,"
LOOP = "    carry = (plgpu.layout_cast(jnp.zeros((HEAD_DIM, ROWS), jnp.float32), wg),\n"
# inserted before the loop, this `body` replaces the kernel's: wait for the slot, then (after a warpgroup
# barrier, as the kernel's commit orders its reads before the refill) refill it
_COPY_BODY = """    def body(page, carry):
        slot = (page - first) % stages
        plgpu.barrier_wait(full.at[slot])
        plgpu.commit_smem()

        @pl.when(page + stages < stop)
        def _refill():
            @plgpu.warp_map
            def _(warp):
                @pl.when(warp == 0)
                def _():
                    issue(page + stages, slot)

        return carry

"""
SMALL_COPIES = ("            plgpu.copy_gmem_to_smem(ks_ref.at[b, h, page], ks_s.at[slot], bar)\n",
                "            plgpu.copy_gmem_to_smem(kz_ref.at[b, h, page], kz_s.at[slot], bar)\n",
                "            plgpu.copy_gmem_to_smem(vs_ref.at[b, h, pl.ds(page * PAGE, PAGE)], vs_s.at[slot], bar)\n",
                "            plgpu.copy_gmem_to_smem(vz_ref.at[b, h, pl.ds(page * PAGE, PAGE)], vz_s.at[slot], bar)\n")


def _replace(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise ValueError(f"expected one occurrence of {old!r} in {SOURCE}, found {text.count(old)}")
    return text.replace(old, new)


# pv_overlap: the loop carries the next page's key tile, made while the tensor cores run this page's P.V
PV_OVERLAP = [
    ("    def body(page, carry):\n", """    def next_keys(page):
        slot = (page - first) % stages
        plgpu.barrier_wait(full.at[slot])
        return key_tile(kc_s.at[slot], ks_s.at[slot], kz_s.at[slot], staging_s)

    def body(page, carry):
"""),
    ("""        acc, m, l_part, z_part = carry
        if ppc == 1:
            slot = buf = (page - first) % stages
""", """        acc, m, l_part, z_part, keys = carry
        if ppc == 1:
            slot = buf = (page - first) % stages
"""),
    ("""        with jax.named_scope("wait"):
            if ppc == 1:
                plgpu.barrier_wait(full.at[slot])
            else:
                @pl.when(sub == 0)
                def _wait():
                    plgpu.barrier_wait(full.at[slot])
        with jax.named_scope("keys"):
            keys = key_tile(kc_s.at[buf], ks_s.at[buf], kz_s.at[buf], staging_s)
""", ""),
    ("""            plgpu.wgmma(acc_ref, values, p_s)
            return acc_ref[...]
""", """            plgpu.wgmma(acc_ref, values, p_s)
            following = lax.cond(page + 1 < stop, lambda: next_keys(page + 1), lambda: keys)  # last: unused
            return acc_ref[...], following
"""),
    ("""            acc = acc + pl.run_scoped(pv, plgpu.ACC((HEAD_DIM, ROWS), jnp.float32))
        return acc, m, l_part, z_part
""", """            out, keys = pl.run_scoped(pv, plgpu.ACC((HEAD_DIM, ROWS), jnp.float32))
            acc = acc + out
        return acc, m, l_part, z_part, keys
"""),
    ("""             plgpu.layout_cast(jnp.zeros((PAGE, ROWS), jnp.float32), wg))
    acc, m, l_part, z_part = lax.fori_loop(first, stop, body, carry)
""", """             plgpu.layout_cast(jnp.zeros((PAGE, ROWS), jnp.float32), wg),
             lax.cond(first < stop, lambda: next_keys(first),
                      lambda: plgpu.layout_cast(jnp.zeros((PAGE, HEAD_DIM), jnp.float16), wg)))
    acc, m, l_part, z_part, _ = lax.fori_loop(first, stop, body, carry)
"""),
]


# Wide boxes are the kernel's `low_bit_splits(wide=...)` option since session 51: `wide` makes it the default;
# `wide_keys` keeps the values' [64, 64]-byte boxes.
WIDE = [("query_scale: float | None = None, pages_per_copy: int = 1, wide: bool = False,\n",
         "query_scale: float | None = None, pages_per_copy: int = 1, wide: bool = True,\n")]
WIDE_KEYS = WIDE + [
    ("    key_rows, value_rows = ((16, 256), (32, 128)) if wide else",
     "    key_rows, value_rows = ((16, 256), (PAGE, BYTES)) if wide else"),
    ("        arg_types=(plgpu.RefType(transforms=_swizzled(jnp.uint8, 128 if wide else BYTES)),),",
     "        arg_types=(plgpu.RefType(transforms=_swizzled(jnp.uint8, BYTES)),),"),
    ("            functools.partial(_value_tile, wide=True) if wide else _value_tile)", "            _value_tile)"),
]


def _apply(text: str, pairs) -> str:
    for old, new in pairs:
        text = _replace(text, old, new)
    return text


def _codes_copies(text: str) -> str:
    for line in SMALL_COPIES:
        text = _replace(text, line, "")
    return _replace(text, "COPIES_PER_PAGE = 6", "COPIES_PER_PAGE = 2")


def variants(text: str) -> dict[str, str]:
    """Variant name -> module source."""
    copy_only = _replace(text, LOOP, _COPY_BODY + LOOP)
    return {
        "keys_const": text + _CONST_TILE + _CONST_KEYS,
        "values_const": text + _CONST_TILE + _CONST_VALUES,
        "tiles_const": text + _CONST_TILE + _CONST_KEYS + _CONST_VALUES,
        "qk_twice": _replace(text, QK, QK + QK),
        "pv_twice": _replace(text, PV, PV + PV),
        "no_redo": _replace(_replace(text, MARK, ""), COND, "keep()"),
        "stages3": _replace(text, STAGES, STAGES.replace("2", "3")),
        "stages4": _replace(text, STAGES, STAGES.replace("2", "4")),
        "copy_only": copy_only,
        "copy_only_stages4": _replace(copy_only, STAGES, STAGES.replace("2", "4")),
        "codes_copies": _codes_copies(text),
        "copy_only_codes": _codes_copies(copy_only),
        "pv_overlap": _apply(text, PV_OVERLAP),
        "wide_keys": _apply(text, WIDE_KEYS),
        "wide": _apply(text, WIDE),
        "copy_only_wide": _apply(copy_only, WIDE),
        "wide_keys_const": _apply(text, WIDE) + _CONST_TILE + _CONST_KEYS,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".gpu_run/ablation", help="folder for the variant modules")
    p.add_argument("names", nargs="*", help="variants to write (default: all)")
    args = p.parse_args()
    with open(SOURCE) as f:
        built = variants(f.read())
    os.makedirs(args.out, exist_ok=True)
    for name in args.names or built:
        path = os.path.join(args.out, name + ".py")
        with open(path, "w") as f:
            f.write(built[name])
        print(path)


if __name__ == "__main__":
    main()
