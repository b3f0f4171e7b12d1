"""RULER-style long-context tasks on an essay haystack: generated from a fixed seed, sized in the model's own
tokens, the question at the end, gold answers per sample.

After RULER (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?"),
its templates and its string-match scoring:

  niah_single          one needle "One of the special magic numbers for KEY is: VALUE." (KEY: two essay words
                       joined by a hyphen; VALUE: 7 digits); the sanity task
  niah_multikey_words  4 such needles with distinct keys; one key is asked
  niah_multikey_uuids  4 needles whose keys and values are UUIDs; one key is asked
  niah_multivalue      4 needles with one key and distinct values; every value is asked
  niah_multiquery      4 needles with distinct keys; all 4 keys are asked at once
  vt                   variable tracking: "VAR ABCDE = 12345." then "VAR FGHIJ = VAR ABCDE." and so on (4 hops),
                       plus 2 distractor chains from other values; the 5 names of the asked value's chain
  cwe                  common-words extraction: a numbered list of essay words (it replaces the haystack), 10 of
                       them 30 times each, the others 3 times each; the 10 common words
  copy_span            3 passages of essay sentences marked "[BEGIN n] ... [END n]" in the haystack; one is to be
                       copied word for word

Needles sit at uniformly random depths (at the sentence boundary nearest each; a vt chain in order), and the
haystack starts at a random essay sentence. A prompt is the checkpoint's chat template around the task text and
its question, then the task's answer prefix; it holds at most `length` tokens (and only a few fewer).

Scoring (`score`): the share of the gold strings found in the output as whole words, case-insensitively (RULER's
string_match_all, which matches substrings); copy_span: the share of the passage's words reproduced in order.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.accuracy.tasks import Haystack, insert_needles

TASKS = ("niah_single", "niah_multikey_words", "niah_multikey_uuids", "niah_multivalue", "niah_multiquery", "vt",
         "cwe", "copy_span")
LENGTHS = (4096, 8192, 16384)
NEEDLES = 4  # needles of the multi-key, multi-value and multi-query tasks
VT_HOPS, VT_CHAINS = 4, 3  # a chain names 1 + VT_HOPS variables; VT_CHAINS - 1 of the chains are distractors
CWE_COMMON, CWE_FREQ_COMMON, CWE_FREQ_RARE = 10, 30, 3
SPANS, SPAN_MIN_TOKENS, SPAN_MAX_TOKENS = 3, 40, 96  # copy_span: marked passages and the asked one's size
MAX_NEW_TOKENS = {"niah_single": 24, "niah_multikey_words": 24, "niah_multikey_uuids": 48, "niah_multivalue": 64,
                  "niah_multiquery": 64, "vt": 48, "cwe": 96}  # copy_span: the passage's tokens + 16
_MARGIN = 8  # tokens kept free below the length (joined sentences tokenize slightly differently)
_STOPWORDS = frozenset(
    "about above after again against because been before being below between both could does doing down during "
    "each from further have having here into more most other ought over same should some such than that their "
    "theirs them then there these they this those through under until very were what when where which while who "
    "whom with would your yours also just like only even much many make made will".split())


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The haystack (essay sentences with their token counts) and a word pool: the distinct lowercase words of
    4 to 10 letters in the essays, stop words left out, sorted (keys and the cwe list are drawn from it)."""

    haystack: Haystack
    words: tuple[str, ...]

    @classmethod
    def from_folder(cls, folder: Path, tokenizer) -> Corpus:
        """From a folder of essays (*.txt); ValueError when it has none."""
        haystack = Haystack.from_folder(folder, tokenizer)
        words = {w.lower() for s in haystack.sentences for w in re.findall(r"[A-Za-z]+", s) if 4 <= len(w) <= 10}
        return cls(haystack, tuple(sorted(words - _STOPWORDS)))


