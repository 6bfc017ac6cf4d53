"""The one request builder, shared by the offline Engine and the server's API process.

Prompts (token ids) with their sampling parameters become ``GenerateReq`` messages: validated, each
prompt's ``n`` samples fanned out (seeds seed, seed + 1, ... when a seed is given), rids assigned
(``rid``, ``rid-i`` per prompt, ``...-j`` per sample) and ``max_new_tokens`` clamped to what the context
leaves after the prompt. A bad input is a ValueError naming the field, raised before anything is queued.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from radixlm.constrained.spec import ConstraintSpec, spec_from_sampling
from radixlm.runtime.messages import GenerateReq, LogprobOptions, SamplingParams


class ContextLengthError(ValueError):
    """A prompt that leaves no room for a new token in the context."""


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on one request (the server's flags set them; the Engine keeps these defaults)."""

    max_n: int = 64
    max_stop: int = 64
    max_top_logprobs: int = 20


def parse_sampling(d: dict[str, Any] | None) -> tuple[SamplingParams, ConstraintSpec | None]:
    """A sampling dict, constraint keys included (json_schema, regex, ebnf, choices) -> typed parts."""
    d = dict(d or {})
    spec = spec_from_sampling(d)
    return SamplingParams.from_dict(d), spec


def check_prompt(ids: list[int], vocab_size: int, max_context: int) -> None:
    if not ids:
        raise ValueError("prompt: the prompt is empty")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in ids):
        raise ValueError("input_ids: must be token ids within the vocabulary")
    if len(ids) + 1 > max_context:
        raise ContextLengthError(f"prompt: {len(ids)} tokens do not fit the context length {max_context} with "
                                 "a new token")


def check_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """logit_bias and stop_token_ids name tokens of the model's vocabulary (the sampler indexes logits by them)."""
    for field, ids in (("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids)):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"sampling_params.{field}: token id {bad[0]} is outside the vocabulary (0-{vocab_size - 1})")


def check_limits(params: SamplingParams, logprob: LogprobOptions, limits: RequestLimits) -> None:
    if params.n > limits.max_n:
        raise ValueError(f"n: must be <= {limits.max_n}, got {params.n}")
    if len(params.stop) > limits.max_stop:
        raise ValueError(f"stop: at most {limits.max_stop} stop strings, got {len(params.stop)}")
    if not 0 <= logprob.top_logprobs_num <= limits.max_top_logprobs:
        raise ValueError(f"top_logprobs: must be in [0, {limits.max_top_logprobs}], got {logprob.top_logprobs_num}")


def build_requests(prompts: list[list[int]], params: list[SamplingParams], rid: str, *, max_context: int,
                   vocab_size: int, constraints: list[ConstraintSpec | None] | None = None,
                   logprob: LogprobOptions = LogprobOptions(), priority: int = 0,
                   limits: RequestLimits = RequestLimits(), namespace: str | None = None) -> list[list[GenerateReq]]:
    """One list of n GenerateReqs per prompt; params[i] and constraints[i] belong to prompts[i]; all in the
    radix ``namespace``."""
    if len(params) != len(prompts):
        raise ValueError(f"sampling_params: {len(params)} given for {len(prompts)} prompts")
    constraints = constraints if constraints is not None else [None] * len(prompts)
    groups = []
    for i, (ids, sp, spec) in enumerate(zip(prompts, params, constraints, strict=True)):
        check_prompt(ids, vocab_size, max_context)
        check_token_ids(sp, vocab_size)
        check_limits(sp, logprob, limits)
        room = max_context - len(ids)
        budget = room if sp.max_new_tokens is None else min(sp.max_new_tokens, room)
        prid = rid if len(prompts) == 1 else f"{rid}-{i}"
        groups.append([
            GenerateReq(rid=prid if sp.n == 1 else f"{prid}-{j}", input_ids=list(ids),
                        params=msgspec.structs.replace(sp, n=1, max_new_tokens=budget,
                                                       seed=None if sp.seed is None else sp.seed + j),
                        logprob=logprob, priority=priority, constraint=spec, namespace=namespace)
            for j in range(sp.n)])
    return groups
