"""Prefill planning: which waiting requests to admit this step, in what order, how many of their tokens (one
chunked request at most, and it ends the batch), whom an urgent request preempts, and which running requests
ride along (mixed chunks). The queue's order is the pure policy's (runtime/policy.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from radixlm.runtime.batch import ExtendEntry
from radixlm.runtime.decode.logprobs import logit_positions
from radixlm.runtime.policy import CLIP_MAX_NEW_TOKENS, PrefillBudget, QueueItem, order_queue
from radixlm.runtime.request import Req, ReqStatus

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.scheduler import Scheduler


class PrefillPlanner:
    def __init__(self, sched: Scheduler) -> None:
        self.sched, self.cfg, self.cache = sched, sched.cfg, sched.cache

    def plan(self) -> list[ExtendEntry]:
        """The extend entries of this step (admitted requests leave the waiting queue); [] when none."""
        s = self.sched
        if not s.waiting and s.chunked is None:
            return []
        budget, entries = self._budget(), []
        if s.chunked is None and (budget.rem_reqs <= 0 or budget.rem_total <= 0) and not self._urgent_waiting():
            return []  # nothing can be admitted: skip ordering the queue (it costs a pass over every prompt)
        candidates = ([s.chunked] if s.chunked else []) + self._ordered_waiting()
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
            if req.status in (ReqStatus.WAITING, ReqStatus.RETRACTED):  # fresh, or back after a jump-forward
                s.waiting.remove(req)
            if fresh:
                self._count_admission(req)
            req.status = ReqStatus.PREFILLING
            entries.append(ExtendEntry(req, req.kv_len, n, loc, logit_positions(req, req.kv_len, n)))
            if n < todo:  # at most one chunked request, and it ends the batch
                s.chunked = req
                break
            if s.chunked is req:
                s.chunked = None
        return entries

    def riders(self) -> list[ExtendEntry]:
        """Running requests that decode their next token inside this prefill batch (mixed chunk), so a
        prefill does not stall them for a step. Only when their KV fits without retracting anyone, and
        not with speculation (its verify steps are batches of their own)."""
        s = self.sched
        if not self.cfg.enable_mixed_chunk or s.speculation is not None or not s.running:
            return []
        locs = s.extend_all(s.running, [1] * len(s.running))
        if locs is None:
            return []
        return [ExtendEntry(r, r.kv_len, 1, loc, [r.kv_len]) for r, loc in zip(s.running, locs, strict=True)]

    def _count_admission(self, req: Req) -> None:
        req.admit_time = req.admit_time or time.monotonic()
        if not req.output_ids and req.num_retractions == 0:
            req.cached_tokens, req.disk_cached_tokens = req.prefix_len, req.disk_prefix_len
            self.sched.stats["prompt_tokens"] += len(req.origin_input_ids)
            self.sched.stats["cached_tokens"] += req.prefix_len
            self.sched.stats["disk_cached_tokens"] += req.disk_prefix_len

    def _budget(self) -> PrefillBudget:
        return PrefillBudget(
            rem_total=int(self.cache.available() - self.sched.reserved_tokens()),
            rem_input=self.cfg.max_prefill_tokens, rem_chunk=self.cfg.chunked_prefill_size,
            rem_reqs=self.cfg.max_running_requests - len(self.sched.running), page_size=self.cache.page)

    def _ordered_waiting(self) -> list[Req]:
        s = self.sched
        by_rid = {r.rid: r for r in s.waiting}
        items = [QueueItem(r.rid, r.fill_ids, self.cache.peek_prefix_len(r), r.params.max_new_tokens,
                           r.priority, r.arrival, r.namespace) for r in s.waiting]
        policy = self.cfg.schedule_policy if self.cache.tree is not None else "fcfs"
        in_flight = [QueueItem(r.rid, r.fill_ids, 0, 0) for r in ([s.chunked] if s.chunked else [])]
        order = order_queue(items, policy, time.monotonic(), self.cfg.max_wait_s, self.cfg.lpm_max_queue,
                            in_flight=in_flight)
        return [by_rid[i.rid] for i in order]

    def _urgent_waiting(self) -> bool:
        """A waiting request that may preempt running ones (priority beyond the threshold)."""
        s = self.sched
        if not s.running:
            return True
        worst = max(r.priority for r in s.running)
        return any(worst - r.priority > self.cfg.priority_preemption_threshold for r in s.waiting)

    def _maybe_preempt(self, candidates: list[Req], budget: PrefillBudget) -> None:
        """A waiting request much more urgent than running ones may push them back to the queue."""
        s = self.sched
        if not candidates or not s.running:
            return
        head = candidates[0]
        need = len(head.fill_ids) - head.kv_len + min(head.params.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        threshold = self.cfg.priority_preemption_threshold
        while budget.rem_total < need or budget.rem_reqs <= 0:
            worst = max(s.running, key=lambda r: (r.priority, -len(r.output_ids)), default=None)
            if worst is None or worst.priority - head.priority <= threshold:
                return
            freed = self.cache.owned_pages(worst) * self.cache.page
            s.retract(worst, preempted=True)
            budget.rem_total += freed
            budget.rem_reqs += 1
