"""The query/key/value states of SmolLM2's layers captured once per window, shared by the coverage and
operator sections."""

from __future__ import annotations

from benchmarks.accuracy.methods import progress


class Captures:
    """Per-layer q/k/v of exact forward passes over WikiText windows, by window length (memoized).

    Window i of length T starts at token i * stride (stride = tokens // 16),
    so windows of different lengths overlap only where they share a start.
    """

    def __init__(self, model, tokens):
        from models import split_model

        self.model, self.tokens = split_model(model), tokens
        self.store: dict[int, list] = {}

    def get(self, length: int, count: int) -> list[tuple]:
        """`count` windows of `length` tokens: a list of (q [L, Hq, T, D], k, v [L, Hkv, T, D]) float32."""
        import jax.numpy as jnp

        from hyquant_jax.eval import capture_qkv

        have = self.store.setdefault(length, [])
        stride = len(self.tokens) // 16
        if count > 16 or (count - 1) * stride + length > len(self.tokens):
            raise ValueError(f"cannot take {count} windows of {length} tokens from {len(self.tokens)} tokens")
        for i in progress(range(len(have), count), desc=f"capture q/k/v {length}"):
            window = jnp.asarray(self.tokens[i * stride:i * stride + length][None])
            layers = capture_qkv(*self.model, window)
            have.append(tuple(jnp.concatenate([layer[j] for layer in layers]) for j in range(3)))
        return have[:count]

    def drop(self):
        self.store.clear()


def stack(windows, length):
    """Windows of (q, k, v) [L, H, T, D] -> (q, k, v) [W * L, H, length, D] (the first `length` tokens)."""
    import jax.numpy as jnp

    return tuple(jnp.concatenate([w[j][:, :, :length] for w in windows]) for j in range(3))
