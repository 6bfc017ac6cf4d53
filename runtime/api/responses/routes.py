"""/v1/responses: the chat machinery underneath, output items and streaming events on top, stored
(stored.py) unless the request says store: false.

``ResponseItems`` turns the chat deltas of ``MessageStream`` into Responses output items (reasoning, one
message, function calls) and the SDK's event types; the whole response and the stream come from the same
items, so they agree.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from radixlm.runtime.api.chat.message_stream import MessageStream
from radixlm.runtime.api.openai_api.chat_completions import ChatPlan, plan_chat, reasoning_budget
from radixlm.runtime.api.openai_api.params import check_model
from radixlm.runtime.api.openai_api.protocol import ResponsesRequest
from radixlm.runtime.api.responses.input import (
    chat_messages,
    chat_tool_choice,
    chat_tools,
    check_unsupported,
    text_spec,
)
from radixlm.runtime.api.responses.store import ResponseStore
from radixlm.runtime.api.responses.stored import (
    add_stored_routes,
    earlier_turns,
    input_items,
    keep,
    open_store,
    should_store,
)
from radixlm.runtime.api.serving import Choice, Serving, finish_reason, now, sse, usage
from radixlm.runtime.messages import LogprobOptions


class ResponseItems:
    """Output items built from chat deltas; ``feed`` returns the events that each delta makes."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.items: list[dict[str, Any]] = []
        self.by_key: dict[Any, int] = {}

    def _open(self, key: Any, item: dict[str, Any], events: list[dict[str, Any]]) -> int:
        """The item for ``key``, added (with its added events appended to ``events``) the first time."""
        if key in self.by_key:
            return self.by_key[key]
        idx = len(self.items)
        self.items.append(item)
        self.by_key[key] = idx
        events.append({"type": "response.output_item.added", "output_index": idx, "item": dict(item, content=[])
                       if "content" in item else dict(item)})
        if item["type"] in ("message", "reasoning"):
            part = {"type": "output_text", "text": "", "annotations": []} if item["type"] == "message" \
                else {"type": "reasoning_text", "text": ""}
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": idx,
                           "content_index": 0, "part": part})
        return idx

    def feed(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if "reasoning_content" in delta:
            idx = self._open("reasoning", {"type": "reasoning", "id": f"rs_{self.rid}", "summary": [],
                                           "content": [{"type": "reasoning_text", "text": ""}],
                                           "status": "in_progress"}, events)
            self.items[idx]["content"][0]["text"] += delta["reasoning_content"]
            events.append({"type": "response.reasoning_text.delta", "item_id": f"rs_{self.rid}",
                           "output_index": idx, "content_index": 0, "delta": delta["reasoning_content"]})
        if "content" in delta:
            idx = self._open("message", {"type": "message", "id": f"msg_{self.rid}", "role": "assistant",
                                         "status": "in_progress",
                                         "content": [{"type": "output_text", "text": "", "annotations": []}]}, events)
            self.items[idx]["content"][0]["text"] += delta["content"]
            events.append({"type": "response.output_text.delta", "item_id": f"msg_{self.rid}", "output_index": idx,
                           "content_index": 0, "delta": delta["content"], "logprobs": []})
        for tc in delta.get("tool_calls", []):
            key = ("call", tc["index"])
            if "id" in tc:
                self._open(key, {"type": "function_call", "id": f"fc_{tc['id']}", "call_id": tc["id"],
                                 "name": tc["function"]["name"], "arguments": "", "status": "in_progress"}, events)
            idx = self.by_key[key]
            if tc["function"]["arguments"]:
                self.items[idx]["arguments"] += tc["function"]["arguments"]
                events.append({"type": "response.function_call_arguments.delta", "item_id": self.items[idx]["id"],
                               "output_index": idx, "delta": tc["function"]["arguments"]})
        return events

    def close(self, status: str) -> list[dict[str, Any]]:
        """Every item done, in order."""
        events = []
        for idx, item in enumerate(self.items):
            item["status"] = status
            if item["type"] == "function_call":
                events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                               "output_index": idx, "name": item["name"], "arguments": item["arguments"]})
            else:
                part, kind = item["content"][0], "output_text" if item["type"] == "message" else "reasoning_text"
                events.append({"type": f"response.{kind}.done", "item_id": item["id"], "output_index": idx,
                               "content_index": 0, "text": part["text"], **({"logprobs": []}
                                                                            if item["type"] == "message" else {})})
                events.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": idx,
                               "content_index": 0, "part": part})
            events.append({"type": "response.output_item.done", "output_index": idx, "item": item})
        return events


