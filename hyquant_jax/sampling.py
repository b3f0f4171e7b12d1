"""Token sampling: greedy, temperature, top-k, top-p (nucleus)."""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        # `not x >= 0` (rather than `x < 0`) also refuses NaN, which compares false with everything
        if (not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool)
                or not 0 <= self.temperature < math.inf):
            raise ValueError(f"SamplingConfig.temperature must be a finite number >= 0 (0 = greedy), got "
                             f"{self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"SamplingConfig.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if (not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool)
                or not 0 < self.top_p <= 1):
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1] (1 = off), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def ignored(self) -> tuple[str, ...]:
        """The filters set (top_k > 0, top_p < 1) that have no effect because decoding is greedy."""
        if not self.greedy:
            return ()
        return tuple(name for name, on in (("top_k", self.top_k > 0), ("top_p", self.top_p < 1)) if on)


# Seeds `generate` takes: jax.random.PRNGKey keeps 32 bits of a seed (2**32 gives the key of 0), so the range in
# which distinct seeds give distinct keys.
MAX_SEED = 2**32 - 1


def check_seed(seed, name: str = "seed") -> int:
    """The seed as an int; ValueError naming `name` unless it is an integer (Python's or NumPy's, not a bool) in
    0 .. MAX_SEED."""
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{name} must be an integer in 0 .. 2**32 - 1 ({MAX_SEED}), got {seed!r}")
    return int(seed)


def sample(logits: jax.Array, key: jax.Array, config: SamplingConfig, positions: jax.Array | None = None
           ) -> jax.Array:
    """logits float32 [B, V] -> token ids int32 [B].

    positions: int [B], the position each sampled token takes in its sequence: row b then draws with
    fold_in(key, positions[b]), so a sequence's samples depend on the seed and its own tokens only, not on
    the rest of the batch or on how the decode is split into calls (streaming). None: one key for the batch.
    """
    if config.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if positions is not None:
        keys = jax.vmap(lambda p: jax.random.fold_in(key, p))(positions.astype(jnp.uint32))
        return jax.vmap(lambda row, k: sample(row[None], k, config)[0])(logits, keys)
    logits = logits.astype(jnp.float32) / config.temperature
    if config.top_k:
        kth = jax.lax.top_k(logits, min(config.top_k, logits.shape[-1]))[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if config.top_p < 1:
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(ordered, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly better tokens
        keep = before < config.top_p  # the best token is always kept
        cutoff = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
