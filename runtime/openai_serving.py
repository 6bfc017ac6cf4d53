"""Request handling shared by the HTTP routes: validation, fan-out of prompts x n, responses and SSE."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from radixlm.constrained import ConstraintSpec, spec_from_sampling
from radixlm.runtime.config import ServerConfig
from radixlm.runtime.messages import GenerateReq, TextUpdate
from radixlm.runtime.request import SamplingParams
from radixlm.runtime.tokenizer_manager import RequestFailed, TokenizerManager


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 err_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, err_type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_param(e: ValueError) -> ApiError:
    msg = str(e)
    head = msg.split(" ", 1)[0].rstrip(":")
    param = head.split(".", 1)[1] if head.startswith("sampling_params.") else head.split(".")[0]
    return ApiError(400, msg, param=param)


@dataclass
class Choice:
    """Everything collected for one (prompt, sample) pair."""

    index: int
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    top_logprobs: list[Any] = field(default_factory=list)
    input_logprobs: list[Any] | None = None
    input_top_logprobs: list[Any] | None = None
    last: TextUpdate | None = None

    def add(self, u: TextUpdate) -> None:
        self.text.append(u.text)
        self.ids += u.new_ids
        self.logprobs += u.output_logprobs or []
        self.top_logprobs += u.output_top_logprobs or []
        if u.input_logprobs is not None:
            self.input_logprobs, self.input_top_logprobs = u.input_logprobs, u.input_top_logprobs
        self.last = u


class Serving:
    def __init__(self, tm: TokenizerManager, cfg: ServerConfig, max_context: int, model_name: str) -> None:
        self.tm, self.cfg, self.max_context, self.model_name = tm, cfg, max_context, model_name

    # ------------------------------------------------------------ building requests
    def check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        if len(ids) + 1 > self.max_context:
            raise ApiError(400, f"the prompt has {len(ids)} tokens; this model's context length is "
                           f"{self.max_context}", param="messages", code="context_length_exceeded")
        vocab = len(self.tm.tokenizer)
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in ids):
            raise ApiError(400, "input ids must be token ids within the vocabulary", param="input_ids")

    def make_reqs(self, prompts: list[list[int]], sampling: dict[str, Any], *, return_logprob=False,
                  logprob_start_len=-1, top_logprobs_num=0, priority=0, rid=None,
                  spec: ConstraintSpec | None = None) -> list[list[GenerateReq]]:
        """One list of n GenerateReqs per prompt (seeds seed, seed + 1, ...). Raises ApiError on bad input."""
        sampling = dict(sampling)
        n, seed = sampling.pop("n", 1), sampling.pop("seed", None)
        try:
            from_params = spec_from_sampling(sampling)
            if spec is not None and from_params is not None:
                raise ValueError("constraint: give one of response_format / tools or regex / ebnf / json_schema")
            spec = spec or from_params
            params = SamplingParams.from_dict({**sampling, "n": n, "seed": seed})
        except (ValueError, TypeError) as e:
            raise bad_param(ValueError(str(e))) from e
        if n > self.cfg.max_n:
            raise ApiError(400, f"n must be <= {self.cfg.max_n}, got {n}", param="n")
        if len(params.stop) > self.cfg.max_stop:
            raise ApiError(400, f"at most {self.cfg.max_stop} stop strings, got {len(params.stop)}", param="stop")
        if top_logprobs_num > self.cfg.max_top_logprobs or top_logprobs_num < 0:
            raise ApiError(400, f"top_logprobs must be in [0, {self.cfg.max_top_logprobs}]", param="top_logprobs")
        out = []
        base = rid or self.tm.new_rid()
        for i, ids in enumerate(prompts):
            self.check_prompt(ids)
            sp = {**sampling, "max_new_tokens": min(params.max_new_tokens, self.max_context - len(ids))}
            prid = base if len(prompts) == 1 else f"{base}-{i}"
            out.append([GenerateReq(rid=prid if n == 1 else f"{prid}-{j}", input_ids=ids, sampling=sp,
                                    return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                                    top_logprobs_num=top_logprobs_num, priority=priority,
                                    seed=None if seed is None else seed + j,
                                    constraint=None if spec is None else (spec.kind, spec.value))
                        for j in range(n)])
        return out

    # ------------------------------------------------------------ running
    async def run(self, groups: list[list[GenerateReq]], is_disconnected) -> list[Choice]:
        reqs = [r for g in groups for r in g]
        choices = [Choice(i) for i in range(len(reqs))]
        async for i, u in self.merged(reqs, is_disconnected):
            choices[i].add(u)
        return choices

    async def start_stream(self, reqs: list[GenerateReq], is_disconnected):
        """Submit and wait for the first event, so that a request failing early (a grammar that does not
        compile, a full queue) is an HTTP error, not an error inside a 200 stream."""
        events = self.merged(reqs, is_disconnected)
        try:
            first = await events.__anext__()
        except StopAsyncIteration:
            first = None

        async def chained():
            if first is not None:
                yield first
                async for item in events:
                    yield item

        return chained()

    async def merged(self, reqs: list[GenerateReq], is_disconnected) -> AsyncIterator[tuple[int, TextUpdate]]:
        """Submit all and yield (index, update) as they arrive; errors and disconnects abort the rest."""
        for r in reqs:
            self.tm.submit(r)
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, rid: str) -> None:
            try:
                async for u in self.tm.updates(rid, is_disconnected):
                    await queue.put((i, u))
            except RequestFailed as e:
                await queue.put((i, e))
            finally:
                await queue.put((i, None))

        tasks = [asyncio.create_task(pump(i, r.rid)) for i, r in enumerate(reqs)]
        loop_deadline = asyncio.get_running_loop().time() + self.cfg.request_timeout_s
        try:
            open_ = len(reqs)
            while open_:
                try:
                    async with asyncio.timeout_at(loop_deadline):
                        i, item = await queue.get()
                except TimeoutError:
                    raise ApiError(504, f"the request did not finish within {self.cfg.request_timeout_s:g} s",
                                   err_type="timeout") from None
                if item is None:
                    open_ -= 1
                elif isinstance(item, RequestFailed):
                    raise ApiError(item.status, item.message, err_type="server_error" if item.status >= 500
                                   else "invalid_request_error")
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            for r in reqs:
                if r.rid in self.tm.states and not self.tm.states[r.rid].finished:
                    self.tm.abort(r.rid)


def usage(groups: list[list[GenerateReq]], choices: list[Choice]) -> dict[str, Any]:
    prompt = sum(len(g[0].input_ids) for g in groups)
    completion = sum(len(c.ids) for c in choices)
    cached, k = 0, 0
    for g in groups:  # cached tokens of each prompt's first sample
        cached += choices[k].last.cached_tokens if choices[k].last else 0
        k += len(g)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def finish_reason(u: TextUpdate | None) -> str | None:
    if u is None or not u.finished or not u.finish_reason:
        return None
    return u.finish_reason.get("type")


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def now() -> int:
    return int(time.time())
