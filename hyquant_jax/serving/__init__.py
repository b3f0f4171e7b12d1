"""Serving: continuous batching of generation requests over a fixed number of cache slots (`Engine`)."""

from hyquant_jax.serving.engine import FINISH_REASONS, Engine, QueueFull, Result, Update

__all__ = ["FINISH_REASONS", "Engine", "QueueFull", "Result", "Update"]
