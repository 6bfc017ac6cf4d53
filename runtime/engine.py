"""The offline, in-process Engine: load a model, submit prompts, get text (blocking, streaming or async)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import torch

from radixlm.constrained import GrammarCache, make_backend, spec_from_sampling
from radixlm.radix_cache import RadixCache
from radixlm.runtime.cache_manager import KVCacheManager
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.detokenize import IncrementalText
from radixlm.runtime.distributed import PlanBroadcaster
from radixlm.runtime.layers import TPInfo
from radixlm.runtime.model_llama import LlamaForCausalLM
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.request import LogprobSettings, Req, SamplingParams
from radixlm.runtime.scheduler import Scheduler
from radixlm.runtime.speculative import spec_meta
from radixlm.runtime.weights import load_model, open_model

DEFAULT_DTYPE = torch.bfloat16  # README: 1.9x the float32 throughput on this CPU (AVX512-BF16 matmuls)


def resolve_dtype(name: str) -> torch.dtype:
    return {"auto": DEFAULT_DTYPE, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for, but torch sees no CUDA device")
    return torch.device("cuda" if name == "cuda" or name == "auto" and torch.cuda.is_available() else "cpu")


def thread_budget(cfg: EngineConfig) -> int:
    """torch threads for this process: the cores shared among the TP ranks on this machine."""
    return cfg.num_threads or max(1, (os.cpu_count() or 1) // cfg.tp_size)


def make_config(model: str | None, overrides: dict[str, Any]) -> EngineConfig:
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"Engine: unknown option {unknown[0]!r}")
    return EngineConfig(model=model, **overrides)


class Engine:
    """``Engine(model=None, **config)``: the embedded SmolLM2 unless a GGUF file or HF folder is given."""

    def __init__(self, model: str | None = None, *, progress: bool = True, tp_group=None, **config: Any) -> None:
        cfg = make_config(model, config)
        if cfg.tp_size > 1 and tp_group is None:
            raise ValueError("tp_size > 1 runs in the server (radixlm serve --tp-size N), not in-process")
        torch.set_num_threads(thread_budget(cfg))
        files = open_model(cfg.model)
        dtype = resolve_dtype(cfg.dtype)
        model_ = load_model(files, dtype, TPInfo(0, cfg.tp_size), progress=progress).to(resolve_device(cfg.device))
        self._setup(cfg, model_, files.load_tokenizer(), dtype, tp_group)

    @classmethod
    def from_model(cls, model: LlamaForCausalLM, tokenizer=None, **config: Any) -> Engine:
        """An engine around an already built model (tests use a tiny random one; tokenizer optional)."""
        self = cls.__new__(cls)
        cfg = make_config(None, config)
        self._setup(cfg, model, tokenizer, next(model.parameters()).dtype)
        return self

    def _setup(self, cfg: EngineConfig, model: LlamaForCausalLM, tokenizer, dtype: torch.dtype,
               tp_group=None) -> None:
        self.config, self.model, self.tokenizer, self.dtype = cfg, model, tokenizer, dtype
        self.runner = ModelRunner(model, cfg, dtype)
        if tp_group is not None:  # rank 0 of a TP group: every forward is broadcast to the other ranks first
            self.runner.plan_sink = PlanBroadcaster(self.runner.req_to_token.table, tp_group)
        tree = None if cfg.disable_radix_cache else RadixCache(cfg.page_size, cfg.eviction_policy)
        self.cache = KVCacheManager(self.runner.allocator, self.runner.req_to_token, tree)
        self._grammars: GrammarCache | None = None
        encode = self._encode if tokenizer is not None else None
        self.scheduler = Scheduler(cfg, self.runner.forward, self.cache, self.runner.max_context, self._decode,
                                   encode, self.grammar_cache if tokenizer is not None else None,
                                   native_sampling=self.runner.native_ops)
        self.eos_ids = model.cfg.eos_token_ids
        if tokenizer is not None and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in self.eos_ids:
            self.eos_ids = (*self.eos_ids, tokenizer.eos_token_id)
        self._rids = itertools.count()
        self._seed_rng = torch.Generator().manual_seed(cfg.random_seed)
        self._streams: dict[str, asyncio.Queue] = {}
        self._driver: asyncio.Task | None = None

    # ------------------------------------------------------------ request building
    def grammar_cache(self) -> GrammarCache:
        if self._grammars is None:
            stop = list(self.eos_ids)
            backend = make_backend(self.config.grammar_backend, self.tokenizer, self.model.cfg.vocab_size, stop)
            self._grammars = GrammarCache(backend)
        return self._grammars

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer else ""

    def _make_reqs(self, prompt, input_ids, sampling_params, logprob: LogprobSettings, rid, priority) -> list[Req]:
        """Validate everything first: a bad item raises ValueError before any request is queued."""
        prompts = self._prompt_ids(prompt, input_ids)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: {len(params)} given for {len(prompts)} prompts")
        reqs = []
        for i, (ids, sp) in enumerate(zip(prompts, params, strict=True)):
            spec = None
            if not isinstance(sp, SamplingParams):
                sp = dict(sp)
                spec = spec_from_sampling(sp)
                sp = SamplingParams.from_dict(sp)
            if sp.stop and self.tokenizer is None:
                raise ValueError("sampling_params.stop needs a tokenizer")
            base = str(next(self._rids)) if rid is None else rid if len(prompts) == 1 else f"{rid}-{i}"
            for j in range(sp.n):
                seed = sp.seed + j if sp.seed is not None else int(torch.randint(2**62, (1,), generator=self._seed_rng))
                req = Req(base if sp.n == 1 else f"{base}-{j}", ids, sp, logprob, self.eos_ids, priority)
                req.generator.manual_seed(seed)
                req.spec = spec
                reqs.append(req)
        for req in reqs:
            self._check_fits(req)
        return reqs

    def _prompt_ids(self, prompt, input_ids) -> list[list[int]]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("prompt: give exactly one of prompt or input_ids")
        if input_ids is not None:
            batch = input_ids if input_ids and isinstance(input_ids[0], list) else [input_ids]
            for ids in batch:
                if not ids or not all(isinstance(t, int) and 0 <= t < self.model.cfg.vocab_size for t in ids):
                    raise ValueError("input_ids: must be a non-empty list of token ids within the vocabulary")
            return [list(ids) for ids in batch]
        texts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise ValueError("prompt: must be a non-empty string or a list of them")
        if self.tokenizer is None:
            raise ValueError("prompt: this engine has no tokenizer; pass input_ids")
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def _check_fits(self, req: Req) -> None:
        n, ctx = len(req.origin_input_ids), self.runner.max_context
        if n + 1 > ctx:
            raise ValueError(f"prompt: {n} tokens do not fit the context length {ctx} with a new token")

    def _result(self, req: Req) -> dict[str, Any]:
        text = IncrementalText(self._decode, req.params.stop, req.params.no_stop_trim).full_text(
            req.output_ids, True, req.finished.matched if req.finished else None)
        meta = {"id": req.rid, "prompt_tokens": len(req.origin_input_ids),
                "completion_tokens": len(req.output_ids), "cached_tokens": req.cached_tokens,
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
        logprob = LogprobSettings(return_logprob, logprob_start_len, top_logprobs_num)
        reqs = self._make_reqs(prompt, input_ids, sampling_params or {}, logprob, rid, priority)
        for req in reqs:
            self.scheduler.add(req)
        if stream:
            if len(reqs) != 1:
                raise ValueError("stream: supported for one prompt with n = 1")
            return self._stream_sync(reqs[0])
        while any(r.finished is None for r in reqs):
            self.scheduler.step()
        bad = next((r.finished for r in reqs if r.finished.status == 400), None)
        if bad is not None:  # e.g. a grammar that does not compile
            raise ValueError(bad.message)
        results = [self._result(r) for r in reqs]
        single = (isinstance(prompt, str) or (input_ids is not None and not isinstance(input_ids[0], list)))
        return results[0] if single and len(results) == 1 else results

    def _stream_sync(self, req: Req) -> Iterator[dict[str, Any]]:
        text = IncrementalText(self._decode, req.params.stop, req.params.no_stop_trim)
        sent_ids = 0
        while True:
            if req.finished is None:
                self.scheduler.step()
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
        chunk = self._result(req) if done else {"meta_info": {"id": req.rid}}
        chunk.update(text=delta, output_ids=req.output_ids[sent_ids:])
        return chunk, len(req.output_ids)

    def chat(self, messages: list[dict[str, str]], sampling_params=None, **kwargs):
        return self.generate(input_ids=self.apply_chat_template(messages), sampling_params=sampling_params, **kwargs)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        if not messages or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError("messages: must be a non-empty list of {'role', 'content'} dicts")
        if self.tokenizer is None:
            raise ValueError("messages: this engine has no tokenizer")
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # ------------------------------------------------------------ async API
    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, stream: bool = False,
                             **kwargs) -> Any:
        """Await a result, or with ``stream=True`` get an async iterator of chunks. Runs with other calls."""
        logprob = LogprobSettings(kwargs.pop("return_logprob", False), kwargs.pop("logprob_start_len", -1),
                                  kwargs.pop("top_logprobs_num", 0))
        reqs = self._make_reqs(prompt, input_ids, sampling_params or {}, logprob, kwargs.pop("rid", None),
                               kwargs.pop("priority", 0))
        if kwargs:
            raise ValueError(f"async_generate: unknown argument {sorted(kwargs)[0]!r}")
        if stream:
            if len(reqs) != 1:
                raise ValueError("stream: supported for one prompt with n = 1")
            return self._stream_async(reqs[0])
        for req in reqs:
            self._submit(req)
        try:
            for r in reqs:
                while r.finished is None:
                    await self._streams[r.rid].get()
        finally:
            for r in reqs:
                if r.finished is None:
                    self.scheduler.abort(r.rid)
                self._streams.pop(r.rid, None)
        results = [self._result(r) for r in reqs]
        return results[0] if len(results) == 1 else results

    def _submit(self, req: Req) -> None:
        self._streams[req.rid] = asyncio.Queue()
        self.scheduler.add(req)
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        """Steps the scheduler on the event loop's thread (the forward pass stays on the main thread)."""
        while self.scheduler.has_work():
            for out in self.scheduler.step():
                q = self._streams.get(out.req.rid)
                if q is not None:
                    q.put_nowait(out)
            await asyncio.sleep(0)
        for q in self._streams.values():  # wake waiters of requests that ended without a step output
            q.put_nowait(None)

    async def _stream_async(self, req: Req) -> AsyncIterator[dict[str, Any]]:
        self._submit(req)
        text = IncrementalText(self._decode, req.params.stop, req.params.no_stop_trim)
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
            if req.finished is None:
                self.scheduler.abort(req.rid)  # the consumer went away: free the request's KV
            self._streams.pop(req.rid, None)

    # ------------------------------------------------------------ admin
    def abort(self, rid: str) -> None:
        self.scheduler.abort(rid)

    def flush_cache(self) -> None:
        if self.scheduler.has_work():
            raise ValueError("flush_cache: requests are queued or running")
        if self.cache.tree is not None:
            self.cache.alloc.free_slots(self.cache.tree.evict(self.cache.tree.total_size()))
            self.cache.tree.reset()

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()

    def shutdown(self) -> None:
        self.scheduler.waiting.clear()
        self._streams.clear()
