"""Data of the accuracy benchmark: WikiText windows, essay haystacks, RULER-style retrieval prompts, scoring.

Retrieval tasks (all on a Paul Graham essay haystack, answered after the
checkpoint's chat template and a RULER-style answer prefix):

* "needle": one sentence "The special magic number is: NNNNNNN." (a random
  7-digit number) at the given depth; the answer is the number.
* "multikey": four "One of the special magic uuids for KEY is: VALUE."
  sentences with random UUIDs; the asked one sits at the given depth, the
  three distractors at random other depths; the answer is the asked VALUE.
* "vartrack": a chain "VAR A = 12345.", "VAR B = VAR A.", ... of five random
  5-letter variables spread over a fifth of the haystack starting around the
  given depth; the answer is all five names.

A sample is correct when its answer strings all appear in the generated
text (RULER's string match; case-insensitive for UUIDs).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from pathlib import Path

import numpy as np

TASKS = ("needle", "multikey", "vartrack")
MAX_NEW_TOKENS = {"needle": 12, "multikey": 44, "vartrack": 36}
_MARGIN = 8  # tokens kept free below the target length (sentence joins tokenize slightly differently)


def require_file(path: Path, arg: str) -> Path:
    """Raise ValueError naming the argument when `path` is not a file."""
    if not path.is_file():
        raise ValueError(f"{arg}: file not found: {path} (pass {arg} PATH)")
    return path


def require_dir(path: Path, arg: str, pattern: str = "*.txt") -> list[Path]:
    """The files matching `pattern` in `path`; raise ValueError naming the argument if there are none."""
    if not path.is_dir():
        raise ValueError(f"{arg}: folder not found: {path} (pass {arg} PATH)")
    files = sorted(path.glob(pattern))
    if not files:
        raise ValueError(f"{arg}: no {pattern} files in {path}")
    return files


# --------------------------------------------------------------------------- WikiText


def wikitext_tokens(path: Path, tokenizer) -> np.ndarray:
    """The whole raw test file as one int32 token stream (no BOS)."""
    return np.asarray(tokenizer.encode(path.read_text(encoding="utf-8"), special=False), np.int32)


def window_starts(num_tokens: int, length: int, count: int) -> list[int]:
    """`count` evenly spaced, non-overlapping starts of `length`-token windows in a stream of num_tokens."""
    if count < 1 or count * length > num_tokens:
        raise ValueError(f"cannot place {count} non-overlapping windows of {length} tokens in {num_tokens} tokens")
    return [int(s) for s in np.linspace(0, num_tokens - length, count).round()]


# --------------------------------------------------------------------------- haystack


@dataclasses.dataclass(frozen=True)
class Haystack:
    """Essay sentences and their token counts (each encoded with a leading space)."""

    sentences: tuple[str, ...]
    tokens: tuple[int, ...]

    @classmethod
    def from_folder(cls, folder: Path, tokenizer) -> Haystack:
        files = require_dir(folder, "--essays")
        text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
        sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 1]
        sentences = [re.sub(r"\s+", " ", s) for s in sentences]
        counts = [len(tokenizer.encode(" " + s, special=False)) for s in sentences]
        return cls(tuple(sentences), tuple(counts))

    def take(self, start: int, budget: int) -> list[str]:
        """Consecutive sentences from `start` (wrapping around) holding at most `budget` tokens."""
        out, used, n = [], 0, len(self.sentences)
        for i in range(n):
            j = (start + i) % n
            if used + self.tokens[j] > budget:
                break
            out.append(self.sentences[j])
            used += self.tokens[j]
        return out


@dataclasses.dataclass
class Sample:
    """One retrieval prompt: token ids (<= length), answer strings, generation budget."""

    task: str
    length: int
    depth: float
    index: int
    prompt: list[int]
    answers: list[str]
    max_new_tokens: int


def _rng(task: str, length: int, depth: float, index: int, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, TASKS.index(task), length, int(round(depth * 1000)), index])


def _uuid(rng) -> str:
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


def _needles(task: str, depth: float, rng) -> tuple[list[tuple[float, str]], str, str, list[str]]:
    """(needles as (depth, sentence), question, answer prefix, answers) of one sample."""
    if task == "needle":
        value = str(int(rng.integers(1_000_000, 10_000_000)))
        return ([(depth, f"The special magic number is: {value}.")],
                "What is the special magic number mentioned in the provided text?",
                "The special magic number mentioned in the provided text is", [value])
    if task == "multikey":
        pairs = [(_uuid(rng), _uuid(rng)) for _ in range(4)]
        others = [float(x) for x in rng.uniform(0, 1, 3)]
        needles = [(d, f"One of the special magic uuids for {k} is: {v}.")
                   for d, (k, v) in zip([depth] + others, pairs)]
        key, value = pairs[0]
        return (needles, f"What is the special magic uuid for {key} mentioned in the provided text?",
                f"The special magic uuid for {key} mentioned in the provided text is", [value])
    if task == "vartrack":
        letters = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
        names = ["".join(rng.choice(letters, 5)) for _ in range(5)]
        value = str(int(rng.integers(10_000, 100_000)))
        start = depth * 0.8
        steps = [start + 0.2 * i / (len(names) - 1) for i in range(len(names))]
        chain = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
        return (list(zip(steps, chain)),
                f"Find all variables that are assigned the value {value} in the text above.",
                f"According to the chain(s) of variable assignment in the text above, {len(names)} variables are "
                f"assigned the value {value}, they are:", names)
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def insert_needles(filler: list[str], needles: list[tuple[float, str]]) -> str:
    """Filler sentences with each needle inserted at the sentence boundary nearest its depth."""
    slots: dict[int, list[str]] = {}
    for d, sentence in sorted(needles, key=lambda x: x[0]):
        slots.setdefault(int(round(min(max(d, 0.0), 1.0) * len(filler))), []).append(sentence)
    parts = []
    for i in range(len(filler) + 1):
        parts.extend(slots.get(i, []))
        if i < len(filler):
            parts.append(filler[i])
    return " ".join(parts)


def make_sample(task: str, length: int, depth: float, index: int, haystack: Haystack, tokenizer,
                seed: int = 0) -> Sample:
    """A retrieval prompt of at most `length` tokens (chat template + haystack + question + answer prefix)."""
    rng = _rng(task, length, depth, index, seed)
    needles, question, prefix, answers = _needles(task, depth, rng)

    def render(filler):
        user = insert_needles(filler, needles) + "\n\n" + question
        return tokenizer.apply_chat_template([{"role": "user", "content": user}]) + prefix

    overhead = len(tokenizer.encode(render([])))
    start = int(rng.integers(0, len(haystack.sentences)))
    filler = haystack.take(start, length - overhead - _MARGIN)
    ids = tokenizer.encode(render(filler))
    while len(ids) > length and filler:
        filler = filler[:-1]
        ids = tokenizer.encode(render(filler))
    if len(ids) > length:
        raise ValueError(f"a {task} prompt needs {len(ids)} tokens even without filler; length={length} is too small")
    return Sample(task, length, depth, index, ids, answers, MAX_NEW_TOKENS[task])


def score(sample: Sample, text: str) -> tuple[bool, float]:
    """(all answers in the generated text, share of answers found)."""
    hay = text.lower() if sample.task == "multikey" else text
    found = [(a.lower() if sample.task == "multikey" else a) in hay for a in sample.answers]
    return all(found), sum(found) / len(found)


# --------------------------------------------------------------------------- greedy prompts


def greedy_prompts(haystack: Haystack, tokenizer, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of about `length` tokens: an essay excerpt and a request to summarize it."""
    rng = np.random.default_rng([seed, 99])
    ask = "Summarize the text above in detail, point by point."
    overhead = len(tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "\n\n" + ask}])))
    prompts = []
    for _ in range(count):
        filler = haystack.take(int(rng.integers(0, len(haystack.sentences))), length - overhead - _MARGIN)

        def encode(filler):
            return tokenizer.encode(tokenizer.apply_chat_template(
                [{"role": "user", "content": " ".join(filler) + "\n\n" + ask}]))

        ids = encode(filler)
        while len(ids) > length and filler:
            filler = filler[:-1]
            ids = encode(filler)
        prompts.append(ids)
    return prompts
