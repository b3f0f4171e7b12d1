"""HyQuantConfig validation, hashing/jit-static use, and the exact VL count formula."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyquant_jax.config import HyQuantConfig, num_vl_tokens
from tests.helpers import oracle


def test_defaults_are_valid_and_documented_values():
    c = HyQuantConfig()
    assert (c.key_bits, c.value_bits, c.window, c.block_size, c.rho) == (4, 4, 128, 64, 0.05)
    assert c.ring_size == c.window + c.block_size == 192
    assert c.rho_fraction == Fraction(1, 20)
    assert c.flush_vl_count == 4  # ceil(64 / 20)


INVALID = [
    ("key_bits", 3), ("key_bits", 1), ("key_bits", 32), ("key_bits", True), ("key_bits", 4.0), ("key_bits", "4"),
    ("value_bits", 0), ("value_bits", 6), ("value_bits", None),
    ("scheme", "kivi"), ("scheme", ""), ("scheme", None),
    ("group_size", 0), ("group_size", 3), ("group_size", -4), ("group_size", 2.0), ("group_size", True),
    ("block_size", 8), ("block_size", 48), ("block_size", 512), ("block_size", 64.0),
    ("window", -64), ("window", 100), ("window", 32), ("window", 64.0),
    ("rho", -0.01), ("rho", 1.5), ("rho", float("nan")), ("rho", float("inf")), ("rho", True), ("rho", "0.1"),
    ("rho", None),
    ("promote_flushed", 1), ("promote_flushed", "yes"), ("promote_flushed", None),
    ("prefill_qk", "int4"), ("prefill_qk", "fp16"),
    ("prefill_block", 8), ("prefill_block", 100), ("prefill_block", 64.0),
]


@pytest.mark.parametrize("field,value", INVALID, ids=[f"{f}={v!r}" for f, v in INVALID])
def test_invalid_value_raises_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"HyQuantConfig\.{field}\b"):
        HyQuantConfig(**{field: value})


def test_window_must_be_multiple_of_prefill_block():
    # window 64 is a multiple of block_size 16 but not of prefill_block 128.
    with pytest.raises(ValueError, match=r"HyQuantConfig\.window"):
        HyQuantConfig(window=64, block_size=16, prefill_block=128)
    HyQuantConfig(window=128, block_size=16, prefill_block=128)  # fine


@pytest.mark.parametrize("window,block", [(0, 16), (16, 16), (256, 256), (96, 32)])
def test_valid_edge_values(window, block):
    c = HyQuantConfig(window=window, block_size=block, prefill_block=16, rho=0.0, group_size=1)
    assert c.ring_size == window + block
    assert c.flush_vl_count == 0  # rho = 0: never promote


def test_head_dim_checks_name_the_problem():
    with pytest.raises(ValueError, match=r"HyQuantConfig\.group_size"):
        HyQuantConfig(group_size=256).check_head_dim(128)
    with pytest.raises(ValueError, match=r"HyQuantConfig\.group_size"):
        HyQuantConfig(group_size=64).check_head_dim(96)
    with pytest.raises(ValueError, match="head_dim=63"):
        HyQuantConfig(key_bits=4).check_head_dim(63)
    with pytest.raises(ValueError, match="head_dim=6"):
        HyQuantConfig(key_bits=8, value_bits=2).check_head_dim(6)
    HyQuantConfig(key_bits=16, value_bits=16).check_head_dim(6)  # nothing packed
    assert HyQuantConfig(group_size=32).group_count(128) == 4
    assert HyQuantConfig().group_count(64) == 1


def test_hashable_and_static_under_jit():
    a = HyQuantConfig(key_bits=8, rho=0.1)
    b = HyQuantConfig(key_bits=8, rho=0.1)
    c = HyQuantConfig(key_bits=2, rho=0.1)
    assert a == b and hash(a) == hash(b) and a != c
    assert len({a, b, c}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.key_bits = 4

    traces = []
    f = jax.jit(lambda x, cfg: (traces.append(cfg), x * cfg.key_bits)[1], static_argnames="cfg")
    x = jnp.ones(3)
    assert float(f(x, cfg=a)[0]) == 8.0
    assert float(f(x, cfg=b)[0]) == 8.0  # equal config: cached, no retrace
    assert float(f(x, cfg=c)[0]) == 2.0
    assert traces == [a, c]


RHOS = [0.0, 1e-9, 1e-5, 0.0001, 0.01, 0.05, 0.1, 1 / 3, 0.3, 0.5, 0.9999, 1.0, 2 / 7]


@pytest.mark.parametrize("rho", RHOS)
def test_num_vl_tokens_matches_fraction_formula(rho):
    frac = HyQuantConfig(rho=rho).rho_fraction
    assert frac == oracle.rho_fraction(rho)
    prefixes = list(range(-3, 700)) + [1000, 4095, 4096, 9999, 10_000, 10_001, 123_457, 2**20 + 3, 2**31 - 1]
    expected = [oracle.num_vl_tokens(p, rho) for p in prefixes]
    assert [num_vl_tokens(p, frac) for p in prefixes] == expected
    traced = jax.jit(lambda p: num_vl_tokens(p, frac))(jnp.asarray(prefixes, jnp.int32))
    assert traced.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(traced), expected)


def test_num_vl_tokens_hand_computed():
    f = HyQuantConfig(rho=0.05).rho_fraction
    assert num_vl_tokens(60, f) == 3
    # 100 * 0.07 = 7.000000000000001 in floats, so a float ceil gives 8; the exact count is 7.
    assert math.ceil(100 * 0.07) == 8
    assert num_vl_tokens(100, HyQuantConfig(rho=0.07).rho_fraction) == 7
    assert int(num_vl_tokens(jnp.int32(100), HyQuantConfig(rho=0.07).rho_fraction)) == 7
    assert num_vl_tokens(20, f) == 1 and num_vl_tokens(21, f) == 2 and num_vl_tokens(1, f) == 1
    assert num_vl_tokens(0, f) == 0 and num_vl_tokens(-5, f) == 0
    assert int(num_vl_tokens(jnp.int32(60), f)) == 3
    one = HyQuantConfig(rho=1.0).rho_fraction
    assert num_vl_tokens(17, one) == 17
    zero = HyQuantConfig(rho=0.0).rho_fraction
    assert num_vl_tokens(17, zero) == 0 and int(num_vl_tokens(jnp.int32(17), zero)) == 0


def test_tiny_positive_rho_still_keeps_one_token():
    # Docstring: "0 disables VL; otherwise at least one token".
    c = HyQuantConfig(rho=1e-9)
    assert num_vl_tokens(5, c.rho_fraction) == 1
    assert int(num_vl_tokens(jnp.int32(5), c.rho_fraction)) == 1
    assert HyQuantConfig(rho=1e-9, block_size=16, window=0).flush_vl_count == 1
