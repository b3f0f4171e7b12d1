"""Reading XLA's optimized HLO text: the decode loop's bodies, their launches and copies, large buffers.

Used by `benchmarks/decode_memory.py`; the names match the profiler's kernel names with '.' as '_'.
"""

from __future__ import annotations

import re

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
