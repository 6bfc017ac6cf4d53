"""SGLang's native ``/generate``: text or token ids (or batches of them), SGLang's sampling_params and meta_info."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from radixlm.runtime.api.errors import ApiError
from radixlm.runtime.api.openai_api.protocol import GenerateRequest
from radixlm.runtime.api.serving import Choice, Serving, sse
from radixlm.runtime.messages import LogprobOptions, spec_meta


def add_routes(app: FastAPI, serving: Serving) -> None:
    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request):
        return await native_generate(serving, req, request)


async def native_generate(serving: Serving, req: GenerateRequest, request: Request):
    tok = serving.client.tokenizer
    if (req.text is None) == (req.input_ids is None):
        raise ApiError(400, "give exactly one of text or input_ids", param="text")
    single = isinstance(req.text, str) or (req.input_ids is not None and not isinstance(req.input_ids[0], list))
    if req.text is not None:
        texts = [req.text] if isinstance(req.text, str) else req.text
        prompts = [tok(t)["input_ids"] for t in texts]  # with the special tokens the tokenizer adds (<bos>)
    else:
        prompts = [req.input_ids] if single else req.input_ids
    sps = req.sampling_params if isinstance(req.sampling_params, list) else [req.sampling_params or {}] * len(prompts)
    if len(sps) != len(prompts):
        raise ApiError(400, "sampling_params: one per prompt", param="sampling_params")
    logprob = LogprobOptions(req.return_logprob, req.logprob_start_len, req.top_logprobs_num)
    groups = []
    for i, (ids, sp) in enumerate(zip(prompts, sps, strict=True)):
        rid = req.rid if single else (f"{req.rid}-{i}" if req.rid else None)
        groups += serving.make_reqs([ids], sp, logprob=logprob, priority=req.priority, rid=rid,
                                    tenant=request.state.tenant, cache_salt=req.cache_salt)
    if req.stream:
        reqs = [r for g in groups for r in g]
        events = await serving.start_stream(reqs, request.is_disconnected)
        return StreamingResponse(generate_stream(reqs, events), media_type="text/event-stream")
    choices = await serving.run(groups, request.is_disconnected)
    results = [native_result(c, r) for c, r in zip(choices, [r for g in groups for r in g], strict=True)]
    return results[0] if single and len(results) == 1 else results


def native_result(c: Choice, r) -> dict[str, Any]:
    u = c.last
    meta = {"id": r.rid, "finish_reason": u.finish_reason if u else None, "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(c.ids), "cached_tokens": u.cached_tokens if u else 0,
            "cached_tokens_disk": u.disk_cached_tokens if u else 0}
    if u is not None:
        meta.update(spec_meta(u.spec_verify_steps, u.spec_draft_tokens, u.spec_accepted_tokens))
    if r.logprob.return_logprob:
        meta.update(input_token_logprobs=c.input_logprobs, output_token_logprobs=c.logprobs,
                    input_top_logprobs=c.input_top_logprobs, output_top_logprobs=c.top_logprobs)
    return {"text": "".join(c.text), "output_ids": c.ids, "meta_info": meta}


async def generate_stream(reqs, events):
    """SGLang's /generate stream: every event carries the text so far, then [DONE]."""
    choices = [Choice(i) for i in range(len(reqs))]
    try:
        async for i, u in events:
            choices[i].add(u)
            out = native_result(choices[i], reqs[i])
            if len(reqs) > 1:
                out["index"] = i
            yield sse(out)
    except ApiError as e:
        yield sse(e.body())
    yield "data: [DONE]\n\n"
