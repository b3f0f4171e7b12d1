"""Paired bootstrap intervals over haystacks for the RULER-style accuracy runs (benchmarks/ruler_eval.py).

Two methods answer the same prompts, so their difference is measured per prompt and the prompts, not the
methods, are resampled (paired). The unit of resampling is the haystack: several questions asked of one
haystack are not independent, so their differences are averaged first and each haystack counts once.
"""

from __future__ import annotations

import numpy as np


def paired_bootstrap(a, b, groups=None, resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """Mean of a - b over haystacks and its percentile bootstrap interval.

    a, b: float [N] a metric of two methods on the same N prompts; groups: [N] the haystack of each prompt
    (None: every prompt its own). The per-haystack mean differences are resampled with replacement
    `resamples` times. Returns {"mean", "low", "high", "units" (haystacks), "level"}.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise ValueError(f"a and b must be non-empty 1-D arrays of the same shape, got {a.shape} and {b.shape}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    groups = np.arange(a.size) if groups is None else np.asarray(groups)
    if groups.shape != a.shape:
        raise ValueError(f"groups must have shape {a.shape}, got {groups.shape}")
    _, inverse = np.unique(groups, return_inverse=True)
    per_unit = np.bincount(inverse, weights=a - b) / np.bincount(inverse)
    rng = np.random.default_rng(seed)
    means = per_unit[rng.integers(0, per_unit.size, (resamples, per_unit.size))].mean(axis=1)
    low, high = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return {"mean": float(per_unit.mean()), "low": float(low), "high": float(high), "units": int(per_unit.size),
            "level": level}
