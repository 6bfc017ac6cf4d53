"""The typed request and every IPC message between the API and scheduler processes.

``SamplingParams`` is validated once, where a request arrives (``SamplingParams.from_dict`` or
``validate``), and then travels as it is inside ``GenerateReq``. Messages are msgpack via msgspec; decoding
is typed, so a socket only ever yields these structs, never arbitrary objects (no pickle).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from radixlm.constrained.spec import ConstraintSpec
from radixlm.radix_cache.snapshot import NodeView

FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
INT_FIELDS = ("min_new_tokens", "top_k", "n")


class SamplingParams(msgspec.Struct, kw_only=True, frozen=True):
    """How to sample one request. ``max_new_tokens`` None: until a stop, or the context is full (the request
    builder replaces it by that bound, so the scheduler always sees a number)."""

    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    n: int = 1
    logit_bias: dict[int, float] | None = None
    # True: the server's speculation method; False: never speculate; or a method the server offers by name
    # ('suffix', 'ngram', 'draft': EngineCore.make_req checks it)
    speculative: bool | str = True

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Validated parameters from a plain dict; a bad or unknown field is a ValueError naming it."""
        d = dict(d or {})
        unknown = sorted(set(d) - set(cls.__struct_fields__))
        if unknown:
            raise ValueError(f"sampling_params: unknown field {unknown[0]!r}")
        if isinstance(d.get("stop"), str):
            d["stop"] = [d["stop"]]
        for key in ("stop", "stop_token_ids"):
            if d.get(key) is None:
                d.pop(key, None)
        if d.get("logit_bias") is not None:
            d["logit_bias"] = _logit_bias(d["logit_bias"])
        params = cls(**d)
        params.validate()
        return params

    def validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"sampling_params.{name} {why}, got {getattr(self, name)!r}")

        for name in FLOAT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
        for name in INT_FIELDS + (("max_new_tokens",) if self.max_new_tokens is not None else ()):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(name, "must be an integer")
        checks = (("max_new_tokens", self.max_new_tokens is None or self.max_new_tokens >= 0, "must be >= 0"),
                  ("min_new_tokens", self.min_new_tokens >= 0, "must be >= 0"),
                  ("temperature", self.temperature >= 0, "must be >= 0"),
                  ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
                  ("top_k", self.top_k >= -1, "must be -1 (off) or >= 0"),
                  ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
                  ("repetition_penalty", self.repetition_penalty > 0, "must be > 0"),
                  ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
                  ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
                  ("n", self.n >= 1, "must be >= 1"),
                  ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
                  ("stop_token_ids", all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
                   "must be token ids"),
                  ("seed", self.seed is None or isinstance(self.seed, int) and not isinstance(self.seed, bool),
                   "must be an integer"),
                  ("speculative", isinstance(self.speculative, (bool, str)), "must be true, false or a method's "
                   "name"))
        for name, ok, why in checks:
            if not ok:
                raise bad(name, why)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0


def _logit_bias(bias: Any) -> dict[int, float]:
    """Token-id keys (OpenAI sends them as strings) -> floats."""
    try:
        return {int(k): float(v) for k, v in dict(bias).items()}
    except (TypeError, ValueError) as e:
        raise ValueError("sampling_params.logit_bias must map token ids to numbers") from e


class LogprobOptions(msgspec.Struct, frozen=True):
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs
    top_logprobs_num: int = 0


class GenerateReq(msgspec.Struct, tag=True):
    """One sequence to generate (a prompt's n samples are n of these), built by request_builder."""

    rid: str
    input_ids: list[int]
    params: SamplingParams  # validated; n == 1 and max_new_tokens set
    logprob: LogprobOptions = LogprobOptions()
    priority: int = 0
    constraint: ConstraintSpec | None = None
    namespace: str | None = None  # the radix namespace, set by the server from the API key (never the client)


class AbortReq(msgspec.Struct, tag=True):
    rid: str  # also aborts every request whose rid starts with it


class FlushCacheReq(msgspec.Struct, tag=True):
    pass


class Shutdown(msgspec.Struct, tag=True):
    pass


class Progress(msgspec.Struct):
    """One request's progress in one step: what the scheduler reports and the API's detokenizer passes on."""

    rid: str
    new_ids: list[int]
    finished: bool
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    disk_cached_tokens: int = 0  # ... of those, loaded back from the radix cache's disk tier
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


