"""Pallas GPU (Triton) kernel: write one new row per (sequence, head) into slot-indexed cache buffers, in place.

A decode step stores each sequence's new key and value (and, in the hybrid cache's window ring, a zero
attention score) at a per-sequence slot. XLA lowers the vmapped dynamic-update-slice, and the select that
keeps inactive sequences unchanged, to a gather, a select and a scatter-like update per buffer, each a
small kernel. Here one launch writes every buffer of a layer; the buffers are aliased to the outputs, so
under donation (the decode loop's carry) nothing else is copied. On the H200 this took ~0.1 ms off a B=1
decode step of a 36-layer model, bf16 and hyquant alike
(benchmarks/results/e2e_h200_b1_write_rows_{main,overlay}.json).
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


def fits(buffers: tuple) -> bool:
    """Whether the kernel takes these buffers: row widths X must be powers of two (Triton block shapes)."""
    return all(buf.ndim == 3 or (buf.shape[-1] & (buf.shape[-1] - 1)) == 0 for buf in buffers)


def write_rows(buffers: tuple, rows: tuple, slot: jax.Array, write: jax.Array | None = None,
               interpret: bool = False) -> tuple:
    """buffers[i][b, h, slot[b]] = rows[i][b, h] for every b with write[b] (all b when write is None).

    buffers: arrays [B, H, S, X] or [B, H, S] (any dtype; rows are cast to it); rows: matching [B, H, X] or
    [B, H]; slot: int32 [B] in [0, S); write: bool [B]. Returns the updated buffers (aliased to the inputs:
    in place under donation). Slots outside [0, S) are not checked on the device (the callers' slots are in
    range by construction); pass interpret=True to run on CPU.
    """
    buffers, rows = tuple(buffers), tuple(rows)
    if not buffers or len(buffers) != len(rows):
        raise ValueError(f"write_rows: need as many rows as buffers (at least one), got {len(rows)} and "
                         f"{len(buffers)}")
    b, h = buffers[0].shape[:2]
    flat = [buf.ndim == 3 for buf in buffers]
    buffers = tuple(buf[..., None] if f else buf for buf, f in zip(buffers, flat))
    rows = tuple(x[..., None] if f else x for x, f in zip(rows, flat))
    if not fits(buffers):
        raise ValueError(f"write_rows: row widths must be powers of two, got {[buf.shape[-1] for buf in buffers]}")
    for i, (buf, x) in enumerate(zip(buffers, rows)):
        if buf.ndim != 4 or buf.shape[:2] != (b, h) or x.shape != (b, h, buf.shape[3]):
            raise ValueError(f"write_rows: buffers[{i}] must be [B={b}, H={h}, S, X] (or [B, H, S]) with rows "
                             f"[B, H, X]; got {buf.shape} and {x.shape}")
    if slot.shape != (b,):
        raise ValueError(f"write_rows: slot must be int32 [B]={(b,)}, got {slot.shape}")
    write = jnp.ones((b,), jnp.int32) if write is None else write.astype(jnp.int32)
    if write.shape != (b,):
        raise ValueError(f"write_rows: write must be bool [B]={(b,)}, got {write.shape}")
    out = _write(slot.astype(jnp.int32), write, rows, buffers, interpret=interpret)
    return tuple(o[..., 0] if f else o for o, f in zip(out, flat))


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
