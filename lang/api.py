"""The user-facing primitives (SGLang-compatible names): they build expressions, nothing runs here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixlm.lang.backend import Backend
from radixlm.lang.choices import METHODS
from radixlm.lang.ir import Expr, Gen, RoleBegin, RoleEnd, Select, as_expr
from radixlm.lang.program import Defaults, SglFunction, resolve_backend

DTYPE_REGEX = {int: r"-?[0-9]{1,12}", float: r"-?[0-9]{1,12}(\.[0-9]{1,8})?", bool: r"(True|False)",
               str: r'"[^"\\\n]{0,200}"'}


def function(func: Callable | None = None, **bound: Any):
    """``@function`` decorator; the first parameter of the decorated function is the state ``s``."""
    if func is None:
        return lambda f: SglFunction(f, bound)
    return SglFunction(func, bound)


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None,
        stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
        temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
        min_p: float | None = None, frequency_penalty: float | None = None, presence_penalty: float | None = None,
        ignore_eos: bool | None = None, n: int | None = None, return_logprob: bool | None = None,
        logprob_start_len: int | None = None, top_logprobs_num: int | None = None, regex: str | None = None,
        json_schema: str | dict | None = None, choices: list[str] | None = None, dtype: type | None = None,
        seed: int | None = None) -> Gen:
    if n not in (None, 1):
        raise ValueError("gen: n > 1 is written as s.fork(n) in a program")
    if dtype is not None:
        if dtype not in DTYPE_REGEX:
            raise ValueError(f"gen: dtype must be one of int, float, bool, str; got {dtype!r}")
        if regex is not None or json_schema is not None:
            raise ValueError("gen: give only one of dtype, regex, json_schema")
        regex = DTYPE_REGEX[dtype]
    params = {"max_tokens": max_tokens, "min_tokens": min_tokens, "stop": stop, "stop_token_ids": stop_token_ids,
              "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
              "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty, "ignore_eos": ignore_eos,
              "regex": regex, "json_schema": json_schema, "choices": list(choices) if choices else None, "seed": seed,
              "return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
              "top_logprobs_num": top_logprobs_num}
    return Gen(name, {k: v for k, v in params.items() if v is not None})


def gen_int(name: str | None = None, **kwargs: Any) -> Gen:
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Gen:
    return gen(name, dtype=str, **kwargs)


def select(name: str | None = None, choices: list[str] | None = None, temperature: float = 0.0,
           choices_method: str = "token_length_normalized") -> Select:
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("select: choices must be a non-empty list of non-empty strings")
    if choices_method not in METHODS:
        raise ValueError(f"select: choices_method must be one of {METHODS}")
    return Select(name, tuple(choices), temperature, choices_method)


def _role(role: str, expr: Any) -> Expr:
    return RoleBegin(role) + as_expr(expr) + RoleEnd(role)


def system(expr: Any) -> Expr:
    return _role("system", expr)


def user(expr: Any) -> Expr:
    return _role("user", expr)


def assistant(expr: Any) -> Expr:
    return _role("assistant", expr)


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")


def set_default_backend(backend: Backend) -> None:
    Defaults.backend = backend


def flush_cache(backend: Backend | None = None) -> None:
    resolve_backend(backend).flush_cache()
