"""The operator's view: the JSON API behind /dashboard (the radix tree, stats and series, requests in flight)
and the static pages (/dashboard, and the chat playground at / and /playground).

The pages are static files shipped with the package (no build step, nothing fetched from outside) and hold
no data, so they load without the API key; every JSON route here needs it like the rest of the API.
Answers are bounded: at most MAX_TOP nodes, MAX_LISTED requests, HISTORY samples.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse

from radixlm.radix_cache.snapshot import MAX_DEPTH, MAX_TOP
from radixlm.runtime.api.errors import ApiError
from radixlm.runtime.api.serving import Serving
from radixlm.runtime.messages import CacheViewResp, as_json

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
PAGES = {"/": "playground.html", "/playground": "playground.html", "/dashboard": "dashboard.html"}
STATIC_FILES = ("dashboard.js", "playground.js", "common.js", "style.css")
PUBLIC_PATHS = frozenset(PAGES) | {f"/static/{f}" for f in STATIC_FILES}  # no key needed: no data in them
PREVIEW_TOKENS = 8
MEDIA = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}


def int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer in [{lo}, {hi}], got {raw!r}", param=name) from None
    if not lo <= value <= hi:
        raise ApiError(400, f"{name} must be an integer in [{lo}, {hi}], got {value}", param=name)
    return value


def add_routes(app: FastAPI, serving: Serving, server_info: dict[str, Any]) -> None:
    client, previews = serving.client, serving.cfg.dashboard_previews == "on"

    def preview(ids) -> str | None:
        return client.tokenizer.decode(list(ids), skip_special_tokens=False) if previews and ids else None

    async def view(request: Request, top: int = 0, depth: int = 1, namespace: str | None = None) -> CacheViewResp:
        """top 0: the requests only. With several tenants, each sees only its own namespaces: the rest are
        dropped here, after the scheduler's top-N (namespaces split at the root, so what is left is whole)."""
        tenant = request.state.tenant
        if namespace is not None and not serving.tenancy.owns(tenant, namespace):
            raise ApiError(400, f"namespace {namespace!r} holds nothing in the cache", param="namespace")
        resp = await client.cache_view(top, depth, namespace, PREVIEW_TOKENS if previews else 0)
        if resp.error:
            raise ApiError(400, resp.error, param="namespace" if "namespace" in resp.error else None)
        owns = functools.partial(serving.tenancy.owns, tenant)
        resp.nodes = [n for n in resp.nodes if owns(n.namespace)]
        resp.namespaces = {k: v for k, v in resp.namespaces.items() if owns(k)}
        resp.requests = [r for r in resp.requests if owns(r.namespace)]
        return resp

    @app.get("/cache/tree")
    async def cache_tree(request: Request):
        top = int_param(request, "top", 50, 1, MAX_TOP)
        depth = int_param(request, "depth", 8, 1, MAX_DEPTH)
        namespace = request.query_params.get("namespace") or None
        resp = await view(request, top, depth, namespace)
        nodes = [{**{f: getattr(n, f) for f in n.__dataclass_fields__ if f != "preview_ids"},
                  "preview": preview(n.preview_ids)} for n in resp.nodes]
        return {"nodes": nodes, "namespaces": resp.namespaces, "previews": previews, "top": top, "depth": depth}

    @app.get("/cache/stats")
    async def cache_stats(request: Request):
        last = int_param(request, "last", 300, 1, 300)
        return {"now": as_json(client.stats), "series": client.series.recent(last), "server": dashboard_info(server_info)}

    @app.get("/requests")
    async def requests_in_flight(request: Request):
        resp = await view(request)
        reqs = [{**{f: getattr(r, f) for f in r.__struct_fields__ if f != "preview_ids"},
                 "preview": preview(r.preview_ids)} for r in resp.requests]
        return {"total": len(reqs) if serving.tenancy.several else resp.total_requests, "requests": reqs}

    for path, name in PAGES.items():
        app.add_api_route(path, _file_route(name), methods=["GET"], include_in_schema=False)
    for name in STATIC_FILES:
        app.add_api_route(f"/static/{name}", _file_route(name), methods=["GET"], include_in_schema=False)


def _file_route(name: str):
    path = os.path.join(STATIC_DIR, name)
    media = MEDIA[os.path.splitext(name)[1]]

    async def page():
        return FileResponse(path, media_type=media, headers={"Cache-Control": "no-cache"})

    return page


def dashboard_info(info: dict[str, Any]) -> dict[str, Any]:
    """What the dashboard shows of the server: model, hardware, kernels, and the configuration."""
    keys = ("model_path", "dtype", "device", "kernels", "cpu", "threads", "max_context", "kv_total", "invariant")
    return {**{k: info.get(k) for k in keys}, "engine": info.get("engine"), "server": info.get("server")}
