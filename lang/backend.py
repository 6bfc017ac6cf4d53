"""Backends run a program's calls: our server over HTTP, a local server process, an in-process Engine,
or any OpenAI-compatible endpoint. All share one small interface."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from radixlm.lang.chat_template import RoleTemplate

SAMPLING_KEYS = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens", "max_new_tokens": "max_new_tokens",
                 "min_new_tokens": "min_new_tokens", "stop": "stop", "stop_token_ids": "stop_token_ids",
                 "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
                 "ignore_eos": "ignore_eos", "regex": "regex", "json_schema": "json_schema", "seed": "seed"}


class GenResult(dict):
    """{"text": str, "meta_info": dict} from a backend."""


class Backend(Protocol):
    def generate(self, prompt: str, params: dict[str, Any], logprobs: dict[str, Any] | None = None) -> GenResult: ...

    def generate_stream(self, prompt: str, params: dict[str, Any]) -> Iterator[tuple[str, dict | None]]: ...

    def select(self, prompt: str, choices: list[str], unconditional: bool) -> tuple[list[list[float]],
                                                                                   list[list[float]] | None]: ...

    def role_template(self) -> RoleTemplate | None: ...

    def cache_prefix(self, prompt: str) -> None: ...

    def flush_cache(self) -> None: ...

    def wait_until(self, done: Callable[[], bool], timeout: float | None = None) -> bool: ...


def sampling_params(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        if v is None:
            continue
        if k not in SAMPLING_KEYS:
            raise ValueError(f"gen: unknown parameter {k!r}")
        out[SAMPLING_KEYS[k]] = v
    return out


def wait_polling(done: Callable[[], bool], timeout: float | None) -> bool:
    end = None if timeout is None else time.monotonic() + timeout
    while not done():
        if end is not None and time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


def choice_logprobs(prompt_ids: list[int], results: list[dict], start: int) -> list[list[float]]:
    """Logprobs of each choice's own tokens, with token healing at the prompt boundary: when the choice
    merged with the prompt's last token, that merged token counts as part of the choice."""
    out = []
    for res in results:
        pairs = res["meta_info"]["input_token_logprobs"]  # from position `start`
        ids = [t for _, t in pairs]
        k = 0
        while start + k < len(prompt_ids) and k < len(ids) and ids[k] == prompt_ids[start + k]:
            k += 1
        own = [lp for lp, _ in pairs[k:]]
        out.append(own or [lp for lp, _ in pairs[-1:]])
    return out
