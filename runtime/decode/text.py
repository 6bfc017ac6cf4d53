"""Incremental detokenization that never emits broken UTF-8 or a (partial) stop string."""

from __future__ import annotations

import functools
from collections.abc import Callable

from radixlm.runtime.model.tokenizer_files import backend_decoder


def ids_to_text(tokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``tokenizer.decode`` for a list of ids: in the Rust backend directly where that is all transformers'
    decode does (backend_decoder), without its per-call argument handling (most of a streamed token's
    detokenizing time)."""
    backend = backend_decoder(tokenizer)
    decode = backend.decode if backend is not None else tokenizer.decode
    return functools.partial(decode, skip_special_tokens=skip_special_tokens)


class IncrementalText:
    """Feeds output token ids and returns only the text that is final.

    Held back: a trailing U+FFFD (a multi-byte character cut between tokens) and any tail that could be the
    start of a stop string. On finish, the text is cut at the matched stop string (unless ``no_stop_trim``).

    ``delta`` decodes a short window, not every id again (which made a stream's detokenizing quadratic in
    its length): ids[prefix:read] are the last ids whose text was taken, decoded again as context for the
    new ones so that tokenizers which drop a leading space or join bytes across tokens decode them as in
    the whole sequence; the new text is decode(ids[prefix:]) past decode(ids[prefix:read]). ``ids`` only
    grows between calls (the ids before ``read`` never change).
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str], no_stop_trim: bool = False) -> None:
        self.decode = decode
        self.stop = stop
        self.no_stop_trim = no_stop_trim
        self.sent = 0  # characters of the text returned so far
        self.text = ""  # the text of ids[:read]
        self.prefix = self.read = 0
        self.window = ""  # decode(ids[prefix:read])

    def full_text(self, ids: list[int], finished: bool, matched_stop: str | int | None = None) -> str:
        return self._cut(self.decode(ids), finished, matched_stop)

    def _cut(self, text: str, finished: bool, matched_stop: str | int | None) -> str:
        if finished and isinstance(matched_stop, str) and not self.no_stop_trim:
            idx = text.find(matched_stop)
            if idx >= 0:
                text = text[:idx]
        return text

    def _advance(self, ids: list[int], finished: bool) -> None:
        """Take the text of ids[read:] unless it ends in a cut character (and the request goes on)."""
        if len(ids) <= self.read:
            return
        new = self.decode(ids[self.prefix:])
        if new.endswith("\ufffd") and not finished:
            return
        if new.startswith(self.window):
            self.text += new[len(self.window):]
        else:  # the window decodes differently with more ids after it: decode them all
            self.text = self.decode(ids)
        self.prefix, self.read = self.read, len(ids)
        self.window = self.decode(ids[self.prefix:self.read])

    def delta(self, ids: list[int], finished: bool, matched_stop: str | int | None = None) -> str:
        self._advance(ids, finished)
        text = self._cut(self.text, finished, matched_stop)
        end = len(text) if finished else self._safe_end(text, len(text))
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
