"""Check a GGUF file's structure before the `gguf` package reads it, and say what is wrong in the file's terms.

`gguf.GGUFReader` trusts the header: a wrong count or length there surfaces as an internal numpy or struct error
("index 0 is out of bounds ..."), a metadata string that is not UTF-8 as a UnicodeDecodeError, and a truncated
file as a numpy dtype message. `check_gguf` walks the layout of the GGUF specification (header, metadata
key/value pairs, tensor table, aligned tensor data) with bounds checks and raises a ValueError naming the field or
tensor at fault and what was expected.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
# metadata value types: (struct format, size) of the fixed-size ones; 8 = string, 9 = array
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
STRING, ARRAY = 8, 9


class _Cursor:
    """Bounds-checked little-endian reads from the file's bytes; every error names `what` was being read."""

    def __init__(self, data: bytes | memoryview, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def fail(self, message: str):
        raise ValueError(f"truncated or corrupt GGUF {self.path}: {message}")

    def skip(self, n: int, what: str) -> int:
        """Advance past n bytes; returns where they start."""
        if n < 0 or self.pos + n > len(self.data):
            self.fail(f"{what} needs {n} bytes at offset {self.pos}, but the file has {len(self.data)} bytes")
        self.pos += n
        return self.pos - n

    def take(self, n: int, what: str) -> bytes:
        start = self.skip(n, what)
        return bytes(self.data[start:start + n])

    def scalar(self, fmt: str, size: int, what: str):
        return struct.unpack(fmt, self.take(size, what))[0]

    def u32(self, what: str) -> int:
        return self.scalar("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", 8, what)

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start} of {n})")

    def count(self, what: str, element_bytes: int) -> int:
        """A u64 element count, checked against the bytes left (each element takes at least element_bytes)."""
        n = self.u64(what)
        left = len(self.data) - self.pos
        if n * element_bytes > left:
            self.fail(f"{what} is {n}, but only {left} bytes follow (at least {element_bytes} per element)")
        return n


def _value(cur: _Cursor, kind: int, what: str, depth: int = 0):
    if kind in _SCALARS:
        return cur.scalar(*_SCALARS[kind], what)
    if kind == STRING:
        return cur.string(what)
    if kind == ARRAY and depth == 0:
        inner = cur.u32(f"the element type of {what}")
        if inner not in _SCALARS and inner not in (STRING, ARRAY):
            cur.fail(f"{what} has element type {inner}, expected one of 0-12")
        size = _SCALARS[inner][1] if inner in _SCALARS else 8
        n = cur.count(f"the element count of {what}", size)
        if inner in _SCALARS:  # skipped in one step: tokenizer scores and types can be long
            cur.skip(n * size, what)
            return None
        return [_value(cur, inner, f"{what}[{i}]", depth + 1) for i in range(n)]
    cur.fail(f"{what} has value type {kind}, expected one of 0-12" + (" (arrays nest one level)" if depth else ""))


def check_gguf(path: str | Path) -> dict:
    """Walk a GGUF file's structure; return {"version", "alignment", "tensors": {name: (type, dims, offset,
    nbytes)}, "keys": [...]} or raise ValueError saying which field or tensor is wrong and what was expected.
    The file is memory-mapped: only its header is read."""
    path = Path(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError(f"truncated or corrupt GGUF {path}: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            view = memoryview(data)
            try:
                return _check(_Cursor(view, path))
            finally:
                view.release()


def _check(cur: _Cursor) -> dict:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = cur.data
    magic = cur.take(4, "the magic number")
    if magic != MAGIC:
        cur.fail(f"the file starts with {magic!r}, not {MAGIC!r}: not a GGUF file")
    version = cur.u32("the version")
    if version not in VERSIONS:
        cur.fail(f"version {version}, expected one of {VERSIONS}")
    n_tensors = cur.count("the tensor count", 8 + 4 + 8 + 4 + 8)  # name length, dims, dim, type, offset
    n_keys = cur.count("the metadata key count", 8 + 4)  # key length and value type
    alignment, keys = DEFAULT_ALIGNMENT, []
    for i in range(n_keys):
        key = cur.string(f"metadata key #{i}")
        kind = cur.u32(f"the value type of metadata {key!r}")
        value = _value(cur, kind, f"metadata {key!r}")
        if key == "general.alignment":
            if kind != 4 or not value or value & (value - 1):
                cur.fail(f"metadata 'general.alignment' must be a uint32 power of two, got {value!r}")
            alignment = value
        keys.append(key)
    tensors = {}
    for i in range(n_tensors):
        name = cur.string(f"the name of tensor #{i}")
        n_dims = cur.u32(f"the dimension count of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            cur.fail(f"tensor {name!r} has {n_dims} dimensions, expected 1 to {MAX_DIMS}")
        dims = [cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
        type_id = cur.u32(f"the type of tensor {name!r}")
        offset = cur.u64(f"the data offset of tensor {name!r}")
        try:
            qtype = GGMLQuantizationType(type_id)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            cur.fail(f"tensor {name!r} has type id {type_id}, which is no GGML type")
        if any(d < 1 for d in dims) or dims[0] % block:
            cur.fail(f"tensor {name!r} has dimensions {dims}: each must be >= 1 and the first a multiple of "
                     f"{block} ({qtype.name} blocks)")
        if offset % alignment:
            cur.fail(f"tensor {name!r} has data offset {offset}, not a multiple of the alignment {alignment}")
        if name in tensors:
            cur.fail(f"tensor {name!r} appears twice in the tensor table")
        elements = 1
        for d in dims:
            elements *= d
        tensors[name] = (qtype.name, dims, offset, elements // block * block_bytes)
    start = -(-cur.pos // alignment) * alignment
    for name, (kind, dims, offset, nbytes) in tensors.items():
        end = start + offset + nbytes
        if end > len(data):
            cur.fail(f"expected {nbytes} bytes for tensor {name!r} ({kind} {dims}) at byte {start + offset}, but "
                     f"the file ends at byte {len(data)}")
    return {"version": version, "alignment": alignment, "tensors": tensors, "keys": keys}
