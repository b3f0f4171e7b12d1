"""Chunked prefill's attention as one Pallas GPU kernel (Triton lowering): flash attention of a prompt chunk's
queries over the key slots staged so far.

Query row t (absolute position q_pos[t]) sees key slots 0 .. q_pos[t]. One program takes `block_q` rows of
one KV head's group of query heads (the group's heads at consecutive positions, so each key tile it loads
serves every head of the group) and runs a base-2 online softmax over key tiles of `block_k` slots, only up
to the tile that holds the block's last position: tiles every row sees whole run without a mask, the rest with
the causal mask. The float32 logits stay in registers, where `models.prefix_attention` (the XLA reference) writes a
step's logits to memory and reads them back for the softmax and the P.V product.

Triton lowering rules kept (as in `prefill.py`): power-of-two block reads from refs, dot operands with dims
>= 16, `lax.dot_general` with `preferred_element_type`, loop bounds read from a prepared meta array, masks
as `jnp.where` on the logits, a finite running-max start so that a fully masked tile gives no NaN.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

LOG2E = math.log2(math.e)
M_INIT = -1e30  # finite start of the running max: exp2(M_INIT - m) is 0, never NaN
_NT = (((1,), (1,)), ((), ()))  # q . k^T with both operands row-major [rows, D]


def _kernel(meta_ref, pos_ref, q_ref, k_ref, v_ref, o_ref, *, block_k: int, factor: float):
    n_full, n_tiles = meta_ref[0], meta_ref[1]
    q = q_ref[...]  # [BQ, D]: query rows (heads of one KV group x positions)
    pos = pos_ref[...]  # [BQ] int32: each row's position
    block_q, d = q.shape

    def tile(i, carry, masked):
        acc, m, l = carry
        start = i * block_k
        kt = k_ref[pl.ds(start, block_k), :]
        logits = lax.dot_general(q, kt, _NT, preferred_element_type=jnp.float32) * factor
        if masked:
            cols = start + jnp.arange(block_k, dtype=jnp.int32)
            logits = jnp.where(cols[None, :] <= pos[:, None], logits, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(logits, axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(logits - m_new[:, None])
        vt = v_ref[pl.ds(start, block_k), :]
        pv = lax.dot_general(p.astype(vt.dtype), vt, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return acc * alpha[:, None] + pv, m_new, l * alpha + jnp.sum(p, axis=1)

    carry = (jnp.zeros((block_q, d), jnp.float32), jnp.zeros((block_q,), jnp.float32) + M_INIT,
             jnp.zeros((block_q,), jnp.float32))
    carry = lax.fori_loop(0, n_full, lambda i, c: tile(i, c, False), carry)
    acc, _, l = lax.fori_loop(n_full, n_tiles, lambda i, c: tile(i, c, True), carry)
    o_ref[...] = (acc / jnp.where(l > 0.0, l, 1.0)[:, None]).astype(o_ref.dtype)  # a row that saw no key: 0


def key_tile(slots: int) -> int | None:
    """The key tile for `slots` staged slots: 64, or 32 or 16 where 64 does not divide them (None: no tile)."""
    return next((n for n in (64, 32, 16) if slots % n == 0), None)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_prefix_inputs(q, k, v, q_pos, block_q: int, block_k: int) -> None:
    """Raise ValueError naming the argument when `prefix_attention` cannot take these (shapes and dtypes only,
    so it runs before tracing)."""
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"q must be [B, Hq, T, D] and k, v equal [B, Hkv, S, D], got q {q.shape}, k {k.shape}, "
                         f"v {v.shape}")
    b, hq, t, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or hq % k.shape[1]:
        raise ValueError(f"k, v {k.shape} must share q's batch and head_dim and divide its {hq} heads "
                         f"(q {q.shape})")
    if q_pos.shape != (t,) or not jnp.issubdtype(q_pos.dtype, jnp.integer):
        raise ValueError(f"q_pos must be integer [T] = [{t}], got {q_pos.dtype} {list(q_pos.shape)}")
    for name, val in (("block_q", block_q), ("block_k", block_k), ("head_dim", d)):
        if not _is_pow2(val) or val < 16:
            raise ValueError(f"{name} must be a power of two >= 16, got {val}")
    if k.shape[2] % block_k:
        raise ValueError(f"the key slots S={k.shape[2]} must be a multiple of block_k={block_k}")


@functools.partial(jax.jit, static_argnames=("block_q", "block_k", "num_warps", "num_stages", "interpret"))
def prefix_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array, *, block_q: int | None = None,
                     block_k: int = 64, num_warps: int = 4, num_stages: int = 2,
                     interpret: bool = False) -> jax.Array:
    """Query t attends over key slots 0 .. q_pos[t] (chunked prefill; `models.prefix_attention`'s contract).

    q [B, Hq, T, D]; k, v [B, Hkv, S, D] (Hkv divides Hq; S a multiple of block_k); q_pos int [T], positions
    past S - 1 see all S slots and negative ones none (output 0). P.V takes the probabilities in v.dtype.
    block_q: rows of a program (query heads x positions of one KV group; None: 128 for head_dim <= 128, else
    64); block_k: key slots of a tile. 128 rows (4 warps, 2 stages) were the fastest at the Qwen3-8B shape
    over 2048-token chunks on Hopper GPUs (docs/design.md, "Chunked prefill").
    Returns [B, Hq, T, D] in q.dtype.
    """
    if block_q is None:
        block_q = 128 if q.shape[-1] <= 128 else 64
    check_prefix_inputs(q, k, v, q_pos, block_q, block_k)
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    group = hq // hkv
    # Rows of a program: the group's query heads at consecutive positions (row r = position r // group, head
    # r % group of the KV head), so that each key tile a program loads serves all heads of its KV group.
    unit = block_q // math.gcd(block_q, group)  # positions whose rows fill whole blocks
    tp = -(-t // unit) * unit
    pos = jnp.minimum(q_pos.astype(jnp.int32), s - 1)
    pos = jnp.pad(pos, (0, tp - t), mode="edge")  # padded positions repeat the last one: no extra tiles
    rows = jnp.pad(q, ((0, 0), (0, 0), (0, tp - t), (0, 0))).reshape(b, hkv, group, tp, d)
    rows = rows.transpose(0, 1, 3, 2, 4).reshape(b, hkv, tp * group, d)
    nblk = tp * group // block_q
    blocks = jnp.repeat(pos, group).reshape(nblk, block_q)  # each row's position
    n_full = jnp.maximum((blocks.min(axis=1) + 1) // block_k, 0)  # tiles every row of the block sees whole
    n_tiles = jnp.maximum(blocks.max(axis=1) // block_k + 1, 0)
    meta = jnp.stack([n_full, n_tiles], axis=1).astype(jnp.int32)  # [nblk, 2]

    kv_spec = pl.BlockSpec((None, None, s, d), lambda h, c, bb: (bb, h, 0, 0))
    row_spec = pl.BlockSpec((None, None, block_q, d), lambda h, c, bb: (bb, h, c, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, block_k=block_k, factor=LOG2E / math.sqrt(d)),
        grid=(hkv, nblk, b),
        in_specs=[pl.BlockSpec((None, 2), lambda h, c, bb: (c, 0)),
                  pl.BlockSpec((block_q,), lambda h, c, bb: (c,)),
                  row_spec, kv_spec, kv_spec],
        out_specs=row_spec,
        out_shape=jax.ShapeDtypeStruct((b, hkv, tp * group, d), q.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="hyquant_prefix_attention",
    )(meta, blocks.reshape(-1), rows, k, v)
    out = out.reshape(b, hkv, tp, group, d).transpose(0, 1, 3, 2, 4).reshape(b, hq, tp, d)
    return out[:, :, :t]
