"""FastAPI routes. Each route validates, then hands off to the tokenizer manager / serving helpers."""

from __future__ import annotations

import hmac
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixlm.runtime import openai_api
from radixlm.runtime.openai_protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from radixlm.runtime.openai_serving import ApiError, Choice, Serving, sse
from radixlm.runtime.speculative import spec_meta
from radixlm.runtime.tokenizer_manager import RequestFailed


def error_response(e: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def create_app(serving: Serving, server_info: dict[str, Any]) -> FastAPI:
    app = FastAPI(title="radixlm")
    tm, cfg = serving.tm, serving.cfg
    app.state.serving = serving

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if cfg.api_key and request.url.path != "/health":
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), cfg.api_key.encode()):
                return error_response(ApiError(401, "invalid or missing API key", code="invalid_api_key",
                                               err_type="authentication_error"))
        size = request.headers.get("content-length")
        if size and size.isdigit() and int(size) > cfg.max_request_bytes:
            return error_response(ApiError(413, f"request body over {cfg.max_request_bytes} bytes"))
        if tm.dead and request.url.path not in ("/metrics",):
            return error_response(ApiError(503, tm.dead, err_type="server_error"))
        return await call_next(request)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError):
        return error_response(e, {"Retry-After": "1"} if e.status == 503 else None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException):
        return error_response(ApiError(e.status_code, str(e.detail), err_type="invalid_request_error"
                                       if e.status_code < 500 else "server_error"))

    @app.exception_handler(RequestFailed)
    async def failed(_: Request, e: RequestFailed):
        return error_response(ApiError(e.status, e.message, err_type="server_error" if e.status >= 500 else
                                       "invalid_request_error"))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError):
        err = e.errors()[0] if e.errors() else {}
        loc = [str(x) for x in err.get("loc", []) if x != "body"]
        param = loc[0] if loc else None
        if err.get("type") == "extra_forbidden":
            msg = f"unsupported parameter: {'.'.join(loc)}"
        elif err.get("type") == "json_invalid":
            msg, param = "the request body is not valid JSON", None
        else:
            msg = f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}"
        return error_response(ApiError(400, msg, param=param))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        return await openai_api.chat_completions(serving, req, request)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await openai_api.completions(serving, req, request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": serving.model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "radixlm", "max_model_len": serving.max_context}]}

    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request):
        return await native_generate(serving, req, request)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate(request: Request):
        groups = serving.make_reqs([[0]], {"max_new_tokens": 1, "temperature": 0})
        await serving.run(groups, request.is_disconnected)
        return Response(status_code=200)

    @app.get("/model_info")
    async def model_info():
        tok = tm.tokenizer
        return {"model_path": server_info["model_path"], "served_model_name": serving.model_name,
                "is_generation": True, "max_context": serving.max_context, "chat_template": tok.chat_template,
                "bos_token": tok.bos_token, "eos_token": tok.eos_token}

    @app.get("/server_info")
    async def info():
        stats = tm.stats
        return {**server_info, "stats": None if stats is None else {f: getattr(stats, f) for f in stats.__struct_fields__}}

    @app.post("/flush_cache")
    async def flush_cache():
        resp = await tm.flush_cache()
        if not resp.ok:
            raise ApiError(400, resp.message)
        return PlainTextResponse("Cache flushed.\n")

    @app.post("/abort_request")
    async def abort_request(body: dict[str, Any]):
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            raise ApiError(400, "rid must be a non-empty string", param="rid")
        tm.abort(rid)
        return Response(status_code=200)

    @app.post("/tokenize")
    async def tokenize(body: dict[str, Any]):
        text = body.get("text", body.get("prompt"))
        if not isinstance(text, str):
            raise ApiError(400, "text must be a string", param="text")
        ids = tm.tokenizer(text, add_special_tokens=False)["input_ids"]
        return {"tokens": ids, "count": len(ids), "max_model_len": serving.max_context}

    @app.post("/detokenize")
    async def detokenize(body: dict[str, Any]):
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < len(tm.tokenizer) for t in ids):
            raise ApiError(400, "tokens must be a list of token ids", param="tokens")
        return {"text": tm.tokenizer.decode(ids)}

    @app.get("/metrics")
    async def metrics():
        return Response(tm.metrics.render(), media_type="text/plain; version=0.0.4")

    return app


async def native_generate(serving: Serving, req: GenerateRequest, request: Request):
    tok = serving.tm.tokenizer
    if (req.text is None) == (req.input_ids is None):
        raise ApiError(400, "give exactly one of text or input_ids", param="text")
    single = isinstance(req.text, str) or (req.input_ids is not None and not isinstance(req.input_ids[0], list))
    if req.text is not None:
        texts = [req.text] if isinstance(req.text, str) else req.text
        prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    else:
        prompts = [req.input_ids] if single else req.input_ids
    sps = req.sampling_params if isinstance(req.sampling_params, list) else [req.sampling_params or {}] * len(prompts)
    if len(sps) != len(prompts):
        raise ApiError(400, "sampling_params: one per prompt", param="sampling_params")
    groups = []
    for i, (ids, sp) in enumerate(zip(prompts, sps, strict=True)):
        sp = dict(sp)
        sp.setdefault("max_new_tokens", 128)
        rid = req.rid if single else (f"{req.rid}-{i}" if req.rid else None)
        groups += serving.make_reqs([ids], sp, return_logprob=req.return_logprob,
                                    logprob_start_len=req.logprob_start_len, top_logprobs_num=req.top_logprobs_num,
                                    priority=req.priority, rid=rid)
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
            "completion_tokens": len(c.ids), "cached_tokens": u.cached_tokens if u else 0}
    if u is not None:
        meta.update(spec_meta(u.spec_verify_steps, u.spec_draft_tokens, u.spec_accepted_tokens))
    if r.return_logprob:
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