def spec_meta(verify_steps: int, drafted: int, accepted: int) -> dict[str, float]:
    """meta_info fields of a request that speculated (empty if it never did)."""
    if not verify_steps:
        return {}
    return {"spec_verify_ct": verify_steps, "spec_draft_tokens": drafted,
            "spec_accept_rate": accepted / max(drafted, 1), "spec_accept_length": 1 + accepted / verify_steps}


class TokenUpdate(Progress):
    """Scheduler -> API, with what its detokenizer needs to cut stop strings."""

    stop: list[str] = []
    no_stop_trim: bool = False
    skip_special_tokens: bool = True


class TokenBatch(msgspec.Struct, tag=True):
    """Scheduler -> API: one step's updates."""

    updates: list[TokenUpdate]


class TextUpdate(Progress):
    """In the API, after detokenizing: the text that is final so far (never broken UTF-8, never a stop string)."""

    text: str = ""  # delta since the last update


class ReqError(msgspec.Struct, tag=True):
    """Scheduler -> API: a request failed before running (queue full, too long...)."""

    rid: str
    message: str
    status: int = 400


class DiskTierStats(msgspec.Struct):
    """The disk tier since start (bytes and seconds are totals; the API turns them into rates)."""

    on: bool
    off_reason: str | None
    pages: int  # pages on disk now (this process's view)
    used_bytes: int
    capacity_bytes: int
    cached_tokens: int  # prompt tokens loaded back from disk (also counted in SchedulerStats.cached_tokens)
    bytes_written: int
    bytes_read: int
    loads: int
    load_s: float  # seconds spent loading pages back (read and copy into the pool)
    save_s: float  # seconds the step spent handing pages to the writer
    corrupt_dropped: int
    evicted_pages: int
    skipped_writes: int  # pages not written because the writer was behind
    skipped_loads: int  # prefixes on disk recomputed because that was expected to be faster


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
    spec_speedup: float = 0.0  # ... verify steps' tokens a second over plain decoding's, lately (0: unknown)
    spec_off_steps: int = 0  # ... decode steps where it did not pay and was left out
    spec_accept_by_method: dict[str, float] = {}  # ... accepted / drafted tokens of each method's requests
    kv_evictable: int = 0  # slots the radix tree holds unlocked (not in kv_used: a new request may take them)
    kv_locked: int = 0  # of kv_used: tree slots locked by running requests (the rest are requests' own)
    prompt_tokens: int = 0  # since start: prompt tokens admitted ...
    cached_tokens: int = 0  # ... and of those, served from the radix cache
    evicted_tokens: int = 0  # since start: tokens evicted from the radix tree
    disk: DiskTierStats | None = None  # the radix cache's disk tier (None: no tier)


class CacheViewReq(msgspec.Struct, tag=True):
    """API -> scheduler: the top of the radix tree and the requests in flight, for the dashboard."""

    query: int  # echoed in the answer
    top: int  # 0: only the requests, no walk over the tree
    depth: int
    namespace: str | None  # None: every namespace
    preview_tokens: int  # 0: no token ids of prompts leave the scheduler


class InFlight(msgspec.Struct):
    rid: str
    state: str  # "grammar" (compiling), "waiting", "prefill" (chunked), "running"
    prompt_tokens: int
    cached_tokens: int
    generated: int
    priority: int
    age_s: float
    grammar: str | None = None  # the constraint's kind
    preview_ids: list[int] = []
    namespace: str = "default"


class CacheViewResp(msgspec.Struct, tag=True):
    query: int
    nodes: list[NodeView] = []
    namespaces: dict[str, int] = {}  # tokens held per namespace
    requests: list[InFlight] = []  # the oldest MAX_LISTED of them
    total_requests: int = 0
    error: str | None = None  # a bad argument (the API turns it into a 400)


class FlushCacheResp(msgspec.Struct, tag=True):
    ok: bool
    message: str = ""


class Ready(msgspec.Struct, tag=True):
    """Child -> launcher handshake: ``error`` is set when startup failed (and says why)."""

    process: str
    error: str | None = None
    info: dict[str, Any] = {}


ToScheduler = GenerateReq | AbortReq | FlushCacheReq | CacheViewReq | Shutdown
ToApi = TokenBatch | ReqError | SchedulerStats | FlushCacheResp | CacheViewResp

_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode


def decoder(kind) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(kind)


def as_json(msg: msgspec.Struct | None) -> dict[str, Any] | None:
    """A message as JSON-able builtins, nested structs included, without its tag (for the HTTP answers)."""
    return None if msg is None else {k: v for k, v in msgspec.to_builtins(msg).items() if k != "type"}
