"""/v1/chat/completions: messages and tools in, OpenAI chat completions (or chunks) out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixlm.constrained.spec import ConstraintSpec, spec_from_response_format, spec_from_sampling
from radixlm.runtime.api.chat.message_stream import MessageStream
from radixlm.runtime.api.chat.prompt import ChatPrompt, chat_prompt
from radixlm.runtime.api.chat.tools import chat_constraint, tool_functions
from radixlm.runtime.api.errors import ApiError
from radixlm.runtime.api.openai_api.protocol import ChatCompletionRequest
from radixlm.runtime.api.serving import Choice, Serving, finish_reason, now, sse, usage
from radixlm.runtime.messages import GenerateReq, LogprobOptions

EFFORT_BUDGET = {"minimal": 0, "low": 256, "medium": 1024, "high": None}


@dataclass(frozen=True)
class ChatPlan:
    """A checked chat request: its prompt, its generation requests and how to read the answers."""

    prompt: ChatPrompt
    groups: list[list[GenerateReq]]
    rid: str  # the API's id: a prefix and the request's rid

    @property
    def call_prefix(self) -> str:
        return f"call_{self.groups[0][0].rid}"


def reasoning_budget(serving: Serving, effort: str | None, max_reasoning_tokens: int | None,
                     effort_param: str = "reasoning_effort") -> int | None:
    """The reasoning's token budget (None: unbounded); 400 when the server splits no reasoning."""
    given = "max_reasoning_tokens" if max_reasoning_tokens is not None else (effort_param if effort else None)
    if given and serving.chat.reasoning is None:
        raise ApiError(400, f"{given}: this server splits no reasoning (its chat template has no reasoning "
                            "markers, or it was started without --reasoning-parser)", param=given)
    if max_reasoning_tokens is not None:
        if isinstance(max_reasoning_tokens, bool) or max_reasoning_tokens < 0:
            raise ApiError(400, f"max_reasoning_tokens must be >= 0, got {max_reasoning_tokens}",
                           param="max_reasoning_tokens")
        return max_reasoning_tokens
    if effort is not None and effort not in EFFORT_BUDGET:
        raise ApiError(400, f"{effort_param} must be one of {sorted(EFFORT_BUDGET)}, got {effort!r}",
                       param=effort_param)
    return EFFORT_BUDGET.get(effort) if effort else None


def plan_chat(serving: Serving, req: Any, messages: list[Any], tools: list | None, tool_choice: Any,
              parallel: bool | None, response_spec: ConstraintSpec | None, budget: int | None,
              sampling: dict[str, Any], logprob: LogprobOptions, request: Request, prefix: str) -> ChatPlan:
    """Shared by chat completions and responses: everything is checked here, before anything runs."""
    if len(messages) > serving.cfg.max_messages:
        raise ApiError(400, f"at most {serving.cfg.max_messages} messages, got {len(messages)}", param="messages")
    functions = tool_functions(tools)
    parse_tools = bool(functions) and tool_choice != "none"
    prompt = chat_prompt(serving.client.tokenizer, serving.chat, messages, functions, parse_tools)
    try:
        answer_spec = spec_from_sampling(sampling, response_spec)
    except ValueError as e:
        raise ApiError(400, str(e), param=str(e).split(":")[0]) from e
    try:
        spec = chat_constraint(prompt.syntax, functions if parse_tools else {}, tool_choice,
                               parallel is not False, answer_spec, budget)
    except ValueError as e:
        raise ApiError(400, str(e), param="tools" if parse_tools else "response_format") from e
    groups = serving.make_reqs([prompt.ids], sampling, logprob=logprob, priority=req.priority, rid=req.rid,
                               spec=spec, tenant=request.state.tenant, cache_salt=req.cache_salt)
    return ChatPlan(prompt, groups, f"{prefix}{groups[0][0].rid}")


