"""Pallas GPU (Triton) kernel: merge the hybrid decode's splits (Triton and Mosaic launches, or the Triton
launch alone) in one launch.

XLA merges the splits in four dependent fusions (the splits' maxima gathered, their maximum, the weighted
outputs and denominators, their sums and the division), a chain between the Mosaic kernel's end and the o
projection on every layer's critical path at B=1. Here one program per (sequence, KV head, block of output
channels) loads every split of both launches at once (no loop over the splits: a merge kernel that looped
over them was no faster) and writes the normalized output and the log-sum-exp (docs/design.md, "The split
merge kernel").

The Mosaic kernel's splits come as it writes them (`decode_mgpu.low_bit_splits(..., packed=True)`): o
[B, H, NS, 128, 16] with the channels in VALUE_CHANNELS order and ml [B, H, NS, 2, 16] (base-2 maxima,
NEG_INIT without keys; denominators), so no XLA transpose or slice runs between the two kernels; the program
gathers its channels back to the natural order with an index vector. Every load depends only on the program
ids: the outputs of splits without keys are read as well and dropped by a select (their weight is 0), so the
loads are not chained behind the maxima.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.decode_mgpu import HEAD_DIM, NATURAL_FROM_VALUE_ROWS, ROWS

CHANNELS = 8  # output channels per program: many small programs, each a short chain of loads (B=1: 128)
BLOCK_ELEMENTS = 4096  # f32 o values a program loads per launch's set, at most: 32 registers a thread


def fits(splits: int, group: int) -> bool:
    """Whether one program can hold a channel of every Triton split's rows (the kernel loads them at once): the
    Triton-only decode merges through this kernel where this holds and through XLA (`decode.merge_splits`)
    elsewhere."""
    return pl.next_power_of_2(splits) * pl.next_power_of_2(group) <= BLOCK_ELEMENTS


def _channels(splits: int, mosaic_splits: int, group: int) -> int:
    """Output channels per program: CHANNELS unless the splits x rows block would pass BLOCK_ELEMENTS."""
    per_channel = max(pl.next_power_of_2(splits), pl.next_power_of_2(mosaic_splits)) * pl.next_power_of_2(group)
    return max(1, min(CHANNELS, BLOCK_ELEMENTS // per_channel))


def _kernel(*refs, group: int, splits: int, mosaic_splits: int, channels: int):
    # Every load and store indexes each axis with an index array (broadcast to the block's shape): the
    # channel axis needs one for the Mosaic set's gather, and Pallas' interpret mode takes index arrays only
    # when no axis is a slice. Split indices past the count are masked, so their addresses are never read.
    if mosaic_splits:
        o_ref, m_ref, l_ref, mo_ref, mml_ref, tm_ref, tv_ref, order_ref, out_ref, lse_ref = refs
    else:
        o_ref, m_ref, l_ref, tm_ref, tv_ref, out_ref, lse_ref = refs
    b, h, c = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    ns, rows = pl.next_power_of_2(splits), pl.next_power_of_2(group)
    r = jnp.arange(rows)[None, :]  # [1, rows]
    cols = (c * channels + jnp.arange(channels))[:, None, None]  # this program's natural output channels
    s_t = jnp.arange(ns)[:, None]  # [splits, 1]
    ok_t = (s_t < splits) & (r < group)  # [ns, rows]; rows past the group may hold anything
    sets = [(  # (m natural-log maxima [splits, rows], l, o [channels, splits, rows]) of each launch
        plgpu.load(m_ref.at[b, h, s_t, r], mask=ok_t, other=-jnp.inf),
        plgpu.load(l_ref.at[b, h, s_t, r], mask=ok_t, other=0.0),
        plgpu.load(o_ref.at[b, h, s_t[None], r[None], cols],
                   mask=jnp.broadcast_to(ok_t[None], (channels, ns, rows)), other=0.0))]
    if mosaic_splits:
        s_m = jnp.arange(pl.next_power_of_2(mosaic_splits))[:, None]
        ok_m = (s_m < mosaic_splits) & (r < group)
        value_rows = plgpu.load(order_ref.at[pl.ds(c * channels, channels)])[:, None, None]  # their Mosaic o rows
        m_m = plgpu.load(mml_ref.at[b, h, s_m, 0, r], mask=ok_m, other=0.0)
        l_m = plgpu.load(mml_ref.at[b, h, s_m, 1, r], mask=ok_m, other=0.0)
        o_m = plgpu.load(mo_ref.at[b, h, s_m[None], value_rows, r[None]],
                         mask=jnp.broadcast_to(ok_m[None], (channels,) + ok_m.shape), other=0.0)
        sets.append((jnp.where(l_m > 0, m_m * math.log(2.0), -jnp.inf), l_m, o_m))  # base 2 -> natural; empty -> -inf
    m_n = plgpu.load(tm_ref.at[b, h, r[0]], mask=r[0] < group, other=-jnp.inf)  # [rows]: the step's own token
    v_n = plgpu.load(tv_ref.at[b, h, cols[:, 0, 0]]).astype(jnp.float32)  # [channels]
    peak = m_n
    for m, _, _ in sets:
        peak = jnp.maximum(peak, jnp.max(m, axis=0))
    peak = jnp.where(peak > -jnp.inf, peak, 0.0)  # [rows]
    w_n = jnp.exp(m_n - peak)  # 0 where the step's token is not attended (m = -inf)
    denom = w_n
    acc = jnp.where(w_n[None, :] > 0, v_n[:, None] * w_n[None, :], 0.0)  # [channels, rows]
    for m, l, o in sets:
        w = jnp.exp(m - peak[None, :])  # 0 for the masked entries and the splits without keys (m = -inf)
        denom = denom + jnp.sum(w * l, axis=0)
        # a split without keys may hold anything in o (NaN included): its weight 0 must not multiply it
        o = jnp.where(jnp.broadcast_to((w > 0)[None], o.shape), o, 0.0)
        acc = acc + jnp.sum(w[None] * o, axis=1)
    safe = jnp.where(denom > 0, denom, 1.0)
    out = (acc / safe[None, :]).astype(out_ref.dtype)
    plgpu.store(out_ref.at[b, h, r, cols[:, :, 0]], out, mask=jnp.broadcast_to(r < group, (channels, rows)))

    @pl.when(c == 0)
    def _():
        lse = jnp.where(denom > 0, jnp.log(safe) + peak, -jnp.inf)
        plgpu.store(lse_ref.at[b, h, r[0]], lse, mask=r[0] < group)


@functools.partial(jax.jit, static_argnames=("group", "out_dtype", "interpret"))
def merge_hybrid_splits(o, m, l, mosaic_o=None, mosaic_ml=None, token=None, *, group: int,
                        out_dtype=jnp.float32, interpret: bool = False):
    """Merge the Triton launch's splits and the Mosaic launch's splits by log-sum-exp, in one launch.

    o f32 [B, H, NS, rows, D], m, l f32 [B, H, NS, rows]: `hybrid_decode_splits`' outputs (natural-log maxima,
    -inf without keys); mosaic_o f32 [B, H, NM, D, 16], mosaic_ml f32 [B, H, NM, 2, 16]:
    `decode_mgpu.low_bit_splits(..., packed=True)`' outputs, or both None when the Triton launch scanned the
    whole cache (then `fits(NS, group)` must hold). token: None or (logits f32 [B, H, rows], v [B, H, D] any
    float dtype), one more key that is not in the cache (the decode step's own token, see
    `decode.merge_splits`); -inf logits leave it out. Rows at or past `group` are ignored.
    Returns (out [B, H * group, D] in out_dtype, lse f32 [B, H * group]): the same as
    `decode.merge_splits` of both sets concatenated (`decode_mgpu.natural_splits` for the Mosaic set);
    a sequence without keys gets 0 and -inf.
    """
    b, h, ns, rows, d = o.shape
    mosaic = mosaic_o is not None or mosaic_ml is not None
    nm = mosaic_o.shape[2] if mosaic_o is not None else 0
    want = {"m": (m, (b, h, ns, rows)), "l": (l, (b, h, ns, rows))}
    if mosaic:
        want.update(mosaic_o=(mosaic_o, (b, h, nm, d, ROWS)), mosaic_ml=(mosaic_ml, (b, h, nm, 2, ROWS)))
    for name, (x, shape) in want.items():
        if x is None or x.shape != shape or x.dtype != jnp.float32:
            raise ValueError(f"{name} must be float32 {shape}, got "
                             f"{'None' if x is None else f'{x.dtype} {x.shape}'}")
    if mosaic and (o.dtype != jnp.float32 or d != HEAD_DIM or not 1 <= group <= min(rows, ROWS)):
        raise ValueError(f"o must be float32 [B, H, NS, rows, D={HEAD_DIM}] and group in [1, min(rows, {ROWS})]; "
                         f"got {o.dtype} {o.shape}, group={group}")
    if not mosaic and (o.dtype != jnp.float32 or d % CHANNELS or not 1 <= group <= rows or not fits(ns, group)):
        raise ValueError(f"o must be float32 [B, H, NS, rows, D] with D a multiple of {CHANNELS}, group in "
                         f"[1, rows] and next_power_of_2(NS) * next_power_of_2(group) <= {BLOCK_ELEMENTS}; "
                         f"got {o.dtype} {o.shape}, group={group}")
    if token is None:
        token = (jnp.full((b, h, rows), -jnp.inf, jnp.float32), jnp.zeros((b, h, d), jnp.float32))
    token_m, token_v = token
    if token_m.shape != (b, h, rows) or token_m.dtype != jnp.float32:
        raise ValueError(f"token logits must be float32 {(b, h, rows)}, got {token_m.dtype} {token_m.shape}")
    if token_v.shape != (b, h, d) or not jnp.issubdtype(token_v.dtype, jnp.floating):
        raise ValueError(f"token v must be a float array {(b, h, d)}, got {token_v.dtype} {token_v.shape}")
    operands = [o, m, l]
    if mosaic:
        operands += [mosaic_o, mosaic_ml, token_m, token_v, jnp.asarray(NATURAL_FROM_VALUE_ROWS, jnp.int32)]
    else:
        operands += [token_m, token_v]
    block_rows, channels = pl.next_power_of_2(group), _channels(ns, nm, group)
    out, lse = pl.pallas_call(
        functools.partial(_kernel, group=group, splits=ns, mosaic_splits=nm, channels=channels),
        grid=(b, h, d // channels),
        out_shape=[jax.ShapeDtypeStruct((b, h, block_rows, d), out_dtype),
                   jax.ShapeDtypeStruct((b, h, block_rows), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="hyquant_merge_splits",
    )(*operands)
    return out[:, :, :group].reshape(b, h * group, d), lse[:, :, :group].reshape(b, h * group)


def reference_merge(o, m, l, mosaic_o, mosaic_ml, group: int, token=None):
    """float64 NumPy oracle of `merge_hybrid_splits` (the log-sum-exp merge of both sets, or of the Triton set
    alone when mosaic_o is None, and the token; first `group` rows)."""
    o, m, l = (np.asarray(x, np.float64)[:, :, :, :group] for x in (o, m, l))
    if mosaic_o is not None:
        mosaic_m, mosaic_l = np.asarray(mosaic_ml)[..., 0, :], np.asarray(mosaic_ml)[..., 1, :]
        mo = np.swapaxes(np.asarray(mosaic_o, np.float64), -1, -2)[:, :, :, :group][..., NATURAL_FROM_VALUE_ROWS]
        ml = np.asarray(mosaic_l, np.float64)[:, :, :, :group]
        mm = np.where(ml > 0, np.asarray(mosaic_m, np.float64)[:, :, :, :group] * np.log(2.0), -np.inf)
        o, m, l = np.concatenate([o, mo], 2), np.concatenate([m, mm], 2), np.concatenate([l, ml], 2)
    if token is not None:  # one more split: a single key, l = 1, o = its value
        tm = np.asarray(token[0], np.float64)[:, :, None, :group]
        tv = np.broadcast_to(np.asarray(token[1], np.float64)[:, :, None, None, :], tm.shape + (o.shape[-1],))
        o, m, l = np.concatenate([o, tv], 2), np.concatenate([m, tm], 2), np.concatenate([l, np.ones_like(tm)], 2)
    peak = m.max(axis=2, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    w = np.where(np.isfinite(m), np.exp(m - peak), 0.0)
    denom = (w * l).sum(axis=2)
    out = np.einsum("bhsr,bhsrd->bhrd", w, np.where(w[..., None] > 0, o, 0.0))
    out = out / np.where(denom > 0, denom, 1.0)[..., None]
    lse = np.where(denom > 0, np.log(np.where(denom > 0, denom, 1.0)) + peak[:, :, 0], -np.inf)
    b, h, g, d = out.shape
    return out.reshape(b, h * g, d), lse.reshape(b, h * g)
