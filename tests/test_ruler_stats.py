"""benchmarks/_ruler_stats.py: the paired bootstrap on cases whose answer is known."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._ruler_stats import paired_bootstrap  # noqa: E402


def test_two_haystacks_give_the_enumerated_distribution():
    # differences 0 and 1: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the 95% interval
    # runs from 0 to 1
    out = paired_bootstrap([1.0, 3.0], [1.0, 2.0], resamples=4000)
    assert out["mean"] == 0.5 and out["low"] == 0.0 and out["high"] == 1.0 and out["units"] == 2


def test_constant_difference_has_a_point_interval():
    rng = np.random.default_rng(0)
    b = rng.standard_normal(50)
    out = paired_bootstrap(b + 0.25, b)
    assert out["low"] == pytest.approx(0.25) and out["high"] == pytest.approx(0.25)
    assert out["mean"] == pytest.approx(0.25)


def test_width_matches_the_normal_approximation():
    rng = np.random.default_rng(1)
    d = rng.normal(0.3, 1.0, 400)
    out = paired_bootstrap(d, np.zeros_like(d), resamples=4000)
    half = 1.96 * d.std() / np.sqrt(d.size)
    assert out["mean"] == pytest.approx(d.mean())
    assert out["low"] < out["mean"] < out["high"]
    assert (out["high"] - out["low"]) / 2 == pytest.approx(half, rel=0.1)
    assert out["mean"] - out["low"] == pytest.approx(half, rel=0.15)


def test_questions_of_one_haystack_count_once():
    # haystack "x" has three questions with difference 1, haystack "y" one with difference 0
    out = paired_bootstrap([1, 1, 1, 0], [0, 0, 0, 0], groups=["x", "x", "x", "y"], resamples=4000)
    assert out["mean"] == 0.5 and out["units"] == 2 and (out["low"], out["high"]) == (0.0, 1.0)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="same shape"):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="groups"):
        paired_bootstrap([1.0, 2.0], [1.0, 2.0], groups=[0])
    with pytest.raises(ValueError, match="level"):
        paired_bootstrap([1.0], [1.0], level=1.5)
