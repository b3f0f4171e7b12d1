"""The accuracy benchmark's data, argument and summary plumbing, without a model (fast)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.accuracy import tasks  # noqa: E402


class CharTokenizer:
    """One token per character; a chat template that wraps the user message."""

    eos_ids, pad_id = (0,), 0

    def encode(self, text, special=True):
        return [ord(c) % 500 + 1 for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return f"<user>{messages[0]['content']}</user><assistant>"


@pytest.fixture(scope="module")
def haystack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("essays")
    for i in range(3):
        sentences = [f"Essay {i} sentence {j} is about startups and work number {j}." for j in range(200)]
        (folder / f"e{i}.txt").write_text(" ".join(sentences))
    return tasks.Haystack.from_folder(folder, CharTokenizer())


@pytest.mark.parametrize("task", tasks.TASKS)
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_samples_fit_and_hold_their_answers(haystack, task, depth):
    tok = CharTokenizer()
    sample = tasks.make_sample(task, 2000, depth, 3, haystack, tok, seed=1)
    assert 1800 < len(sample.prompt) <= 2000
    text = "".join(chr(i - 1) for i in sample.prompt)  # CharTokenizer is invertible for ASCII
    for answer in sample.answers:
        assert answer in text
    assert tasks.score(sample, " ".join(sample.answers)) == (True, 1.0)
    assert tasks.score(sample, "no idea")[0] is False
    again = tasks.make_sample(task, 2000, depth, 3, haystack, tok, seed=1)
    assert again.prompt == sample.prompt and again.answers == sample.answers


def test_needle_depth_moves_the_needle(haystack):
    tok = CharTokenizer()
    pos = []
    for depth in (0.0, 0.5, 1.0):
        s = tasks.make_sample("needle", 3000, depth, 0, haystack, tok)
        text = "".join(chr(i - 1) for i in s.prompt)
        pos.append(text.index("special magic number is:") / len(text))
    assert pos[0] < 0.1 and 0.35 < pos[1] < 0.65 and pos[2] > 0.85


def test_multikey_scoring_is_case_insensitive(haystack):
    s = tasks.make_sample("multikey", 2500, 0.5, 0, haystack, CharTokenizer())
    assert tasks.score(s, s.answers[0].upper())[0]
    assert len(s.answers[0]) == 36


def test_clear_errors_for_missing_data(tmp_path):
    with pytest.raises(ValueError, match="--wikitext: file not found"):
        tasks.require_file(tmp_path / "nope.raw", "--wikitext")
    with pytest.raises(ValueError, match="--essays: no \\*.txt files"):
        tasks.require_dir(tmp_path, "--essays")
    with pytest.raises(ValueError, match="too small"):
        tasks.make_sample("needle", 50, 0.5, 0, tasks.Haystack(("A b.",), (4,)), CharTokenizer())
    with pytest.raises(ValueError, match="non-overlapping"):
        tasks.window_starts(1000, 600, 2)
    assert tasks.window_starts(1000, 100, 3) == [0, 450, 900]


def test_benchmark_arguments_and_reductions(tmp_path, capsys):
    from benchmarks.accuracy import options, run, settings
    assert run.main(["--sections", "perplexity", "--wikitext", str(tmp_path / "missing.raw")]) == 2
    assert "--wikitext: file not found" in capsys.readouterr().err
    assert run.main(["--ppl-methods", "bf16,fp4", "--out", str(tmp_path / "x.json")]) == 2
    assert "unknown methods ['fp4']" in capsys.readouterr().err
    assert options.reductions(settings.SPEC) == []
    assert options.sizes_from_args(options.parse_args(["--spec"])) == settings.SPEC
    assert options.sizes_from_args(options.parse_args(["--spec", "--greedy-prompts", "2"])).greedy_prompts == 2
    with pytest.raises(SystemExit):
        options.parse_args(["--spec", "--quick"])
    assert any(r.startswith("retrieval_samples: 1") for r in options.reductions(settings.FULL))
    with pytest.raises(SystemExit):
        options.parse_args(["--sections", "speed"])


def test_hyquant_eval_accuracy_is_listed(capsys):
    from hyquant_jax import cli

    assert cli.main(["eval"]) == 0
    assert "accuracy" in capsys.readouterr().out
    assert cli.main(["bench"]) == 0
    assert "accuracy" not in capsys.readouterr().out


def _hits(methods, lengths, depths=(0.0, 1.0), samples=2, tasks_=("needle", "multikey"), seed=3):
    """Deterministic pseudo-random per-sample hits [task, length, depth, index, correct, partial]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for m in methods:
        rows = []
        for n in lengths:
            for i in range(samples):
                for t in tasks_:
                    for d in depths:
                        partial = float(rng.integers(0, 5)) / 4
                        rows.append([t, n, d, i, partial == 1.0, partial])
        out[m] = rows
    return out


