"""/v1/chat/completions, /v1/completions and /v1/models in OpenAI's shapes, streaming included."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from radixlm.constrained.spec import spec_from_response_format
from radixlm.runtime.api.protocol import ChatCompletionRequest, CompletionRequest, SamplingExtras
from radixlm.runtime.api.serving import ApiError, Choice, Serving, finish_reason, now, sse, usage
from radixlm.runtime.api.tool_stream import ToolCallStream
from radixlm.runtime.api.tools import (
    call_arguments,
    call_schema,
    check_tool_results,
    chosen_functions,
    tool_functions,
    tools_system_prompt,
)
from radixlm.runtime.messages import LogprobOptions


def add_routes(app: FastAPI, serving: Serving) -> None:
    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        return await chat_completions(serving, req, request)

    @app.post("/v1/completions")
    async def text_completions(req: CompletionRequest, request: Request):
        return await completions(serving, req, request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": serving.model_name, "object": "model", "created": now(),
                                            "owned_by": "radixlm", "max_model_len": serving.max_context}]}


def check_model(serving: Serving, name: str | None) -> str:
    """Accept the served name, "default", or no name; anything else is OpenAI's 404."""
    if name in (None, "", "default", serving.model_name):
        return serving.model_name
    raise ApiError(404, f"The model '{name}' does not exist (this server serves '{serving.model_name}')",
                   param="model", code="model_not_found")


def sampling_from(req: SamplingExtras, max_tokens: int | None) -> dict[str, Any]:
    """The request's sampling dict (SamplingParams' names, constraint keys included); max_tokens None: until a
    stop or the end of the context, as for every API."""
    return {
        "max_new_tokens": max_tokens, "temperature": req.temperature,
        "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p, "repetition_penalty": req.repetition_penalty,
        "frequency_penalty": req.frequency_penalty, "presence_penalty": req.presence_penalty,
        "stop": [req.stop] if isinstance(req.stop, str) else (req.stop or []),
        "stop_token_ids": req.stop_token_ids or [], "ignore_eos": req.ignore_eos, "min_new_tokens": req.min_tokens,
        "skip_special_tokens": req.skip_special_tokens, "logit_bias": req.logit_bias or None, "n": req.n,
        "seed": req.seed,
        "regex": req.regex, "ebnf": req.ebnf, "json_schema": req.json_schema,
    }


def chat_prompt(serving: Serving, req: ChatCompletionRequest, functions: dict[str, dict]) -> list[int]:
    if len(req.messages) > serving.cfg.max_messages:
        raise ApiError(400, f"at most {serving.cfg.max_messages} messages, got {len(req.messages)}", param="messages")
    check_tool_results(req.messages)
    messages = []
    if functions and req.tool_choice != "none":
        messages.append({"role": "system", "content": tools_system_prompt(functions)})
    for i, m in enumerate(req.messages):
        content = m.content
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(str(part.get("text", "")) for part in content)
        if m.tool_calls:  # an earlier call, shown to the model the way it is asked to write calls
            name, args = call_arguments(m.tool_calls[0], f"messages[{i}].tool_calls[0]")
            content = json.dumps({"name": name, "arguments": args})
        messages.append({"role": m.role, "content": content or ""})
    tok = serving.tm.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def token_logprobs(serving: Serving, c: Choice) -> dict[str, Any]:
    tok = serving.tm.tokenizer
    content = []
    for k, (lp, tid) in enumerate(c.logprobs):
        s = tok.decode([tid])
        tops = c.top_logprobs[k] if k < len(c.top_logprobs) else []
        content.append({"token": s, "logprob": lp, "bytes": list(s.encode()),
                        "top_logprobs": [{"token": tok.decode([t]), "logprob": v, "bytes": list(tok.decode([t]).encode())}
                                         for t, v in (tops or [])]})
    return {"content": content}


