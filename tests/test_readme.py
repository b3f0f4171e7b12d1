"""The README's library example runs as written (reference path on CPU) and gives finite outputs of the shapes it
implies; the test reads the first python block under "## Using the library"."""

import pathlib

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
FENCE = "`" * 3


def test_readme_library_example_runs():
    text = README.read_text()
    block = text.split("## Using the library", 1)[1].split(FENCE + "python", 1)[1].split(FENCE, 1)[0]
    ns = {}
    exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 - the README is ours
    out, out1, cache = ns["out"], ns["out1"], ns["cache"]
    assert out.shape == (2, 8, 1000, 128) and out1.shape == (2, 8, 128)
    assert np.all(np.isfinite(np.asarray(out, np.float32))) and np.all(np.isfinite(np.asarray(out1, np.float32)))
    np.testing.assert_array_equal(np.asarray(cache.length), [1001, 614])  # prompt + the decoded token
