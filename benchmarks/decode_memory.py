"""What the compiled decode loop allocates beyond its arguments, and which large buffers XLA hoisted out of it.

Compiles `hyquant_jax.generate.decode` for the e2e benchmark's model and a method at one prefix and batch from shapes
only (no weights or caches are allocated), then prints XLA's memory analysis and every instruction of the
entry computation (outside the loops) whose result is at least --min-mb megabytes and is not a parameter:
a weight copy or slice hoisted out of the decode loop shows there, which separates the decode's own memory
from the rest of the process. It also lists the `copy` instructions of the loops' bodies by shape and the
launches of each body (a per-step copy of a small counter shows there as a `copy` of shape s32[...]).

  python -m benchmarks.decode_memory --method hyquant --prefix 32768 --out $OUT
  CPU check: python -m benchmarks.decode_memory --layers 2 --prefix 1024 --out /tmp/mem
"""

from __future__ import annotations

import argparse
import gc
import os
import re
from collections import Counter

# ----------------------------------------------------------------------------------------- HLO text helpers
# The names match the profiler's kernel names with '.' as '_'.

COPY = re.compile(r"(%[\w.\-]+) = (\S+) copy\((%[\w.\-]+)\)")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def while_bodies(hlo: str) -> list[str]:
    """Names of the computations used as the body of a `while` instruction."""
    return sorted(set(re.findall(r"\bwhile\(.*?body=(%[\w.\-]+)", hlo)))


def computation(hlo: str, name: str) -> str:
    """The text of one computation of an HLO module dump."""
    start = re.search(rf"^(?:ENTRY )?{re.escape(name)} ", hlo, re.M)
    if start is None:
        raise ValueError(f"no computation {name} in the HLO text")
    end = hlo.find("\n}\n", start.start())
    return hlo[start.start():end]


def copies(text: str) -> list[dict]:
    """Every `copy` instruction of an HLO text: name, shape, operand and the JAX op it came from."""
    out = []
    for line in text.splitlines():
        m = COPY.search(line)
        if m:
            op = OP_NAME.search(line)
            out.append(dict(name=m.group(1), shape=m.group(2), operand=m.group(3), op=op.group(1) if op else ""))
    return out


LAUNCH = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = (.+?) (fusion|custom-call|copy|conditional|scatter|gather|"
                    r"dynamic-update-slice)\(")
FUSION_KIND = re.compile(r"kind=(\w+)")
TARGET = re.compile(r'custom_call_target="([^"]*)"')


def launches(text: str) -> list[dict]:
    """The top-level instructions of an HLO computation that become GPU launches or copies (fusions, custom
    calls, copies, conditionals and unfused scatters, gathers, dynamic-update-slices): name, opcode, fusion
    kind or custom-call target, and the JAX op it came from. The names match the profiler's kernel names with
    '.' as '_' (e.g. %loop_pad_fusion.35 is loop_pad_fusion_35)."""
    out = []
    for line in text.splitlines():
        m = LAUNCH.match(line)
        if not m:
            continue
        kind = FUSION_KIND.search(line) if m.group(3) == "fusion" else TARGET.search(line)
        op = OP_NAME.search(line)
        out.append(dict(name=m.group(1), opcode=m.group(3), kind=kind.group(1) if kind else "",
                        op=op.group(1) if op else ""))
    return out


CONDITIONAL = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = .* conditional\(")
BRANCHES = re.compile(r"(?:true_computation|false_computation)=(%[\w.\-]+)|branch_computations=\{([^}]*)\}")


def branch_launches(hlo: str, text: str) -> dict:
    """For each `conditional` of an HLO computation's text: {its name: {branch computation: launches}}
    (e.g. the decode loop's window-flush `lax.cond`)."""
    out = {}
    for line in text.splitlines():
        m = CONDITIONAL.match(line)
        if not m:
            continue
        names = []
        for true_or_false, listed in BRANCHES.findall(line):
            names += [true_or_false] if true_or_false else re.findall(r"%[\w.\-]+", listed)
        out[m.group(1)] = {name: len(launches(computation(hlo, name))) for name in names}
    return out


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8}


