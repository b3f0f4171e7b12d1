"""Pallas GPU (Triton) kernel: write one new row per (sequence, head) into slot-indexed cache buffers, in place.

A decode step stores each sequence's new key and value (and, in the hybrid cache's window ring, a zero
attention score) at a per-sequence slot. XLA lowers the vmapped dynamic-update-slice, and the select that
keeps inactive sequences unchanged, to a gather, a select and a scatter-like update per buffer, each a
small kernel. Here one launch writes every buffer of a layer; the buffers are aliased to the outputs, so
under donation (the decode loop's carry) nothing else is copied. This shortens the decode step, bf16 and
hyquant alike (docs/design.md, "Per-layer kernels").

`append_rows` is the ring form: the slot is (start + count) % S and the launch also advances the counters
(the hybrid cache's window ring).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def _kernel(slot_ref, write_ref, *refs, count: int):
    rows, bufs = refs[:count], refs[2 * count:]  # refs[count:2 * count]: the aliased inputs, never read
    b, h = pl.program_id(0), pl.program_id(1)
    slot = slot_ref[b]
    write = write_ref[b] != 0
    for x_ref, buf_ref in zip(rows, bufs):
        x = x_ref[b, h, :][None, :].astype(buf_ref.dtype)  # [1, X]
        plgpu.store(buf_ref.at[b, h, pl.ds(slot, 1), :], x, mask=jnp.full(x.shape, write))


def _append_kernel(start_ref, write_ref, *refs, count: int, counters: int, heads: int, size: int):
    # refs: rows, aliased buffers (never read), counters in, then the outputs: buffers, counters. One program
    # per sequence, all heads at once: it reads its counters before it writes them (they are aliased, so a
    # program per head could read a counter another program had already advanced).
    rows, counts_in = refs[:count], refs[2 * count:2 * count + counters]
    bufs, counts_out = refs[2 * count + counters:3 * count + counters], refs[3 * count + counters:]
    b = pl.program_id(0)
    step = write_ref[b]
    slot = (start_ref[b] + counts_in[0][b]) % size
    # Triton block shapes are powers of two, so the heads axis is padded to one and the extra heads are masked.
    # Both axes are indexed with index arrays: a slice past the heads axis is out of bounds, which jax >= 0.12
    # refuses, and Pallas' interpret mode takes index arrays only when no axis is a slice.
    h = jnp.arange(pl.next_power_of_2(heads))[:, None]  # [block, 1]
    for x_ref, buf_ref in zip(rows, bufs):
        c = jnp.arange(x_ref.shape[-1])[None, :]  # [1, X]
        head_ok = jnp.broadcast_to(h < heads, (h.shape[0], c.shape[1]))
        x = plgpu.load(x_ref.at[b, h, c], mask=head_ok)  # [block, X]; masked rows are never read or stored
        plgpu.store(buf_ref.at[b, h, slot, c], x.astype(buf_ref.dtype), mask=head_ok & (step != 0))
    for c_in, c_out in zip(counts_in, counts_out):
        c_out[pl.ds(b, 1)] = c_in[pl.ds(b, 1)] + step


def fits(buffers: tuple) -> bool:
    """Whether the kernel takes these buffers: row widths X must be powers of two (Triton block shapes)."""
    return all(buf.ndim == 3 or (buf.shape[-1] & (buf.shape[-1] - 1)) == 0 for buf in buffers)


def _check(name: str, buffers: tuple, rows: tuple):
    """Validate buffers [B, H, S, X] (or [B, H, S]) and rows [B, H, X] (or [B, H]); return them as 4-D and
    3-D arrays with the flags of the flat ones."""
    buffers, rows = tuple(buffers), tuple(rows)
    if not buffers or len(buffers) != len(rows):
        raise ValueError(f"{name}: need as many rows as buffers (at least one), got {len(rows)} and "
                         f"{len(buffers)}")
    b, h = buffers[0].shape[:2]
    flat = [buf.ndim == 3 for buf in buffers]
    buffers = tuple(buf[..., None] if f else buf for buf, f in zip(buffers, flat))
    rows = tuple(x[..., None] if f else x for x, f in zip(rows, flat))
    if not fits(buffers):
        raise ValueError(f"{name}: row widths must be powers of two, got {[buf.shape[-1] for buf in buffers]}")
    for i, (buf, x) in enumerate(zip(buffers, rows)):
        if buf.ndim != 4 or buf.shape[:3] != (b, h, buffers[0].shape[2]) or x.shape != (b, h, buf.shape[3]):
            raise ValueError(f"{name}: buffers[{i}] must be [B={b}, H={h}, S={buffers[0].shape[2]}, X] (or "
                             f"[B, H, S]) with rows [B, H, X]; got {buf.shape} and {x.shape}")
    return buffers, rows, flat


def _per_sequence(name: str, x, b: int, what: str = "int32"):
    if x.shape != (b,):
        raise ValueError(f"{name} must be {what} [B]={(b,)}, got {x.shape}")
    return x.astype(jnp.int32)


def write_rows(buffers: tuple, rows: tuple, slot: jax.Array, write: jax.Array | None = None,
               interpret: bool = False) -> tuple:
    """buffers[i][b, h, slot[b]] = rows[i][b, h] for every b with write[b] (all b when write is None).

    buffers: arrays [B, H, S, X] or [B, H, S] (any dtype; rows are cast to it), all with the same B, H, S;
    rows: matching [B, H, X] or [B, H]; slot: int32 [B] in [0, S); write: bool [B]. Returns the updated
    buffers (aliased to the inputs: in place under donation). Slots outside [0, S) are not checked on the
    device (the callers' slots are in range by construction); pass interpret=True to run on CPU.
    """
    buffers, rows, flat = _check("write_rows", buffers, rows)
    b = buffers[0].shape[0]
    slot = _per_sequence("write_rows: slot", slot, b)
    write = jnp.ones((b,), jnp.int32) if write is None else _per_sequence("write_rows: write", write, b, "bool")
    out = _write(slot, write, rows, buffers, interpret=interpret)
    return tuple(o[..., 0] if f else o for o, f in zip(out, flat))


def append_rows(buffers: tuple, rows: tuple, start: jax.Array, count: jax.Array, write: jax.Array,
                counters: tuple = (), interpret: bool = False) -> tuple:
    """Append one row per (sequence, head) to ring buffers and advance their counters, in one launch.

    With S the ring size (buffers' axis 2) and slot[b] = (start[b] + count[b]) % S, this is
    `write_rows(buffers, rows, slot, write)` followed by count + write and c + write for each c in counters.
    The hybrid cache's window ring appends this way: computing the slot and the counters in XLA made three
    dependent one-element kernels per layer and step.

    buffers, rows: as `write_rows`'s; start, count: int32 [B], start in [0, S) and count >= 0;
    write: bool [B]; counters: int32 [B] arrays. Returns (buffers..., count + write, counters... + write),
    each aliased to its input (in place under donation).
    """
    buffers, rows, flat = _check("append_rows", buffers, rows)
    b = buffers[0].shape[0]
    start = _per_sequence("append_rows: start", start, b)
    count = _per_sequence("append_rows: count", count, b)
    write = _per_sequence("append_rows: write", write, b, "bool")
    counters = tuple(_per_sequence(f"append_rows: counters[{i}]", c, b) for i, c in enumerate(counters))
    out = _append(start, write, rows, buffers, (count,) + counters, interpret=interpret)
    n = len(buffers)
    return tuple(o[..., 0] if f else o for o, f in zip(out[:n], flat)) + tuple(out[n:])


@functools.partial(jax.jit, static_argnames=("interpret",))
def _write(slot, write, rows, buffers, interpret: bool):
    count = len(buffers)
    b, h = buffers[0].shape[:2]
    return pl.pallas_call(
        functools.partial(_kernel, count=count),
        grid=(b, h),
        out_shape=[jax.ShapeDtypeStruct(buf.shape, buf.dtype) for buf in buffers],
        input_output_aliases={2 + count + i: i for i in range(count)},
        compiler_params=plgpu.CompilerParams(num_warps=1, num_stages=1),
        interpret=interpret,
        name="hyquant_write_rows",
    )(slot, write, *rows, *buffers)


@functools.partial(jax.jit, static_argnames=("interpret",))
def _append(start, write, rows, buffers, counters, interpret: bool):
    count, n = len(buffers), len(counters)
    b, h, size = buffers[0].shape[:3]
    return pl.pallas_call(
        functools.partial(_append_kernel, count=count, counters=n, heads=h, size=size),
        grid=(b,),
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in buffers + counters],
        input_output_aliases={2 + count + i: i for i in range(count + n)},
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="hyquant_append_rows",
    )(start, write, *rows, *buffers, *counters)
