"""OpenAI tools: checking them and the messages that refer to them, and the grammar of an answer (tool calls
for tool_choice auto, required or named; a response_format; either after the reasoning)."""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.constrained.spec import ConstraintSpec
from radixlm.runtime.api.chat.message_stream import Syntax
from radixlm.runtime.api.chat.reasoning import with_reasoning
from radixlm.runtime.api.chat.tool_formats import structural_format
from radixlm.runtime.api.errors import ApiError

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


def tool_functions(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    out = {}
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name', ...}}}}",
                           param="tools")
        if not NAME.match(fn["name"]) or fn["name"] in out:
            raise ApiError(400, f"tools[{i}].function.name must be unique, 1-64 of a-z, A-Z, 0-9, _ and -, got "
                                f"{fn['name']!r}", param="tools")
        check_parameters(fn.get("parameters"), f"tools[{i}].function.parameters")
        out[fn["name"]] = fn
    return out


def check_parameters(schema: Any, where: str) -> None:
    """A function's parameters must be a JSON schema of an object (absent: any object); 400 naming it."""
    if schema is None:
        return
    ok = isinstance(schema, dict) and schema.get("type", "object") == "object" and \
        isinstance(schema.get("properties", {}), dict) and all(isinstance(v, (dict, bool)) for v in
                                                               schema.get("properties", {}).values()) and \
        isinstance(schema.get("required", []), list)
    if not ok:
        raise ApiError(400, f"{where} must be a JSON schema of an object (type 'object', properties a map of "
                            "schemas, required a list)", param="tools")
    try:
        ConstraintSpec.json_schema(schema)
    except ValueError as e:
        raise ApiError(400, f"{where}: {e}", param="tools") from e


def call_arguments(call: Any, where: str) -> tuple[str | None, dict[str, Any]]:
    """An earlier assistant tool call from the messages -> (name, arguments); 400 if its arguments are not a
    JSON object."""
    fn = (call or {}).get("function") or {} if isinstance(call, dict) else {}
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except (TypeError, json.JSONDecodeError):
        args = None
    if not isinstance(args, dict):
        raise ApiError(400, f"{where}.function.arguments must be a JSON object in a string", param="messages")
    return fn.get("name"), args


def check_tool_results(messages: list[Any]) -> None:
    """Every role 'tool' message answers a call an earlier assistant message made (by tool_call_id)."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        calls.update(c.get("id") for c in (m.tool_calls or []) if isinstance(c, dict) and c.get("id"))
        if m.role == "tool" and m.tool_call_id not in calls:
            raise ApiError(400, f"messages[{i}]: a 'tool' message needs the tool_call_id of an earlier assistant "
                                f"tool call, got {m.tool_call_id!r}", param="messages")


def chosen_functions(functions: dict[str, dict], tool_choice: Any) -> dict[str, dict] | None:
    """Functions the output must call (None: free text allowed)."""
    if not functions or tool_choice in (None, "auto", "none"):
        return None
    if tool_choice == "required":
        return functions
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in functions:
            raise ApiError(400, f"tool_choice names an unknown function {name!r}", param="tool_choice")
        return {name: functions[name]}
    raise ApiError(400, "tool_choice must be 'none', 'auto', 'required' or a named function", param="tool_choice")


def spec_format(spec: ConstraintSpec) -> dict[str, Any]:
    """A constraint as a structural-tag format (to follow the reasoning)."""
    if spec.kind == "json_schema":
        return {"type": "json_schema", "json_schema": spec.schema()}
    if spec.kind == "json_object":
        return {"type": "json_schema", "json_schema": {"type": "object", "additionalProperties": True}}
    if spec.kind == "regex":
        return {"type": "regex", "pattern": spec.value}
    if spec.kind == "choices":
        return {"type": "regex", "pattern": spec.choices_regex()}
    if spec.kind == "ebnf":
        return {"type": "grammar", "grammar": spec.value}
    return spec.schema()


def chat_constraint(syntax: Syntax, functions: dict[str, dict], tool_choice: Any, parallel: bool,
                    spec: ConstraintSpec | None, max_reasoning_tokens: int | None) -> ConstraintSpec | None:
    """The answer's grammar: tool calls (auto: free text until the trigger; required / named: only calls) or
    ``spec``, after the reasoning when there is one."""
    forced = chosen_functions(functions, tool_choice)
    rest: dict[str, Any] | None = None
    if syntax.tools is not None:
        named = isinstance(tool_choice, dict)  # a named function is called once, as OpenAI does
        rest = structural_format(syntax.tools, forced or functions, forced is not None, parallel and not named,
                                 syntax.also if forced is None else ())
    elif spec is not None:
        if syntax.reasoning is None:
            return spec
        rest = spec_format(spec)
    if syntax.reasoning is not None and (rest is not None or max_reasoning_tokens is not None):
        rest = with_reasoning(syntax.reasoning, syntax.reasoning_opened, rest, max_reasoning_tokens)
    return None if rest is None else ConstraintSpec.structural_tag(rest)
