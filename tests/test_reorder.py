"""reorder.stable_partition against NumPy's stable argsort, and its defining properties."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from hyquant_jax.reorder import stable_partition

partition = jax.jit(stable_partition)


def _shapes(gen, count=10):
    """`count` shapes [..., N]: an empty axis, the largest case, then random ones (0-2 leading axes of 1-3).

    Few distinct shapes on purpose: each one is one compiled program, and masks reuse them.
    """
    shapes = [(0,), (2, 3, 300)]
    while len(shapes) < count:
        lead = tuple(int(s) for s in gen.integers(1, 4, size=gen.integers(0, 3)))
        shapes.append(lead + (int(gen.integers(1, 301)),))
    return shapes


def _cases(seed=0):
    """40 (name, mask) cases: every shape with all False, all True, a random density and a sparse one."""
    gen = np.random.default_rng(seed)
    cases = []
    for shape in _shapes(gen):
        for density in (0.0, 1.0, gen.random(), gen.random() ** 4):
            mask = gen.random(shape) < density
            cases.append((f"{shape}-p{density:.3g}", mask))
    return cases


CASES = _cases()


@pytest.mark.parametrize("mask", [m for _, m in CASES], ids=[name for name, _ in CASES])
def test_equals_stable_argsort(mask):
    perm = np.asarray(partition(mask))
    assert perm.dtype == np.int32 and perm.shape == mask.shape
    np.testing.assert_array_equal(perm, np.argsort(~mask, axis=-1, kind="stable"))


@pytest.mark.parametrize("mask", [m for _, m in CASES], ids=[name for name, _ in CASES])
def test_permutation_with_true_first_in_position_order(mask):
    rows_shape = (int(np.prod(mask.shape[:-1])), mask.shape[-1])  # -1 can't be inferred when N = 0
    perm = np.asarray(partition(mask)).reshape(rows_shape)
    rows = mask.reshape(rows_shape)
    for row, p in zip(rows, perm):
        np.testing.assert_array_equal(np.sort(p), np.arange(len(row)))  # a permutation of the positions
        num_true = int(row.sum())
        assert row[p[:num_true]].all() and not row[p[num_true:]].any()
        assert np.all(np.diff(p[:num_true]) > 0) and np.all(np.diff(p[num_true:]) > 0)
