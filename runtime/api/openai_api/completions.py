"""/v1/completions in OpenAI's shape: prompts as text or token ids, echo, best_of, legacy logprobs, streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixlm.runtime.api.errors import ApiError
from radixlm.runtime.api.openai_api.params import check_model, sampling_from
from radixlm.runtime.api.openai_api.protocol import CompletionRequest
from radixlm.runtime.api.serving import Choice, Serving, finish_reason, now, sse, usage
from radixlm.runtime.messages import LogprobOptions


def completion_prompts(serving: Serving, prompt) -> list[list[int]]:
    tok = serving.client.tokenizer
    if isinstance(prompt, str):
        return [tok(prompt)["input_ids"]]  # a prompt starts a sequence: the special tokens the tokenizer adds
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    return [tok(p)["input_ids"] if isinstance(p, str) else list(p) for p in prompt]


async def completions(serving: Serving, req: CompletionRequest, request: Request):
    model = check_model(serving, req.model)
    if req.suffix is not None:
        raise ApiError(400, "suffix: not supported (this server does no fill-in-the-middle)", param="suffix")
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
    tok = serving.client.tokenizer
    return [t if t is not None else tok.decode(g[0].input_ids) for t, g in zip(texts, groups, strict=True) for _ in g]


def completion_logprobs(serving: Serving, c: Choice, echo: bool = False) -> dict[str, Any]:
    """OpenAI's legacy logprobs; with echo the prompt's tokens come first (the very first has no logprob)."""
    tok = serving.client.tokenizer
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
