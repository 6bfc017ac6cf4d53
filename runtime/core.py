"""EngineCore: the one object that builds the model runner, KV cache, radix tree and scheduler from a config.

Both fronts are thin layers on it: the offline ``Engine`` (engine.py) and the server's scheduler process
(serve/scheduler_process.py). A request enters as a typed ``GenerateReq`` (request_builder.py) and becomes the
scheduler's ``Req`` here; a step is the scheduler's plan, the executor's run of it and the scheduler's
postprocess (``step``), so the Engine and the server run the very same request the same way.
"""

from __future__ import annotations

import torch

from radixlm.constrained import GrammarCache, make_backend
from radixlm.radix_cache import RadixCache
from radixlm.radix_cache.disk import DiskStore
from radixlm.runtime.config import SPECULATIVE_METHODS, EngineConfig
from radixlm.runtime.decode.text import ids_to_text
from radixlm.runtime.execute import Executor
from radixlm.runtime.execute.draft_model import DraftModelProposer
from radixlm.runtime.kv.cache_manager import KVCacheManager
from radixlm.runtime.kv.disk_tier import DiskTier
from radixlm.runtime.messages import GenerateReq
from radixlm.runtime.model.distributed import PlanBroadcaster
from radixlm.runtime.model.draft import check_vocabulary, draft_runner, load_draft, vocabulary
from radixlm.runtime.model.kv_fingerprint import kv_fingerprint
from radixlm.runtime.model.llama import LlamaForCausalLM
from radixlm.runtime.model.loader import load_for, resolve_quantization
from radixlm.runtime.model.runner import ModelRunner
from radixlm.runtime.model.tokenizer_files import turn_end_ids
from radixlm.runtime.request import Req
from radixlm.runtime.request_builder import RequestLimits, build_requests
from radixlm.runtime.scheduler import Scheduler, StepOutput


def open_disk_tier(runner: ModelRunner, cfg: EngineConfig, model_path: str | None) -> DiskTier:
    """The disk tier of --kv-disk-path (ValueError naming the flag where its folder cannot be used)."""
    c = cfg.cache
    try:
        store = DiskStore(c.kv_disk_path, int(c.kv_disk_gb * 2**30), kv_fingerprint(runner, cfg, model_path))
    except OSError as e:
        raise ValueError(f"kv_disk_path {c.kv_disk_path!r} cannot be used: {e}") from e
    return DiskTier(runner.pool, store, c.kv_disk_block)