def test_score_hits_matches_a_direct_count():
    from benchmarks.accuracy import retrieval

    hits = _hits(["bf16"], [512, 1024])["bf16"]
    scored = retrieval.score_hits(hits, [512, 1024], [0.0, 1.0], ["needle", "multikey"])
    assert scored["samples"] == len(hits) == 16
    assert scored["overall"] == pytest.approx(sum(h[4] for h in hits) / 16)
    cell = [h[4] for h in hits if h[:3] == ["multikey", 1024, 1.0]]
    assert len(cell) == 2 and scored["multikey"]["grid"]["1024"]["1.0"] == pytest.approx(sum(cell) / 2)
    needle = [h for h in hits if h[0] == "needle"]
    assert scored["needle"]["partial"] == pytest.approx(sum(h[5] for h in needle) / len(needle))
    assert retrieval.score_hits([], [512], [0.0], ["needle"])["overall"] is None


def test_combine_retrieval_equals_one_run_and_lists_conflicts():
    """Sections split by method and by length, combined, score exactly as the whole."""
    from benchmarks.accuracy import retrieval

    depths, tasks_ = [0.0, 1.0], ["needle", "multikey"]
    whole = _hits(["bf16", "hyquant_k4v4", "uniform4"], [512, 1024])
    full = retrieval.retrieval_result(whole, [512, 1024], depths, tasks_, 2, seed=0)

    def part(methods, n):
        hits = {m: [h for h in whole[m] if h[1] == n] for m in methods}
        return retrieval.retrieval_result(hits, [n], depths, tasks_, 2, seed=0, complete=n == 512)

    parts = [part(["bf16", "uniform4"], 512), part(["hyquant_k4v4"], 512), part(["bf16", "hyquant_k4v4"], 1024),
             part(["uniform4"], 1024), part(["uniform4"], 1024)]  # a duplicate with equal scores is fine
    combined = retrieval.combine_retrieval(parts)
    assert combined["methods"] == full["methods"] and combined["lengths"] == [512, 1024]
    assert list(combined["methods"]) == ["bf16", "hyquant_k4v4", "uniform4"]
    # parts stopped early but finished by others: complete, since every cell has all its samples
    assert combined["samples_per_cell"] == [2, 2] and combined["complete"] is True
    assert retrieval.combine_retrieval(parts[:1] + parts[2:])["complete"] is False  # hyquant at 512 missing
    assert combined["equal_duplicates"] == 8 and combined["differing_duplicates"] == []
    bad = part(["uniform4"], 1024)
    first = bad["hits"]["uniform4"][0]
    bad["hits"]["uniform4"][0] = first[:4] + [not first[4], 0.5]
    again = retrieval.combine_retrieval(parts + [bad])
    assert again["methods"] == full["methods"]  # the first score is kept, the other listed
    assert again["differing_duplicates"] == [{"method": "uniform4", "kept": first,
                                              "other": first[:4] + [not first[4], 0.5]}]
    with pytest.raises(ValueError, match="differ in seed"):
        retrieval.combine_retrieval([parts[0], retrieval.retrieval_result(whole, [512], depths, tasks_, 2, seed=1)])
    old = dict(parts[0])
    del old["hits"]
    with pytest.raises(ValueError, match="hits"):
        retrieval.combine_retrieval([old])


