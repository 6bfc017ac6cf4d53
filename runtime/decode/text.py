"""Incremental detokenization that never emits broken UTF-8 or a (partial) stop string."""

from __future__ import annotations

from collections.abc import Callable


class IncrementalText:
    """Feeds output token ids and returns only the text that is final.

    Held back: a trailing U+FFFD (a multi-byte character cut between tokens) and any tail that could be the
    start of a stop string. On finish, the text is cut at the matched stop string (unless ``no_stop_trim``).
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str], no_stop_trim: bool = False) -> None:
        self.decode = decode
        self.stop = stop
        self.no_stop_trim = no_stop_trim
        self.sent = 0

    def full_text(self, ids: list[int], finished: bool, matched_stop: str | int | None = None) -> str:
        text = self.decode(ids)
        if finished and isinstance(matched_stop, str) and not self.no_stop_trim:
            idx = text.find(matched_stop)
            if idx >= 0:
                text = text[:idx]
        return text

    def delta(self, ids: list[int], finished: bool, matched_stop: str | int | None = None) -> str:
        text = self.full_text(ids, finished, matched_stop)
        end = len(text)
        if not finished:
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
            end = min(end, self._safe_end(text, end))
        out = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def _safe_end(self, text: str, end: int) -> int:
        """Hold back a suffix that is a proper prefix of some stop string: it may still complete."""
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, end), 0, -1):
                if text[end - k:end] == s[:k]:
                    hold = max(hold, k)
                    break
        return end - hold
