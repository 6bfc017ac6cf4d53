"""Chat messages -> prompt tokens, with tools, earlier tool calls and tool results rendered as the template does.

A template that renders tools itself gets them (``tools=``) and the earlier calls as structured
``tool_calls``; one that knows no tools gets a system prompt in the hermes convention, earlier calls as the
text the model wrote, and tool results as ``<tool_response>`` user turns. Either way an earlier call renders as
exactly the text that was generated for it (``ToolFormat.render``), so the radix cache covers the turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.runtime.api.chat.message_stream import Syntax
from radixlm.runtime.api.chat.reasoning import ReasoningSyntax
from radixlm.runtime.api.chat.tool_formats import ToolFormat, also_written, detect, tools_system_prompt
from radixlm.runtime.api.chat.tools import call_arguments, check_tool_results
from radixlm.runtime.api.errors import ApiError


@dataclass(frozen=True)
class ChatSyntax:
    """What the served chat template does: its tool format (and whether it renders tools) and reasoning."""

    tools: ToolFormat
    native_tools: bool
    reasoning: ReasoningSyntax | None
    also: tuple[ToolFormat, ...] = ()  # the other forms its models write calls in (tool_formats.also_written)

    @classmethod
    def of(cls, template: str | None, reasoning: ReasoningSyntax | None) -> ChatSyntax:
        fmt, native = detect(template)
        return cls(fmt, native, reasoning, also_written(template, fmt))


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    syntax: Syntax  # how to read the answer


def text_of(content: Any, where: str) -> str:
    if isinstance(content, list):
        if any(not isinstance(p, dict) or p.get("type") not in ("text", "input_text", "output_text")
               for p in content):
            raise ApiError(400, f"{where}.content: only text parts are supported", param="messages")
        return "".join(str(p.get("text", "")) for p in content)
    return content or ""


def render_messages(chat: ChatSyntax, messages: list[Any], functions: dict[str, dict]) -> list[dict[str, Any]]:
    """Pydantic chat messages -> template messages (tool calls and results in the template's terms)."""
    check_tool_results(messages)
    out: list[dict[str, Any]] = []
    if functions and not chat.native_tools:
        out.append({"role": "system", "content": tools_system_prompt(chat.tools, functions)})
    for i, m in enumerate(messages):
        content = text_of(m.content, f"messages[{i}]")
        calls = [call_arguments(c, f"messages[{i}].tool_calls[{k}]") for k, c in enumerate(m.tool_calls or [])]
        if m.role == "tool" and not chat.native_tools:
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        elif calls and chat.native_tools:
            out.append({"role": "assistant", "content": content or None, "tool_calls": [
                {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]})
        elif calls:
            out.append({"role": "assistant", "content": (content + "\n" if content else "") + chat.tools.render(calls)})
        else:
            msg = {"role": m.role, "content": content}
            if m.role == "tool":
                msg["tool_call_id"] = m.tool_call_id
            out.append(msg)
    return out


def chat_prompt(tokenizer, chat: ChatSyntax, messages: list[Any], functions: dict[str, dict],
                parse_tools: bool) -> ChatPrompt:
    """The prompt's tokens and the syntax of the answer (whether the prompt opened the reasoning)."""
    rendered = render_messages(chat, messages, functions if parse_tools else {})
    kwargs = {"tools": [{"type": "function", "function": f} for f in functions.values()]} \
        if parse_tools and functions and chat.native_tools else {}
    try:
        text = tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True, **kwargs)
    except Exception as e:  # a template's own raise_exception (roles out of order, ...)
        raise ApiError(400, f"messages: the chat template refused them: {e}", param="messages") from e
    reasoning = chat.reasoning
    syntax = Syntax(reasoning=reasoning, reasoning_opened=bool(reasoning and reasoning.opened_by(text)),
                    tools=chat.tools if parse_tools and functions else None,
                    functions=frozenset(functions) if parse_tools else frozenset(),
                    also=chat.also if parse_tools and functions else ())
    return ChatPrompt(tokenizer(text, add_special_tokens=False)["input_ids"], syntax)
