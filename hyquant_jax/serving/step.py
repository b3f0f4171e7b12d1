"""The engine's jitted pieces: one decode step over all slots, writing a prefilled row into a slot, and
per-row sampling (each slot has its own temperature, top-k, top-p and seed).

Every decode state leaf (`models.attention.KVBuffer`, `hyquant_jax.HybridKVCache`) has the batch axis first
(its fields declare it: `models.attention.logical_axes`), so a slot is one row of every leaf; `check_rows`
checks that before an engine uses a state.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from hyquant_jax.compile_options import XLA_FLAGS, TopLevelJit, decode_compiler_options
from models.attention import BATCH, DecodeContext, begin_decode_step
from models.transformer import ModelDef


@partial(jax.tree_util.register_dataclass, data_fields=["key", "temperature", "top_k", "top_p"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class RowSampling:
    """Sampling parameters per row: key uint32 [B, 2] (`jax.random.PRNGKey(seed)`), temperature float32 [B]
    (0: greedy), top_k int32 [B] (0: off), top_p float32 [B] in (0, 1] (1: off)."""

    key: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array


def _sample_row(logits, key, position, temperature, top_k, top_p):
    """One row of `sample_rows`: `hyquant_jax.sampling.sample` with this row's parameters as arrays."""
    x = logits.astype(jnp.float32) / jnp.where(temperature > 0, temperature, 1.0)
    vocab = x.shape[-1]
    kth = jnp.sort(x)[::-1][jnp.clip(top_k - 1, 0, vocab - 1)]
    x = jnp.where((top_k > 0) & (x < kth), -jnp.inf, x)
    ordered = jnp.sort(x)[::-1]
    probs = jax.nn.softmax(ordered)
    before = jnp.cumsum(probs) - probs  # mass of strictly better tokens; the best token is always kept
    cutoff = jnp.min(jnp.where(before < top_p, ordered, jnp.inf))
    x = jnp.where((top_p < 1) & (x < cutoff), -jnp.inf, x)
    drawn = jax.random.categorical(jax.random.fold_in(key, position.astype(jnp.uint32)), x[None])[0]
    return jnp.where(temperature > 0, drawn, jnp.argmax(logits)).astype(jnp.int32)


@jax.jit
def sample_rows(logits: jax.Array, sampling: RowSampling, positions: jax.Array) -> jax.Array:
    """logits float32 [B, V] -> token ids int32 [B]. Row b draws with fold_in(key[b], positions[b]) (positions:
    the place each token takes in its sequence), as `hyquant_jax.sampling.sample` does for one sequence with
    SamplingConfig(temperature[b], top_k[b], top_p[b]) and PRNGKey(seed): the same tokens as `generate`.
    Greedy rows take the argmax; with every row greedy, nothing is sorted."""

    def drawn(_):
        return jax.vmap(_sample_row)(logits, sampling.key, positions, sampling.temperature, sampling.top_k,
                                     sampling.top_p)

    def greedy(_):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    return jax.lax.cond(jnp.any(sampling.temperature > 0), drawn, greedy, None)


def _decode_step(model_def: ModelDef, weights, states: tuple, last: jax.Array, positions: jax.Array,
                 active: jax.Array, sampling: RowSampling, *, attention, pad_id: int):
    """One decode step over all slots: (states, tokens int32 [B]).

    last: int32 [B] each slot's newest token (not cached yet); positions: int32 [B] tokens cached before it;
    active: bool [B] slots that hold a running request. An inactive slot's state does not grow and its token
    is pad_id; nothing mixes rows, so an inactive slot's contents never reach another slot's tokens.
    The steps and states are those of `hyquant_jax.generate.decode` (its loop calls the same
    `begin_decode_step`, the model and the sampling with a key per position).
    """
    model = model_def.merge(weights)
    states, ctx = begin_decode_step(attention, states, DecodeContext(positions, active))
    logits, states = model(last[:, None], ctx, states, attention=attention)
    token = sample_rows(logits[:, 0], sampling, positions + 1)
    return states, jnp.where(active, token, pad_id)


decode_step = TopLevelJit(_decode_step, decode_compiler_options(XLA_FLAGS),
                          static_argnames=("model_def", "attention", "pad_id"), donate_argnames=("states",))


@partial(jax.jit, donate_argnames=("states",))
def write_row(states: tuple, row: tuple, slot: jax.Array) -> tuple:
    """states (batch B) with row (the same pytree with batch 1, e.g. one prefilled prompt) written at row slot
    (int32 []) of every leaf; in place (states donated)."""
    return jax.tree_util.tree_map(
        lambda big, one: jax.lax.dynamic_update_slice_in_dim(big, one.astype(big.dtype), slot, axis=0), states, row)


def empty_rows(row: tuple, batch: int) -> tuple:
    """Zeros of row's pytree (batch 1) with `batch` rows: decode states of `batch` empty slots (a zero
    `HybridKVCache` or `KVBuffer` holds no token)."""
    return jax.tree_util.tree_map(lambda x: jnp.zeros((batch,) + x.shape[1:], x.dtype), row)


def check_rows(state) -> None:
    """Raise TypeError unless every array field of one layer's decode state declares the batch axis first."""
    fields = dataclasses.fields(state) if dataclasses.is_dataclass(state) else ()
    arrays = [f for f in fields if hasattr(getattr(state, f.name), "shape")]
    wrong = [f.name for f in arrays if f.metadata.get("logical_axes", ())[:1] != (BATCH,)]
    if not arrays or wrong:
        raise TypeError(f"the serving engine writes one slot as one row of each decode-state array, so every "
                        f"array field must declare the batch axis first (models.attention.logical_axes); "
                        f"{type(state).__name__} does not for {wrong or 'any field'}")
