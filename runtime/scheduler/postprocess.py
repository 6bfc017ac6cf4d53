"""Postprocess: a step's result applied to its requests. Appends each request's new tokens (with their
logprobs) until it finishes, counts their KV and gives back the slots past it, records speculation's
acceptance, moves requests between queues (a completed prefill starts running, a finished request is released
into the radix tree, a grammar's forced text jumps forward), and feeds the watchdog and the step clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from radixlm.runtime.decode.grammar import jump_forward
from radixlm.runtime.decode.logprobs import record_output_logprob, record_prompt_logprobs
from radixlm.runtime.decode.stopping import append_token
from radixlm.runtime.request import FinishReason, Req
from radixlm.runtime.step_plan import Sampled, StepOutput, StepPlan, StepResult

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.scheduler import Scheduler


class Postprocessor:
    def __init__(self, sched: Scheduler, decode: Callable[[list[int]], str],
                 encode: Callable[[str], list[int]] | None) -> None:
        self.sched, self.cache, self.decode, self.encode = sched, sched.cache, decode, encode

    def apply(self, plan: StepPlan, result: StepResult) -> list[StepOutput]:
        return self._prefill(plan, result) if plan.mode == "prefill" else self._decode(plan, result)

    def _prefill(self, plan: StepPlan, result: StepResult) -> list[StepOutput]:
        s = self.sched
        s.stats["prefill_steps"] += 1
        s.watch(result.seconds, "extend", [e.req for e in plan.entries + plan.riders])
        got = dict(zip(map(id, plan.sampled), result.sampled, strict=True))
        outputs = []
        if plan.riders:  # running requests that fed their last token in this batch
            s.stats["mixed_decode_steps"] += 1
            riders = [e.req for e in plan.riders]
            outputs += self._finish(riders, self._append(riders, [got[id(r)] for r in riders], fed=True))
        for e, lp in zip(plan.entries, result.prompt_logprobs, strict=True):
            req = e.req
            req.kv_len += e.n
            if lp is not None:
                record_prompt_logprobs(req, lp)
            self.cache.cache_unfinished(req)  # shareable now, by requests admitted while this one decodes
            if req.kv_len < len(req.fill_ids):  # the chunked request: more next step
                continue
            if req.params.max_new_tokens == 0:
                req.finished = FinishReason("length", matched=None)
                s.release(req, insert=True)
                outputs.append(_output(req, len(req.output_ids)))
                continue
            s.start_running(req)
            outputs += self._finish([req], self._append([req], [got[id(req)]], fed=False))
        return outputs

    def _decode(self, plan: StepPlan, result: StepResult) -> list[StepOutput]:
        s = self.sched
        s.stats["decode_steps"] += plan.steps
        if plan.steps > 1:
            s.stats["grouped_decode_steps"] += plan.steps
        s.new_token_ratio = max(s.init_ratio * 0.14, s.new_token_ratio - plan.steps * s.init_ratio / 600)
        s.watch(result.seconds, plan.mode, plan.reqs, plan.steps)
        starts = self._append(plan.reqs, result.sampled, fed=True)
        if plan.mode == "verify":
            for req, draft, start in zip(plan.reqs, result.drafts, starts, strict=True):
                s.speculation.record(req, draft, req.output_ids[start:])
        if plan.mode == "verify" or plan.steps > 1:  # slots past the kept tokens go back
            for req in plan.reqs:
                self.cache.truncate(req, req.kv_len)
        if s.speculation is not None:  # the whole step's time: drafting and Python work count, not the forward alone
            made = sum(len(r.output_ids) - start for r, start in zip(plan.reqs, starts, strict=True))
            took = time.monotonic() - s.step_started - result.catch_up_seconds
            s.speculation.observe(plan.mode, len(plan.reqs), made, took)
        return self._finish(plan.reqs, starts)

    def _append(self, reqs: list[Req], sampled: list[Sampled], fed: bool) -> list[int]:
        """Append each request's tokens (and their logprobs) until it finishes -> each one's output length
        before them. ``fed``: the step fed each request its last token, so each kept token's input now has KV
        (a prefill that completes a prompt computed the KV of its fill ids already)."""
        starts = []
        for req, got in zip(reqs, sampled, strict=True):
            starts.append(len(req.output_ids))
            for j, token in enumerate(got.tokens):
                record_output_logprob(req, got, j)
                append_token(req, token, self.decode, self.sched.max_context)
                if req.finished:
                    break
            if fed:
                req.kv_len += len(req.output_ids) - starts[-1]
        return starts

    def _finish(self, reqs: list[Req], starts: list[int]) -> list[StepOutput]:
        """After new tokens were appended (and ``finished`` set): release finished requests, jump forward."""
        outputs, now = [], time.monotonic()
        for req, start in zip(reqs, starts, strict=True):
            req.first_token_time = req.first_token_time or now
            if req.finished:
                self.sched.release(req, insert=True)
            elif req.grammar is not None:
                self._jump_forward(req)
            outputs.append(_output(req, start))
        return outputs

    def _jump_forward(self, req: Req) -> None:
        """Forced text goes in as one extend step: the request waits for it, keeping its KV row."""
        if not self.sched.decoding.jump_forward or self.encode is None or req.logprob.return_logprob:
            return
        room = req.params.max_new_tokens - len(req.output_ids)
        n = jump_forward(req, self.encode, self.decode, room) if room > 0 else 0
        if n:
            self.sched.stats["jump_forward_tokens"] += n
            self.sched.requeue_first(req)


def _output(req: Req, start: int) -> StepOutput:
    return StepOutput(req, req.output_ids[start:], req.finished is not None)
