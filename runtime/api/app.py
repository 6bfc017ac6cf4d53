"""The FastAPI app: guards and error shapes, then the routes, each handing off to serving / the tokenizer manager."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixlm.runtime.api import native
from radixlm.runtime.api.dashboard import routes as dashboard
from radixlm.runtime.api.errors import ApiError
from radixlm.runtime.api.limits import BodyLimits
from radixlm.runtime.api.openai_api import routes as openai_routes
from radixlm.runtime.api.responses import routes as responses_routes
from radixlm.runtime.api.scheduler_client import RequestFailed
from radixlm.runtime.api.serving import Serving
from radixlm.runtime.messages import as_json


def error_response(e: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def create_app(serving: Serving, server_info: dict[str, Any]) -> FastAPI:
    app = FastAPI(title="radixlm")
    app.state.serving = serving
    add_guard(app, serving)
    app.add_middleware(BodyLimits, max_bytes=serving.cfg.max_request_bytes)  # outermost: before any parsing
    add_error_handlers(app)
    openai_routes.add_routes(app, serving)
    native.add_routes(app, serving)
    responses_routes.add_routes(app, serving)
    add_admin_routes(app, serving, server_info)
    add_token_routes(app, serving)
    dashboard.add_routes(app, serving, server_info)
    return app


def add_guard(app: FastAPI, serving: Serving) -> None:
    """Every request: the API key (not /health, nor the static pages, which hold no data and ask for the key
    themselves), and 503 once the server is dying. Body size, headers and JSON depth: limits.BodyLimits."""
    app.add_middleware(Guard, serving=serving)


class Guard:
    """A plain ASGI middleware, not ``@app.middleware("http")``: that form (Starlette's BaseHTTPMiddleware)
    passes every chunk of a streamed response through a memory stream between two tasks, per token."""

    def __init__(self, app, serving: Serving) -> None:
        self.app, self.client, self.tenancy = app, serving.client, serving.tenancy
        self.public = dashboard.PUBLIC_PATHS | {"/health"}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        error = self._check(Request(scope))
        if error is not None:
            return await error_response(error)(scope, receive, send)
        await self.app(scope, receive, send)

    def _check(self, request: Request) -> ApiError | None:
        """Sets request.state.tenant (the scope's state, which the routes' requests share)."""
        path, client, tenancy = request.url.path, self.client, self.tenancy
        request.state.tenant = None
        if tenancy.required and path not in self.public:
            request.state.tenant = tenancy.authenticate(request.headers.get("authorization", ""))
            if request.state.tenant is None:
                # OpenAI's own 401 for a wrong key: type invalid_request_error, code invalid_api_key
                return ApiError(401, "invalid or missing API key", code="invalid_api_key")
        if client.dead and path not in ("/metrics",):
            return ApiError(503, client.dead, err_type="server_error")
        if client.draining and path in ("/health", "/health_generate"):
            return ApiError(503, "the server is shutting down (draining)", err_type="server_error")
        return None


def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

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


def add_admin_routes(app: FastAPI, serving: Serving, server_info: dict[str, Any]) -> None:
    client = serving.client

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
        tok = client.tokenizer
        return {"model_path": server_info["model_path"], "served_model_name": serving.model_name,
                "is_generation": True, "max_context": serving.max_context, "chat_template": tok.chat_template,
                "bos_token": tok.bos_token, "eos_token": tok.eos_token}

    @app.get("/server_info")
    async def info():
        return {**server_info, "stats": as_json(client.stats)}

    @app.post("/flush_cache")
    async def flush_cache():
        resp = await client.flush_cache()
        if not resp.ok:
            raise ApiError(400, resp.message)
        return PlainTextResponse(f"Cache flushed: {resp.message}.\n")

    @app.post("/abort_request")
    async def abort_request(body: dict[str, Any]):
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            raise ApiError(400, "rid must be a non-empty string", param="rid")
        client.abort(rid)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(client.metrics.render(), media_type="text/plain; version=0.0.4")


def add_token_routes(app: FastAPI, serving: Serving) -> None:
    client = serving.client

    @app.post("/tokenize")
    async def tokenize(body: dict[str, Any]):
        text = body.get("text", body.get("prompt"))
        if not isinstance(text, str):
            raise ApiError(400, "text must be a string", param="text")
        ids = client.tokenizer(text, add_special_tokens=False)["input_ids"]
        return {"tokens": ids, "count": len(ids), "max_model_len": serving.max_context}

    @app.post("/detokenize")
    async def detokenize(body: dict[str, Any]):
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < len(client.tokenizer) for t in ids):
            raise ApiError(400, "tokens must be a list of token ids", param="tokens")
        return {"text": client.tokenizer.decode(ids)}
