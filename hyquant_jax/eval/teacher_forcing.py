"""Teacher forcing: score given continuations through a method's decode path (next-token NLL and top-1).

The jitted function takes the model as `models.split_model(model)` and the per-layer decode states that
`hyquant_jax.eval.shared_prefill.decode_states` builds.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from models.attention import DecodeContext
from models.transformer import ModelDef


@partial(jax.jit, static_argnames=("model_def", "attention"), donate_argnames=("states",))
def teacher_forced_nll(model_def: ModelDef, weights, states: tuple, tokens: jax.Array, positions: jax.Array, *,
                       attention):
    """Feed tokens[:, i] through the decode path and score tokens[:, i + 1].

    tokens: int32 [B, N + 1]; positions: int32 [B] position of tokens[:, 0]
    (= tokens already cached). Returns (nll float32 [B, N] of tokens[:, 1:],
    argmax int32 [B, N] the model's top-1 prediction at each step, final states).
    """
    model = model_def.merge(weights)
    b, n1 = tokens.shape
    active = jnp.ones((b,), bool)

    def step(states, i):
        ctx = DecodeContext(positions + i, active)
        tok = jax.lax.dynamic_slice_in_dim(tokens, i, 1, axis=1)
        target = jax.lax.dynamic_slice_in_dim(tokens, i + 1, 1, axis=1)[:, 0]
        logits, states = model(tok, ctx, states, attention=attention)
        logp = jax.nn.log_softmax(logits[:, 0], axis=-1)
        nll = -jnp.take_along_axis(logp, target[:, None], axis=1)[:, 0]
        return states, (nll, jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32))

    states, (nll, top1) = jax.lax.scan(step, states, jnp.arange(n1 - 1))
    return nll.T, top1.T, states




@partial(jax.jit, static_argnames=("model_def", "attention"))  # no donation: the states are copied to 2 rows
def greedy_and_forced(model_def: ModelDef, weights, states: tuple, first: jax.Array, forced: jax.Array,
                      position: jax.Array, *, attention):
    """Greedy decoding and teacher forcing of one prompt in one loop: two rows decoded together.

    states: one prompt's decode states (batch 1), copied into two rows; row 0 feeds `first` and then its own
    argmax, row 1 feeds `forced`. first: int32 [] the token after the prompt; forced: int32 [N] the tokens row 1
    feeds; position: int32 [] the prompt length. Returns (greedy int32 [N + 1]: `first` and the N tokens after
    it, log-probabilities float32 [N, V]: row 1's next-token distribution after each forced token). Nothing
    stops at EOS: the caller cuts the greedy tokens there.
    """
    model = model_def.merge(weights)
    states = jax.tree.map(lambda x: jnp.concatenate([x, x]), states)
    positions = jnp.full((2,), position, jnp.int32)
    active = jnp.ones((2,), bool)

    def step(carry, i):
        states, last = carry
        tok = jnp.stack([last, forced[i]])[:, None]
        logits, states = model(tok, DecodeContext(positions + i, active), states, attention=attention)
        logits = logits[:, 0].astype(jnp.float32)
        token = jnp.argmax(logits[0]).astype(jnp.int32)
        return (states, token), (token, jax.nn.log_softmax(logits[1]))

    _, (greedy, logp) = jax.lax.scan(step, (states, first.astype(jnp.int32)), jnp.arange(forced.shape[0]))
    return jnp.concatenate([first.astype(jnp.int32)[None], greedy]), logp
