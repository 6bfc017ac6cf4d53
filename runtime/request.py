"""Sampling parameters (validated) and the scheduler's per-request state."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    n: int = 1
    logit_bias: dict[int, float] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"sampling_params: unknown field {unknown[0]!r}")
        if isinstance(d.get("stop"), str):
            d["stop"] = [d["stop"]]
        for key in ("stop", "stop_token_ids"):
            if d.get(key) is None:
                d.pop(key, None)
        params = cls(**d)
        params.validate()
        return params

    def validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"sampling_params.{name} {why}, got {getattr(self, name)!r}")

        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(name, "must be an integer")
        if self.max_new_tokens < 0:
            raise bad("max_new_tokens", "must be >= 0")
        if not 0 <= self.min_new_tokens:
            raise bad("min_new_tokens", "must be >= 0")
        if self.temperature < 0:
            raise bad("temperature", "must be >= 0")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        if self.top_k < -1:
            raise bad("top_k", "must be -1 (off) or >= 0")
        if not 0 <= self.min_p <= 1:
            raise bad("min_p", "must be in [0, 1]")
        if self.repetition_penalty <= 0:
            raise bad("repetition_penalty", "must be > 0")
        if not -2 <= self.frequency_penalty <= 2:
            raise bad("frequency_penalty", "must be in [-2, 2]")
        if not -2 <= self.presence_penalty <= 2:
            raise bad("presence_penalty", "must be in [-2, 2]")
        if self.n < 1:
            raise bad("n", "must be >= 1")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be token ids")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise bad("seed", "must be an integer")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0


@dataclass
class LogprobSettings:
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs
    top_logprobs_num: int = 0


@dataclass
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None
    message: str | None = None
    status: int | None = None  # for an error: the HTTP status it maps to (400 for a bad grammar)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type, "matched": self.matched}
        if self.message:
            d["message"] = self.message
        return d


class Req:
    """One sequence being served. KV layout of its table row: positions [0, prefix_len) are slots held by the
    radix tree (locked through ``last_node``), [prefix_len, kv_len) are slots this request owns."""

    def __init__(self, rid: str, input_ids: list[int], params: SamplingParams, logprob: LogprobSettings,
                 eos_ids: tuple[int, ...], priority: int = 0, namespace: Any = None) -> None:
        self.rid = rid
        self.origin_input_ids = input_ids
        self.params = params
        self.logprob = logprob
        self.eos_ids = () if params.ignore_eos else eos_ids
        self.priority = priority
        self.namespace = namespace
        self.arrival = time.monotonic()
        self.output_ids: list[int] = []
        self.generator = torch.Generator()
        self.finished: FinishReason | None = None
        self.cached_tokens = 0  # prompt tokens served from the radix cache at (first) admission
        self.num_retractions = 0
        self.first_token_time: float | None = None
        self.admit_time: float | None = None  # first admission into a batch
        # KV state, valid while the request is admitted
        self.row: int | None = None
        self.kv_len = 0  # tokens whose KV is computed
        self.alloc_len = 0  # tokens with a slot assigned (>= kv_len)
        self.prefix_len = 0
        self.last_node = None
        # logprob outputs
        self.input_token_logprobs: list = []
        self.input_top_logprobs: list = []
        self.output_token_logprobs: list = []
        self.output_top_logprobs: list = []
        self.stop_text_len: int | None = None  # where a matched stop string starts in the output text
        self.spec = None  # ConstraintSpec, if constrained
        self.grammar_future = None  # Future[Grammar] while compiling
        self.grammar = None  # Matcher, once compiled
        self.num_jump_forward_tokens = 0
        self.spec_state = None  # SpecState, once speculative decoding looked at this request

    @property
    def fill_ids(self) -> list[int]:
        """Tokens whose KV the request needs: the prompt, plus output so far after a retraction."""
        return self.origin_input_ids + self.output_ids

    def __repr__(self) -> str:
        return f"Req({self.rid!r}, prompt={len(self.origin_input_ids)}, out={len(self.output_ids)})"
