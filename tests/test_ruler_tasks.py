"""benchmarks/_ruler_tasks.py: every task's prompt fits its length, holds its gold answers where the task says
(checked by parsing the prompt text: the vt chains resolved, the cwe list counted), ends with the question and
answer prefix, and is the same for the same seed; scoring and cell selection. A fake word tokenizer keeps it fast;
one test runs the tiny checkpoint's BPE tokenizer and chat template."""

import collections
import re
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _ruler_tasks as ruler  # noqa: E402


class WordTokenizer:
    """One token per whitespace-separated word; a chat template that wraps the user message."""

    def encode(self, text, special=True):
        return [zlib.crc32(w.encode()) % 1000 + 1 for w in text.split()]

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return f"<user> {messages[0]['content']} </user> <assistant>"


@pytest.fixture(scope="module")
def essays(tmp_path_factory):
    """A folder of three essays of pseudo-words (a vocabulary of ~3000), ~15,000 words in all."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = sorted({"".join(rng.choice(letters, rng.integers(4, 10))) for _ in range(3000)})
    folder = tmp_path_factory.mktemp("essays")
    for i in range(3):
        sentences = [" ".join(rng.choice(vocab, rng.integers(6, 15))).capitalize() + "." for _ in range(400)]
        (folder / f"essay{i}.txt").write_text(" ".join(sentences))
    return folder


@pytest.fixture(scope="module")
def corpus(essays):
    return ruler.Corpus.from_folder(essays, WordTokenizer())


LENGTH = 3000


@pytest.mark.parametrize("task", ruler.TASKS)
def test_samples_fit_end_with_the_question_and_repeat(corpus, task):
    tok = WordTokenizer()
    sample = ruler.make_sample(task, LENGTH, 2, corpus, tok, seed=5)
    assert list(sample.prompt) == tok.encode(sample.text)
    assert LENGTH - 40 <= len(sample.prompt) <= LENGTH  # the margin and at most a sentence or a few cwe entries
    user = sample.text.split("<user> ", 1)[1]
    question, prefix = user.rsplit("</user> <assistant>", 1)
    assert question.rstrip().endswith("?") or question.rstrip().endswith(".")
    assert prefix.startswith(" ") and len(prefix) < 250
    assert all(a and a in sample.text for a in sample.answers)
    assert len(sample.answers) == {"niah_multivalue": 4, "niah_multiquery": 4, "vt": 5, "cwe": 10}.get(task, 1)
    assert sample.max_new_tokens >= len(tok.encode(" ".join(sample.answers)))
    assert all(0.0 <= d <= 1.0 for d in sample.depths)
    assert ruler.make_sample(task, LENGTH, 2, corpus, tok, seed=5) == sample
    other = ruler.make_sample(task, LENGTH, 3, corpus, tok, seed=5)
    assert other.answers != sample.answers and other.text != sample.text


@pytest.mark.parametrize("task", [t for t in ruler.TASKS if t.startswith("niah")])
def test_needles_say_what_the_answers_are(corpus, task):
    sample = ruler.make_sample(task, LENGTH, 0, corpus, WordTokenizer())
    needles = re.findall(r"One of the special magic (?:numbers|uuids) for (\S+) is: (\S+)\.", sample.text)
    assert len(needles) == (1 if task == "niah_single" else ruler.NEEDLES)
    question = sample.text.rsplit("What are all the special magic", 1)[1]
    asked = [k for k, _ in needles if k in question]
    assert sorted(sample.answers) == sorted(v for k, v in needles if k in asked)
    assert len(asked) == {"niah_multivalue": 4, "niah_multiquery": 4}.get(task, 1)
    if task == "niah_multikey_uuids":
        assert all(re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", x) for kv in needles for x in kv)
    if task == "niah_multivalue":
        assert len({k for k, _ in needles}) == 1
    elif task != "niah_single":
        assert len({k for k, _ in needles}) == ruler.NEEDLES


def test_needle_positions_follow_their_depths(corpus):
    tok = WordTokenizer()
    for index in range(6):
        s = ruler.make_sample("niah_single", LENGTH, index, corpus, tok)
        body = s.text.split("afterwards.", 1)[1].rsplit("What are all", 1)[0]
        where = body.index("One of the special magic") / len(body)
        assert abs(where - s.depths[0]) < 0.03


def test_variable_tracking_answers_resolve_from_the_text(corpus):
    """Resolve every VAR statement of the prompt in order: the answer is the set of names bound to the asked
    value, and the other chains bind other values."""
    for index in range(4):
        s = ruler.make_sample("vt", LENGTH, index, corpus, WordTokenizer())
        value = re.search(r"assigned the value (\d+) in the text above", s.text).group(1)
        bound = {}
        statements = re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d+)\.", s.text)
        assert len(statements) == ruler.VT_CHAINS * (ruler.VT_HOPS + 1)
        for name, rhs in statements:
            assert name not in bound
            bound[name] = bound[rhs[4:]] if rhs.startswith("VAR ") else rhs  # a KeyError: a chain out of order
        assert sorted(n for n, v in bound.items() if v == value) == sorted(s.answers)
        assert len(set(bound.values())) == ruler.VT_CHAINS


def test_common_words_are_counted_from_the_list(corpus):
    s = ruler.make_sample("cwe", LENGTH, 1, corpus, WordTokenizer())
    listing = s.text.split("appear most often.\n", 1)[1].split("\nQuestion:", 1)[0]
    entries = re.findall(r"(\d+)\. (\w+)", listing)
    assert [int(i) for i, _ in entries] == list(range(1, len(entries) + 1))
    counts = collections.Counter(w for _, w in entries)
    assert sorted(w for w, c in counts.items() if c == ruler.CWE_FREQ_COMMON) == sorted(s.answers)
    assert set(counts.values()) == {ruler.CWE_FREQ_COMMON, ruler.CWE_FREQ_RARE}
    # the most rare words that fit: one more word (3 entries of 2 tokens) would not
    assert len(s.prompt) + 2 * ruler.CWE_FREQ_RARE > LENGTH


def test_copy_span_asks_for_one_marked_passage(corpus):
    s = ruler.make_sample("copy_span", LENGTH, 0, corpus, WordTokenizer())
    marked = dict(re.findall(r"\[BEGIN (\d+)\] (.*?) \[END \1\]", s.text))
    assert len(marked) == ruler.SPANS
    label = re.search(r"Copy the passage marked (\d+)", s.text).group(1)
    assert marked[label] == s.answers[0]
    assert ruler.SPAN_MIN_TOKENS <= len(s.answers[0].split()) <= ruler.SPAN_MAX_TOKENS


def test_scores(corpus):
    tok = WordTokenizer()
    multi = ruler.make_sample("niah_multivalue", LENGTH, 0, corpus, tok)
    a = multi.answers
    assert ruler.score(multi, f"{a[0]}, {a[1]}, {a[2]} and {a[3]}.") == 1.0
    assert ruler.score(multi, f"{a[2]}, {a[0]}") == 0.5
    assert ruler.score(multi, a[0] + "9") == 0.0  # whole numbers only, not a prefix of another
    uuids = ruler.make_sample("niah_multikey_uuids", LENGTH, 0, corpus, tok)
    assert ruler.score(uuids, uuids.answers[0].upper()) == 1.0
    span = ruler.make_sample("copy_span", LENGTH, 0, corpus, tok)
    words = span.answers[0].split()
    assert ruler.score(span, span.answers[0] + " [END]") == 1.0
    assert ruler.score(span, " ".join(words[: len(words) // 2])) == pytest.approx((len(words) // 2) / len(words))
    assert ruler.score(span, "") == 0.0


def test_select_cells_keeps_the_measurable_ones():
    scores = {("niah_single", 4096): [1.0] * 20, ("vt", 4096): [1.0] * 14 + [0.0] * 6,
              ("cwe", 8192): [0.1] * 20, ("copy_span", 16384): [0.4] * 20, ("vt", 16384): []}
    assert ruler.select_cells(scores) == [("vt", 4096), ("copy_span", 16384)]
    with pytest.raises(ValueError, match="low <= high"):
        ruler.select_cells(scores, low=0.9, high=0.5)


def test_clear_errors(corpus):
    with pytest.raises(ValueError, match="task must be one of"):
        ruler.make_sample("qa", LENGTH, 0, corpus, WordTokenizer())
    with pytest.raises(ValueError, match="too small"):
        ruler.make_sample("vt", 60, 0, corpus, WordTokenizer())
    with pytest.raises(ValueError, match="too small"):
        ruler.make_sample("cwe", 400, 0, corpus, WordTokenizer())


def test_with_the_tiny_checkpoints_tokenizer(essays, tiny_gguf):
    """A real BPE tokenizer and ChatML template: the ids are the text's encoding, fill the length, and the
    prompt ends with the assistant turn opened on the answer prefix."""
    from models.gguf_loader import open_gguf
    from models.tokenizer import tokenizer_from_gguf

    tok = tokenizer_from_gguf(open_gguf(tiny_gguf[0]), tiny_gguf[0])
    corpus = ruler.Corpus.from_folder(essays, tok)
    tasks = ("niah_multikey_words", "vt", "copy_span")
    samples = ruler.make_samples(tasks, [1500], 2, corpus, tok, seed=1)
    assert [(s.task, s.index) for s in samples] == [(t, i) for t in tasks for i in (0, 1)]
    for s in samples:
        assert list(s.prompt) == tok.encode(s.text) and 1500 - 150 <= len(s.prompt) <= 1500  # a sentence or two
        assert s.text.startswith("<|im_start|>")
        turn = s.text.rsplit("<|im_end|>\n<|im_start|>assistant\n", 1)[1]
        assert turn.startswith((" The special magic", " Answer:", " The passage marked")) and "\n" not in turn
