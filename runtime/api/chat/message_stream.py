"""One streaming state machine for an assistant's text: reasoning, content and tool calls, as OpenAI deltas.

``parse`` reads the whole text so far into a ``View`` (reasoning, content, calls); ``MessageStream`` sends
what each new view adds. Invariants (a hypothesis test checks them): every view's reasoning and content are
prefixes of the next view's, calls are only appended and a call's arguments only grow, so the deltas add up to
the final view whatever the text's chunking (one character at a time, token by token or whole). To keep them,
a view holds back text that may still turn out to be a marker: a tail that starts the reasoning's end marker
or the tool trigger, a call whose opening is not complete, trailing whitespace. Stop strings are cut before
this (``runtime.decode.text.IncrementalText`` holds back a tail that may start one, and cuts the match).

A call is ``{"name": "<function>", "<args key>": <value>}`` in the template's format (``tool_formats``); the
arguments' text streams as generated, ending with the value's own closing bracket.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.api.chat.reasoning import ReasoningSyntax
from radixlm.runtime.api.chat.tool_formats import ToolFormat

WS = " \t\n\r"


@dataclass(frozen=True)
class Syntax:
    """What the text may hold: reasoning (already opened by the prompt or not) and tool calls."""

    reasoning: ReasoningSyntax | None = None
    reasoning_opened: bool = False
    tools: ToolFormat | None = None
    functions: frozenset[str] = frozenset()
    also: tuple[ToolFormat, ...] = ()  # other forms of a call, read beside the template's (tool_formats.JSON_*)

    @property
    def formats(self) -> tuple[ToolFormat, ...]:
        """Every form a call may take here, the template's first (it wins a tie)."""
        return (self.tools, *self.also) if self.tools else ()


@dataclass
class Call:
    name: str
    arguments: str
    done: bool


@dataclass
class View:
    reasoning: str | None = None
    content: str = ""
    calls: list[Call] = field(default_factory=list)


def held(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def parse(text: str, finished: bool, syntax: Syntax) -> View:
    view = View()
    pos = 0
    if syntax.reasoning is not None:
        pos = _reasoning(text, finished, syntax, view)
        if pos < 0:
            return view
    _content(text, pos, finished, syntax, view)
    return view


def _reasoning(text: str, finished: bool, syntax: Syntax, view: View) -> int:
    """Fill view.reasoning; return where the answer starts, or -1 if the text so far is all reasoning."""
    r = syntax.reasoning
    start = 0
    if not syntax.reasoning_opened:
        lead = len(text) - len(text.lstrip(WS))
        rest = text[lead:]
        if not rest.startswith(r.start):
            if not finished and r.start.startswith(rest):
                return -1  # may still open the reasoning
            return 0
        start = lead + len(r.start)
    end = text.find(r.end, start)
    if end < 0:
        body = text[start:] if finished else text[start:len(text) - held(text[start:], r.end)]
        view.reasoning = body.lstrip(WS)
        return -1
    view.reasoning = text[start:end].lstrip(WS)
    after = end + len(r.end)
    return after + len(text[after:]) - len(text[after:].lstrip(WS))


def _content(text: str, pos: int, finished: bool, syntax: Syntax, view: View) -> None:
    formats = syntax.formats
    parts: list[str] = []
    while True:
        found = [(text.find(f.trigger, pos), f) for f in formats if f.trigger in text[pos:]]
        if not found:
            tail = text[pos:]
            hold = 0 if finished else max((held(tail, f.trigger) for f in formats), default=0)
            parts.append(tail[:len(tail) - hold])
            break
        t = min(at for at, _ in found)
        parts.append(text[pos:t])
        state, end = _first_section(text, t, finished, syntax, view.calls, [f for at, f in found if at == t])
        if state == "partial":
            break
        if state == "no":  # the trigger was plain text: one character of it, the rest scanned again
            parts.append(text[t])
            end = t + 1
        pos = end
    content = "".join(parts)
    view.content = content.rstrip(WS) if not finished or view.calls else content


def _first_section(text: str, i: int, finished: bool, syntax: Syntax, calls: list[Call],
                   forms: list[ToolFormat]) -> tuple[str, int]:
    """Calls from index i in the first of ``forms`` (each's trigger at i) that may hold them: ("done", end) |
    ("partial", 0) one may still, or does and the text ends inside it | ("no", 0) none does."""
    for fmt in forms:
        state, end = _section(text, i, finished, syntax, calls, fmt)
        if state != "no":
            return state, end
    return "no", 0


def _section(text: str, i: int, finished: bool, syntax: Syntax, calls: list[Call],
             fmt: ToolFormat) -> tuple[str, int]:
    """Calls of form ``fmt`` from index i (where its trigger is): ("done", end) | ("partial", 0) | ("no", 0)."""
    first = len(calls)
    if fmt.section_open:
        state, i = _literal(text, i, fmt.section_open)
        if state != "match":
            return _unmatched(state, finished, calls, first)
    while True:
        state, i = _one_call(text, i, syntax, calls, fmt)
        if state != "match":
            return _unmatched(state, finished, calls, first)
        # another call: the separator, then (when each call carries its own wrapper) that call's opening
        following = fmt.separator + ("" if fmt.section_open else fmt.call_open or fmt.trigger)
        rest = text[i:]
        if rest.startswith(following):
            i += len(fmt.separator)
            continue
        if rest and following.startswith(rest) and not finished:
            return "partial", 0
        if fmt.section_close:
            state, end = _literal(text, i, fmt.section_close)
            if state == "prefix" and not finished:
                return "partial", 0
            i = end if state == "match" else i
        return "done", i


def _unmatched(state: str, finished: bool, calls: list[Call], first: int) -> tuple[str, int]:
    if state == "prefix" and not finished:
        return "partial", 0
    if len(calls) > first or state == "partial":
        return "partial", 0  # a call started: the text is its own, cut short
    return "no", 0


def _one_call(text: str, i: int, syntax: Syntax, calls: list[Call], fmt: ToolFormat) -> tuple[str, int]:
    """One call at i: ("match", end) | ("prefix", 0) the opening may still come | ("no", 0) |
    ("partial", 0) the call started and the text ends inside it."""
    state, j = _literal(text, i, fmt.call_open + fmt.name_open + '"')
    if state != "match":
        return state, 0
    close = text.find('"', j)
    if close < 0:
        return ("no", 0) if "\\" in text[j:] else ("prefix", 0)
    name = text[j:close]
    state, j = _literal(text, close, '"' + fmt.object_open(name)[len(fmt.name_open) + len(json.dumps(name)):])
    if name not in syntax.functions:
        return "no", 0
    if state != "match":
        return state, 0
    end = value_end(text, j)
    if end is None:
        calls.append(Call(name, text[j:], False))
        return "partial", 0
    call = Call(name, text[j:end], False)
    calls.append(call)
    state, k = _literal(text, end, fmt.object_close + fmt.call_close)
    if state != "match":
        return "partial", 0
    call.done = True
    return "match", k


def _literal(text: str, i: int, lit: str) -> tuple[str, int]:
    got = text[i:i + len(lit)]
    if got == lit:
        return "match", i + len(lit)
    return ("prefix", 0) if lit.startswith(got) else ("no", 0)


def value_end(text: str, i: int) -> int | None:
    """End of the JSON value starting at i, or None if the text ends inside it."""
    depth, in_str, esc = 0, False, False
    for k in range(i, len(text)):
        ch = text[k]
        if in_str:
            esc, in_str = (False, True) if esc else (ch == "\\", ch != '"')
            if not in_str and depth == 0:
                return k + 1
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]" or (ch == "," and depth == 0):
            if depth == 0:
                return k
            depth -= 1
            if depth == 0:
                return k + 1
    return None


