"""Turning a sequence's tokens into text as they come, and cutting it at a stop string.

Decoding token by token breaks characters a tokenizer splits over several tokens (byte-level BPE)
and drops the spaces some tokenizers add only between tokens. `IncrementalDecoder` decodes a short
window of recent tokens and emits what it adds once the text no longer ends in a partial character
(the method of Hugging Face's text-generation-inference). `StopMatcher` holds back any tail that
could still become a stop string, and cuts the text before the first one found (OpenAI's rule:
the stop string itself is not returned).
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """The text that each new token adds to a sequence's output."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # tokens whose text has already been emitted

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        """Append a token; return the new text (empty while a character is incomplete)."""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever text is still held back (an incomplete character at the end)."""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]


class StopMatcher:
    """Emits text up to the first stop string, holding back tails that may begin one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Text safe to emit now; sets ``stopped`` when a stop string appeared."""
        if not self._stops:
            return text
        if self.stopped:
            return ""
        pending = self._held + text
        cut = min((i for s in self._stops if (i := pending.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return pending[:cut]
        keep = max((self._overlap(pending, s) for s in self._stops), default=0)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """The held-back tail, when the sequence ends for another reason."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    @staticmethod
    def _overlap(text: str, stop: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
        for n in range(min(len(text), len(stop) - 1), 0, -1):
            if text.endswith(stop[:n]):
                return n
        return 0
