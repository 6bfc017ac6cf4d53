"""Our server over HTTP (native /generate), and a local server process started for the program."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx

from radixlm.lang.backend import GenResult, choice_logprobs, sampling_params, wait_polling
from radixlm.lang.chat_template import RoleTemplate


class RuntimeEndpoint:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600,
                 cache_salt: str | None = None) -> None:
        """``api_key`` is the tenant (its radix namespace); ``cache_salt`` splits it further, for every call
        this endpoint makes, the prefix hints of run_batch included."""
        self.base_url = base_url.rstrip("/")
        self.cache_salt = cache_salt
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self._template: RoleTemplate | None = None

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        if self.cache_salt is not None and path == "/generate":
            body = {**body, "cache_salt": self.cache_salt}
        r = self.client.post(path, json=body)
        if r.status_code != 200:
            try:
                msg = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = r.text[:300]
            raise RuntimeError(f"{path}: HTTP {r.status_code}: {msg}")
        return r.json()

    def generate(self, prompt: str, params: dict[str, Any], logprobs: dict[str, Any] | None = None) -> GenResult:
        body = {"text": prompt, "sampling_params": sampling_params(params), **(logprobs or {})}
        out = self._post("/generate", body)
        return GenResult(text=out["text"], meta_info=out["meta_info"])

    def generate_stream(self, prompt: str, params: dict[str, Any]) -> Iterator[tuple[str, dict | None]]:
        body = {"text": prompt, "sampling_params": sampling_params(params), "stream": True}
        sent = ""
        with self.client.stream("POST", "/generate", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"/generate: HTTP {r.status_code}: {r.read()[:300]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"/generate: {event['error']['message']}")
                text = event["text"]
                yield text[len(sent):], event["meta_info"] if event["meta_info"].get("finish_reason") else None
                sent = text

    def select(self, prompt: str, choices: list[str], unconditional: bool):
        prompt_ids = self._post("/tokenize", {"text": prompt})["tokens"]
        self.cache_prefix(prompt)
        start = max(len(prompt_ids) - 2, 0)  # two tokens back: room for token healing at the boundary
        res = self._post("/generate", {"text": [prompt + c for c in choices], "return_logprob": True,
                                       "logprob_start_len": start, "sampling_params": {"max_new_tokens": 0}})
        cond = choice_logprobs(prompt_ids, res, start)
        uncond = None
        if unconditional:
            un = self._post("/generate", {"text": list(choices), "return_logprob": True, "logprob_start_len": 0,
                                          "sampling_params": {"max_new_tokens": 0}})
            uncond = [[lp or 0.0 for lp, _ in r["meta_info"]["input_token_logprobs"]] for r in un]
        return cond, uncond

    def role_template(self) -> RoleTemplate:
        if self._template is None:
            info = self.client.get("/model_info").json()
            self._template = RoleTemplate.from_jinja(info["chat_template"], info.get("bos_token") or "",
                                                     info.get("eos_token") or "")
        return self._template

    def cache_prefix(self, prompt: str) -> None:
        if prompt:
            self._post("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 0}})

    def flush_cache(self) -> None:
        self.client.post("/flush_cache")

    def wait_until(self, done, timeout: float | None = None) -> bool:
        return wait_polling(done, timeout)


class Runtime(RuntimeEndpoint):
    """Starts `radixlm serve` on a free 127.0.0.1 port for this program; stopped at exit."""

    def __init__(self, timeout: float = 600, **server_args: Any) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "radixlm.runtime", "--port", str(port)]
        for k, v in server_args.items():
            flag = "--" + k.replace("_", "-")
            cmd += [flag] if v is True else ([] if v is False else [flag, str(v)])
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, cwd=os.path.expanduser("~"))
        atexit.register(self.shutdown)
        self.endpoint = f"http://127.0.0.1:{port}"
        from radixlm.runtime.serve.health import wait_healthy  # lang reaches the runtime lazily (layering)

        def dead() -> str | None:
            if self.proc.poll() is None:
                return None
            return f"radixlm server failed to start: {self.proc.stderr.read()[-2000:]}"

        try:
            wait_healthy(self.endpoint, timeout, dead, poll=0.3)
        except RuntimeError:
            self.shutdown()
            raise
        super().__init__(self.endpoint)

    def shutdown(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
