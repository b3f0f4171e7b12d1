"""Causal attention in query chunks that read only (about) the keys they can see.

Used by the reference-path prefills of the accuracy benchmark
(`hyquant_jax.evaluation`, `hyquant_jax.sparse_attention`): a chunk of C
queries ending at position e needs keys [0, e) only, which halves the work
of a full-key pass, but T / C chunks of distinct shapes also compile T / C
times. `key_buckets` rounds the keys each chunk reads up to a power of two
of chunks, so a prompt of n chunks compiles about log2(n) shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def key_buckets(n_chunks: int) -> list[tuple[int, int, int]]:
    """Query chunks grouped by how many key chunks they read: [(first, stop, key_chunks)].

    Chunk c needs the keys of chunks 0..c; rounding that count up to a power
    of two (at most n_chunks) leaves about log2(n_chunks) groups of
    contiguous chunks, each group one shape, for about 1.25x the causal
    minimum of attention work. XLA compiles a repeated shape once: on 2 CPU
    cores an 8K hybrid prefill of SmolLM2 compiles in 52 s instead of 73 s
    (n_chunks distinct shapes), the exact one in 9 s instead of 16 s; on the
    H200 the first 8K retrieval batch had spent 480 s compiling.
    """
    groups: list[tuple[int, int, int]] = []
    for c in range(n_chunks):
        need = min(1 << c.bit_length(), n_chunks)  # smallest power of two >= c + 1
        if groups and groups[-1][2] == need:
            groups[-1] = (groups[-1][0], c + 1, need)
        else:
            groups.append((c, c + 1, need))
    return groups


def map_causal_chunks(attend, q: jax.Array, t: int, chunk: int) -> jax.Array:
    """Causal attention of q [..., T, D] in query chunks, each reading the keys of its `key_buckets` group.

    attend(q_chunk [..., C, D], positions int32 [C], key_len: int) returns
    the chunk's output [..., C, D] from keys [0, key_len). Positions past T
    (the last chunk's padding) see every key and are dropped. Returns
    [..., T, D].

    The chunks run one after the other (an optimization barrier ties each
    chunk's query to the previous output), so XLA keeps one chunk's logits
    alive instead of scheduling them side by side: for 5 prompts of 8K
    tokens through SmolLM2, the temporary memory of the hybrid prefill falls
    from 23 GiB to 2.6 GiB (18 GiB with unbucketed chunks), at 8-14% more
    run time at 4K than unbucketed, unbarriered chunks.
    """
    chunk = min(chunk, t)
    n = -(-t // chunk)
    qp = jnp.pad(q, [(0, 0)] * (q.ndim - 2) + [(0, n * chunk - t), (0, 0)])
    outs = []
    for first, stop, key_chunks in key_buckets(n):
        key_len = min(key_chunks * chunk, t)
        for c in range(first, stop):
            qc = qp[..., c * chunk:(c + 1) * chunk, :]
            if outs:  # chunk c starts after chunk c - 1 is done: one chunk's temporaries live at a time
                qc, outs[-1] = jax.lax.optimization_barrier((qc, outs[-1]))
            outs.append(attend(qc, c * chunk + jnp.arange(chunk), key_len))
    return jnp.concatenate(outs, axis=-2)[..., :t, :]
