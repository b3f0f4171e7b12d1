"""Shared test helpers: float64 oracles, checkpoint writers, reference tokenizers, subprocess workers."""