class EngineCore:
    """``EngineCore(cfg)`` loads ``cfg.load.model``; ``EngineCore(cfg, model, tokenizer)`` wraps a built model
    (tests use a tiny random one; the tokenizer is optional). ``tp_group``: rank 0 of a tensor-parallel group."""

    def __init__(self, cfg: EngineConfig, model: LlamaForCausalLM | None = None, tokenizer=None, *,
                 tp_group=None, progress: bool = True, draft: LlamaForCausalLM | None = None) -> None:
        if cfg.parallel.tp_size > 1 and tp_group is None:
            raise ValueError("tp_size > 1 runs in the server (radixlm serve --tp-size N), not in-process")
        self._load_tokenizer, model_path, target_vocab = None, None, None
        if model is None:
            files, model, dtype, cfg = load_for(cfg, progress=progress)
            model_path = getattr(files, "path", None)
            target_vocab = vocabulary(files) if cfg.speculative.speculative_draft_model else None
            # decoding and the eos id need only the cached Rust tokenizer: transformers' (its import is most
            # of the load) waits for a request that needs it (jump-forward's encode, a grammar's vocabulary)
            light = files.light_tokenizer()
            tokenizer = files.load_tokenizer() if light is None else None
            self._load_tokenizer = files.load_tokenizer
        else:
            dtype = next(model.parameters()).dtype
            kind, _ = resolve_quantization(cfg.load.quantization, None, next(model.parameters()).device)
            cfg = cfg.replace(quantization=kind)
            light = None
        decoder, eos = light if light is not None else (tokenizer, getattr(tokenizer, "eos_token_id", None))
        self.config, self.model, self._tokenizer, self.dtype = cfg, model, tokenizer, dtype
        self.has_tokenizer = decoder is not None
        self._ids_to_text = ids_to_text(decoder, True) if decoder is not None else None
        self.runner = ModelRunner(model, cfg, dtype)
        if tp_group is not None:  # every forward is broadcast to the other ranks first
            self.runner.plan_sink = PlanBroadcaster(self.runner.req_to_token.table, tp_group)
        tree = None if cfg.cache.disable_radix_cache else RadixCache(cfg.cache.page_size, cfg.cache.eviction_policy)
        disk = open_disk_tier(self.runner, cfg, model_path) if cfg.cache.kv_disk_path else None
        self.cache = KVCacheManager(self.runner.allocator, self.runner.req_to_token, tree, disk)
        self.eos_ids = model.cfg.eos_token_ids
        for end in (eos, *(turn_end_ids(decoder) if decoder is not None else ())):
            if end is not None and end not in self.eos_ids:
                self.eos_ids = (*self.eos_ids, end)
        self._grammars: GrammarCache | None = None
        encode = self.encode if self.has_tokenizer else None
        self.scheduler = Scheduler(cfg, self.cache, self.max_context, self.decode, encode,
                                   self.grammar_cache if self.has_tokenizer else None)
        self.executor = Executor(self.runner.forward, self.runner.fused_steps, self.runner.cpu_isa, cfg.speculative,
                                 self._draft_proposer(cfg, draft, target_vocab, progress))
        if self.executor.draft_model is not None:  # its probes spare requests whose prompt it has not run
            self.scheduler.speculation.draft_model = True
        self._seed_rng = torch.Generator().manual_seed(cfg.decoding.random_seed)

    def _draft_proposer(self, cfg: EngineConfig, draft: LlamaForCausalLM | None, target_vocab, progress: bool
                        ) -> DraftModelProposer | None:
        """The separate draft model's proposer: ``draft`` (built in-process), else --speculative-draft-model's."""
        self.draft_runner: ModelRunner | None = None
        if draft is None and cfg.speculative.speculative_draft_model is None:
            return None
        if draft is None:
            draft = load_draft(cfg, target_vocab, self.model, progress)
        else:
            check_vocabulary(draft, self.model, None, None)
        self.draft_runner, valid = draft_runner(draft, cfg, self.dtype, self.runner)
        return DraftModelProposer(self.draft_runner.forward, valid, self.runner.req_to_token.table, self.runner.cpu_isa)

    @property
    def tokenizer(self):
        """transformers' tokenizer (None for a model built without one), loaded on first use where the engine
        started with the Rust tokenizer alone."""
        if self._tokenizer is None and self._load_tokenizer is not None:
            self._tokenizer = self._load_tokenizer()
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self.runner.max_context

    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    # ------------------------------------------------------------ text
    def encode(self, text: str) -> list[int]:
        """Text inside a sequence (grammar-forced text, a chat template's output): no special tokens added."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_prompt(self, text: str) -> list[int]:
        """A text prompt that starts a sequence: with the special tokens the tokenizer adds (Gemma's and Llama 3's
        <bos>; none for Qwen2 or SmolLM2), as llama.cpp adds them where the file says add_bos_token."""
        return self.tokenizer(text)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self._ids_to_text(ids) if self._ids_to_text is not None else ""

    def warm_up(self) -> None:
        """Loads what the start deferred (transformers' tokenizer, the grammar backend's vocabulary), so that
        the first request needing them does not wait for it; the scheduler process calls it once when idle."""
        if self.has_tokenizer:
            self.grammar_cache()

    def grammar_cache(self) -> GrammarCache:
        if self._grammars is None:
            backend = make_backend(self.config.decoding.grammar_backend, self.tokenizer, self.vocab_size,
                                   list(self.eos_ids))
            self._grammars = GrammarCache(backend)
        return self._grammars

    # ------------------------------------------------------------ requests
    def build(self, prompts: list[list[int]], params: list, rid: str, **options) -> list[list[GenerateReq]]:
        """request_builder.build_requests with this model's context and vocabulary."""
        options.setdefault("limits", RequestLimits())
        return build_requests(prompts, params, rid, max_context=self.max_context, vocab_size=self.vocab_size,
                              **options)

    def make_req(self, msg: GenerateReq) -> Req:
        """The scheduler's state for one request; a request without a seed draws one from the engine's RNG."""
        if msg.params.stop and not self.has_tokenizer:
            raise ValueError("sampling_params.stop needs a tokenizer")
        self._check_speculative(msg.params.speculative)
        req = Req(msg.rid, msg.input_ids, msg.params, msg.logprob, self.eos_ids, msg.priority, msg.namespace)
        seed = msg.params.seed
        req.generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, (1,), generator=self._seed_rng)))
        req.constraint = msg.constraint
        return req

    def _check_speculative(self, choice: bool | str) -> None:
        """A request may name a speculation method only where the server speculates, and only one it has."""
        if isinstance(choice, bool):
            return
        if self.config.speculative.speculative_algorithm is None:
            raise ValueError(f"sampling_params.speculative: {choice!r} needs a server started with "
                             "--speculative-algorithm (this one does not speculate)")
        if choice not in SPECULATIVE_METHODS:
            raise ValueError(f"sampling_params.speculative must be true, false or one of {SPECULATIVE_METHODS}, "
                             f"got {choice!r}")

    def submit(self, msg: GenerateReq) -> Req:
        """Queue one request (ValueError if the scheduler cannot take it: too long for the pool, queue full)."""
        req = self.make_req(msg)
        self.scheduler.add(req)
        return req

    def step(self) -> list[StepOutput]:
        """One step: the scheduler's plan, the executor's run of it, the scheduler's postprocess."""
        plan = self.scheduler.schedule()
        result = self.executor.run(plan) if plan.mode != "idle" else None
        if plan.mode == "prefill" and self.cache.disk is not None:  # what recomputing costs, for load-or-compute
            self.cache.disk.note_prefill(sum(e.n for e in plan.entries), result.seconds)
        return self.scheduler.postprocess(plan, result)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def abort(self, rid: str) -> None:
        self.scheduler.abort(rid)

    # ------------------------------------------------------------ admin
    def flush_cache(self) -> tuple[int, int]:
        """Drop the radix cache -> (tokens flushed, tokens kept). Idle, all of it; under load, every node no
        running request holds (what is locked stays, so nothing running breaks)."""
        tree = self.cache.tree
        if tree is None:
            return 0, 0
        if self.scheduler.has_work():
            freed = tree.evict(tree.evictable_size)
            self.cache.alloc.free_slots(freed)
            return len(freed), tree.protected_size
        flushed = tree.total_size()
        self.cache.alloc.free_slots(tree.evict(flushed))
        tree.reset()
        return flushed, 0

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()

    def close(self) -> None:
        """Drop queued requests; on rank 0 of a TP group, let the other ranks exit."""
        self.scheduler.waiting.clear()
        if self.cache.disk is not None:
            self.cache.disk.close()  # pages still queued are written first
        if self.runner.plan_sink is not None:
            self.runner.plan_sink.close()
