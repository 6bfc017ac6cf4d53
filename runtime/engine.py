"""The offline, in-process Engine: a thin front on EngineCore (core.py) with a blocking, streaming and async API."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.core import EngineCore
from radixlm.runtime.decode.text import IncrementalText
from radixlm.runtime.messages import GenerateReq, LogprobOptions, spec_meta
from radixlm.runtime.model.llama import LlamaForCausalLM
from radixlm.runtime.request import Req
from radixlm.runtime.request_builder import parse_sampling


class Engine:
    """``Engine(model=None, **config)``: the embedded SmolLM2 unless a GGUF file or HF folder is given; every
    keyword is an option of EngineConfig (``radixlm serve --help`` lists them)."""

    def __init__(self, model: str | None = None, *, progress: bool = True, **config: Any) -> None:
        self.core = EngineCore(EngineConfig.from_flat(model=model, **config), progress=progress)
        self._setup()

    @classmethod
    def from_model(cls, model: LlamaForCausalLM, tokenizer=None, draft: LlamaForCausalLM | None = None,
                   **config: Any) -> Engine:
        """An engine around an already built model (tests use a tiny random one; tokenizer optional), with a
        built draft model for speculation where given (--speculative-algorithm draft)."""
        self = cls.__new__(cls)
        self.core = EngineCore(EngineConfig.from_flat(**config), model, tokenizer, draft=draft)
        self._setup()
        return self

    def _setup(self) -> None:
        core = self.core
        self.config, self.model = core.config, core.model
        self.runner, self.cache, self.scheduler = core.runner, core.cache, core.scheduler
        self._rids = itertools.count()
        self._streams: dict[str, asyncio.Queue] = {}
        self._driver: asyncio.Task | None = None
        self._shut_down = False

    @property
    def tokenizer(self):
        """transformers' tokenizer (None if the engine has none), loaded on first use."""
        return self.core.tokenizer

    # ------------------------------------------------------------ building requests
    def build(self, prompt=None, input_ids=None, sampling_params=None, return_logprob: bool = False,
              logprob_start_len: int = -1, top_logprobs_num: int = 0, rid: str | None = None,
              priority: int = 0) -> list[GenerateReq]:
        """The typed requests for one call (n samples of each prompt), validated: nothing is queued yet."""
        prompts = self._prompt_ids(prompt, input_ids)
        given = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(given) != len(prompts):
            raise ValueError(f"sampling_params: {len(given)} given for {len(prompts)} prompts")
        parsed = [parse_sampling(sp) for sp in given]
        logprob = LogprobOptions(return_logprob, logprob_start_len, top_logprobs_num)
        groups = self.core.build(prompts, [p for p, _ in parsed], str(next(self._rids)) if rid is None else rid,
                                 constraints=[c for _, c in parsed], logprob=logprob, priority=priority)
        return [m for g in groups for m in g]

    def _prompt_ids(self, prompt, input_ids) -> list[list[int]]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("prompt: give exactly one of prompt or input_ids")
        if input_ids is not None:
            batch = input_ids if input_ids and isinstance(input_ids[0], list) else [input_ids]
            if not all(isinstance(ids, list) and ids for ids in batch):
                raise ValueError("input_ids: must be a non-empty list of token ids within the vocabulary")
            return [list(ids) for ids in batch]
        texts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise ValueError("prompt: must be a non-empty string or a list of them")
        if not self.core.has_tokenizer:
            raise ValueError("prompt: this engine has no tokenizer; pass input_ids")
        return [self.core.encode_prompt(t) for t in texts]

    def submit(self, msgs: list[GenerateReq]) -> list[Req]:
        """Queue built requests; none is queued if one is refused."""
        if self._shut_down:
            raise RuntimeError("this Engine was shut down (its KV pool is freed); build a new one")
        reqs = [self.core.make_req(m) for m in msgs]
        for req in reqs:
            self.scheduler.add(req)
        return reqs

    def result(self, req: Req) -> dict[str, Any]:
        text = IncrementalText(self.core.decode, req.params.stop, req.params.no_stop_trim).full_text(
            req.output_ids, True, req.finished.matched if req.finished else None)
        meta = {"id": req.rid, "prompt_tokens": len(req.origin_input_ids),
                "completion_tokens": len(req.output_ids), "cached_tokens": req.cached_tokens,
                "cached_tokens_disk": req.disk_cached_tokens,
                "finish_reason": req.finished.to_dict() if req.finished else None,
                "e2e_latency": time.monotonic() - req.arrival, "num_retractions": req.num_retractions,
                "ttft": req.first_token_time - req.arrival if req.first_token_time else None}
        if req.spec_state is not None:
            meta.update(spec_meta(req.spec_state.verify_steps, req.spec_state.drafted, req.spec_state.accepted))
        if req.logprob.return_logprob:
            meta.update(input_token_logprobs=req.input_token_logprobs, output_token_logprobs=req.output_token_logprobs,
                        input_top_logprobs=req.input_top_logprobs, output_top_logprobs=req.output_top_logprobs)
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

    # ------------------------------------------------------------ blocking API
    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob: bool = False,
                 logprob_start_len: int = -1, top_logprobs_num: int = 0, stream: bool = False,
                 rid: str | None = None, priority: int = 0):
        """One prompt -> a dict (a list of n dicts if n > 1); a list of prompts -> a list of dicts."""
        msgs = self.build(prompt, input_ids, sampling_params, return_logprob, logprob_start_len, top_logprobs_num,
                          rid, priority)
        if stream and len(msgs) != 1:
            raise ValueError("stream: supported for one prompt with n = 1")
        reqs = self.submit(msgs)
        if stream:
            return self._stream_sync(reqs[0])
        while any(r.finished is None for r in reqs):
            self.core.step()
        bad = next((r.finished for r in reqs if r.finished.status == 400), None)
        if bad is not None:  # e.g. a grammar that does not compile
            raise ValueError(bad.message)
        results = [self.result(r) for r in reqs]
        single = (isinstance(prompt, str) or (input_ids is not None and not isinstance(input_ids[0], list)))
        return results[0] if single and len(results) == 1 else results

    def _stream_sync(self, req: Req) -> Iterator[dict[str, Any]]:
        text = IncrementalText(self.core.decode, req.params.stop, req.params.no_stop_trim)
        sent_ids = 0
        while True:
            if req.finished is None:
                self.core.step()
            chunk, sent_ids = self._next_chunk(req, text, sent_ids)
            if chunk is not None:
                yield chunk
            if req.finished is not None:
                return

    def _next_chunk(self, req: Req, text: IncrementalText, sent_ids: int) -> tuple[dict[str, Any] | None, int]:
        """The stream chunk to send now (None if nothing new is final yet) and the new count of ids sent."""
        done = req.finished is not None
        delta = text.delta(req.output_ids, done, req.finished.matched if done else None)
        if not (delta or done or len(req.output_ids) > sent_ids):
            return None, sent_ids
        chunk = self.result(req) if done else {"meta_info": {"id": req.rid}}
        chunk.update(text=delta, output_ids=req.output_ids[sent_ids:])
        return chunk, len(req.output_ids)

    def chat(self, messages: list[dict[str, str]], sampling_params=None, **kwargs):
        return self.generate(input_ids=self.apply_chat_template(messages), sampling_params=sampling_params, **kwargs)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        if not messages or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError("messages: must be a non-empty list of {'role', 'content'} dicts")
        if self.tokenizer is None:
            raise ValueError("messages: this engine has no tokenizer")
        return self.core.encode(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    # ------------------------------------------------------------ async API
    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, stream: bool = False,
                             **kwargs) -> Any:
        """Await a result, or with ``stream=True`` get an async iterator of chunks. Runs with other calls."""
        known = ("return_logprob", "logprob_start_len", "top_logprobs_num", "rid", "priority")
        if set(kwargs) - set(known):
            raise ValueError(f"async_generate: unknown argument {sorted(set(kwargs) - set(known))[0]!r}")
        msgs = self.build(prompt, input_ids, sampling_params, **kwargs)
        if stream:
            if len(msgs) != 1:
                raise ValueError("stream: supported for one prompt with n = 1")
            return self._stream_async(self.submit(msgs)[0])
        reqs = self.submit(msgs)
        self._watch(reqs)
        try:
            for r in reqs:
                while r.finished is None:
                    await self._streams[r.rid].get()
        finally:
            self._unwatch(reqs)
        results = [self.result(r) for r in reqs]
        return results[0] if len(results) == 1 else results

    def _watch(self, reqs: list[Req]) -> None:
        for req in reqs:
            self._streams[req.rid] = asyncio.Queue()
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    def _unwatch(self, reqs: list[Req]) -> None:
        for r in reqs:
            if r.finished is None:
                self.core.abort(r.rid)  # the caller went away: free the request's KV
            self._streams.pop(r.rid, None)

    async def _drive(self) -> None:
        """Steps the scheduler on the event loop's thread (the forward pass stays on the main thread)."""
        while self.core.has_work():
            for out in self.core.step():
                q = self._streams.get(out.req.rid)
                if q is not None:
                    q.put_nowait(out)
            await asyncio.sleep(0)
        for q in self._streams.values():  # wake waiters of requests that ended without a step output
            q.put_nowait(None)

    async def _stream_async(self, req: Req) -> AsyncIterator[dict[str, Any]]:
        self._watch([req])
        text = IncrementalText(self.core.decode, req.params.stop, req.params.no_stop_trim)
        sent_ids = 0
        try:
            while True:
                await self._streams[req.rid].get()
                chunk, sent_ids = self._next_chunk(req, text, sent_ids)
                if chunk is not None:
                    yield chunk
                if req.finished is not None:
                    return
        finally:
            self._unwatch([req])

    # ------------------------------------------------------------ admin
    def abort(self, rid: str) -> None:
        self.core.abort(rid)

    def flush_cache(self) -> tuple[int, int]:
        """Drop the radix cache -> (tokens flushed, tokens kept because running requests hold them)."""
        return self.core.flush_cache()

    def check_invariants(self) -> None:
        self.core.check_invariants()

    def shutdown(self) -> None:
        """Drop queued requests and free the KV pool at once; the engine runs nothing after this."""
        self.core.close()
        self._streams.clear()
        if not self._shut_down:
            self._shut_down = True
            self.runner.release()
            if self.core.draft_runner is not None:
                self.core.draft_runner.release()