def add_routes(app: FastAPI, serving: Serving) -> None:
    store = open_store(serving.cfg)

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request):
        return await create_response(serving, store, req, request)

    add_stored_routes(app, store)


async def create_response(serving: Serving, store: ResponseStore | None, req: ResponsesRequest, request: Request):
    model = check_model(serving, req.model)
    check_unsupported(req)
    tenant = request.state.tenant
    stored, earlier, inputs = should_store(store, req), earlier_turns(store, req, tenant), input_items(req)
    budget = reasoning_budget(serving, (req.reasoning or {}).get("effort"), req.max_reasoning_tokens, "reasoning")
    sampling = {"max_new_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
                "top_k": req.top_k, "min_p": req.min_p, "seed": req.seed}
    plan = plan_chat(serving, req, chat_messages(req, [*earlier, *inputs]), chat_tools(req.tools),
                     chat_tool_choice(req.tool_choice), req.parallel_tool_calls, text_spec(req.text), budget,
                     sampling, LogprobOptions(), request, "resp_")
    keeper = (lambda final: keep(store, tenant, final, inputs, earlier)) if stored else None
    head = {"id": plan.rid, "object": "response", "created_at": now(), "model": model, "error": None,
            "instructions": req.instructions, "metadata": req.metadata or {}, "tools": req.tools or [],
            "tool_choice": req.tool_choice or "auto", "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id, "reasoning": req.reasoning or {"effort": None},
            "store": stored,
            "text": req.text or {"format": {"type": "text"}}, "truncation": "disabled", "background": False}
    if req.stream:
        events = await serving.start_stream(plan.groups[0], request.is_disconnected)
        return StreamingResponse(response_events(serving, plan, events, head, keeper),
                                 media_type="text/event-stream")
    choices = await serving.run(plan.groups, request.is_disconnected)
    items = ResponseItems(plan.rid.removeprefix("resp_"))
    stream = MessageStream(plan.prompt.syntax, plan.call_prefix)
    for delta in stream.feed("".join(choices[0].text), finished=True):
        items.feed(delta)
    final = finished(serving, plan, head, items, choices[0])[0]
    if keeper is not None:
        keeper(final)
    return final


def finished(serving: Serving, plan: ChatPlan, head: dict, items: ResponseItems, c: Choice) -> tuple[dict, list]:
    """The final response object, and the events that close its items."""
    cut = finish_reason(c.last) == "length"
    closing = items.close("incomplete" if cut else "completed")
    u = usage(plan.groups, [c])
    reasoning = "".join(p["text"] for i in items.items if i["type"] == "reasoning" for p in i["content"])
    reasoning_tokens = len(serving.client.tokenizer(reasoning, add_special_tokens=False)["input_ids"]) if reasoning else 0
    return {**head, "status": "incomplete" if cut else "completed", "output": items.items,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "usage": {"input_tokens": u["prompt_tokens"], "input_tokens_details": u["prompt_tokens_details"],
                      "output_tokens": u["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, u["completion_tokens"])},
                      "total_tokens": u["total_tokens"]}}, closing


async def response_events(serving: Serving, plan: ChatPlan, events, head: dict,
                          keeper: Callable[[dict], None] | None) -> AsyncIterator[str]:
    seq = 0

    def event(obj: dict[str, Any]) -> str:
        nonlocal seq
        seq += 1
        return f"event: {obj['type']}\n" + sse({**obj, "sequence_number": seq - 1})

    start = {**head, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield event({"type": "response.created", "response": start})
    yield event({"type": "response.in_progress", "response": start})
    items = ResponseItems(plan.rid.removeprefix("resp_"))
    stream = MessageStream(plan.prompt.syntax, plan.call_prefix)
    choice = Choice(0)
    try:
        async for _, u in events:
            choice.add(u)
            for delta in stream.feed(u.text, u.finished):
                for e in items.feed(delta):
                    yield event(e)
    except Exception as e:  # an error after the stream began: OpenAI's failed event
        msg = getattr(e, "message", str(e))
        yield event({"type": "response.failed", "response": {**start, "status": "failed",
                                                              "error": {"code": "server_error", "message": msg}}})
        return
    final, closing = finished(serving, plan, head, items, choice)
    if keeper is not None:
        keeper(final)
    for e in closing:
        yield event(e)
    yield event({"type": "response.completed" if final["status"] == "completed" else "response.incomplete",
                 "response": final})
