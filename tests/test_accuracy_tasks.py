"""The accuracy benchmark's data, argument and summary plumbing, without a model (fast)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _accuracy_tasks as tasks  # noqa: E402


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
    from benchmarks import accuracy as bench
    assert bench.main(["--sections", "perplexity", "--wikitext", str(tmp_path / "missing.raw")]) == 2
    assert "--wikitext: file not found" in capsys.readouterr().err
    assert bench.main(["--ppl-methods", "bf16,fp4", "--out", str(tmp_path / "x.json")]) == 2
    assert "unknown methods ['fp4']" in capsys.readouterr().err
    assert bench.reductions(bench.SPEC) == []
    assert bench.sizes_from_args(bench.parse_args(["--spec"])) == bench.SPEC
    assert bench.sizes_from_args(bench.parse_args(["--spec", "--greedy-prompts", "2"])).greedy_prompts == 2
    with pytest.raises(SystemExit):
        bench.parse_args(["--spec", "--quick"])
    assert any(r.startswith("retrieval_samples: 1") for r in bench.reductions(bench.FULL))
    with pytest.raises(SystemExit):
        bench.parse_args(["--sections", "speed"])


def test_hyquant_eval_accuracy_is_listed(capsys):
    from hyquant_jax import cli

    assert cli.main(["eval"]) == 0
    assert "accuracy" in capsys.readouterr().out
    assert cli.main(["bench"]) == 0
    assert "accuracy" not in capsys.readouterr().out