def test_partial_retrieval_counts_samples_per_cell():
    """A run stopped early reports the fewest and most samples any cell got, and says it is partial."""
    from benchmarks.accuracy import retrieval, summary

    hits = _hits(["bf16"], [512], samples=3)
    hits["bf16"] = hits["bf16"][:-3]  # the last sample index is missing three of its four cells
    r = retrieval.retrieval_result(hits, [512], [0.0, 1.0], ["needle", "multikey"], 3, seed=0, complete=False)
    assert r["samples_per_cell"] == [2, 3] and r["samples_done"] == {"bf16": 9}
    text = "\n".join(summary._md_retrieval(r))
    assert "2-3 sample(s)" in text and "stopped early" in text


def test_combine_files_writes_a_result(tmp_path):
    import json

    from benchmarks.accuracy import retrieval, run

    depths, tasks_ = [0.0, 1.0], ["needle", "multikey"]
    whole = _hits(["bf16", "hyquant_k4v4"], [512])
    paths = []
    for m in whole:
        sec = retrieval.retrieval_result({m: whole[m]}, [512], depths, tasks_, 2, seed=0)
        sec["elapsed_s"] = 10.0 + len(paths)
        path = tmp_path / f"{m}.json"
        path.write_text(json.dumps({"env": {"command": f"run {m}", "device": "cpu", "date": "2026-11-30",
                                            "platform": "cpu"},
                                    "model": {"name": "m"}, "data": {}, "sizes": {"retrieval_depths": depths},
                                    "retrieval": sec}))
        paths.append(path)
    out = tmp_path / "combined.json"
    assert run.main(["--combine-retrieval", *map(str, paths), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["wall_s"] == 11.0 and len(result["combined_from"]) == 2
    assert "retrieval_within_2_points" in result["targets"]
    assert "`run bf16`" in result["summary_markdown"] and "0 stopped early" in result["summary_markdown"]
    assert (tmp_path / "combined_needle.png").is_file()
    assert run.main(["--combine-retrieval", str(tmp_path / "missing.json"), "--out", str(out)]) == 2


def test_retrieval_target_pairs_the_samples_both_methods_ran():
    from benchmarks.accuracy import retrieval, summary

    hits = {"bf16": [["needle", 512, 0.0, i, i < 2, float(i < 2)] for i in range(4)],
            "hyquant_k4v4": [["needle", 512, 0.0, i, True, 1.0] for i in range(2)]}  # stopped after 2 samples
    sec = retrieval.retrieval_result(hits, [512], [0.0], ["needle"], 4, seed=0, complete=False)
    target = summary.targets({"retrieval": sec})["retrieval_within_2_points"]
    assert target["samples"] == 2 and target["value"] == 0.0 and target["met"]  # unpaired it would be +50 points


def test_retrieval_samples_interleave_cells_and_start_at_first_index(haystack):
    import dataclasses

    from benchmarks.accuracy import retrieval, settings

    sizes = dataclasses.replace(settings.QUICK, retrieval_lengths=(600,), retrieval_samples=3,
                                retrieval_tasks=("needle", "vartrack"), retrieval_depths=(0.0, 1.0))
    every = retrieval.retrieval_samples(sizes, haystack, CharTokenizer(), seed=0)
    assert [(s.index, s.task, s.depth) for s in every[:4]] == [(0, "needle", 0.0), (0, "needle", 1.0),
                                                                (0, "vartrack", 0.0), (0, "vartrack", 1.0)]
    later = retrieval.retrieval_samples(sizes, haystack, CharTokenizer(), seed=0, first_index=2)
    assert [s.prompt for s in later] == [s.prompt for s in every[8:]] and {s.index for s in later} == {2}
    with pytest.raises(ValueError, match="retrieval-first-index"):
        retrieval.retrieval_section(None, CharTokenizer(), haystack, sizes, None, 0, first_index=3)