async def chat_completions(serving: Serving, req: ChatCompletionRequest, request: Request):
    model = check_model(serving, req.model)
    functions = tool_functions(req.tools)
    forced = chosen_functions(functions, req.tool_choice)
    try:
        spec = call_schema(forced) if forced else spec_from_response_format(
            req.response_format.model_dump() if req.response_format else None)
    except ValueError as e:
        raise ApiError(400, str(e), param="tools" if forced else "response_format") from e
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sampling = sampling_from(req, max_tokens)
    top = req.top_logprobs or 0
    if top and not req.logprobs:
        raise ApiError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    groups = serving.make_reqs([chat_prompt(serving, req, functions)], sampling,
                               logprob=LogprobOptions(req.logprobs, -1, top), priority=req.priority, rid=req.rid,
                               spec=spec, tenant=request.state.tenant, cache_salt=req.cache_salt)
    rid = f"chatcmpl-{groups[0][0].rid}"
    tools = functions if req.tool_choice != "none" else {}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = await serving.start_stream([r for g in groups for r in g], request.is_disconnected)
        return StreamingResponse(chat_stream(serving, groups, events, rid, model, include_usage, req.logprobs, tools),
                                 media_type="text/event-stream")
    choices = await serving.run(groups, request.is_disconnected)
    return {"id": rid, "object": "chat.completion", "created": now(), "model": model,
            "choices": [chat_choice(serving, c, tools, f"call_{rid}_{c.index}", req.logprobs) for c in choices],
            "usage": usage(groups, choices)}


def chat_choice(serving: Serving, c: Choice, tools: dict, call_id: str, logprobs: bool) -> dict[str, Any]:
    stream = ToolCallStream(tools, call_id)
    stream.feed("".join(c.text), finished=True)
    return {"index": c.index, "message": {"role": "assistant", **stream.result()},
            "logprobs": token_logprobs(serving, c) if logprobs else None,
            "finish_reason": "tool_calls" if stream.complete() else finish_reason(c.last)}


async def chat_stream(serving, groups, events, rid, model, include_usage, logprobs, tools) -> AsyncIterator[str]:
    reqs = [r for g in groups for r in g]
    choices = [Choice(i) for i in range(len(reqs))]
    base = {"id": rid, "object": "chat.completion.chunk", "created": now(), "model": model}
    streams = [ToolCallStream(tools, f"call_{rid}_{c.index}") for c in choices]
    for c in choices:
        yield sse({**base, "choices": [{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]})
    try:
        async for i, u in events:
            choices[i].add(u)
            lp = None
            if logprobs and u.output_logprobs:
                tmp = Choice(i, logprobs=u.output_logprobs, top_logprobs=u.output_top_logprobs or [])
                lp = token_logprobs(serving, tmp)
            deltas = streams[i].feed(u.text, u.finished) or ([{}] if u.finished or lp else [])
            for k, delta in enumerate(deltas):
                last = u.finished and k == len(deltas) - 1
                reason = ("tool_calls" if streams[i].complete() else finish_reason(u)) if last else None
                yield sse({**base, "choices": [{"index": i, "delta": delta, "logprobs": lp if k == 0 else None,
                                                "finish_reason": reason}]})
    except ApiError as e:
        yield sse(e.body())
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage(groups, choices)})
    yield "data: [DONE]\n\n"