class MessageStream:
    """Feed text deltas; get OpenAI chat delta dicts. ``message()`` is the final message."""

    def __init__(self, syntax: Syntax, call_id: str) -> None:
        self.syntax, self.call_id = syntax, call_id
        self.text = ""
        self.view = View()
        self.sent_reasoning = self.sent_content = 0
        self.sent_args: list[int] = []

    def feed(self, delta: str, finished: bool = False) -> list[dict[str, Any]]:
        self.text += delta
        view = parse(self.text, finished, self.syntax)
        out: list[dict[str, Any]] = []
        if view.reasoning and len(view.reasoning) > self.sent_reasoning:
            out.append({"reasoning_content": view.reasoning[self.sent_reasoning:]})
            self.sent_reasoning = len(view.reasoning)
        if len(view.content) > self.sent_content:
            out.append({"content": view.content[self.sent_content:]})
            self.sent_content = len(view.content)
        for k, call in enumerate(view.calls):
            if k == len(self.sent_args):
                out.append({"tool_calls": [{"index": k, "id": self.id(k), "type": "function",
                                            "function": {"name": call.name, "arguments": ""}}]})
                self.sent_args.append(0)
            if len(call.arguments) > self.sent_args[k]:
                out.append({"tool_calls": [{"index": k, "function": {
                    "arguments": call.arguments[self.sent_args[k]:]}}]})
                self.sent_args[k] = len(call.arguments)
        self.view = view
        return out

    def id(self, k: int) -> str:
        return f"{self.call_id}_{k}"

    def tool_calls_done(self) -> bool:
        """Whether the text ended with every call it started complete (finish_reason "tool_calls")."""
        return bool(self.view.calls) and all(c.done for c in self.view.calls)

    def message(self) -> dict[str, Any]:
        """The final message, after the last feed(..., finished=True): exactly what the deltas add up to."""
        v = self.view
        msg: dict[str, Any] = {"content": v.content if v.content or not v.calls else None}
        if self.syntax.reasoning is not None:
            msg["reasoning_content"] = v.reasoning
        if v.calls:
            msg["tool_calls"] = [{"id": self.id(k), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for k, c in enumerate(v.calls)]
        return msg
