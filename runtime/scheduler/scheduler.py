"""The scheduler: waiting queue -> admission -> chunked prefill -> continuous decode -> release.

A step is ``schedule()`` (a StepPlan: which requests, which mode, which KV slots), the executor's run of it, and
``postprocess()``: append the tokens, stop, release, jump forward, insert into the tree. Prefill has priority:
each step runs either one extend batch (new requests and the chunked one, with running requests riding along
where mixed chunks are on) or one decode batch of every running request (one step, several back to back, or a
speculative verify). The scheduler never calls the model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.decode.grammar import poll_compiles
from radixlm.runtime.decode.speculative import SpecPolicy
from radixlm.runtime.kv.cache_manager import KVCacheManager
from radixlm.runtime.policy import CLIP_MAX_NEW_TOKENS
from radixlm.runtime.request import FinishReason, Req, ReqStatus
from radixlm.runtime.scheduler.postprocess import Postprocessor
from radixlm.runtime.scheduler.prefill import PrefillPlanner
from radixlm.runtime.scheduler.step_groups import StepClock, steps_for
from radixlm.runtime.step_plan import StepOutput, StepPlan, StepResult

log = logging.getLogger("radixlm.scheduler")


class Scheduler:
    """``decode``: token ids -> text (stop strings); ``encode``: text -> ids (jump-forward), None without a
    tokenizer; ``grammars``: () -> GrammarCache, built on first use."""

    def __init__(self, config: EngineConfig, cache: KVCacheManager, max_context: int,
                 decode: Callable[[list[int]], str], encode: Callable[[str], list[int]] | None = None,
                 grammars: Callable | None = None) -> None:
        self.cfg, self.decoding = config.scheduler, config.decoding
        self.clock = StepClock(self.cfg.decode_group_ms / 1000)  # how many steps a group may take
        self.cache = cache
        self.max_context = max_context
        self.grammars = grammars
        self.grammar_queue: list[Req] = []  # constrained requests whose grammar is compiling
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None
        self.pending_aborts: set[str] = set()
        self.failures: dict[str, str] = {}  # rid -> why it must fail (the watchdog)
        self.step_started = time.monotonic()  # when the current step's schedule() began
        self.init_ratio = min(1.0, 0.7 * config.scheduler.schedule_conservativeness)
        self.new_token_ratio = self.init_ratio
        self.stats = {"retractions": 0, "preemptions": 0, "prefill_steps": 0, "decode_steps": 0, "mixed_decode_steps": 0,
                      "grouped_decode_steps": 0, "prompt_tokens": 0, "cached_tokens": 0, "disk_cached_tokens": 0,
                      "jump_forward_tokens": 0}
        self.speculation = SpecPolicy(config.speculative, max_context) \
            if config.speculative.speculative_algorithm else None
        self.prefill = PrefillPlanner(self)
        self.post = Postprocessor(self, decode, encode)

    # ------------------------------------------------------------ queue management
    def add(self, req: Req) -> None:
        if len(req.origin_input_ids) + 1 > self.max_context:
            raise ValueError(f"prompt has {len(req.origin_input_ids)} tokens; the context length is "
                             f"{self.max_context} (prompt + at least one new token)")
        if len(req.origin_input_ids) > self.cache.alloc.capacity - self.cache.page:
            raise ValueError(f"prompt has {len(req.origin_input_ids)} tokens; the KV pool holds "
                             f"{self.cache.alloc.capacity}")
        cap = self.cfg.max_queued_requests
        if cap is not None and len(self.waiting) + len(self.grammar_queue) >= cap:
            raise ValueError(f"the request queue is full ({cap} waiting); retry later")
        if req.constraint is not None:
            if self.grammars is None:
                raise ValueError("constraint: this engine has no tokenizer, so no grammar backend")
            req.grammar_future = self.grammars().get(req.constraint)
            req.status = ReqStatus.COMPILING
            self.grammar_queue.append(req)
            return
        req.status = ReqStatus.WAITING
        self.waiting.append(req)

    def abort(self, rid: str) -> None:
        """Abort ``rid`` and any request whose rid starts with it (the n > 1 children of a parent rid)."""
        self.pending_aborts.add(rid)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked or self.pending_aborts or self.grammar_queue
                    or self.failures)

    def live_requests(self) -> list[Req]:
        """Requests holding KV: running, chunked, and waiting ones that keep their row (after jump-forward)."""
        held = [r for r in self.waiting if r.row is not None]
        return self.running + ([self.chunked] if self.chunked else []) + held

    def queued(self) -> list[Req]:
        """Every request the scheduler holds, finished or not yet released."""
        return self.grammar_queue + self.waiting + self.running + ([self.chunked] if self.chunked else [])

    # ------------------------------------------------------------ the step
    def schedule(self) -> StepPlan:
        """Apply aborts and finished compiles, then plan a prefill if one can be admitted, else decode."""
        self.step_started = time.monotonic()
        ended = self._apply_aborts()
        if self.grammar_queue:
            idle = not (self.waiting or self.running or self.chunked)
            ready, failed = poll_compiles(self.grammar_queue, self.decoding.grammar_timeout_s, 0.01 if idle else 0)
            for r in ready:
                r.status = ReqStatus.WAITING
            self.waiting += ready
            ended += failed
        entries = self.prefill.plan()
        if entries:
            riders = self.prefill.riders()
            return StepPlan("prefill", entries, riders, ended=ended, sampled=[e.req for e in riders] + [
                e.req for e in entries if e.completes and e.req.params.max_new_tokens > 0])
        plan = self._schedule_decode()
        plan.ended = ended
        return plan

    def postprocess(self, plan: StepPlan, result: StepResult | None) -> list[StepOutput]:
        """Apply the executor's result to the requests -> each request's new tokens (and the ended ones')."""
        outputs = [StepOutput(r, [], True) for r in plan.ended]
        if plan.mode != "idle":
            outputs += self.post.apply(plan, result)
        if self.cfg.check_invariants:
            self.check_invariants()
        return outputs

    def check_invariants(self) -> None:
        msg = self.cache.check(self.live_requests())
        if msg:
            raise RuntimeError(msg)
        if self.cache.tree is not None:
            self.cache.tree.check_integrity()
            if not self.live_requests() and self.cache.tree.protected_size:
                raise RuntimeError(f"KV leak: {self.cache.tree.protected_size} tokens still locked while idle")
        for req in self.queued():
            if req.status == ReqStatus.FINISHED:
                raise RuntimeError(f"{req.rid} is finished but still queued")

    def _apply_aborts(self) -> list[Req]:
        ended = []
        if self.failures:
            failures, self.failures = self.failures, {}
            for req in self.queued():
                if req.rid in failures and req.finished is None:
                    req.finished = FinishReason("abort", message=failures[req.rid], status=503)
                    self.release(req, insert=False)
                    ended.append(req)
        if not self.pending_aborts:
            return ended
        prefixes, self.pending_aborts = tuple(self.pending_aborts), set()
        for req in [r for r in self.queued() if r.rid.startswith(prefixes)]:
            req.finished = FinishReason("abort", message="aborted by request")
            self.release(req, insert=req.row is not None)
            ended.append(req)
        return ended

    # ------------------------------------------------------------ decode
    def _schedule_decode(self) -> StepPlan:
        """Every running request: a verify (speculation drafted), or decode steps, one or several back to back.
        Short of KV, speculation and back-to-back steps go first, then requests are retracted."""
        if not self.running:
            return StepPlan()
        drafts = self.speculation.plan(self.running) if self.speculation else None
        if drafts is not None and not any(SpecPolicy.sizes(drafts)):
            drafts = None
        steps = 1 if drafts is not None or self.waiting or self.grammar_queue or self.failures \
            else steps_for(self.running, self.clock.fit(self.cfg.decode_steps), self.max_context)
        while self.running:
            sizes = [1 + s for s in SpecPolicy.sizes(drafts)] if drafts else [steps] * len(self.running)
            locs = self.extend_all(self.running, sizes)
            if locs is not None:
                reqs = list(self.running)
                if drafts is not None:
                    return StepPlan("verify", reqs=reqs, locs=locs, drafts=drafts, sampled=reqs)
                return StepPlan("decode", reqs=reqs, locs=locs, steps=steps, sampled=reqs)
            if drafts is not None or steps > 1:
                drafts, steps = None, 1
                continue
            victim = min(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
            self.retract(victim)
            self.new_token_ratio = self.init_ratio
            log.info("KV pool is full: retracted %s (%d tokens generated)", victim.rid, len(victim.output_ids))
        return StepPlan()

    def extend_all(self, reqs: list[Req], sizes: list[int]) -> list[torch.Tensor] | None:
        """KV slots for ``sizes[i]`` more tokens of each request (evicting cached prefixes if needed), or None
        (nothing allocated) when they do not all fit."""
        need = sum(self.cache.pages_needed(r, n) for r, n in zip(reqs, sizes, strict=True))
        if not self.cache.ensure_free_pages(need):
            return None
        return [self.cache.extend(r, n) for r, n in zip(reqs, sizes, strict=True)]

    # ------------------------------------------------------------ moving requests
    def retract(self, req: Req, preempted: bool = False) -> None:
        """Take a running request's KV back and queue it again (its output so far is recomputed as prompt):
        out of KV, or ``preempted`` by a more urgent request."""
        self.running.remove(req)
        self.cache.release(req, insert=False)
        req.num_retractions += 1
        req.status = ReqStatus.RETRACTED
        self.stats["preemptions" if preempted else "retractions"] += 1
        self.waiting.append(req)

    def release(self, req: Req, insert: bool) -> None:
        """A finished request leaves its queue and gives its KV back (``insert``: its tokens into the tree)."""
        queue = {ReqStatus.COMPILING: self.grammar_queue, ReqStatus.WAITING: self.waiting,
                 ReqStatus.RETRACTED: self.waiting, ReqStatus.RUNNING: self.running}.get(req.status)
        if queue is not None and req in queue:
            queue.remove(req)
        if self.chunked is req:
            self.chunked = None
        req.status = ReqStatus.FINISHED
        self.cache.release(req, insert=insert)
        if self.speculation is not None and req.finished is not None and req.finished.type != "abort":
            self.speculation.finished(req)

    def watch(self, seconds: float, mode: str, reqs: list[Req], steps: int = 1) -> None:
        """A step over the watchdog limit is reported and its requests fail (at the next step boundary) instead
        of the server silently stalling; decode steps feed the clock that sizes step groups."""
        if mode == "decode":
            self.clock.observe(seconds, steps)
        if seconds > self.cfg.watchdog_timeout_s:
            log.error("watchdog: a %s step of %d requests took %.2f s (limit %.2f s); failing them",
                      mode, len(reqs), seconds, self.cfg.watchdog_timeout_s)
            for r in reqs:
                self.failures[r.rid] = (f"watchdog: a forward step took {seconds:.2f} s "
                                        f"(limit {self.cfg.watchdog_timeout_s} s)")

    def reserved_tokens(self) -> float:
        """KV the running requests are expected to still need (the admission budget keeps it free)."""
        return sum(min(r.params.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS)
                   for r in self.running) * self.new_token_ratio

    def start_running(self, req: Req) -> None:
        req.status = ReqStatus.RUNNING
        self.running.append(req)

    def requeue_first(self, req: Req) -> None:
        """Back to the head of the queue, keeping its KV row (after a jump-forward: the forced text extends)."""
        self.running.remove(req)
        req.status = ReqStatus.WAITING
        self.waiting.insert(0, req)
