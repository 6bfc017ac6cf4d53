"""What each backend enforces of JSON Schema. A keyword a backend would ignore is an error, never silent."""

from __future__ import annotations

from typing import Any

# keywords that compile but are NOT enforced (xgrammar warns; outlines-core ignores silently)
IGNORED = {
    "xgrammar": {"not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
                 "uniqueItems", "contains", "minContains", "maxContains"},
    "outlines": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                 "patternProperties", "uniqueItems", "not", "if", "then", "else", "dependencies",
                 "dependentRequired", "dependentSchemas", "propertyNames", "contains", "minContains",
                 "maxContains", "unevaluatedProperties", "unevaluatedItems"},
}
# annotations with no effect on validity
_CONTAINERS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def check_supported(schema: Any, backend: str) -> None:
    """Raise ValueError naming the first keyword ``backend`` would not enforce."""
    for path, key in _keywords(schema, "$"):
        if key in IGNORED[backend]:
            raise ValueError(f"json_schema: keyword {key!r} at {path} is not enforced by the {backend} backend "
                             f"(see docs/constrained.md)")


def _keywords(node: Any, path: str):
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key
            if key in _CONTAINERS and isinstance(value, dict):  # names, not keywords
                for name, sub in value.items():
                    yield from _keywords(sub, f"{path}.{key}.{name}")
            elif key not in ("enum", "const", "default", "examples"):
                yield from _keywords(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _keywords(item, f"{path}[{i}]")
