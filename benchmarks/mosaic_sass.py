"""Registers, shared memory and machine code (SASS) of the Mosaic GPU kernels, on a machine without a GPU.

Mosaic GPU compiles a kernel (MLIR -> PTX -> ptxas) inside the CUDA plugin when XLA compiles the program,
which normally needs a GPU. Here the kernel is lowered on the CPU as in the lowering tests, its module is
handed to the plugin's compiler (`MosaicGpuCompile`) with a libcuda stub that answers for an H200 (sm_90a),
and Mosaic's own dump writes the PTX and the ptxas report before the module load fails (no GPU); ptxas and
nvdisasm then give the SASS. Set up the tools once with `bash scripts/offline_cuda/setup.sh`.

  python -m benchmarks.mosaic_sass decode --out DIR     # pallas_kernels.decode_mgpu.low_bit_splits
  python -m benchmarks.mosaic_sass decode --module PATH.py --out DIR   # a modified copy of decode_mgpu.py
  python -m benchmarks.mosaic_sass prefill --out DIR    # pallas_kernels.prefill_mgpu, prefill_launch.PrefillTuning()

Writes KERNEL.ptx, KERNEL.ptxas.txt, KERNEL.sass and KERNEL.json (registers, spills, instructions in the
kernel and in its largest loop by opcode) into DIR and prints the summary. Checked against a GPU machine: for
an earlier version of the decode kernel (138 registers, a 696-instruction loop) the SASS built here is
identical, instruction for instruction, to the GPU build's.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile

from benchmarks.cases import QWEN3_8B_HEADS
from benchmarks.common import ROOT, check_out, module_env, write_json

TOOLS = os.path.join(ROOT, ".offline_cuda")
CUDA = os.path.join(TOOLS, "root", "nvidia", "cu13")
PLUGIN = os.path.join(TOOLS, "root", "jax_plugins", "xla_cuda13", "xla_cuda_plugin.so")
RUNTIME = os.path.join(TOOLS, "root", "jax_cuda13_plugin", "libmosaic_gpu_runtime.so")

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\s+`\((\.L_x_\d+)\)")


def sass_summary(sass: str) -> dict:
    """Instruction counts of nvdisasm output: {"instructions", "opcodes", "loop": {"start", "end",
    "instructions", "opcodes", "skips"} of the largest loop, or None}. A loop is a backward branch before the
    last EXIT (the out-of-line retry stubs of barrier waits sit after it and jump back into the body). Opcodes
    drop modifiers (HFMA2.MMA -> HFMA2) and predicates. "skips" lists the loop's forward branches to a label
    inside it, {"at", "instructions"}: how many loop instructions a taken branch jumps over (a rarely taken
    path, e.g. the lazy max's redo, or a block only some warps run), so the path a warp runs per iteration
    can be counted."""
    rows, labels, loops, exits, forward = [], {}, [], [], []
    pending = []
    for line in sass.splitlines():
        if m := _LABEL.match(line.strip()):
            pending.append(m.group(1))
            continue
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        address, opcode = int(m.group(1), 16), m.group(2)
        for label in pending:
            labels[label] = address
        pending = []
        rows.append((address, opcode))
        if opcode == "EXIT":
            exits.append(address)
        if b := _BRANCH.search(line):
            if labels.get(b.group(1), address + 1) <= address:
                loops.append((labels[b.group(1)], address))
            else:
                forward.append((address, b.group(1)))  # label not seen yet: later in the listing
    if exits:
        loops = [x for x in loops if x[1] < exits[-1]]
    loop = None
    if loops:
        start, end = max(loops, key=lambda x: x[1] - x[0])
        inside = [op for a, op in rows if start <= a <= end]
        skips = [dict(at=hex(a), instructions=sum(1 for x, _ in rows if a < x < labels[label]))
                 for a, label in forward if start <= a <= end and a < labels.get(label, -1) <= end]
        loop = dict(start=hex(start), end=hex(end), instructions=len(inside),
                    opcodes=dict(collections.Counter(inside).most_common()), skips=skips)
    return dict(instructions=len(rows), opcodes=dict(collections.Counter(op for _, op in rows).most_common()),
                loop=loop)


def ptxas_summary(report: str) -> dict:
    """Registers, spill bytes and barriers from `ptxas -v` output."""
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return dict(registers=int(registers.group(1)) if registers else None,
                spill_store_bytes=int(spills.group(1)) if spills else None,
                spill_load_bytes=int(spills.group(2)) if spills else None)


def _lower(kernel: str, module_path: str | None = None):
    """Lower one kernel for CUDA on this machine; returns its Mosaic GPU module (bytecode). module_path: a
    modified copy of pallas_kernels/decode_mgpu.py to lower instead (decode only)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import core

    sd = jax.ShapeDtypeStruct
    if kernel == "decode":
        if module_path:
            from benchmarks.common import load_module

            dm = load_module(module_path, "decode_mgpu_variant")
        else:
            from pallas_kernels import decode_mgpu as dm

        b, h, pages = 1, 2, 4
        u8, bf = jnp.uint8, jnp.bfloat16
        args = (sd((b, h, dm.ROWS, dm.HEAD_DIM), jnp.float16), sd((b, h, pages * dm.PAGE, dm.BYTES), u8),
                sd((b, h, pages, dm.HEAD_DIM), bf), sd((b, h, pages, dm.HEAD_DIM), bf),
                sd((b, h, pages * dm.PAGE, dm.BYTES), u8), sd((b, h, pages * dm.PAGE), bf),
                sd((b, h, pages * dm.PAGE), bf), sd((b, pages), jnp.int32), sd((b,), jnp.int32))
        fn = jax.jit(lambda *a: dm.low_bit_splits(*a, num_splits=2, stages=2))
    elif kernel == "prefill":
        from hyquant_jax.prefill_launch import PrefillTuning
        from pallas_kernels.prefill_mgpu import argument_shapes, hybrid_prefill_mgpu

        heads, kv_heads, head_dim = QWEN3_8B_HEADS
        args = argument_shapes(1, heads, kv_heads, 4096, 256, head_dim)  # 4K tokens, as the lowering tests
        fn = jax.jit(lambda *a: hybrid_prefill_mgpu(*a, scale=head_dim ** -0.5, **PrefillTuning().mosaic()))
    else:
        raise ValueError(f"kernel must be 'decode' or 'prefill', got {kernel!r}")
    before = set(core.KNOWN_KERNELS)
    fn.trace(*args).lower(lowering_platforms=("cuda",))
    new = [v for k, v in core.KNOWN_KERNELS.items() if k not in before]
    if len(new) != 1:
        raise RuntimeError(f"expected one Mosaic GPU kernel, lowering gave {len(new)}")
    return new[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kernel", choices=("decode", "prefill"))
    p.add_argument("--out", default=".")
    p.add_argument("--module", help="decode only: a modified copy of pallas_kernels/decode_mgpu.py to compile "
                                    "instead")
    args = p.parse_args()
    if args.module and args.kernel != "decode":
        p.error("--module is for the decode kernel only")
    if not os.path.exists(PLUGIN):
        sys.exit(f"{PLUGIN} is missing: run `bash scripts/offline_cuda/setup.sh` first")
    stub_dir = os.path.join(TOOLS, "lib")
    if os.environ.get("MOSAIC_SASS_CHILD") != "1":  # the stub must be on the loader path from process start
        env = dict(os.environ, MOSAIC_SASS_CHILD="1", JAX_PLATFORMS="cpu",
                   PATH=":".join([os.path.join(CUDA, "bin"), os.environ.get("PATH", "")]),
                   LD_LIBRARY_PATH=":".join(filter(None, [stub_dir, os.environ.get("LD_LIBRARY_PATH")])))
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.mosaic_sass", *sys.argv[1:]], module_env(env))

    check_out(args.out)
    with tempfile.TemporaryDirectory() as dump:
        os.environ.update(MOSAIC_GPU_CUDA_ROOT=CUDA, MOSAIC_GPU_RUNTIME_LIB_PATH=RUNTIME, MOSAIC_GPU_DUMP_PTX="1",
                          MOSAIC_GPU_DUMP_TO=dump)
        module = _lower(args.kernel, args.module)
        compile_module = ctypes.CDLL(PLUGIN).MosaicGpuCompile
        compile_module.argtypes = [ctypes.c_char_p, ctypes.c_int]
        compile_module.restype = ctypes.c_void_p
        # It fails at the module load (no GPU), after the PTX is dumped; its messages go to a log that is
        # shown only when no PTX came out.
        log_path = os.path.join(dump, "compile.log")
        saved = os.dup(2)
        with open(log_path, "w") as log:
            os.dup2(log.fileno(), 2)
            try:
                compile_module(module, len(module))
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        ptx_files = glob.glob(os.path.join(dump, "*.ptx"))
        if len(ptx_files) != 1:
            with open(log_path) as log:
                sys.exit(f"Mosaic GPU dumped {len(ptx_files)} PTX files (expected 1); its log:\n{log.read()}")
        ptx = os.path.join(args.out, args.kernel + ".ptx")
        with open(ptx_files[0]) as src, open(ptx, "w") as dst:
            dst.write(src.read())
    cubin = os.path.join(args.out, args.kernel + ".cubin")
    report = subprocess.run([os.path.join(CUDA, "bin", "ptxas"), "-arch=sm_90a", "-v", "-o", cubin, ptx],
                            capture_output=True, text=True, check=True).stderr
    sass = subprocess.run([os.path.join(CUDA, "bin", "nvdisasm"), "-c", "-g", cubin], capture_output=True,
                          text=True, check=True).stdout
    os.remove(cubin)
    with open(os.path.join(args.out, args.kernel + ".ptxas.txt"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, args.kernel + ".sass"), "w") as f:
        f.write(sass)
    summary = dict(kernel=args.kernel, **ptxas_summary(report), **sass_summary(sass))
    write_json(os.path.join(args.out, args.kernel + ".json"), summary, indent=1)
    loop = summary["loop"] or {}
    print(f"{args.kernel}: {summary['registers']} registers, spills {summary['spill_store_bytes']} / "
          f"{summary['spill_load_bytes']} bytes, {summary['instructions']} instructions, largest loop "
          f"{loop.get('instructions')} ({loop.get('start')}-{loop.get('end')})")
    print("  loop opcodes:", ", ".join(f"{k} {v}" for k, v in list(loop.get("opcodes", {}).items())[:16]))
    print("  forward branches in the loop (address: instructions skipped):",
          ", ".join(f"{x['at']}: {x['instructions']}" for x in loop.get("skips", [])) or "none")


if __name__ == "__main__":
    main()
