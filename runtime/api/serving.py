"""Request handling shared by the HTTP routes: validation, fan-out of prompts x n, responses and SSE."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from radixlm.constrained.spec import ConstraintSpec
from radixlm.runtime.api.chat.prompt import ChatSyntax
from radixlm.runtime.api.chat.reasoning import reasoning_syntax
from radixlm.runtime.api.errors import ApiError, bad_param
from radixlm.runtime.api.scheduler_client import RequestFailed, SchedulerClient
from radixlm.runtime.api.tenancy import Tenancy
from radixlm.runtime.config import ServerConfig
from radixlm.runtime.messages import GenerateReq, LogprobOptions, TextUpdate
from radixlm.runtime.request_builder import ContextLengthError, RequestLimits, build_requests, parse_sampling


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
    def __init__(self, client: SchedulerClient, cfg: ServerConfig, max_context: int, model_name: str,
                 tenancy: Tenancy | None = None) -> None:
        self.client, self.cfg, self.max_context, self.model_name = client, cfg, max_context, model_name
        self.tenancy = tenancy or Tenancy()
        template = getattr(client.tokenizer, "chat_template", None)
        self.chat = ChatSyntax.of(template, reasoning_syntax(cfg.reasoning_parser, template))
        self.limits = RequestLimits(cfg.max_n, cfg.max_stop, cfg.max_top_logprobs)

    # ------------------------------------------------------------ building requests
    def make_reqs(self, prompts: list[list[int]], sampling: dict[str, Any], *, logprob: LogprobOptions = LogprobOptions(),
                  priority: int = 0, rid: str | None = None, spec: ConstraintSpec | None = None,
                  tenant: str | None = None, cache_salt: str | None = None) -> list[list[GenerateReq]]:
        """One list of n GenerateReqs per prompt (request_builder), in the radix namespace of ``tenant`` (who
        authenticated) and ``cache_salt``; raises ApiError on bad input."""
        try:
            rid = rid or self.client.new_rid()
            namespace = self.tenancy.namespace(tenant, cache_salt, rid)
            params, from_params = parse_sampling(sampling)
            if spec is not None and from_params is not None:
                raise ValueError("constraint: give one of response_format / tools or regex / ebnf / json_schema")
            return build_requests(prompts, [params] * len(prompts), rid,
                                  max_context=self.max_context, vocab_size=len(self.client.tokenizer),
                                  constraints=[spec or from_params] * len(prompts), logprob=logprob,
                                  priority=priority, limits=self.limits, namespace=namespace)
        except ContextLengthError as e:
            raise ApiError(400, str(e), param="messages", code="context_length_exceeded") from e
        except (ValueError, TypeError) as e:
            raise bad_param(ValueError(str(e))) from e

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
            self.client.submit(r)
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, rid: str) -> None:
            try:
                async for u in self.client.updates(rid, is_disconnected):
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
                    if item.status == 400 and item.message.startswith("sampling_params."):  # the scheduler's check
                        raise bad_param(ValueError(item.message))
                    raise ApiError(item.status, item.message, err_type="server_error" if item.status >= 500
                                   else "invalid_request_error")
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            for r in reqs:
                if r.rid in self.client.states and not self.client.states[r.rid].finished:
                    self.client.abort(r.rid)


def usage(groups: list[list[GenerateReq]], choices: list[Choice]) -> dict[str, Any]:
    prompt = sum(len(g[0].input_ids) for g in groups)
    completion = sum(len(c.ids) for c in choices)
    cached, disk, k = 0, 0, 0
    for g in groups:  # cached tokens of each prompt's first sample
        last = choices[k].last
        cached += last.cached_tokens if last else 0
        disk += last.disk_cached_tokens if last else 0
        k += len(g)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached, "cached_tokens_ram": cached - disk,
                                      "cached_tokens_disk": disk}}


def finish_reason(u: TextUpdate | None) -> str | None:
    if u is None or not u.finished or not u.finish_reason:
        return None
    return u.finish_reason.get("type")


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def now() -> int:
    return int(time.time())
