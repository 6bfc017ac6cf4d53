"""The stored side of /v1/responses: the store a server opens, the routes that read and delete a stored
response, and what a new response keeps (its input items, and the conversation through its output)."""

from __future__ import annotations

import os
import sqlite3
import uuid
from typing import Any

from fastapi import FastAPI, Request

from radixlm.runtime.api.errors import ApiError
from radixlm.runtime.api.openai_api.protocol import ResponsesRequest
from radixlm.runtime.api.responses.store import ResponseStore, StoredResponse
from radixlm.runtime.config import ServerConfig

MAX_LIST = 100


def open_store(cfg: ServerConfig) -> ResponseStore | None:
    """The server's store (None with --responses-db off); ValueError naming the flag where it cannot be opened."""
    if cfg.responses_db == "off":
        return None
    path = os.path.expanduser(cfg.responses_db)
    try:
        return ResponseStore(path, cfg.responses_ttl_hours * 3600, cfg.responses_max)
    except (OSError, sqlite3.Error) as e:
        raise ValueError(f"responses_db {cfg.responses_db!r} cannot be opened: {e}") from e


def not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"no response with id {response_id!r}", param=param, code="not_found")


def earlier_turns(store: ResponseStore | None, req: ResponsesRequest, tenant: str | None) -> list[dict[str, Any]]:
    """The conversation ``previous_response_id`` continues (404 where it is unknown, expired or another
    tenant's; 400 where nothing is stored)."""
    if req.previous_response_id is None:
        return []
    if store is None:
        raise ApiError(400, "previous_response_id: this server stores no responses (--responses-db off)",
                       param="previous_response_id")
    record = store.get(tenant, req.previous_response_id)
    if record is None:
        raise not_found(req.previous_response_id, "previous_response_id")
    return record.history


def should_store(store: ResponseStore | None, req: ResponsesRequest) -> bool:
    """store: true where asked for (the API's default); a 400 where asked for and there is no store."""
    if req.store is True and store is None:
        raise ApiError(400, "store: this server stores no responses (--responses-db off); send store=false",
                       param="store")
    return store is not None and req.store is not False


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as the API lists it: items, each with an id."""
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": req.input}]}] \
        if isinstance(req.input, str) else [dict(i) for i in req.input]
    for item in items:
        item.setdefault("type", "message")
        item.setdefault("id", f"msg_{uuid.uuid4().hex[:24]}")
    return items


def keep(store: ResponseStore, tenant: str | None, response: dict[str, Any], inputs: list[dict[str, Any]],
         earlier: list[dict[str, Any]]) -> None:
    store.put(tenant, StoredResponse(response, inputs, [*earlier, *inputs, *response["output"]]))


def add_stored_routes(app: FastAPI, store: ResponseStore | None) -> None:
    def lookup(response_id: str, request: Request) -> StoredResponse:
        record = store.get(request.state.tenant, response_id) if store is not None else None
        if record is None:
            raise not_found(response_id)
        return record

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request):
        return lookup(response_id, request).response

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request):
        if store is None or not store.delete(request.state.tenant, response_id):
            raise not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(response_id: str, request: Request, limit: int = 20, order: str = "desc",
                               after: str | None = None):
        items = lookup(response_id, request).input_items
        return page(items, limit, order, after)


def page(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> dict[str, Any]:
    """OpenAI's list object over ``items`` (oldest first as stored)."""
    if not 1 <= limit <= MAX_LIST:
        raise ApiError(400, f"limit: must be in [1, {MAX_LIST}], got {limit}", param="limit")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"order: must be 'asc' or 'desc', got {order!r}", param="order")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i.get("id") for i in ordered]
        if after not in ids:
            raise ApiError(400, f"after: no input item {after!r} in this response", param="after")
        ordered = ordered[ids.index(after) + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}