@dataclasses.dataclass(frozen=True)
class RulerSample:
    """One prompt: token ids (chat template and answer prefix included; at most `length`), its text, the gold
    answers, the generation budget and the depths in [0, 1] of the asked needles (empty for cwe)."""

    task: str
    length: int
    index: int
    prompt: tuple[int, ...]
    text: str
    answers: tuple[str, ...]
    max_new_tokens: int
    depths: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class _Task:
    """A haystack task before sizing: needles as (depth, sentence), the text before the haystack, the question
    after it, the answer prefix after the chat template, the gold answers."""

    needles: list[tuple[float, str]]
    intro: str
    question: str
    prefix: str
    answers: tuple[str, ...]
    depths: tuple[float, ...]
    max_new_tokens: int


def make_sample(task: str, length: int, index: int, corpus: Corpus, tokenizer, seed: int = 0) -> RulerSample:
    """Sample `index` of `task` at `length` tokens; the same arguments give the same sample.

    tokenizer: `encode(text) -> list[int]` (special tokens parsed) and `apply_chat_template(messages) -> str`.
    ValueError: an unknown task, or a length too small for the task without any haystack."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if length < 1:
        raise ValueError(f"length must be a positive number of tokens, got {length}")
    rng = np.random.default_rng([seed, TASKS.index(task), length, index])
    if task == "cwe":
        return _cwe_sample(length, index, corpus, tokenizer, rng)
    spec = _BUILDERS[task](rng, corpus)

    def render(filler: list[str]) -> str:
        user = spec.intro + "\n\n" + insert_needles(filler, spec.needles) + "\n\n" + spec.question
        return tokenizer.apply_chat_template([{"role": "user", "content": user}]) + spec.prefix

    text, ids = _fit(task, length, render, corpus.haystack, int(rng.integers(len(corpus.haystack.sentences))),
                     tokenizer)
    return RulerSample(task, length, index, tuple(ids), text, spec.answers, spec.max_new_tokens, spec.depths)


def make_samples(tasks, lengths, count: int, corpus: Corpus, tokenizer, seed: int = 0) -> list[RulerSample]:
    """`count` samples of every (task, length), in that order (a cell's samples do not depend on the others)."""
    return [make_sample(t, n, i, corpus, tokenizer, seed) for t in tasks for n in lengths for i in range(count)]


def score(sample: RulerSample, output: str) -> float:
    """The sample's score in [0, 1] for the generated text (after the answer prefix)."""
    if sample.task == "copy_span":
        gold, out = sample.answers[0].split(), output.split()
        matched = difflib.SequenceMatcher(None, gold, out, autojunk=False).get_matching_blocks()
        return sum(b.size for b in matched) / len(gold)
    found = [re.search(rf"\b{re.escape(a)}\b", output, re.IGNORECASE) is not None for a in sample.answers]
    return sum(found) / len(found)


def select_cells(scores: dict, low: float = 0.40, high: float = 0.95) -> list:
    """The (task, length) cells whose mean score (bf16, in a pilot) lies in [low, high]: hard enough to show a
    loss and easy enough to be measured. scores: {(task, length): [score per sample]}."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"need 0 <= low <= high <= 1, got low={low}, high={high}")
    return [cell for cell, values in scores.items() if values and low <= float(np.mean(values)) <= high]


# --------------------------------------------------------------------------- sizing


def _fit(task: str, length: int, render: Callable[[list[str]], str], haystack: Haystack, start: int,
         tokenizer) -> tuple[str, list[int]]:
    """The rendered prompt with as many haystack sentences from `start` as fit in `length` tokens, and its ids."""
    overhead = len(tokenizer.encode(render([])))
    if overhead > length:
        raise ValueError(f"a {task} prompt needs {overhead} tokens without any haystack; length={length} is too "
                         f"small")
    filler = haystack.take(start, length - overhead - _MARGIN)
    counts = [haystack.tokens[(start + i) % len(haystack.tokens)] for i in range(len(filler))]
    text = render(filler)
    ids = tokenizer.encode(text)
    while len(ids) > length:  # drop sentences from the end worth at least the excess, then measure again
        excess, drop = len(ids) - length, 0
        while filler and drop < excess:
            filler.pop()
            drop += counts.pop()
        text = render(filler)
        ids = tokenizer.encode(text)
    return text, ids


# --------------------------------------------------------------------------- tasks


def _key(rng, corpus: Corpus) -> str:
    a, b = rng.choice(len(corpus.words), 2, replace=False)
    return f"{corpus.words[a]}-{corpus.words[b]}"


def _keys(rng, corpus: Corpus, n: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < n:
        key = _key(rng, corpus)
        if key not in keys:
            keys.append(key)
    return keys


def _numbers(rng, n: int, digits: int) -> list[str]:
    values = rng.choice(9 * 10 ** (digits - 1), n, replace=False) + 10 ** (digits - 1)
    return [str(int(v)) for v in values]


def _uuid(rng) -> str:
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


def _depths(rng, n: int) -> list[float]:
    return [float(d) for d in rng.uniform(0.0, 1.0, n)]


def _niah(kind: str, keys: list[str], values: list[str], asked: list[str], depths: list[float],
          answers: list[str], task: str) -> _Task:
    """RULER's needle template: needle i (at depths[i]) says values[i] belongs to keys[i]; the keys in `asked`
    are asked, and the depths of their needles are the sample's depths."""
    query = ", ".join(asked[:-1]) + (" and " if len(asked) > 1 else "") + asked[-1]
    needles = [(d, f"One of the special magic {kind} for {k} is: {v}.") for d, k, v in zip(depths, keys, values)]
    return _Task(needles=needles,
                 intro=f"Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
                       f"I will quiz you about the {kind} afterwards.",
                 question=f"What are all the special magic {kind} for {query} mentioned in the provided text?",
                 prefix=f" The special magic {kind} for {query} mentioned in the provided text are",
                 answers=tuple(answers), depths=tuple(d for d, k in zip(depths, keys) if k in asked),
                 max_new_tokens=MAX_NEW_TOKENS[task])


def _niah_single(rng, corpus) -> _Task:
    key, value = _key(rng, corpus), _numbers(rng, 1, 7)[0]
    return _niah("numbers", [key], [value], [key], _depths(rng, 1), [value], "niah_single")


def _niah_multikey_words(rng, corpus) -> _Task:
    keys, values = _keys(rng, corpus, NEEDLES), _numbers(rng, NEEDLES, 7)
    return _niah("numbers", keys, values, keys[:1], _depths(rng, NEEDLES), values[:1], "niah_multikey_words")


def _niah_multikey_uuids(rng, corpus) -> _Task:
    keys, values = [_uuid(rng) for _ in range(NEEDLES)], [_uuid(rng) for _ in range(NEEDLES)]
    return _niah("uuids", keys, values, keys[:1], _depths(rng, NEEDLES), values[:1], "niah_multikey_uuids")


def _niah_multivalue(rng, corpus) -> _Task:
    key, values = _key(rng, corpus), _numbers(rng, NEEDLES, 7)
    return _niah("numbers", [key] * NEEDLES, values, [key], _depths(rng, NEEDLES), values, "niah_multivalue")


def _niah_multiquery(rng, corpus) -> _Task:
    keys, values = _keys(rng, corpus, NEEDLES), _numbers(rng, NEEDLES, 7)
    return _niah("numbers", keys, values, keys, _depths(rng, NEEDLES), values, "niah_multiquery")


def _vt(rng, corpus) -> _Task:
    letters = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    names: list[str] = []
    while len(names) < VT_CHAINS * (VT_HOPS + 1):
        name = "".join(rng.choice(letters, 5))
        if name not in names:
            names.append(name)
    values = _numbers(rng, VT_CHAINS, 5)
    needles, asked_depths = [], []
    for c in range(VT_CHAINS):
        chain = names[c * (VT_HOPS + 1):(c + 1) * (VT_HOPS + 1)]
        depths = sorted(_depths(rng, VT_HOPS + 1))
        statements = [f"VAR {chain[0]} = {values[c]}."] + [f"VAR {b} = VAR {a}." for a, b in zip(chain, chain[1:])]
        needles += list(zip(depths, statements))
        if c == 0:
            asked_depths = depths
    return _Task(needles=needles,
                 intro="Memorize and track the chain(s) of variable assignment hidden in the following text.",
                 question=f"Question: Find all variables that are assigned the value {values[0]} in the text above.",
                 prefix=f" Answer: According to the chain(s) of variable assignment in the text above, {VT_HOPS + 1} "
                        f"variables are assigned the value {values[0]}, they are:",
                 answers=tuple(names[:VT_HOPS + 1]), depths=tuple(asked_depths), max_new_tokens=MAX_NEW_TOKENS["vt"])


def _passage(rng, haystack: Haystack) -> tuple[str, int]:
    """Consecutive essay sentences of SPAN_MIN_TOKENS to SPAN_MAX_TOKENS tokens, and their token count."""
    n = len(haystack.sentences)
    for _ in range(1000):
        start = int(rng.integers(n))
        sentences, tokens = [], 0
        while tokens < SPAN_MIN_TOKENS and len(sentences) < n:
            j = (start + len(sentences)) % n
            sentences.append(haystack.sentences[j])
            tokens += haystack.tokens[j]
        if SPAN_MIN_TOKENS <= tokens <= SPAN_MAX_TOKENS:
            return " ".join(sentences), tokens
    raise ValueError(f"the essays hold no run of sentences of {SPAN_MIN_TOKENS} to {SPAN_MAX_TOKENS} tokens")


def _copy_span(rng, corpus) -> _Task:
    labels = _numbers(rng, SPANS, 4)
    passages = [_passage(rng, corpus.haystack) for _ in range(SPANS)]
    depths = _depths(rng, SPANS)
    needles = [(d, f"[BEGIN {label}] {text} [END {label}]") for d, label, (text, _) in zip(depths, labels, passages)]
    text, tokens = passages[0]
    return _Task(needles=needles,
                 intro="The following text contains passages marked [BEGIN n] at their start and [END n] at their "
                       "end, where n is a number. Read it carefully: I will ask you to copy one of these passages.",
                 question=f"Copy the passage marked {labels[0]} word for word, without its markers.",
                 prefix=f" The passage marked {labels[0]} reads:", answers=(text,), depths=(depths[0],),
                 max_new_tokens=tokens + 16)


def _cwe_sample(length: int, index: int, corpus: Corpus, tokenizer, rng) -> RulerSample:
    """The numbered word list sized to `length`: CWE_COMMON words CWE_FREQ_COMMON times each, as many others
    CWE_FREQ_RARE times each as fit, in a random order."""
    pool = len(corpus.words)
    most = min(pool - CWE_COMMON, length // CWE_FREQ_RARE)
    if most < 1:
        raise ValueError(f"cwe needs more than {CWE_COMMON} distinct words; the essays give {pool}")
    chosen = [corpus.words[i] for i in rng.choice(pool, CWE_COMMON + most, replace=False)]
    common, rare = chosen[:CWE_COMMON], chosen[CWE_COMMON:]
    order_seed = int(rng.integers(2 ** 32))
    intro = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
             "ones that appear most often.")
    question = f"Question: What are the {CWE_COMMON} most common words in the above list?"
    prefix = f" Answer: The top {CWE_COMMON} words that appear most often in the list are:"

    def render(n_rare: int) -> str:
        words = np.array(common * CWE_FREQ_COMMON + rare[:n_rare] * CWE_FREQ_RARE)
        words = words[np.random.default_rng(order_seed).permutation(len(words))]
        listing = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
        user = intro + "\n" + listing + "\n" + question
        return tokenizer.apply_chat_template([{"role": "user", "content": user}]) + prefix

    text = render(0)
    ids = tokenizer.encode(text)
    if len(ids) > length:
        raise ValueError(f"a cwe prompt needs {len(ids)} tokens with no rare words; length={length} is too small")
    lo, hi = 0, most  # the most rare words that fit: bisection (the prompt grows with every word)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        mid_text = render(mid)
        mid_ids = tokenizer.encode(mid_text)
        if len(mid_ids) <= length:
            lo, text, ids = mid, mid_text, mid_ids
        else:
            hi = mid - 1
    return RulerSample("cwe", length, index, tuple(ids), text, tuple(common), MAX_NEW_TOKENS["cwe"], ())


_BUILDERS = {"niah_single": _niah_single, "niah_multikey_words": _niah_multikey_words,
             "niah_multikey_uuids": _niah_multikey_uuids, "niah_multivalue": _niah_multivalue,
             "niah_multiquery": _niah_multiquery, "vt": _vt, "copy_span": _copy_span}
