"""Decode steps back to back, the scheduler's side: which requests may run several decode steps without the
scheduler between their tokens, how many steps, and how many fit the group's time budget. The executor runs
them (execute/steps.py)."""

from __future__ import annotations

from radixlm.runtime.request import Req


def plain_decode(req: Req) -> bool:
    """Whether the request's next tokens can be chosen without the scheduler between them: no grammar; greedy or
    sampled, with or without logit bias, penalties and blocked stops (the group applies them, adding each step's
    token) and logprobs."""
    return req.grammar is None


def room(req: Req, max_context: int) -> int:
    """The steps a group may take for the request: the new tokens it may still take (its max_new_tokens, the
    context) and, before its min_new_tokens, no more than the steps its EOS and stops stay blocked."""
    left = min(req.params.max_new_tokens - len(req.output_ids), max_context - len(req.fill_ids))
    early = req.params.min_new_tokens - len(req.output_ids)
    return min(left, early) if early > 0 else left


def steps_for(reqs: list[Req], limit: int, max_context: int) -> int:
    """How many steps to run back to back: 1 unless every request is plain, and never more than the fewest any
    request has room for."""
    if limit <= 1 or not reqs or not all(plain_decode(r) for r in reqs):
        return 1
    return max(1, min(limit, *(room(r, max_context) for r in reqs)))


class StepClock:
    """The recent decode step time (an exponential average of the seconds a step took, groups counted a step at a
    time) and how many steps fit a group's time budget."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s  # 0: no limit
        self.step_s: float | None = None  # None until a decode step was timed

    def observe(self, seconds: float, steps: int) -> None:
        each = seconds / steps
        self.step_s = each if self.step_s is None else 0.75 * self.step_s + 0.25 * each

    def fit(self, limit: int) -> int:
        """At most ``limit`` steps, as many as fit the budget (at least 1; 1 until a step was timed)."""
        if self.budget_s <= 0:
            return limit
        if self.step_s is None:
            return 1
        return max(1, min(limit, int(self.budget_s / max(self.step_s, 1e-9))))


