"""The OpenAI routes: /v1/chat/completions (chat_completions.py), /v1/completions (completions.py) and
/v1/models."""

from __future__ import annotations

from fastapi import FastAPI, Request

from radixlm.runtime.api.openai_api.chat_completions import chat_completions
from radixlm.runtime.api.openai_api.completions import completions
from radixlm.runtime.api.openai_api.params import check_model, sampling_from
from radixlm.runtime.api.openai_api.protocol import ChatCompletionRequest, CompletionRequest
from radixlm.runtime.api.serving import Serving, now


def add_routes(app: FastAPI, serving: Serving) -> None:
    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return await chat_completions(serving, req, request, check_model(serving, req.model),
                                      sampling_from(req, max_tokens))

    @app.post("/v1/completions")
    async def text_completions(req: CompletionRequest, request: Request):
        return await completions(serving, req, request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": serving.model_name, "object": "model", "created": now(),
                                            "owned_by": "radixlm", "max_model_len": serving.max_context}]}
