"""The README's examples run as written (reference path on CPU): the first python block under "## Using the library",
"## Whole models from Python" and "## Flax"; its results table is what benchmarks/report.py gives."""

import pathlib

import numpy as np
import pytest

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
    (rewrite them with `python benchmarks/report.py` and `--headline` after a benchmark run)."""
    from benchmarks import report

    assert report.main(["--check"]) == 0


def test_readme_size():
    text = README.read_text()
    assert len(text.encode()) <= 25_000 and len(text.splitlines()) <= 250


def test_readme_flax_example_runs(capsys):
    ns = {}
    exec(compile(python_block("## Flax"), "README.md", "exec"), ns)  # noqa: S102
    assert capsys.readouterr().out.strip() == "(2, 600, 256) (2, 1, 256) [604 454]"
    assert not bool(ns["cache"].overflowed.any())