def completion_prompts(serving: Serving, prompt) -> list[list[int]]:
    tok = serving.tm.tokenizer
    if isinstance(prompt, str):
        return [tok(prompt, add_special_tokens=False)["input_ids"]]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    return [tok(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else list(p) for p in prompt]


async def completions(serving: Serving, req: CompletionRequest, request: Request):
    model = check_model(serving, req.model)
    sampling = sampling_from(req, req.max_tokens)
    best_of = check_best_of(req, serving.cfg.max_n)
    if best_of:
        sampling["n"] = best_of
    top = req.logprobs or 0
    prompts = completion_prompts(serving, req.prompt)
    # echo with logprobs: the prompt's own logprobs too, from its first token (so no cached prefix for it)
    logprob = LogprobOptions(req.logprobs is not None or bool(best_of),
                             0 if req.echo and req.logprobs is not None else -1, top)
    groups = serving.make_reqs(prompts, sampling, logprob=logprob, priority=req.priority, rid=req.rid,
                               tenant=request.state.tenant, cache_salt=req.cache_salt)
    rid = f"cmpl-{groups[0][0].rid}"
    echoes = echo_texts(serving, req.prompt, groups) if req.echo else None
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = await serving.start_stream([r for g in groups for r in g], request.is_disconnected)
        return StreamingResponse(completion_stream(serving, groups, events, rid, model, include_usage, echoes),
                                 media_type="text/event-stream")
    choices = await serving.run(groups, request.is_disconnected)
    all_choices = choices
    if best_of:
        choices, echoes = pick_best(groups, choices, req.n, echoes)
    return {"id": rid, "object": "text_completion", "created": now(), "model": model,
            "choices": [{"index": c.index, "text": (echoes[c.index] if echoes else "") + "".join(c.text),
                         "finish_reason": finish_reason(c.last),
                         "logprobs": completion_logprobs(serving, c, bool(echoes)) if req.logprobs is not None
                         else None} for c in choices],
            "usage": usage(groups, all_choices)}  # best_of: every sample generated counts


def check_best_of(req: CompletionRequest, max_n: int) -> int | None:
    """best_of: None when absent or equal to n; else how many samples to draw per prompt."""
    if req.best_of is None or req.best_of == req.n:
        return None
    if isinstance(req.best_of, bool) or not req.n <= req.best_of <= max_n:
        raise ApiError(400, f"best_of must be an integer in [n, {max_n}], got {req.best_of}", param="best_of")
    if req.stream:
        raise ApiError(400, "best_of cannot be streamed (the best are known only at the end)", param="best_of")
    return req.best_of


def pick_best(groups: list[list], choices: list[Choice], n: int, echoes: list[str] | None):
    """Per prompt, the n samples with the highest total logprob, re-indexed in order; their echoes."""
    picked, texts, k = [], [], 0
    for g in groups:
        mine = choices[k:k + len(g)]
        best = sorted(mine, key=lambda c: -sum(lp for lp, _ in c.logprobs))[:n]
        for c in best:
            texts.append(echoes[c.index] if echoes else "")
            c.index = len(picked)
            picked.append(c)
        k += len(g)
    return picked, texts if echoes else None


def echo_texts(serving: Serving, prompt, groups: list[list]) -> list[str]:
    """echo: each choice's prompt as the client sent it (token ids decoded), one per choice in order."""
    texts = [prompt] if isinstance(prompt, str) else [p if isinstance(p, str) else None for p in prompt] \
        if prompt and not all(isinstance(p, int) for p in prompt) else [None]
    tok = serving.tm.tokenizer
    return [t if t is not None else tok.decode(g[0].input_ids) for t, g in zip(texts, groups, strict=True) for _ in g]


def completion_logprobs(serving: Serving, c: Choice, echo: bool = False) -> dict[str, Any]:
    """OpenAI's legacy logprobs; with echo the prompt's tokens come first (the very first has no logprob)."""
    tok = serving.tm.tokenizer
    pairs = (c.input_logprobs or []) + c.logprobs if echo else c.logprobs
    top_rows = ((c.input_top_logprobs or [None] * len(c.input_logprobs or [])) + c.top_logprobs) if echo \
        else c.top_logprobs
    tokens = [tok.decode([t]) for _, t in pairs]
    offsets, pos = [], 0
    for s in tokens:
        offsets.append(pos)
        pos += len(s)
    tops = [None if top is None else {tok.decode([t]): v for t, v in top} for top in top_rows] \
        if c.top_logprobs else None
    return {"tokens": tokens, "token_logprobs": [lp for lp, _ in pairs], "top_logprobs": tops,
            "text_offset": offsets}


async def completion_stream(serving, groups, events, rid, model, include_usage, echoes=None) -> AsyncIterator[str]:
    reqs = [r for g in groups for r in g]
    choices = [Choice(i) for i in range(len(reqs))]
    base = {"id": rid, "object": "text_completion", "created": now(), "model": model}
    for i, text in enumerate(echoes or []):  # echo: the prompt first
        yield sse({**base, "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": None}]})
    try:
        async for i, u in events:
            choices[i].add(u)
            if u.text or u.finished:
                yield sse({**base, "choices": [{"index": i, "text": u.text, "logprobs": None,
                                                "finish_reason": finish_reason(u)}]})
    except ApiError as e:
        yield sse(e.body())
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage(groups, choices)})
    yield "data: [DONE]\n\n"
