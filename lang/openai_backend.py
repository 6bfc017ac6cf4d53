"""Any OpenAI-compatible server (ours under /v1, vLLM, llama.cpp). Chat models get the messages."""

from __future__ import annotations

import re
from typing import Any

import httpx

from radixlm.lang.backend import GenResult, wait_polling
from radixlm.lang.chat_template import SENTINEL, RoleTemplate

OPENAI_KEYS = {"max_tokens", "stop", "temperature", "top_p", "frequency_penalty", "presence_penalty", "seed"}


class OpenAI:
    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 is_chat_model: bool = True, timeout: float = 600) -> None:
        self.model, self.is_chat = model, is_chat_model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=(base_url or "https://api.openai.com/v1").rstrip("/"), headers=headers,
                                   timeout=timeout)
        # role markers that can be parsed back into messages
        marks = {r: f"{SENTINEL}{r}{SENTINEL}" for r in ("system", "user", "assistant")}
        self.template = RoleTemplate(prefix=marks, suffix={r: SENTINEL + "end" + SENTINEL for r in marks})

    def _messages(self, prompt: str) -> list[dict[str, str]]:
        parts = re.split(re.escape(SENTINEL), prompt)
        messages, i = [], 1
        if parts[0].strip():  # text outside any role goes to the model as a user message
            messages.append({"role": "user", "content": parts[0]})
        while i + 1 < len(parts):
            role, content = parts[i], parts[i + 1]
            if role in ("system", "user", "assistant"):
                messages.append({"role": role, "content": content})
            i += 2
        return [m for m in messages if m["content"] or m["role"] != "assistant"]

    def _body(self, prompt: str, params: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model}
        for k, v in params.items():
            if k in OPENAI_KEYS:
                body[k] = v
            elif k in ("regex", "json_schema", "top_k", "min_p", "ignore_eos"):  # extras our server and vLLM take
                body[k] = v
        if self.is_chat:
            body["messages"] = self._messages(prompt)
        else:
            body["prompt"] = prompt
        return body

    def generate(self, prompt: str, params: dict[str, Any], logprobs: dict[str, Any] | None = None) -> GenResult:
        path = "/chat/completions" if self.is_chat else "/completions"
        r = self.client.post(path, json=self._body(prompt, params))
        if r.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {r.status_code}: {r.text[:300]}")
        data = r.json()
        choice = data["choices"][0]
        text = choice["message"]["content"] if self.is_chat else choice["text"]
        return GenResult(text=text or "", meta_info={"usage": data.get("usage"), "finish_reason": choice["finish_reason"]})

    def generate_stream(self, prompt: str, params: dict[str, Any]):
        res = self.generate(prompt, params)
        yield res["text"], res["meta_info"]

    def select(self, prompt: str, choices: list[str], unconditional: bool):
        """By constrained choice (a regex over the options): the pick gets score 0, the others -inf."""
        pattern = "(" + "|".join(re.escape(c) for c in choices) + ")"
        text = self.generate(prompt, {"regex": pattern, "temperature": 0, "max_tokens": 32})["text"]
        best = max(range(len(choices)), key=lambda i: (text.startswith(choices[i]), len(choices[i])))
        scores = [[0.0] if i == best else [float("-inf")] for i in range(len(choices))]
        return scores, [[0.0] for _ in choices] if unconditional else None

    def role_template(self) -> RoleTemplate:
        return self.template

    def cache_prefix(self, prompt: str) -> None:
        pass  # nothing to warm through the OpenAI API

    def flush_cache(self) -> None:
        pass

    def wait_until(self, done, timeout: float | None = None) -> bool:
        return wait_polling(done, timeout)
