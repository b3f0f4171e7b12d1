"""Causal attention in query chunks that read only the keys they can see.

Used by the reference-path prefills of the accuracy benchmark
(`hyquant_jax.evaluation`, `hyquant_jax.sparse_attention`): a chunk of C
queries ending at position e needs keys [0, e) only, which halves the work
of a full-key pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def map_causal_chunks(attend, q: jax.Array, t: int, chunk: int) -> jax.Array:
    """Causal attention of q [..., T, D] in query chunks of `chunk` rows.

    attend(q_chunk [..., C, D], positions int32 [C], key_len: int) returns
    the chunk's output [..., C, D] from keys [0, key_len), key_len the
    chunk's end. Positions past T (the last chunk's padding) see every key
    and are dropped. Returns [..., T, D].

    The chunks run one after the other (an optimization barrier ties each
    chunk's query to the previous output), so XLA keeps one chunk's logits
    alive instead of scheduling chunks side by side: for 5 prompts of 8K
    tokens through SmolLM2 the temporary memory of the hybrid prefill falls
    from 18.3 GiB to 2.4 GiB (`benchmarks/reference_prefill_cost.py`).
    """
    chunk = min(chunk, t)
    n = -(-t // chunk)
    qp = jnp.pad(q, [(0, 0)] * (q.ndim - 2) + [(0, n * chunk - t), (0, 0)])
    outs = []
    for c in range(n):
        qc = qp[..., c * chunk:(c + 1) * chunk, :]
        if outs:  # chunk c starts after chunk c - 1 is done: one chunk's temporaries live at a time
            qc, outs[-1] = jax.lax.optimization_barrier((qc, outs[-1]))
        outs.append(attend(qc, c * chunk + jnp.arange(chunk), min((c + 1) * chunk, t)))
    return jnp.concatenate(outs, axis=-2)[..., :t, :]
