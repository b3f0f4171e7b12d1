"""The README's examples run as written (reference path on CPU): the first python block under "## Using the library",
"## Whole models from Python" and "## Flax"; its results table is what benchmarks/report.py gives."""

import pathlib
import re
import types

import numpy as np
import pytest

import hyquant_jax as hq

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
FENCE = "`" * 3


def python_block(heading: str) -> str:
    """The first python code block under a README heading."""
    return README.read_text().split(heading + "\n", 1)[1].split(FENCE + "python", 1)[1].split(FENCE, 1)[0]


def test_readme_library_example_runs():
    block = python_block("## Using the library")
    ns = {}
    exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 - the README is ours
    out, out1, cache = ns["out"], ns["out1"], ns["cache"]
    assert out.shape == (2, 8, 1000, 128) and out1.shape == (2, 8, 128)
    assert np.all(np.isfinite(np.asarray(out, np.float32))) and np.all(np.isfinite(np.asarray(out1, np.float32)))
    np.testing.assert_array_equal(np.asarray(cache.length), [1001, 614])  # prompt + the decoded token


@pytest.mark.slow
def test_readme_whole_model_example_runs(capsys, default_model):
    ns = {}
    exec(compile(python_block("## Whole models from Python"), "README.md", "exec"), ns)  # noqa: S102
    printed = capsys.readouterr().out
    assert "Paris" in printed and "bytes hybrid against" in printed
    assert ns["out"].completions[0].finish_reason in ("stop", "length")


def test_readme_and_results_page_are_what_the_results_files_give():
    """docs/results.md and the README's headline table are `benchmarks/report.py`'s output for benchmarks/results
    (rewrite them with `python -m benchmarks.report` and `--headline` after a benchmark run)."""
    from benchmarks import report

    assert report.main(["--check"]) == 0


# The top-level names: what a user of the README needs; everything else is imported from its module.
TOP_LEVEL = ["Completion", "GenerateResult", "Generation", "HyQuantAttention", "HyQuantConfig", "HybridKVCache",
             "Model", "SamplingConfig", "decode_attention", "decode_step", "freeze", "generate", "load",
             "make_attention", "prefill_attention", "tail_queries"]


def test_the_top_level_names_are_the_readme_api():
    """`hyquant_jax.__all__` is exactly TOP_LEVEL, every one of them exists and is the package's only public
    name besides its submodules, and every `hq.NAME` of the README is one of them."""
    assert hq.__all__ == TOP_LEVEL
    public = {n for n, x in vars(hq).items() if not n.startswith("_") and not isinstance(x, types.ModuleType)}
    assert public == set(TOP_LEVEL)
    used = set(re.findall(r"\bhq\.([A-Za-z_]\w*)", README.read_text()))
    assert used and used <= set(TOP_LEVEL), sorted(used - set(TOP_LEVEL))


def test_readme_size():
    text = README.read_text()
    assert len(text.encode()) <= 25_000 and len(text.splitlines()) <= 250


def test_readme_flax_example_runs(capsys):
    ns = {}
    exec(compile(python_block("## Flax"), "README.md", "exec"), ns)  # noqa: S102
    assert capsys.readouterr().out.strip() == "(2, 600, 256) (2, 1, 256) [604 454]"
    assert not bool(ns["cache"].overflowed.any())
