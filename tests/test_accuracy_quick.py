"""CI run of the accuracy benchmark's --quick mode on the real SmolLM2-135M (`python -m benchmarks.accuracy`).

Marked slow (about 3 minutes on 2 CPU cores). It asserts only what must hold
on any correct implementation, not the issue's targets: the hybrid cache is
more accurate than uniform 4-bit on the captured states, 8-bit beats 4-bit,
exact attention is exact up to bf16 rounding, nothing is NaN, coverage shares
are ordered shares, bf16 perplexity is sane, every plot is written.
"""

import json
import math
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, default_model):
    from benchmarks.accuracy import run, settings

    for path in (settings.DEFAULT_WIKITEXT, settings.DEFAULT_ESSAYS):
        if not path.exists():
            pytest.skip(f"evaluation data not found: {path}")
    out = tmp_path_factory.mktemp("accuracy") / "accuracy_smollm2.json"
    assert run.main(["--quick", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def _finite(x) -> bool:
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, list):
        return all(_finite(v) for v in x)
    return not isinstance(x, float) or math.isfinite(x)


def test_operator_error(quick_run):
    op = quick_run["operator"]
    assert _finite(op["methods"]) and _finite(op["prefill"])
    for n in map(str, op["lengths"]):
        mean = {name: cells[n]["mean"] for name, cells in op["methods"].items()}
        assert mean["hyquant_k4v4"] < mean["uniform4"], n
        assert mean["uniform8"] < mean["uniform4"], n
        assert mean["bf16"] < 1e-3 and mean["bf16"] == min(mean.values()), n
        assert all(len(cells[n]["per_layer"]) == 30 for cells in op["methods"].values())


def test_coverage_shares_are_ordered(quick_run):
    for cell in quick_run["coverage"]["per_length"].values():
        per = cell["per_layer"]
        for i in range(len(per["top1"])):
            assert 0.0 < per["top1"][i] <= per["top5"][i] + 1e-9 <= per["top5_win"][i] + 2e-9 <= 1.0 + 1e-6
            assert 0.0 < per["vti_win"][i] <= 1.0 + 1e-6


def test_perplexity_is_finite_and_sane(quick_run):
    methods = quick_run["perplexity"]["methods"]
    assert all(m["finite"] for m in methods.values())
    assert 1.0 < methods["bf16"]["ppl"] < 200.0
    assert methods["bf16"]["delta_nll"] == 0.0
    assert all(math.isfinite(m["ppl"]) for m in methods.values())


def test_generation_sections_and_outputs(quick_run):
    ret = quick_run["retrieval"]["methods"]
    assert set(ret) == set(quick_run["sizes"]["retrieval_methods"])
    assert all(0.0 <= m["overall"] <= 1.0 for m in ret.values())
    greedy = quick_run["greedy"]["methods"]
    assert greedy["bf16"]["agreement"] == 1.0
    assert all(0.0 <= m["agreement"] <= 1.0 for m in greedy.values())
    for path in quick_run["plots"].values():
        assert Path(path).is_file() and Path(path).stat().st_size > 1000
    assert "Targets:" in quick_run["summary_markdown"]
    assert set(quick_run["targets"]) == {"perplexity_within_1pct", "retrieval_within_2_points",
                                         "operator_mse_at_most_quarter_of_uniform4"}