def large_entry_buffers(hlo_text: str, min_bytes: int) -> list[dict]:
    """Instructions of the ENTRY computation of an HLO module's text whose array result has at least min_bytes
    and that are not parameters (nor tuples, get-tuple-elements or bitcasts, which allocate nothing)."""
    rows, in_entry = [], False
    for line in hlo_text.splitlines():
        if line.startswith("ENTRY "):
            in_entry = True
            continue
        if in_entry and line.startswith("}"):
            break
        if not in_entry:
            continue
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\w+)\[([\d,]*)\]\S* (\w[\w\-]*)\(", line)
        if not m or m.group(4) in ("parameter", "get-tuple-element", "bitcast", "tuple"):
            continue
        name, dtype, dims, op = m.groups()
        size = _DTYPE_BYTES.get(dtype, 0)
        for d in filter(None, dims.split(",")):
            size *= int(d)
        if size >= min_bytes:
            rows.append({"name": name, "op": op, "shape": f"{dtype}[{dims}]", "bytes": size})
    return rows


def main(argv=None) -> None:
    import jax
    import jax.numpy as jnp

    from benchmarks.common import check_out, write_json
    from benchmarks.e2e.options import method_attention, model_config, parse_args
    from benchmarks.e2e.states import decode_states
    from hyquant_jax import SamplingConfig
    from hyquant_jax.generate import decode
    from models import abstract_model, init_model, split_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="hyquant", help="a method of benchmarks.e2e (bf16, hyquant, kivi4, ...)")
    p.add_argument("--prefix", type=int, default=32768)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the model (a quick CPU check)")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--min-mb", type=float, default=16.0)
    p.add_argument("--allocate-weights", action="store_true",
                   help="also initialize the weights for real (as benchmarks.e2e does) and record the device's live "
                        "and peak bytes after it against the weights' own bytes")
    p.add_argument("--out", default=None, help="folder for decode_memory_<method>_<prefix>.json")
    args = p.parse_args(argv)
    if args.out:
        check_out(args.out)
    e2e_args = parse_args(["--sections", "b1"] + (["--layers", str(args.layers)] if args.layers else []))
    config = model_config(e2e_args)
    attention, _ = method_attention(e2e_args, args.method)
    max_len = args.prefix + args.steps + 8
    model_def, weights = split_model(abstract_model(config, jnp.bfloat16))  # shapes only
    after_init = None
    if args.allocate_weights:  # benchmarks.e2e's eager initialization; is anything besides the weights left alive?
        real = init_model(jax.random.PRNGKey(0), config, jnp.bfloat16)
        real_weights = jax.block_until_ready(split_model(real).weights)
        gc.collect()
        stats = jax.devices()[0].memory_stats() or {}
        after_init = {"weights_bytes": sum(x.nbytes for x in jax.tree_util.tree_leaves(real_weights)),
                      "bytes_in_use": stats.get("bytes_in_use"), "peak_bytes_in_use": stats.get("peak_bytes_in_use")}
        print("after init: " + ", ".join(f"{k} {v / 2**30:.3f} GiB" for k, v in after_init.items() if v is not None))
        del real, real_weights
    states = jax.eval_shape(lambda: decode_states(attention, config, args.prefix, args.batch, max_len))
    tokens = jax.ShapeDtypeStruct((args.batch,), jnp.int32)
    static = dict(attention=attention, sampling=SamplingConfig(), max_new_tokens=args.steps + 1, eos_ids=(), pad_id=0,
                  layer_kernels="auto")
    compiled = decode.lower(model_def, weights, states, tokens, tokens, jax.random.PRNGKey(2), **static).compile()
    analysis, hlo = compiled.memory_analysis(), compiled.as_text()
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
              "generated_code_size_in_bytes")
    result = {"method": args.method, "prefix": args.prefix, "batch": args.batch, "layers": config.num_layers,
              "device": jax.devices()[0].device_kind, "jax": jax.__version__,
              "memory_analysis": {f: getattr(analysis, f, None) for f in fields} if analysis else None,
              "weights_after_init": after_init,
              "large_entry_buffers": large_entry_buffers(hlo, int(args.min_mb * 2**20))}
    bodies = {body: computation(hlo, body) for body in while_bodies(hlo)}
    result["while_bodies"] = {body: dict(launches=len(launches(text)), conditionals=branch_launches(hlo, text))
                              for body, text in bodies.items()}
    loop_copies = [dict(c, body=body, body_launches=result["while_bodies"][body]["launches"])
                   for body, text in bodies.items() for c in copies(text)]
    result["loop_copies_by_shape"] = dict(Counter(c["shape"] for c in loop_copies))
    result["loop_copies"] = loop_copies
    for f, v in (result["memory_analysis"] or {}).items():
        print(f"{f}: {v / 2**20:.1f} MiB" if v is not None else f"{f}: -")
    for row in result["large_entry_buffers"]:
        print(f"outside the loops: {row['name']} = {row['op']} {row['shape']}, {row['bytes'] / 2**20:.1f} MiB")
    print(f"copies in the loop bodies: {len(loop_copies)} {result['loop_copies_by_shape']}")
    for body, n in sorted(Counter((c["body"], c["body_launches"]) for c in loop_copies).items()):
        print(f"  {n} in {body[0]} ({body[1]} launches)")
    for body, info in result["while_bodies"].items():
        branches = "; ".join(f"{c}: " + ", ".join(f"{b} {n}" for b, n in br.items())
                             for c, br in info["conditionals"].items())
        print(f"loop body {body}: {info['launches']} launches" + (f"; conditionals {branches}" if branches else ""))
    if args.out:
        path = os.path.join(args.out, f"decode_memory_{args.method}_{args.prefix}.json")
        write_json(path, result, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    from benchmarks.common import run_script

    run_script(main)
