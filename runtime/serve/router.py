"""The data-parallel router: one HTTP front for several radixlm servers (replicas), cache-aware by default.

It forwards the OpenAI and native endpoints, streams included, to the replica the policy picks, and marks a
replica down when it cannot be reached or fails its /health probe (a background task re-admits it when it
answers again). A request that could not be delivered is retried on another replica; one that a replica
dropped mid-way fails with a 503. Each response names its replica in the ``x-radixlm-worker`` header.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlm.runtime.api.dashboard.routes import PAGES, STATIC_FILES
from radixlm.runtime.config import RouterConfig
from radixlm.runtime.serve.router_policy import RoutingPolicy

log = logging.getLogger("radixlm.router")
ROUTED = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate")
FORWARDED_HEADERS = ("authorization", "content-type")
WORKER_HEADER = "x-radixlm-worker"


def error(status: int, message: str, err_type: str = "server_error") -> JSONResponse:
    body = {"error": {"message": message, "type": err_type, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers={"Retry-After": "1"} if status == 503 else None)


def routing_text(path: str, body: dict[str, Any], authorization: str = "") -> str:
    """The text whose prefix decides the replica: the caller's namespace (a digest of its API key and
    cache_salt: the replicas keep tenants apart, and so do the router's approximate trees), then the prompt,
    or the chat messages in order."""
    salt = body.get("cache_salt")
    scope = hashlib.sha256(f"{authorization}\0{salt if isinstance(salt, str) else ''}".encode()).hexdigest()[:16]
    return f"{scope}:{_prompt_text(path, body)}"


def _prompt_text(path: str, body: dict[str, Any]) -> str:
    if path == "/v1/responses":
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        body = {"messages": [{"role": "system", "content": body.get("instructions")}] * bool(body.get("instructions"))
                + [m for m in items or [] if isinstance(m, dict)]}
        path = "/v1/chat/completions"
    if path == "/v1/chat/completions":
        parts = []
        for m in body.get("messages") or []:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"{m.get('role', '') if isinstance(m, dict) else ''}:{content or ''}\n")
        return "".join(parts)
    prompt = body.get("prompt") if path == "/v1/completions" else body.get("text", body.get("input_ids"))
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt and isinstance(prompt[0], (str, list)) else prompt
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


class Router:
    def __init__(self, policy: RoutingPolicy, cfg: RouterConfig) -> None:
        self.policy, self.cfg = policy, cfg
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))

    async def route(self, path: str, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "the request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return error(400, "the request body must be a JSON object", "invalid_request_error")
        text, tried = routing_text(path, body, request.headers.get("authorization", "")), set()
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        while True:
            try:
                url = self.policy.pick(text, frozenset(tried)).url
            except LookupError:
                return error(503, "no replica is available")
            try:
                upstream = await self.client.send(
                    self.client.build_request("POST", url + path, content=raw, headers=headers), stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # never delivered: try another replica
                log.warning("replica %s unreachable (%s); marking it down", url, e)
                self.policy.finished(url)
                self.policy.mark(url, False)
                tried.add(url)
                continue
            except httpx.TransportError as e:  # delivered, then the replica went away: it fails here
                self.policy.finished(url)
                self._dropped(url, e)
                return error(503, f"the replica serving this request failed: {e}")
            return await self._relay(url, upstream, bool(body.get("stream")))

    async def _relay(self, url: str, upstream: httpx.Response, stream: bool) -> Response:
        headers = {WORKER_HEADER: url}
        media = upstream.headers.get("content-type", "application/json")
        if not stream or upstream.status_code != 200:
            try:
                content = await upstream.aread()
            except httpx.TransportError as e:
                self._dropped(url, e)
                return error(503, f"the replica serving this request failed: {e}")
            finally:
                await upstream.aclose()
                self.policy.finished(url)
            return Response(content, upstream.status_code, headers=headers, media_type=media)

        async def chunks():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.TransportError as e:
                self._dropped(url, e)
                msg = {"error": {"message": f"the replica serving this request failed: {e}", "type": "server_error"}}
                yield f"data: {json.dumps(msg)}\n\n".encode()
            finally:
                await upstream.aclose()
                self.policy.finished(url)

        return StreamingResponse(chunks(), headers=headers, media_type=media)

    def _dropped(self, url: str, e: Exception) -> None:
        log.warning("replica %s dropped a request (%s); marking it down", url, e)
        self.policy.mark(url, False)

    async def probe_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._probe(url) for url in self.policy.replicas))
            await asyncio.sleep(self.cfg.health_check_interval_s)

    async def _probe(self, url: str) -> None:
        try:
            ok = (await self.client.get(url + "/health", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok != self.policy.replicas[url].up:
            log.warning("replica %s is %s", url, "up" if ok else "down")
            self.policy.mark(url, ok)

    async def first_up(self, method: str, path: str, request: Request) -> Response:
        query = f"?{request.url.query}" if request.url.query else ""
        for r in self.policy.up():
            try:
                resp = await self.client.request(method, r.url + path + query, content=await request.body(),
                                                 headers=dict(request.headers.items()), timeout=30.0)
            except httpx.HTTPError:
                continue
            return Response(resp.content, resp.status_code, media_type=resp.headers.get("content-type"),
                            headers={WORKER_HEADER: r.url})
        return error(503, "no replica is available")


def create_router_app(urls: list[str], cfg: RouterConfig, shared_disk: bool = False) -> FastAPI:
    """``shared_disk``: the replicas share a disk tier (the router remembers what it holds)."""
    router = Router(RoutingPolicy(cfg, [u.rstrip("/") for u in urls], shared_disk), cfg)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        task = asyncio.create_task(router.probe_forever())
        yield
        task.cancel()
        await router.client.aclose()

    app = FastAPI(title="radixlm-router", lifespan=lifespan)
    app.state.router = router
    for path in ROUTED:
        app.add_api_route(path, _route_to(router, path), methods=["POST"])

    @app.get("/health")
    async def health():
        return Response(status_code=200) if router.policy.up() else error(503, "no replica is up")

    @app.get("/router_info")
    async def router_info():
        return {"policy": cfg.router_policy, "replicas": router.policy.info()}

    @app.post("/flush_cache")
    async def flush_cache():
        codes = [(await router.client.post(r.url + "/flush_cache")).status_code for r in router.policy.up()]
        return JSONResponse({"flushed": codes.count(200), "replicas": len(codes)},
                            status_code=200 if codes and all(c == 200 for c in codes) else 400)

    # the pages and the dashboard's JSON API: the first replica up (its tree; the playground's chats are routed)
    for path in ("/v1/models", "/model_info", "/server_info", "/cache/tree", "/cache/stats", "/requests",
                 *PAGES, *(f"/static/{f}" for f in STATIC_FILES)):
        app.add_api_route(path, _first_up(router, "GET", path), methods=["GET"])
    for path in ("/tokenize", "/detokenize"):
        app.add_api_route(path, _first_up(router, "POST", path), methods=["POST"])
    return app


def _route_to(router: Router, path: str):
    async def handler(request: Request) -> Response:
        return await router.route(path, request)
    return handler


def _first_up(router: Router, method: str, path: str):
    async def handler(request: Request) -> Response:
        return await router.first_up(method, path, request)
    return handler
