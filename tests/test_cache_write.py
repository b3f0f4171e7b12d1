"""The row-write kernel (`pallas_kernels.cache_write`) against a NumPy oracle, and the cache paths that use it
(`append`'s ring writes, the bf16 baseline's `write_tokens`) against their jnp versions, bit for bit."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyquant_jax.cache import append
from models.attention import write_token, write_tokens
from pallas_kernels.cache_write import append_rows, write_rows
from tests.helpers.hq_helpers import Harness, config, j32, rng


def oracle_write(buffers, rows, slot, write):
    out = [np.array(b) for b in buffers]
    for o, x in zip(out, rows):
        for b in range(o.shape[0]):
            if write is None or write[b]:
                o[b, :, slot[b]] = np.asarray(jnp.asarray(x[b]).astype(o.dtype))
    return out


def random_case(gen, batch, heads, slots, widths, dtypes):
    buffers, rows = [], []
    for width, dtype in zip(widths, dtypes):
        shape = (batch, heads, slots) + ((width,) if width else ())
        buffers.append(jnp.asarray(gen.standard_normal(shape), dtype))
        rows.append(jnp.asarray(gen.standard_normal(shape[:2] + shape[3:]), jnp.float32))
    slot = jnp.asarray(gen.integers(0, slots, batch), jnp.int32)
    write = jnp.asarray(gen.random(batch) < 0.7)
    return tuple(buffers), tuple(rows), slot, write


def check(buffers, rows, slot, write, interpret):
    expected = oracle_write(buffers, rows, np.asarray(slot), None if write is None else np.asarray(write))
    got = write_rows(buffers, rows, slot, write, interpret=interpret)
    assert len(got) == len(expected)
    for g, e, b in zip(got, expected, buffers):
        assert g.shape == b.shape and g.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(g), e)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 3), heads=st.integers(1, 5), slots=st.integers(1, 9),
       widths=st.lists(st.sampled_from([0, 1, 2, 16, 64]), min_size=1, max_size=3),
       bf16=st.booleans(), masked=st.booleans(), seed=st.integers(0, 2**16))
def test_write_rows_matches_oracle(batch, heads, slots, widths, bf16, masked, seed):
    """Random shapes (width 0: a [B, H, S] buffer), dtypes, slots and write masks; everything outside the
    written rows keeps its value."""
    gen = rng(seed)
    dtypes = [jnp.bfloat16 if bf16 and i % 2 == 0 else jnp.float32 for i in range(len(widths))]
    buffers, rows, slot, write = random_case(gen, batch, heads, slots, widths, dtypes)
    check(buffers, rows, slot, write if masked else None, interpret=True)


def test_write_rows_rejects_bad_arguments():
    buf = jnp.zeros((2, 3, 4, 8))
    row = jnp.zeros((2, 3, 8))
    slot = jnp.zeros((2,), jnp.int32)
    with pytest.raises(ValueError, match="as many rows as buffers"):
        write_rows((buf, buf), (row,), slot, interpret=True)
    with pytest.raises(ValueError, match=r"buffers\[0\] must be \[B=2, H=3, S=4, X\]"):
        write_rows((buf,), (jnp.zeros((2, 3, 4)),), slot, interpret=True)
    with pytest.raises(ValueError, match="powers of two"):
        write_rows((jnp.zeros((2, 3, 4, 6)),), (jnp.zeros((2, 3, 6)),), slot, interpret=True)
    with pytest.raises(ValueError, match=r"slot must be int32 \[B\]"):
        write_rows((buf,), (row,), jnp.zeros((3,), jnp.int32), interpret=True)
    with pytest.raises(ValueError, match=r"write must be bool \[B\]"):
        write_rows((buf,), (row,), slot, jnp.ones((1,), bool), interpret=True)


def check_append(buffers, rows, start, count, write, counters, interpret):
    """append_rows against the oracle: write_rows' oracle at (start + count) % S, counters + write."""
    size = buffers[0].shape[2]
    slot = (np.asarray(start) + np.asarray(count)) % size
    expected = oracle_write(buffers, rows, slot, np.asarray(write))
    step = np.asarray(write).astype(np.int32)
    expected += [np.asarray(c) + step for c in (count,) + counters]
    got = append_rows(buffers, rows, start, count, write, counters, interpret=interpret)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_array_equal(np.asarray(g), e)


def random_append_case(gen, batch, heads, slots, widths, dtypes, num_counters):
    buffers, rows, _, write = random_case(gen, batch, heads, slots, widths, dtypes)
    start = jnp.asarray(gen.integers(0, slots, batch), jnp.int32)
    count = jnp.asarray(gen.integers(0, slots + 1, batch), jnp.int32)  # a full ring wraps to slot start
    counters = tuple(jnp.asarray(gen.integers(0, 10_000, batch), jnp.int32) for _ in range(num_counters))
    return buffers, rows, start, count, write, counters


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 3), heads=st.integers(1, 5), slots=st.integers(1, 9),
       widths=st.lists(st.sampled_from([0, 1, 2, 16, 64]), min_size=1, max_size=3),
       num_counters=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_append_rows_matches_oracle(batch, heads, slots, widths, num_counters, seed):
    """Random ring shapes, starts, counts (wrapping past the end), write masks and extra counters."""
    gen = rng(seed)
    dtypes = [jnp.bfloat16 if i % 2 == 0 else jnp.float32 for i in range(len(widths))]
    check_append(*random_append_case(gen, batch, heads, slots, widths, dtypes, num_counters), interpret=True)


