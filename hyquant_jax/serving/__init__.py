"""Serving: continuous batching of generation requests over a fixed number of cache slots (`Engine`), a thread
that owns the engine (`worker.EngineWorker`), and `hyquant serve`'s OpenAI-compatible HTTP API
(`server.build_app`, `server.serve`; they need the `serve` extra, Starlette and uvicorn)."""

from hyquant_jax.serving.engine import FINISH_REASONS, Engine, QueueFull, Result, Update

__all__ = ["FINISH_REASONS", "Engine", "QueueFull", "Result", "Update"]
