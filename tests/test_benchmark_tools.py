"""Helpers of the benchmark scripts that turn arguments and results into what they report."""

import pytest

from benchmarks.decode_kernel import parse_tunings
from benchmarks.report import e2e_prefill_table
from hyquant_jax.decode_kernel import DecodeTuning


def test_parse_tunings_fields_and_default_items():
    first, default, third = parse_tunings("warps=1,pages=2,stages=3;;convert=magic,n_low=8")
    assert (first.num_warps, first.pages_per_tile, first.num_stages) == (1, 2, 3)
    assert (default.num_warps, default.num_stages, default.pages_per_tile, default.n_low) == (None,) * 4
    assert (third.convert, third.n_low) == ("magic", 8)
    assert all(isinstance(t, DecodeTuning) for t in (first, default, third))


@pytest.mark.parametrize("spec", ["warp=1", "warps=", "warps"])
def test_parse_tunings_rejects_unknown_or_empty_keys(spec):
    with pytest.raises(ValueError, match="--compare-tunings"):
        parse_tunings(spec)


def test_e2e_prefill_table_ratio_is_against_bf16_at_the_same_length():
    rows = [{"method": "bf16", "prefix": 4096, "seconds": 0.1, "tokens_per_s": 40960},
            {"method": "hyquant", "prefix": 4096, "seconds": 0.125, "tokens_per_s": 32768},
            {"method": "hyquant", "prefix": 8192, "seconds": 0.3, "tokens_per_s": 27307},
            {"method": "kivi4", "prefix": 4096, "error": "out of memory"}]
    lines = e2e_prefill_table({"prefill": rows}).splitlines()
    assert lines[2] == "| bf16 | 4096 | 0.100 | 40960 | 1.00x |"
    assert lines[3] == "| hyquant | 4096 | 0.125 | 32768 | 0.80x |"
    assert lines[4] == "| hyquant | 8192 | 0.300 | 27307 | - |"
    assert len(lines) == 5  # the failed row is left out
