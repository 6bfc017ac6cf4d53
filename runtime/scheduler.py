"""The scheduler core: waiting queue -> admission -> chunked prefill -> continuous decode -> release.

Prefill has priority: each step runs either one extend batch (new requests and the chunked one) or one decode
batch (every running request). Runs on the caller's thread; the offline Engine and the server's scheduler
process both drive it through ``step()``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixlm.runtime.batch import ExtendEntry, ForwardBatch, make_decode_batch, make_extend_batch
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.decode.grammar import jump_forward, poll_compiles
from radixlm.runtime.decode.logprobs import logit_positions, record_output_logprob, record_prompt_logprobs
from radixlm.runtime.decode.sampler import sample
from radixlm.runtime.decode.speculative import SpecDecoder
from radixlm.runtime.decode.step_groups import GroupedSteps, StepClock, run_steps, steps_for, take_tokens
from radixlm.runtime.decode.stopping import append_token
from radixlm.runtime.kv.cache_manager import KVCacheManager
from radixlm.runtime.policy import CLIP_MAX_NEW_TOKENS, PrefillBudget, QueueItem, order_queue
from radixlm.runtime.request import FinishReason, Req

log = logging.getLogger("radixlm.scheduler")


@dataclass
class StepOutput:
    req: Req
    new_tokens: list[int]
    finished: bool


class Scheduler:
    def __init__(self, config: EngineConfig, forward: Callable[[ForwardBatch], torch.Tensor],
                 cache: KVCacheManager, max_context: int, decode: Callable[[list[int]], str],
                 encode: Callable[[str], list[int]] | None = None, grammars: Callable | None = None,
                 cpu_isa: int | None = None, decode_steps: GroupedSteps | None = None) -> None:
        self.cfg, self.decoding = config.scheduler, config.decoding
        self.cpu_isa = cpu_isa  # the path of radixlm's C++ CPU kernels, None without them (sampler.apply_grammars)
        self.forward = forward
        self.decode_steps = decode_steps  # back-to-back decode steps in one call, where the runner has it
        self.clock = StepClock(self.cfg.decode_group_ms / 1000)  # how many steps a group may take
        self.cache = cache
        self.max_context = max_context
        self.decode = decode
        self.encode = encode
        self.grammars = grammars  # () -> GrammarCache, built on first use
        self.grammar_queue: list[Req] = []  # constrained requests whose grammar is compiling
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None
        self.pending_aborts: set[str] = set()
        self.failures: dict[str, str] = {}  # rid -> why it must fail (the watchdog)
        self.init_ratio = min(1.0, 0.7 * config.scheduler.schedule_conservativeness)
        self.new_token_ratio = self.init_ratio
        self.stats = {"retractions": 0, "preemptions": 0, "prefill_steps": 0, "decode_steps": 0, "mixed_decode_steps": 0,
                      "grouped_decode_steps": 0, "prompt_tokens": 0, "cached_tokens": 0, "jump_forward_tokens": 0}
        self.spec = SpecDecoder(config.speculative, forward, cache, decode, max_context, cpu_isa) \
            if config.speculative.speculative_algorithm else None

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
        if req.spec is not None:
            if self.grammars is None:
                raise ValueError("constraint: this engine has no tokenizer, so no grammar backend")
            req.grammar_future = self.grammars().get(req.spec)
            self.grammar_queue.append(req)
            return
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

    # ------------------------------------------------------------ the step
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        outputs = self._apply_aborts()
        if self.grammar_queue:
            idle = not (self.waiting or self.running or self.chunked)
            ready, failed = poll_compiles(self.grammar_queue, self.decoding.grammar_timeout_s, 0.01 if idle else 0)
            self.waiting += ready
            outputs += [StepOutput(r, [], True) for r in failed]
        entries = self._schedule_prefill()
        if entries:
            outputs += self._run_prefill(entries, self._mixed_riders())
        else:
            reqs, locs, plan, steps = self._schedule_decode()
            if reqs:
                outputs += self._run_decode(reqs, locs, plan, steps)
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

    def _apply_aborts(self) -> list[StepOutput]:
        failed = []
        if self.failures:
            failures, self.failures = self.failures, {}
            for req in self.running + ([self.chunked] if self.chunked else []) + self.waiting:
                if req.rid in failures and req.finished is None:
                    req.finished = FinishReason("abort", message=failures[req.rid], status=503)
                    self._release(req, insert=False)
                    failed.append(StepOutput(req, [], True))
        if not self.pending_aborts:
            return failed
        prefixes, self.pending_aborts = tuple(self.pending_aborts), set()
        hit = [r for r in self.grammar_queue + self.waiting + self.running + ([self.chunked] if self.chunked else [])
               if r.rid.startswith(prefixes)]
        for req in hit:
            req.finished = FinishReason("abort", message="aborted by request")
            self._release(req, insert=req.row is not None)
        return failed + [StepOutput(r, [], True) for r in hit]

    # ------------------------------------------------------------ prefill
    def _budget(self) -> PrefillBudget:
        reserved = sum(min(r.params.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS)
                       for r in self.running) * self.new_token_ratio
        return PrefillBudget(
            rem_total=int(self.cache.available() - reserved), rem_input=self.cfg.max_prefill_tokens,
            rem_chunk=self.cfg.chunked_prefill_size,
            rem_reqs=self.cfg.max_running_requests - len(self.running), page_size=self.cache.page)

    def _ordered_waiting(self) -> list[Req]:
        by_rid = {r.rid: r for r in self.waiting}
        items = [QueueItem(r.rid, r.fill_ids, self.cache.peek_prefix_len(r), r.params.max_new_tokens,
                           r.priority, r.arrival, r.namespace) for r in self.waiting]
        policy = self.cfg.schedule_policy if self.cache.tree is not None else "fcfs"
        in_flight = [QueueItem(r.rid, r.fill_ids, 0, 0) for r in ([self.chunked] if self.chunked else [])]
        order = order_queue(items, policy, time.monotonic(), self.cfg.max_wait_s, self.cfg.lpm_max_queue,
                            in_flight=in_flight)
        return [by_rid[i.rid] for i in order]

    def _schedule_prefill(self) -> list[ExtendEntry]:
        if not self.waiting and self.chunked is None:
            return []
        budget, entries = self._budget(), []
        if self.chunked is None and (budget.rem_reqs <= 0 or budget.rem_total <= 0) and not self._urgent_waiting():
            return []  # nothing can be admitted: skip ordering the queue (it costs a pass over every prompt)
        candidates = ([self.chunked] if self.chunked else []) + self._ordered_waiting()
        self._maybe_preempt(candidates, budget)
        for req in candidates:
            fresh = req.row is None
            if fresh and not self.cache.admit(req):
                break
            todo = len(req.fill_ids) - req.kv_len
            n = budget.admit(todo, req.params.max_new_tokens - len(req.output_ids), batch_empty=not entries)
            loc = self.cache.extend(req, n) if n else None
            if loc is None:
                if fresh:
                    self.cache.release(req, insert=False)
                break
            if req in self.waiting:  # fresh, or back after a jump-forward (it kept its KV row)
                self.waiting.remove(req)
            if fresh:
                req.admit_time = req.admit_time or time.monotonic()
                if not req.output_ids and req.num_retractions == 0:
                    req.cached_tokens = req.prefix_len
                    self.stats["prompt_tokens"] += len(req.origin_input_ids)
                    self.stats["cached_tokens"] += req.prefix_len
            entries.append(ExtendEntry(req, req.kv_len, n, loc, logit_positions(req, req.kv_len, n)))
            if n < todo:  # at most one chunked request, and it ends the batch
                self.chunked = req
                break
            if self.chunked is req:
                self.chunked = None
        return entries

    def _urgent_waiting(self) -> bool:
        """A waiting request that may preempt running ones (priority beyond the threshold)."""
        if not self.running:
            return True
        worst = max(r.priority for r in self.running)
        return any(worst - r.priority > self.cfg.priority_preemption_threshold for r in self.waiting)

    def _mixed_riders(self) -> list[ExtendEntry]:
        """Running requests that decode their next token inside this prefill batch (mixed chunk), so a
        prefill does not stall them for a step. Only when their KV fits without retracting anyone, and
        not with speculation (its verify steps are batches of their own)."""
        if not self.cfg.enable_mixed_chunk or self.spec is not None or not self.running:
            return []
        locs = self._extend_all(self.running, [1] * len(self.running))
        if locs is None:
            return []
        return [ExtendEntry(r, r.kv_len, 1, loc, [r.kv_len]) for r, loc in zip(self.running, locs, strict=True)]

    def _run_prefill(self, entries: list[ExtendEntry], riders: list[ExtendEntry]) -> list[StepOutput]:
        reqs = [e.req for e in entries + riders]
        logits = self._forward(make_extend_batch(entries + riders), reqs)
        self.stats["prefill_steps"] += 1
        outputs, row = [], 0
        if riders:  # their rows come last, one each
            self.stats["mixed_decode_steps"] += 1
            outputs += self._decode_tail([e.req for e in riders], logits[len(logits) - len(riders):])
        for e in entries:
            req, k = e.req, len(e.logit_positions)
            req_logits = logits[row:row + k]
            row += k
            req.kv_len += e.n
            if req.logprob.return_logprob and not req.output_ids:
                record_prompt_logprobs(req, e.logit_positions, req_logits, self.cpu_isa)
            self.cache.cache_unfinished(req)  # shareable now, by requests admitted while this one decodes
            if req.kv_len < len(req.fill_ids):
                continue
            if req.params.max_new_tokens == 0:
                req.finished = FinishReason("length", matched=None)
                self._release(req, insert=True)
                outputs.append(StepOutput(req, [], True))
                continue
            self.running.append(req)
            outputs += self._sample_and_finish([req], req_logits[-1:])
        return outputs

    def _forward(self, batch: ForwardBatch, reqs: list[Req]) -> torch.Tensor:
        """The forward pass, watched: a step over the watchdog limit is reported and its requests fail
        (at the next step boundary) instead of the server silently stalling."""
        start = time.monotonic()
        logits = self.forward(batch)
        self._watch(start, batch.mode, reqs)
        return logits

    def _watch(self, start: float, what: str, reqs: list[Req], steps: int = 1) -> None:
        took = time.monotonic() - start
        if what == "decode":
            self.clock.observe(took, steps)
        if took > self.cfg.watchdog_timeout_s:
            log.error("watchdog: a %s step of %d requests took %.2f s (limit %.2f s); failing them",
                      what, len(reqs), took, self.cfg.watchdog_timeout_s)
            for r in reqs:
                self.failures[r.rid] = f"watchdog: a forward step took {took:.2f} s (limit {self.cfg.watchdog_timeout_s} s)"

    # ------------------------------------------------------------ decode
    def _schedule_decode(self) -> tuple[list[Req], list[torch.Tensor], list | None, int]:
        """-> running requests, their new KV slots, the speculative plan (None: plain decode steps) and how many
        decode steps run back to back. Short of KV, speculation and back-to-back steps go first, then requests
        are retracted."""
        plan = self.spec.plan(self.running) if self.spec else None
        if plan is not None and not any(SpecDecoder.sizes(plan)):
            plan = None
        steps = 1 if plan is not None or self.waiting or self.grammar_queue or self.failures \
            else steps_for(self.running, self.clock.fit(self.cfg.decode_steps), self.max_context)
        while self.running:
            sizes = [1 + s for s in SpecDecoder.sizes(plan)] if plan else [steps] * len(self.running)
            locs = self._extend_all(self.running, sizes)
            if locs is not None:
                return list(self.running), locs, plan, steps
            if plan is not None or steps > 1:
                plan, steps = None, 1
                continue
            self._retract_one()
        return [], [], None, 1

    def _extend_all(self, reqs: list[Req], sizes: list[int]) -> list[torch.Tensor] | None:
        """KV slots for ``sizes[i]`` more tokens of each request (evicting cached prefixes if needed), or None
        (nothing allocated) when they do not all fit."""
        need = sum(self.cache.pages_needed(r, n) for r, n in zip(reqs, sizes, strict=True))
        if not self.cache.ensure_free_pages(need):
            return None
        return [self.cache.extend(r, n) for r, n in zip(reqs, sizes, strict=True)]

    def _retract_one(self) -> None:
        """Out of KV for the next decode step: requeue the request with the fewest generated tokens."""
        victim = min(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
        self.running.remove(victim)
        self.cache.release(victim, insert=False)
        victim.num_retractions += 1
        self.stats["retractions"] += 1
        self.waiting.append(victim)
        self.new_token_ratio = self.init_ratio
        log.info("KV pool is full: retracted %s (%d tokens generated)", victim.rid, len(victim.output_ids))

    def _maybe_preempt(self, candidates: list[Req], budget: PrefillBudget) -> None:
        """A waiting request much more urgent than running ones may push them back to the queue."""
        if not candidates or not self.running:
            return
        head = candidates[0]
        need = len(head.fill_ids) - head.kv_len + min(head.params.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        threshold = self.cfg.priority_preemption_threshold
        while budget.rem_total < need or budget.rem_reqs <= 0:
            worst = max(self.running, key=lambda r: (r.priority, -len(r.output_ids)), default=None)
            if worst is None or worst.priority - head.priority <= threshold:
                return
            freed = self.cache.owned_pages(worst) * self.cache.page
            self._retract(worst)
            self.stats["preemptions"] += 1
            budget.rem_total += freed
            budget.rem_reqs += 1

    def _retract(self, req: Req) -> None:
        self.running.remove(req)
        self.cache.release(req, insert=False)
        req.num_retractions += 1
        self.waiting.append(req)

    def _run_decode(self, reqs: list[Req], locs: list[torch.Tensor], plan: list | None,
                    steps: int) -> list[StepOutput]:
        self.stats["decode_steps"] += steps
        self.new_token_ratio = max(self.init_ratio * 0.14, self.new_token_ratio - steps * self.init_ratio / 600)
        if plan is not None:
            start = time.monotonic()
            starts = self.spec.run(reqs, locs, plan)
            self._watch(start, "verify", reqs)
            return self._finish_step(reqs, starts)
        if steps > 1:
            self.stats["grouped_decode_steps"] += steps
            start = time.monotonic()
            tokens, logprobs = run_steps(self.forward, reqs, locs, steps, self.decode_steps, self.cpu_isa)
            self._watch(start, "decode", reqs, steps)
            starts = take_tokens(reqs, tokens, self.cache, self.decode, self.max_context, logprobs)
            return self._finish_step(reqs, starts)
        logits = self._forward(make_decode_batch(reqs, locs), reqs)
        return self._decode_tail(reqs, logits)

    def _decode_tail(self, reqs: list[Req], logits: torch.Tensor) -> list[StepOutput]:
        """After a forward that fed each request its last token: count the KV, sample the next one."""
        for r in reqs:
            r.kv_len += 1
        return self._sample_and_finish(reqs, logits)

    def _sample_and_finish(self, reqs: list[Req], logits: torch.Tensor) -> list[StepOutput]:
        result = sample(logits, reqs, self.cpu_isa)
        starts = [len(r.output_ids) for r in reqs]
        for i, req in enumerate(reqs):
            record_output_logprob(req, result, i)
            append_token(req, result.tokens[i], self.decode, self.max_context)
        return self._finish_step(reqs, starts)

    def _finish_step(self, reqs: list[Req], starts: list[int]) -> list[StepOutput]:
        """After new tokens were appended (and ``finished`` set): release finished requests, jump forward."""
        outputs, now = [], time.monotonic()
        for req, start in zip(reqs, starts, strict=True):
            req.first_token_time = req.first_token_time or now
            if req.finished:
                self.running.remove(req)
                self._release(req, insert=True)
            elif req.grammar is not None:
                self._jump_forward(req)
            outputs.append(StepOutput(req, req.output_ids[start:], req.finished is not None))
        return outputs

    def _jump_forward(self, req: Req) -> bool:
        """Forced text goes in as one extend step: the request waits for it, keeping its KV row."""
        if not self.decoding.jump_forward or self.encode is None or req.logprob.return_logprob:
            return False
        room = req.params.max_new_tokens - len(req.output_ids)
        n = jump_forward(req, self.encode, self.decode, room) if room > 0 else 0
        if n == 0:
            return False
        self.stats["jump_forward_tokens"] += n
        self.running.remove(req)
        self.waiting.insert(0, req)
        return True

    def _release(self, req: Req, insert: bool) -> None:
        if req in self.grammar_queue:
            self.grammar_queue.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if self.chunked is req:
            self.chunked = None
        self.cache.release(req, insert=insert)
