"""OpenAI tools: a system prompt that lists them, a JSON-schema constraint for tool_choice required or
named (so the arguments always validate), and parsing the output back into tool_calls."""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.spec import ConstraintSpec
from radixlm.runtime.api.serving import ApiError


def tool_functions(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    out = {}
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name', ...}}}}",
                           param="tools")
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


def call_schema(functions: dict[str, dict]) -> ConstraintSpec:
    branches = [{"type": "object", "properties": {"name": {"const": name},
                                                  "arguments": fn.get("parameters") or {"type": "object"}},
                 "required": ["name", "arguments"]} for name, fn in functions.items()]
    return ConstraintSpec.json_schema(branches[0] if len(branches) == 1 else {"anyOf": branches})


def tools_system_prompt(functions: dict[str, dict]) -> str:
    listing = "\n".join(json.dumps({"name": n, "description": f.get("description", ""),
                                    "parameters": f.get("parameters", {})}) for n, f in functions.items())
    return ("You can call these functions:\n" + listing + "\nTo call one, answer with only a JSON object "
            '{"name": <function name>, "arguments": <arguments object>}.')
