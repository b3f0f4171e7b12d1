"""SentencePiece BPE as llama.cpp's `llm_tokenizer_spm` runs it, written directly (a reference for
`models.tokenizer._spm_backend`), and a small SentencePiece-style vocabulary trained here.
"""

from __future__ import annotations

import collections

from models.tokenizer import BYTE, CONTROL, NORMAL, SPACE, UNKNOWN  # llama.cpp's token types, U+2581


def train_vocab(corpus: str, merges: int = 120) -> tuple[list[str], list[float], list[int]]:
    """tokens, scores, types: <unk>, <s>, </s>, the 256 byte tokens, the corpus's characters, then `merges`
    tokens from greedy pair merging over the whole normalized corpus (scores falling with merge order)."""
    text = SPACE + corpus.replace(" ", SPACE)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for i, ch in enumerate(sorted(set(text))):
        tokens.append(ch)
        types.append(NORMAL)
        scores.append(-1000.0 - i)
    symbols = list(text)
    for n in range(merges):
        pairs = collections.Counter(zip(symbols, symbols[1:]))
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if a + b in tokens:
            break
        tokens.append(a + b)
        types.append(NORMAL)
        scores.append(-float(n))
        out, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
                out.append(a + b)
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out
    return tokens, scores, types


def encode(text: str, tokens: list[str], scores: list[float], types: list[int]) -> list[int]:
    """Token ids: spaces -> U+2581 with one prepended; merge the adjacent pair whose concatenation is the
    NORMAL token of highest score (leftmost on ties) until none is left; pieces outside the vocabulary as
    their UTF-8 bytes."""
    if not text:
        return []
    normal = {t: i for i, t in enumerate(tokens) if types[i] == NORMAL}
    byte_ids = {t: i for i, t in enumerate(tokens) if types[i] == BYTE}
    symbols = list(SPACE + text.replace(" ", SPACE))
    while True:
        best, best_score = None, None
        for i in range(len(symbols) - 1):
            j = normal.get(symbols[i] + symbols[i + 1])
            if j is not None and (best_score is None or scores[j] > best_score):
                best, best_score = i, scores[j]
        if best is None:
            break
        symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
    ids = []
    for s in symbols:
        if s in normal:
            ids.append(normal[s])
        else:
            ids += [byte_ids[f"<0x{b:02X}>"] for b in s.encode()]
    return ids
