"""ConstraintSpec: one normalized, hashable description of a constraint, whatever API it came from."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "ebnf", "choices", "structural_tag")
MAX_SPEC_BYTES = 256 * 1024


@dataclass(frozen=True)
class ConstraintSpec:
    kind: str
    value: str  # schema as JSON, regex, EBNF, JSON list of choices, structural-tag format as JSON; "" json_object

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint: unknown kind {self.kind!r} (one of {KINDS})")
        if len(self.value) > MAX_SPEC_BYTES:
            raise ValueError(f"{self.kind}: over {MAX_SPEC_BYTES} bytes")

    @classmethod
    def json_schema(cls, schema: dict | str | bool) -> ConstraintSpec:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema: not valid JSON: {e}") from e
        if not isinstance(schema, (dict, bool)):
            raise ValueError("json_schema: must be a JSON object")
        _check_depth(schema, "json_schema")
        return cls("json_schema", json.dumps(schema))  # key order kept: it is the property order

    @classmethod
    def regex(cls, pattern: str) -> ConstraintSpec:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("regex: must be a non-empty string")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"regex: invalid pattern: {e}") from e
        return cls("regex", pattern)

    @classmethod
    def choices(cls, options: list[str]) -> ConstraintSpec:
        if not options or not all(isinstance(o, str) and o for o in options):
            raise ValueError("choices: must be a non-empty list of non-empty strings")
        return cls("choices", json.dumps(list(options)))

    @classmethod
    def structural_tag(cls, fmt: dict[str, Any]) -> ConstraintSpec:
        """An xgrammar structural-tag format (tool calls, reasoning); its json_schema parts get bounded numbers."""
        if not isinstance(fmt, dict) or "type" not in fmt:
            raise ValueError("structural_tag: must be a format object with a 'type'")
        _check_depth(fmt, "structural_tag", limit=96)
        return cls("structural_tag", json.dumps(fmt))

    def choices_regex(self) -> str:
        return "(" + "|".join(re.escape(o) for o in json.loads(self.value)) + ")"

    def schema(self) -> Any:
        return json.loads(self.value)


def _check_depth(obj: Any, what: str, limit: int = 64) -> None:
    stack = [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise ValueError(f"{what}: nested deeper than {limit} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def spec_from_sampling(params: dict[str, Any], response_format: ConstraintSpec | None = None) -> ConstraintSpec | None:
    """The request's one constraint: from sampling parameters (json_schema, regex, ebnf, choices: popped) or, given,
    from OpenAI's response_format; more than one is a ValueError naming them all (the one check of it)."""
    given = {k: params.pop(k) for k in ("json_schema", "regex", "ebnf", "choices") if params.get(k) is not None}
    for k in ("json_schema", "regex", "ebnf", "choices"):
        params.pop(k, None)
    if len(given) + (response_format is not None) > 1:
        names = sorted(given) + (["response_format"] if response_format is not None else [])
        raise ValueError(f"constraint: give only one of {names}")
    if response_format is not None:
        return response_format
    if not given:
        return None
    (kind, value), = given.items()
    if kind == "json_schema":
        return ConstraintSpec.json_schema(value)
    if kind == "regex":
        return ConstraintSpec.regex(value)
    if kind == "choices":
        return ConstraintSpec.choices(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("ebnf: must be a non-empty grammar string")
    return ConstraintSpec("ebnf", value)


def check_format_name(name: Any, where: str) -> None:
    """A json_schema format's ``name``, required by OpenAI's API: 1-64 of a-z, A-Z, 0-9, _ and -."""
    if name is None:
        raise ValueError(f"{where}: required (1-64 of a-z, A-Z, 0-9, _ and -)")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError(f"{where}: must be 1-64 of a-z, A-Z, 0-9, _ and -, got {name!r}")


def spec_from_response_format(rf: dict[str, Any] | None) -> ConstraintSpec | None:
    """OpenAI response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}."""
    if not rf or rf.get("type") == "text":
        return None
    if rf.get("type") == "json_object":
        return ConstraintSpec("json_object", "")
    if rf.get("type") == "json_schema":
        js = rf.get("json_schema") or {}
        check_format_name(js.get("name"), "response_format.json_schema.name")
        if "schema" not in js:
            raise ValueError("response_format.json_schema.schema: required")
        return ConstraintSpec.json_schema(js["schema"])
    raise ValueError(f"response_format.type: unknown {rf.get('type')!r}")
