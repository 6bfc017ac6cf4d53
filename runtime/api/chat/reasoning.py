"""Reasoning markers (``<think>...</think>``): which templates can use them, and the grammar around them.

The reasoning is free text; a constraint (JSON schema, tools) applies only after the end marker, never inside
it. ``max_reasoning_tokens`` bounds the reasoning in the grammar itself: once the budget is spent the only
allowed continuation is the end marker, so the model is forced out of its reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReasoningSyntax:
    name: str
    start: str
    end: str

    def opened_by(self, prompt_text: str) -> bool:
        """Whether the prompt itself opened the reasoning (a template that starts the answer with the marker)."""
        return prompt_text.rstrip().endswith(self.start)


PARSERS = {"deepseek-r1": ReasoningSyntax("deepseek-r1", "<think>", "</think>"),
           "qwen3": ReasoningSyntax("qwen3", "<think>", "</think>")}


def reasoning_syntax(name: str | None, template: str | None) -> ReasoningSyntax | None:
    """The parser named by --reasoning-parser; ValueError naming the flag when the chat template never writes
    its markers (the split would never happen)."""
    if name in (None, "", "none"):
        return None
    if name not in PARSERS:
        raise ValueError(f"reasoning_parser: unknown {name!r} (one of {sorted(PARSERS)} or none)")
    syntax = PARSERS[name]
    if syntax.start not in (template or "") and syntax.end not in (template or ""):
        raise ValueError(f"reasoning_parser: {name!r} needs a chat template that knows {syntax.start!r} and "
                         f"{syntax.end!r}; this one does not (give --chat-template with one that does)")
    return syntax


def with_reasoning(syntax: ReasoningSyntax, opened: bool, rest: dict[str, Any] | None,
                   max_tokens: int | None) -> dict[str, Any]:
    """A structural-tag format: the reasoning (already open, or optional at the start), then ``rest`` (None:
    any text)."""
    think = {"type": "any_text"} if max_tokens is None else {"type": "any_text", "max_tokens": max_tokens}
    block = {"type": "tag", "begin": "" if opened else syntax.start, "content": think, "end": syntax.end}
    if not opened:
        block = {"type": "optional", "content": block}
    return {"type": "sequence", "elements": [block, rest or {"type": "any_text"}]}
