"""A Responses request in chat terms: input items -> chat messages, flat tools -> chat tools, text.format -> a
constraint; a continued conversation's earlier turns come first. Whatever cannot be honoured (background
responses, built-in tools, ...) is a 400 naming it."""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.spec import ConstraintSpec, check_format_name, spec_from_response_format
from radixlm.runtime.api.errors import ApiError
from radixlm.runtime.api.openai_api.protocol import ChatMessage, ResponsesRequest


def check_unsupported(req: ResponsesRequest) -> None:
    if req.background:
        raise ApiError(400, "background: not supported", param="background")
    if req.include:
        raise ApiError(400, f"include: not supported ({req.include})", param="include")
    if req.truncation not in (None, "disabled"):
        raise ApiError(400, "truncation: only 'disabled' (a prompt over the context is a 400)", param="truncation")
    for field, allowed in (("text", {"format"}), ("reasoning", {"effort", "summary"})):
        extra = sorted(set(getattr(req, field) or {}) - allowed)
        if extra:
            raise ApiError(400, f"{field}.{extra[0]}: not supported", param=field)


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function tools -> chat's nested ones."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else t
            raise ApiError(400, f"tools[{i}].type: only 'function' tools are supported, got {kind!r}", param="tools")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                     if k in t}})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def text_spec(text: dict[str, Any] | None) -> ConstraintSpec | None:
    fmt = (text or {}).get("format")
    if not fmt:
        return None
    if not isinstance(fmt, dict):
        raise ApiError(400, "text.format must be an object", param="text")
    try:
        if fmt.get("type") == "json_schema":
            check_format_name(fmt.get("name"), "text.format.name")
            if "schema" not in fmt:
                raise ValueError("text.format.schema: required")
            return ConstraintSpec.json_schema(fmt["schema"])
        return spec_from_response_format(fmt)
    except ValueError as e:
        raise ApiError(400, str(e).replace("response_format", "text.format"), param="text") from e


def chat_messages(req: ResponsesRequest, items: list[dict[str, Any]]) -> list[ChatMessage]:
    """instructions and input items (the earlier turns' and this request's) -> chat messages (consecutive
    function calls make one assistant turn)."""
    out = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            out.append(_message(item, i))
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if out and out[-1].role == "assistant" and out[-1].tool_calls:
                out[-1].tool_calls.append(call)
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif kind == "function_call_output":
            output = item.get("output")
            out.append(ChatMessage(role="tool", tool_call_id=item.get("call_id"),
                                   content=output if isinstance(output, str) else json.dumps(output)))
        elif kind != "reasoning":  # earlier reasoning is not shown to the model again
            raise ApiError(400, f"input[{i}].type: unsupported input item {kind!r}", param="input")
    if not out:
        raise ApiError(400, "input: no messages", param="input")
    return out


def _message(item: dict[str, Any], i: int) -> ChatMessage:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise ApiError(400, f"input[{i}].role: must be user, system, developer or assistant, got {role!r}",
                       param="input")
    content = item.get("content")
    if isinstance(content, list):
        bad = [p.get("type") for p in content if not isinstance(p, dict) or
               p.get("type") not in ("input_text", "output_text", "text")]
        if bad:
            raise ApiError(400, f"input[{i}].content: only text parts are supported, got {bad[0]!r}", param="input")
    return ChatMessage(role=role, content=content)
