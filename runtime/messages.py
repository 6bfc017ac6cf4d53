"""Typed IPC messages between the API, scheduler and detokenizer processes (msgpack via msgspec).

Decoding is typed: a socket only ever yields these structs, never arbitrary objects (no pickle).
"""

from __future__ import annotations

from typing import Any

import msgspec


class GenerateReq(msgspec.Struct, tag=True):
    rid: str
    input_ids: list[int]
    sampling: dict[str, Any]  # validated SamplingParams fields
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    priority: int = 0
    seed: int | None = None
    constraint: tuple[str, str] | None = None  # (ConstraintSpec.kind, ConstraintSpec.value)


class AbortReq(msgspec.Struct, tag=True):
    rid: str  # also aborts every request whose rid starts with it


class FlushCacheReq(msgspec.Struct, tag=True):
    pass


class Shutdown(msgspec.Struct, tag=True):
    pass


class Progress(msgspec.Struct):
    """One request's progress in one step: what the scheduler reports and the detokenizer passes on."""

    rid: str
    new_ids: list[int]
    finished: bool
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    output_logprobs: list[Any] | None = None  # new [logprob, token_id] pairs
    output_top_logprobs: list[Any] | None = None
    input_logprobs: list[Any] | None = None  # sent once, with the first token
    input_top_logprobs: list[Any] | None = None
    queue_time: float | None = None  # seconds from arrival to first admission, sent once
    spec_verify_steps: int = 0  # speculative decoding: verify passes so far
    spec_draft_tokens: int = 0  # ... draft tokens proposed
    spec_accepted_tokens: int = 0  # ... and accepted


def merge_progress(earlier: Progress, later: Progress) -> Progress:
    """One update for a request's steps held back together (stream_interval): the new tokens (and their
    logprobs) of both in order, the once-only fields of the first, the counters and end of the later."""
    later.new_ids = earlier.new_ids + later.new_ids
    if earlier.output_logprobs is not None:
        later.output_logprobs = earlier.output_logprobs + (later.output_logprobs or [])
    if earlier.output_top_logprobs is not None:
        later.output_top_logprobs = earlier.output_top_logprobs + (later.output_top_logprobs or [])
    for name in ("input_logprobs", "input_top_logprobs", "queue_time"):
        if getattr(earlier, name) is not None:
            setattr(later, name, getattr(earlier, name))
    return later


class TokenUpdate(Progress):
    """Scheduler -> detokenizer, with what the detokenizer needs to cut stop strings."""

    stop: list[str] = []
    no_stop_trim: bool = False
    skip_special_tokens: bool = True


class TokenBatch(msgspec.Struct, tag=True):
    """Scheduler -> detokenizer."""

    updates: list[TokenUpdate]


class TextUpdate(Progress):
    """Detokenizer -> API: the text that is final so far (never broken UTF-8, never a stop string)."""

    text: str = ""  # delta since the last update


class TextBatch(msgspec.Struct, tag=True):
    updates: list[TextUpdate]


class ReqError(msgspec.Struct, tag=True):
    """Scheduler -> API: a request failed before running (queue full, too long...)."""

    rid: str
    message: str
    status: int = 400


class SchedulerStats(msgspec.Struct, tag=True):
    running: int
    queued: int
    kv_used: int
    kv_total: int
    cache_hit_rate: float
    retractions: int
    leak: str | None = None
    rss_mb: float = 0.0  # the scheduler process's resident memory
    spec_accept_rate: float = 0.0  # speculative decoding: accepted / drafted tokens, since start
    spec_accept_length: float = 0.0  # ... tokens produced per verify pass


class FlushCacheResp(msgspec.Struct, tag=True):
    ok: bool
    message: str = ""


class Ready(msgspec.Struct, tag=True):
    """Child -> launcher handshake: ``error`` is set when startup failed (and says why)."""

    process: str
    error: str | None = None
    info: dict[str, Any] = {}


ToScheduler = GenerateReq | AbortReq | FlushCacheReq | Shutdown
ToDetokenizer = TokenBatch | Shutdown
ToApi = TextBatch | ReqError | SchedulerStats | FlushCacheResp

_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode


def decoder(kind) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(kind)