def test_append_rows_rejects_bad_arguments():
    buf, row = jnp.zeros((2, 3, 4, 8)), jnp.zeros((2, 3, 8))
    ok = jnp.zeros((2,), jnp.int32)
    write = jnp.ones((2,), bool)
    with pytest.raises(ValueError, match=r"buffers\[1\] must be \[B=2, H=3, S=4, X\]"):
        append_rows((buf, jnp.zeros((2, 3, 5, 8))), (row, row), ok, ok, write, interpret=True)
    with pytest.raises(ValueError, match=r"append_rows: start must be int32 \[B\]"):
        append_rows((buf,), (row,), jnp.zeros((3,), jnp.int32), ok, write, interpret=True)
    with pytest.raises(ValueError, match=r"append_rows: count must be int32 \[B\]"):
        append_rows((buf,), (row,), ok, jnp.zeros((1,), jnp.int32), write, interpret=True)
    with pytest.raises(ValueError, match=r"append_rows: write must be bool \[B\]"):
        append_rows((buf,), (row,), ok, ok, jnp.ones((3,), bool), interpret=True)
    with pytest.raises(ValueError, match=r"append_rows: counters\[1\] must be int32 \[B\]"):
        append_rows((buf,), (row,), ok, ok, write, (ok, jnp.zeros((2, 1), jnp.int32)), interpret=True)


def _append_paths_agree(backend, steps, promote):
    """append(backend=...) and append(backend="reference") leave the same cache, leaf for leaf, over `steps`
    steps with window flushes, ragged lengths and a paused sequence."""
    cfg = config(key_bits=4, value_bits=4, scheme="channel_key", window=32, block_size=16, rho=0.1,
                 promote_flushed=promote)
    h = Harness(rng(7), cfg, 2, 2, 2, 40, 64, [40, 23], 40 + steps + 8)
    kernel_cache = h.cache
    for step in range(steps):
        active = jnp.asarray([True, step % 3 != 0])
        h.randomize_scores()
        kernel_cache = dataclasses.replace(kernel_cache, ring_score=h.cache.ring_score)
        k, v, _ = h.step_tokens()
        kernel_cache = append(kernel_cache, j32(k), j32(v), cfg, active=active, backend=backend)
        h.cache = append(h.cache, j32(k), j32(v), cfg, active=active, backend="reference")
        for a, b in zip(jax.tree_util.tree_leaves(kernel_cache), jax.tree_util.tree_leaves(h.cache)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("promote", [False, True])
def test_append_interpret_equals_reference(promote):
    _append_paths_agree("interpret", 20, promote)


def test_append_rejects_unknown_backend():
    cfg = config()
    h = Harness(rng(1), cfg, 1, 2, 1, 40, 64, [40], 80)
    k, v, _ = h.step_tokens()
    with pytest.raises(ValueError, match="append: backend must be one of"):
        append(h.cache, j32(k), j32(v), cfg, backend="cuda")


def test_write_tokens_equals_write_token():
    """The bf16 baseline's cache write (the jnp path here; the kernel path in the GPU test below)."""
    gen = rng(3)
    bufs = tuple(jnp.asarray(gen.standard_normal((2, 3, 10, 16)), jnp.bfloat16) for _ in range(2))
    xs = tuple(jnp.asarray(gen.standard_normal((2, 3, 16)), jnp.bfloat16) for _ in range(2))
    pos = jnp.asarray([9, 4], jnp.int32)
    for got, buf, x in zip(write_tokens(bufs, xs, pos), bufs, xs):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(write_token(buf, x, pos)))


# ----------------------------------------------------------------- GPU: the compiled kernel


@pytest.mark.gpu
@pytest.mark.parametrize("batch,heads,slots,widths", [(1, 8, 192, (128, 128, 0)), (3, 3, 200, (64, 64, 0)),
                                                      (16, 8, 4096, (128, 128)), (5, 1, 7, (256, 1))])
def test_gpu_write_rows_matches_oracle(batch, heads, slots, widths):
    gen = rng(batch * 100 + heads)
    dtypes = [jnp.bfloat16 if w > 1 else jnp.float32 for w in widths]
    buffers, rows, slot, write = random_case(gen, batch, heads, slots, widths, dtypes)
    check(buffers, rows, slot, write, interpret=False)
    check(buffers, rows, slot, None, interpret=False)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,heads,slots,widths", [(1, 8, 192, (128, 128, 0)), (3, 3, 200, (64, 64, 0)),
                                                      (16, 8, 4096, (128, 128, 0)), (5, 1, 7, (256, 1))])
def test_gpu_append_rows_matches_oracle(batch, heads, slots, widths):
    gen = rng(batch * 100 + heads + 1)
    dtypes = [jnp.bfloat16 if w > 1 else jnp.float32 for w in widths]
    check_append(*random_append_case(gen, batch, heads, slots, widths, dtypes, 1), interpret=False)


@pytest.mark.gpu
@pytest.mark.parametrize("promote", [False, True])
def test_gpu_append_kernel_equals_reference(promote):
    _append_paths_agree("triton", 40, promote)


@pytest.mark.gpu
def test_gpu_write_tokens_equals_write_token():
    gen = rng(4)
    bufs = tuple(jnp.asarray(gen.standard_normal((4, 8, 300, 128)), jnp.bfloat16) for _ in range(2))
    xs = tuple(jnp.asarray(gen.standard_normal((4, 8, 128)), jnp.bfloat16) for _ in range(2))
    pos = jnp.asarray([299, 0, 17, 17], jnp.int32)
    got = jax.jit(write_tokens)(bufs, xs, pos)
    for g, buf, x in zip(got, bufs, xs):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(write_token(buf, x, pos)))
