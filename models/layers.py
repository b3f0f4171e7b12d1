"""Building blocks: RMSNorm, rotary position embedding, SwiGLU MLP (pure jnp)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.config import ModelConfig, rope_inv_freq


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """x [..., E] normalised in float32 and scaled by weight [E]; returns x.dtype."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * weight.astype(jnp.float32)).astype(x.dtype)


def rope_cos_sin(positions: jax.Array, config: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """positions int [B, T] -> (cos, sin) float32 [B, 1, T, head_dim] (HF layout: halves repeated)."""
    inv = jnp.asarray(rope_inv_freq(config), jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * inv  # [B, T, D/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, None]
    if config.rope_attention_factor != 1.0:  # YaRN
        return jnp.cos(angles) * config.rope_attention_factor, jnp.sin(angles) * config.rope_attention_factor
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, H, T, D] by (cos, sin) [B, 1, T, D] the rotate-half way (non-interleaved)."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """down(silu(x @ gate) * (x @ up)); x [B, T, E], w_gate/w_up [E, F], w_down [F, E]."""
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down
