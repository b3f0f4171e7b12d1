"""Decode states of the end-to-end benchmark built directly from random keys and values (Freeze for the
quantized caches), one sequence's cache tiled to the batch: no prefill runs."""

from __future__ import annotations


def _layer_cache(attention, config, key, prefix, max_len):
    """One layer's decode state holding `prefix` random tokens for one sequence."""
    import jax
    import jax.numpy as jnp

    from hyquant_jax import freeze
    from hyquant_jax.model_attention import HybridAttention
    from models import KVBuffer
    from models.attention import cache_slots

    kk, kv, kq = jax.random.split(key, 3)
    shape = (1, config.num_kv_heads, prefix, config.head_dim)
    k = jax.random.normal(kk, shape, jnp.bfloat16)
    v = jax.random.normal(kv, shape, jnp.bfloat16)
    lengths = jnp.array([prefix], jnp.int32)
    if not hasattr(attention, "config"):  # bf16
        pad = ((0, 0), (0, 0), (0, cache_slots(max_len) - prefix), (0, 0))
        return KVBuffer(jnp.pad(k, pad), jnp.pad(v, pad))
    if isinstance(attention, HybridAttention):
        from hyquant_jax.vti import tail_query_count

        q_tail = jax.random.normal(kq, (1, config.num_heads, tail_query_count(attention.config), config.head_dim),
                                   jnp.bfloat16)
        return freeze(k, v, lengths, q_tail, attention.config, max_len, min_length=prefix)
    empty = (jnp.zeros((1, config.num_kv_heads, 0), jnp.int32), jnp.zeros((1,), jnp.int32))
    return freeze(k, v, lengths, None, attention.config, max_len, vl=empty, min_length=prefix)


def decode_states(attention, config, prefix, batch, max_len, seed=0, mesh=None):
    """Per-layer decode states: one random sequence's cache tiled to `batch` (split over the mesh when given)."""
    import jax
    import jax.numpy as jnp

    def tile(one):
        return jax.tree_util.tree_map(lambda x: jnp.repeat(x, batch, axis=0), one)

    tiled = None
    states = []
    for i in range(config.num_layers):
        one = _layer_cache(attention, config, jax.random.PRNGKey(seed * 1000 + i), prefix, max_len)
        if mesh is not None:
            if tiled is None:  # one compiled tiling for every layer, written straight into the shards
                from hyquant_jax.sharding import named, state_specs

                tiled = jax.jit(tile, out_shardings=named(mesh, state_specs(one)))
            one = tiled(one)
        elif batch > 1:
            one = tile(one)
        states.append(jax.block_until_ready(one))
    return tuple(states)
