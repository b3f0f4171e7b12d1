"""A request's text as its tokens arrive: the new text per step, cut at a stop string."""

from __future__ import annotations


class TextStream:
    """Decodes a growing list of token ids into text deltas.

    tokenizer: has decode(ids) -> str (special tokens skipped); stop: strings that end the text (not included).
    `add(ids)` returns (the new text, whether a stop string appeared). Text is held back while it ends in an
    incomplete character (U+FFFD: a multi-byte character split over tokens) or in the start of a stop string,
    so no delta ever shows text that a stop string later removes; `finish()` releases what is held back.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""  # the text so far, cut at a stop string once one appeared
        self.shown = 0  # characters of self.text already returned
        self.stopped = False

    def add(self, ids: list[int]) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        self.ids += ids
        self.text = self.tokenizer.decode(self.ids)
        at = min((i for i in (self.text.find(s) for s in self.stop) if i >= 0), default=-1)
        if at >= 0:
            self.text, self.stopped = self.text[:at], True
            return self._release(len(self.text)), True
        return self._release(len(self.text) - self._held_back()), False

    def finish(self) -> str:
        """The text still held back (the request ended)."""
        return self._release(len(self.text))

    def _held_back(self) -> int:
        """Characters at the end of the text not to show yet."""
        text = self.text
        if text.endswith("\ufffd"):
            return len(text) - len(text.rstrip("\ufffd"))
        return max((n for s in self.stop for n in range(len(s) - 1, 0, -1) if text.endswith(s[:n])), default=0)

    def _release(self, upto: int) -> str:
        upto = max(upto, self.shown)
        delta, self.shown = self.text[self.shown:upto], upto
        return delta
