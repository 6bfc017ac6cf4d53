"""The scheduler's per-request state (``Req``) and why a request finished."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any

import torch

from radixlm.runtime.messages import LogprobOptions, SamplingParams


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


class ReqStatus(enum.Enum):
    """Where a request is in the scheduler; each but FINISHED names the one queue that holds it."""

    COMPILING = "compiling"  # its grammar compiles (the grammar queue)
    WAITING = "waiting"  # queued for admission, new or back after a jump-forward (it keeps its KV row then)
    RETRACTED = "retracted"  # queued again after its KV was taken back (out of KV, or preempted)
    PREFILLING = "prefilling"  # the chunked request: part of its fill ids computed, more next step
    RUNNING = "running"  # decoding
    FINISHED = "finished"


class Req:
    """One sequence being served. KV layout of its table row: positions [0, prefix_len) are slots held by the
    radix tree (locked through ``last_node``), [prefix_len, kv_len) are slots this request owns."""

    def __init__(self, rid: str, input_ids: list[int], params: SamplingParams, logprob: LogprobOptions,
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
        self.status = ReqStatus.WAITING
        self.generator = torch.Generator()
        self.finished: FinishReason | None = None
        self.cached_tokens = 0  # prompt tokens served from the radix cache at (first) admission
        self.disk_cached_tokens = 0  # ... and of those, loaded back from its disk tier
        self.disk_prefix_len = 0  # tokens of prefix_len loaded from the disk tier at the last admission
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
        self.constraint = None  # ConstraintSpec, if constrained
        self.grammar_future = None  # Future[Grammar] while compiling
        self.grammar = None  # Matcher, once compiled
        self.spec_state = None  # SpecState, once speculative decoding looked at this request

    @property
    def fill_ids(self) -> list[int]:
        """Tokens whose KV the request needs: the prompt, plus output so far after a retraction."""
        return self.origin_input_ids + self.output_ids

    def __repr__(self) -> str:
        return f"Req({self.rid!r}, prompt={len(self.origin_input_ids)}, out={len(self.output_ids)})"
