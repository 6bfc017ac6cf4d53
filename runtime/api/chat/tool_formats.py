"""How a chat template writes tool calls, and the structural tag that makes every started call valid.

A call is always the JSON object ``{"name": "<function>", "<key>": <arguments>}`` (key ``arguments`` or
``parameters``), written the way ``json.dumps`` writes it (", " and ": "), so a call the model generated and
the same call rendered back by the template are the same text (the radix cache hits on the earlier turns).
Formats differ in what surrounds the objects:

- hermes (Hermes, Qwen): ``<tool_call>\\n{...}\\n</tool_call>`` per call, calls separated by a newline;
- llama3_json (Llama 3.1+): the bare object, calls separated by ``; ``;
- mistral: ``[TOOL_CALLS][{...}, {...}]``.

Templates that know no tools get the hermes convention, explained in a system prompt (``tools_system_prompt``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolFormat:
    name: str
    trigger: str  # text that starts the tool-call section; the grammar takes over from here
    section_open: str  # before the first call ("" when each call carries its own wrapper)
    call_open: str  # before each call's object
    call_close: str  # after each call's object
    separator: str  # between two calls
    section_close: str  # after the last call
    args_key: str = "arguments"
    indent: str = ""  # "": the object on one line; else its two keys on lines of their own, so indented

    @property
    def name_open(self) -> str:
        """A call's object up to its name's value (without the quote that opens it)."""
        return "{" + (f"\n{self.indent}" if self.indent else "") + '"name": '

    def object_open(self, name: str) -> str:
        """A call's object up to its arguments' value."""
        between = f",\n{self.indent}" if self.indent else ", "
        return self.name_open + json.dumps(name) + between + '"' + self.args_key + '": '

    @property
    def object_close(self) -> str:
        return "\n}" if self.indent else "}"

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """Calls as the model writes them (what the template renders an assistant's tool_calls as)."""
        objs = [self.call_open + self.object_open(n) + json.dumps(a) + self.object_close + self.call_close
                for n, a in calls]
        return self.section_open + self.separator.join(objs) + self.section_close


HERMES = ToolFormat("hermes", "<tool_call>", "", "<tool_call>\n", "\n</tool_call>", "\n", "")
LLAMA3_JSON = ToolFormat("llama3_json", '{"name": ', "", "", "", "; ", "", args_key="parameters")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "[TOOL_CALLS][", "", "", ", ", "]")
FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL)}
# What Qwen2.5 (Coder) models write in `auto` instead of their template's <tool_call>: the call's object alone, or
# in a ```json fence, on one line or with its keys on lines of their own (indented by two). Read as calls only
# when the object names one of the request's functions.
JSON_FENCE = ToolFormat("json_fence", "```json\n", "", "```json\n", "\n```", "\n", "")
JSON_FENCE_LINES = ToolFormat("json_fence_lines", "```json\n", "", "```json\n", "\n```", "\n", "", indent="  ")
JSON_OBJECT = ToolFormat("json_object", '{"name": ', "", "", "", "\n", "")
JSON_OBJECT_LINES = ToolFormat("json_object_lines", '{\n  "name": ', "", "", "", "\n", "", indent="  ")
QWEN_FORMS = (JSON_FENCE, JSON_FENCE_LINES, JSON_OBJECT, JSON_OBJECT_LINES)


def also_written(template: str | None, fmt: ToolFormat) -> tuple[ToolFormat, ...]:
    """The other forms a model of this template writes calls in, beside ``fmt``: a Qwen2.5 template's (hermes tags
    in ChatML) models also write the bare object or a ```json fence."""
    return QWEN_FORMS if fmt is HERMES and "<|im_start|>" in (template or "") else ()


def detect(template: str | None) -> tuple[ToolFormat, bool]:
    """(the template's tool format, whether the template renders tools itself)."""
    t = template or ""
    native = "tools" in t and ("tool_calls" in t or "tool_call" in t)
    if "[TOOL_CALLS]" in t:
        return MISTRAL, native
    if "<tool_call>" in t:
        return HERMES, native
    if "<|python_tag|>" in t or ('"parameters"' in t and "<|eot_id|>" in t):
        return LLAMA3_JSON, native
    return HERMES, False


def _call_tags(fmt: ToolFormat, functions: dict[str, dict], wrapped: bool) -> list[dict[str, Any]]:
    """One tag per function: its object's opening, its parameters' schema, the object's close."""
    return [{"type": "tag", "begin": (fmt.call_open if wrapped else "") + fmt.object_open(name),
             "content": {"type": "json_schema", "json_schema": fn.get("parameters") or {"type": "object"}},
             "end": fmt.object_close + (fmt.call_close if wrapped else "")} for name, fn in functions.items()]


def structural_format(fmt: ToolFormat, functions: dict[str, dict], required: bool, parallel: bool,
                      also: tuple[ToolFormat, ...] = ()) -> dict:
    """xgrammar structural-tag format for the calls.

    required: only calls (at least one); otherwise free text until the trigger, then a call that must
    complete and validate. parallel False: at most one call. ``also`` (auto only): the object forms the model
    writes besides its template's, triggered by an object's opening up to a function's name (never by JSON that
    names none: that stays free text), then held to that function's schema; a fence around it is free text.
    """
    if fmt.section_open:  # one section holding a list of calls
        calls = {"type": "tags_with_separator", "tags": _call_tags(fmt, functions, False),
                 "separator": fmt.separator, "at_least_one": True, "stop_after_first": not parallel}
        section = {"type": "tag", "begin": fmt.section_open, "content": calls, "end": fmt.section_close}
        if required:
            return section
        return {"type": "triggered_tags", "triggers": [fmt.trigger], "tags": [section], "at_least_one": False,
                "stop_after_first": True}
    tags = _call_tags(fmt, functions, True)
    if required:
        return {"type": "tags_with_separator", "tags": tags, "separator": fmt.separator, "at_least_one": True,
                "stop_after_first": not parallel}
    triggers = [fmt.trigger]
    for obj in (o for o in (JSON_OBJECT, JSON_OBJECT_LINES) if o in also):  # a fence's opening stays free text
        tags += _call_tags(obj, functions, True)
        triggers += [obj.name_open + json.dumps(name) for name in functions]
    return {"type": "triggered_tags", "triggers": triggers, "tags": tags, "at_least_one": False,
            "stop_after_first": not parallel}


def tools_system_prompt(fmt: ToolFormat, functions: dict[str, dict]) -> str:
    """For templates that know no tools: the functions and how to call them."""
    listing = "\n".join(json.dumps({"name": n, "description": f.get("description", ""),
                                    "parameters": f.get("parameters", {})}) for n, f in functions.items())
    example = fmt.render([("<function name>", {"<argument>": "<value>"})])
    return ("You can call these functions:\n" + listing + "\nTo call a function, write:\n" + example +
            "\nOtherwise answer in plain text.")