async def chat_completions(serving: Serving, req: ChatCompletionRequest, request: Request, model: str,
                           sampling: dict[str, Any]):
    top = req.top_logprobs or 0
    if top and not req.logprobs:
        raise ApiError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    try:
        response_spec = spec_from_response_format(req.response_format.model_dump() if req.response_format else None)
    except ValueError as e:
        raise ApiError(400, str(e), param="response_format") from e
    budget = reasoning_budget(serving, req.reasoning_effort, req.max_reasoning_tokens)
    plan = plan_chat(serving, req, req.messages, req.tools, req.tool_choice, req.parallel_tool_calls,
                     response_spec, budget, sampling, LogprobOptions(req.logprobs, -1, top), request, "chatcmpl-")
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = await serving.start_stream([r for g in plan.groups for r in g], request.is_disconnected)
        return StreamingResponse(chat_stream(serving, plan, events, model, include_usage, req.logprobs),
                                 media_type="text/event-stream")
    choices = await serving.run(plan.groups, request.is_disconnected)
    return {"id": plan.rid, "object": "chat.completion", "created": now(), "model": model,
            "choices": [chat_choice(serving, plan, c, req.logprobs) for c in choices],
            "usage": usage(plan.groups, choices)}


def chat_choice(serving: Serving, plan: ChatPlan, c: Choice, logprobs: bool) -> dict[str, Any]:
    stream = MessageStream(plan.prompt.syntax, f"{plan.call_prefix}_{c.index}")
    stream.feed("".join(c.text), finished=True)
    return {"index": c.index, "message": {"role": "assistant", **stream.message(), "refusal": None},
            "logprobs": token_logprobs(serving, c) if logprobs else None,
            "finish_reason": "tool_calls" if stream.tool_calls_done() else finish_reason(c.last)}


async def chat_stream(serving: Serving, plan: ChatPlan, events, model: str, include_usage: bool,
                      logprobs: bool) -> AsyncIterator[str]:
    choices = [Choice(i) for i in range(sum(len(g) for g in plan.groups))]
    base = {"id": plan.rid, "object": "chat.completion.chunk", "created": now(), "model": model}
    streams = [MessageStream(plan.prompt.syntax, f"{plan.call_prefix}_{c.index}") for c in choices]
    # with tools the answer may be calls only (content null, as OpenAI sends it), so no empty content up front
    first = {"role": "assistant", "refusal": None} if plan.prompt.syntax.tools else \
        {"role": "assistant", "content": "", "refusal": None}
    for c in choices:
        yield sse({**base, "choices": [{"index": c.index, "delta": first,
                                        "logprobs": None, "finish_reason": None}]})
    try:
        async for i, u in events:
            choices[i].add(u)
            lp = None
            if logprobs and u.output_logprobs:
                lp = token_logprobs(serving, Choice(i, logprobs=u.output_logprobs,
                                                    top_logprobs=u.output_top_logprobs or []))
            deltas = streams[i].feed(u.text, u.finished) or ([{}] if u.finished or lp else [])
            for k, delta in enumerate(deltas):
                last = u.finished and k == len(deltas) - 1
                reason = ("tool_calls" if streams[i].tool_calls_done() else finish_reason(u)) if last else None
                yield sse({**base, "choices": [{"index": i, "delta": delta, "logprobs": lp if k == 0 else None,
                                                "finish_reason": reason}]})
    except ApiError as e:
        yield sse(e.body())
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage(plan.groups, choices)})
    yield "data: [DONE]\n\n"


def token_logprobs(serving: Serving, c: Choice) -> dict[str, Any]:
    tok = serving.client.tokenizer
    content = []
    for k, (lp, tid) in enumerate(c.logprobs):
        s = tok.decode([tid])
        tops = c.top_logprobs[k] if k < len(c.top_logprobs) else []
        content.append({"token": s, "logprob": lp, "bytes": list(s.encode()),
                        "top_logprobs": [{"token": tok.decode([t]), "logprob": v,
                                          "bytes": list(tok.decode([t]).encode())} for t, v in (tops or [])]})
    return {"content": content}
