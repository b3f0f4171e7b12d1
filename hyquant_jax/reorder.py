"""Sort-free reordering of a sequence axis."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def stable_partition(first: jax.Array) -> jax.Array:
    """Gather indices that put the positions where `first` is True first, both parts in position order.

    first: bool [..., N]. Returns int32 [..., N] `perm` such that `x[..., perm]` (per leading index)
    lists the positions where `first` is True in increasing order, then those where it is False in
    increasing order: exactly `jnp.argsort(~first, axis=-1, stable=True)`.

    Why not that argsort: XLA lowers an argsort over a long axis (a 16K-32K prompt) on GPU to a
    multi-pass sort; this is one prefix sum and one scatter. An element's destination is its rank
    among the elements of its own part, offset by the size of the True part for the False part.
    """
    first = jnp.asarray(first, bool)
    last = first.ndim - 1
    if first.shape[last] == 0:
        return jnp.zeros(first.shape, jnp.int32)
    position = jax.lax.broadcasted_iota(jnp.int32, first.shape, last)
    true_count = jnp.cumsum(first, axis=last, dtype=jnp.int32)  # True positions in 0..i
    false_count = position + 1 - true_count  # False positions in 0..i: the second prefix sum, for free
    num_true = true_count[..., -1:]
    dest = jnp.where(first, true_count - 1, num_true + false_count - 1)
    # Scatter each position to its destination, leading axes unchanged (no reshape, so any sharding of
    # them carries through). dest is a permutation of 0..N-1 in every row: no collisions, none out of range.
    leading = tuple(jax.lax.broadcasted_iota(jnp.int32, first.shape, axis) for axis in range(last))
    return jnp.zeros(first.shape, jnp.int32).at[leading + (dest,)].set(
        position, unique_indices=True, mode="promise_in_bounds")
