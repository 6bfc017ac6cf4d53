"""Programs on an in-process Engine: no server, no HTTP.

The forward pass must stay on one thread (ideally the main one), while a program's calls come from its
executor threads. Calls are queued; whichever thread waits (``wait_until``: reading a variable, ``text()``,
``run_batch``) drives the engine's steps, one thread at a time, until what it waits for is done.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from radixlm.lang.backend import GenResult, choice_logprobs, sampling_params
from radixlm.lang.chat_template import RoleTemplate


class EngineBackend:
    def __init__(self, engine=None, **engine_args: Any) -> None:
        if engine is None:
            from radixlm.runtime.engine import Engine  # lazy: importing radixlm.lang never loads torch

            engine = Engine(**engine_args)
        self.engine = engine
        self._lock = threading.Lock()  # held by the thread that steps the engine
        self._inbox: list = []
        self._inbox_lock = threading.Lock()
        self._template: RoleTemplate | None = None

    # ------------------------------------------------------------ driving
    def wait_until(self, done, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not done():
            if end is not None and time.monotonic() > end:
                return False
            if self._lock.acquire(blocking=False):
                try:
                    self._pump()
                finally:
                    self._lock.release()
            else:
                time.sleep(0.001)
        return True

    def _pump(self) -> None:
        """On the driving thread: queue what callers built, then run one scheduler step."""
        with self._inbox_lock:
            batch, self._inbox = self._inbox, []
        core = self.engine.core
        for msgs, box in batch:
            try:
                box.extend(self.engine.submit(msgs))
            except ValueError as e:
                box.append(e)
        if core.has_work():
            core.step()
        else:
            time.sleep(0.001)

    def _run(self, prompts: list[str] | None, params: dict[str, Any], input_ids=None, **logprob: Any) -> list[dict]:
        prompt = None if prompts is None else (prompts if len(prompts) > 1 else prompts[0])
        ids = None if input_ids is None else (input_ids if len(input_ids) > 1 else input_ids[0])
        msgs = self.engine.build(prompt, ids, params, **logprob)
        box: list = []  # filled on the driving thread: the Reqs, or the ValueError that refused them
        with self._inbox_lock:
            self._inbox.append((msgs, box))
        self.wait_until(lambda: bool(box) and all(isinstance(r, Exception) or r.finished is not None for r in box))
        if isinstance(box[0], Exception):
            raise RuntimeError(str(box[0]))
        bad = next((r.finished for r in box if r.finished.status), None)
        if bad is not None:
            raise RuntimeError(bad.message)
        return [self.engine.result(r) for r in box]

    # ------------------------------------------------------------ backend interface
    def generate(self, prompt: str, params: dict[str, Any], logprobs: dict[str, Any] | None = None) -> GenResult:
        res = self._run([prompt], sampling_params(params), **(logprobs or {}))[0]
        return GenResult(text=res["text"], meta_info=res["meta_info"])

    def generate_stream(self, prompt: str, params: dict[str, Any]):
        res = self.generate(prompt, params)  # in-process calls return whole; one chunk
        yield res["text"], res["meta_info"]

    def select(self, prompt: str, choices: list[str], unconditional: bool):
        tok = self.engine.tokenizer
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        self.cache_prefix(prompt)
        start = max(len(prompt_ids) - 2, 0)
        res = self._run([prompt + c for c in choices], {"max_new_tokens": 0}, return_logprob=True,
                        logprob_start_len=start)
        cond = choice_logprobs(prompt_ids, res, start)
        uncond = None
        if unconditional:
            un = self._run(list(choices), {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
            uncond = [[lp or 0.0 for lp, _ in r["meta_info"]["input_token_logprobs"]] for r in un]
        return cond, uncond

    def role_template(self) -> RoleTemplate:
        if self._template is None:
            tok = self.engine.tokenizer
            self._template = RoleTemplate.from_jinja(tok.chat_template, tok.bos_token or "", tok.eos_token or "")
        return self._template

    def cache_prefix(self, prompt: str) -> None:
        if prompt:
            self._run([prompt], {"max_new_tokens": 0})

    def flush_cache(self) -> None:
        self.wait_until(lambda: not self.engine.core.has_work())
        with self._lock:
            self.engine.flush_cache()
