"""The frontend's expressions: what ``s += ...`` appends. Frozen and cheap; execution is elsewhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Expr:
    def __add__(self, other: Any) -> Concat:
        return Concat([self, as_expr(other)])

    def __radd__(self, other: Any) -> Concat:
        return Concat([as_expr(other), self])


@dataclass(frozen=True)
class Text(Expr):
    text: str


@dataclass(frozen=True)
class Gen(Expr):
    name: str | None
    params: dict[str, Any] = field(default_factory=dict)  # sampling params, incl. regex / json_schema / choices


@dataclass(frozen=True)
class Select(Expr):
    name: str | None
    choices: tuple[str, ...]
    temperature: float = 0.0
    choices_method: str = "token_length_normalized"


@dataclass(frozen=True)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True)
class Concat(Expr):
    parts: list[Expr]

    def __add__(self, other: Any) -> Concat:
        return Concat([*self.parts, as_expr(other)])


def as_expr(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return Text(x)
    raise TypeError(f"cannot append {type(x).__name__} to a program state (use a string or a primitive)")


def flatten(expr: Expr) -> list[Expr]:
    if isinstance(expr, Concat):
        return [e for p in expr.parts for e in flatten(p)]
    return [expr]
