"""An assistant's text as OpenAI chat deltas: plain content, or a tool call whose arguments stream as generated.

A call is the text ``{"name": "<function>", "arguments": {...}}`` (what the tools system prompt asks for and
the tool_choice grammar enforces). ``ToolCallStream`` reads the text as it grows: while it can still become a
call it holds it back; once it cannot (or names an unknown function, or its arguments do not start an
object) everything so far goes out as content. In a call, the first delta carries index, id, type and name;
then the arguments' text goes out as it arrives, less any trailing ``}`` and whitespace (the outer object's
``}`` must never be sent). Fed the whole text at once it gives the same final message as fed piece by piece.
"""

from __future__ import annotations

import json
from typing import Any

WS = " \t\n\r"
# the call's opening, as (literal, then optional whitespace); "<name>" is a JSON string without escapes
OPENING = ("{", '"name"', ":", "<name>", ",", '"arguments"', ":")


def match_opening(text: str) -> tuple[str, str | None, int]:
    """("match", name, index where the arguments start) | ("prefix", None, 0) | ("no", None, 0)."""
    i, name = 0, None
    for part in OPENING:
        while i < len(text) and text[i] in WS:
            i += 1
        if i == len(text):
            return "prefix", None, 0
        if part == "<name>":
            if text[i] != '"':
                return "no", None, 0
            end = text.find('"', i + 1)
            if end < 0:
                return ("no", None, 0) if "\\" in text[i + 1:] else ("prefix", None, 0)
            name, i = text[i + 1:end], end + 1
            if "\\" in name:
                return "no", None, 0
            continue
        got = text[i:i + len(part)]
        if not part.startswith(got):
            return "no", None, 0
        if len(got) < len(part):
            return "prefix", None, 0
        i += len(part)
    while i < len(text) and text[i] in WS:
        i += 1
    return "match", name, i


class ToolCallStream:
    """Feed text deltas; get lists of OpenAI delta dicts ({"content": ...} or {"tool_calls": [...]})."""

    def __init__(self, functions: dict[str, dict], call_id: str) -> None:
        self.functions, self.call_id = functions, call_id
        self.text = ""
        self.mode: str | None = None  # None: undecided, "content", "call"
        self.sent = 0  # content: characters sent; call: characters of the arguments sent
        self.args_at = 0
        self.name: str | None = None

    def feed(self, delta: str, finished: bool = False) -> list[dict[str, Any]]:
        self.text += delta
        out: list[dict[str, Any]] = []
        if self.mode is None:
            self._decide(out, finished)
        if self.mode == "content":
            if len(self.text) > self.sent:
                out.append({"content": self.text[self.sent:]})
                self.sent = len(self.text)
        elif self.mode == "call":
            args = self.text[self.args_at:]
            upto = len(self._final_args(args)) if finished else len(args.rstrip(WS + "}"))
            if upto > self.sent:
                out.append({"tool_calls": [{"index": 0, "function": {"arguments": args[self.sent:upto]}}]})
                self.sent = upto
        return out

    def _decide(self, out: list, finished: bool) -> None:
        if not self.functions:
            self.mode = "content"
            return
        state, name, at = match_opening(self.text)
        if state == "match" and name in self.functions and at < len(self.text):
            if self.text[at] != "{":
                self.mode = "content"
                return
            self.mode, self.name, self.args_at = "call", name, at
            out.append({"tool_calls": [{"index": 0, "id": self.call_id, "type": "function",
                                        "function": {"name": name, "arguments": ""}}]})
        elif state == "no" or finished or (state == "match" and name not in self.functions):
            self.mode = "content"

    @staticmethod
    def _final_args(args: str) -> str:
        """The arguments' text once the call ended: without the outer object's closing brace."""
        body = args.rstrip(WS)
        return body[:-1].rstrip(WS) if body.endswith("}") else body

    def complete(self) -> bool:
        """Whether the text is one whole call (its arguments parse as an object and the call is closed)."""
        if self.mode != "call":
            return False
        try:
            args = json.loads(self._final_args(self.text[self.args_at:]))
        except json.JSONDecodeError:
            return False
        return isinstance(args, dict) and self.text.rstrip(WS).endswith("}")

    def result(self) -> dict[str, Any]:
        """The final message, after the last feed(..., finished=True), exactly what the deltas add up to: a
        call (its arguments cut short if the text was; ``complete`` says) or the text as content."""
        if self.mode == "call":
            args = self._final_args(self.text[self.args_at:])
            return {"content": None, "tool_calls": [{"id": self.call_id, "type": "function",
                                                     "function": {"name": self.name, "arguments": args}}]}
        return {"content": self.text}
