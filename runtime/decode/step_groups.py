"""Decode steps back to back. When no running request needs the scheduler between its tokens (no grammar: each
token is the argmax of the model's logits or a draw from them, after any logit bias, blocked stops and
penalties; logprobs come from each step's logits, kept for them) and nothing else waits, it runs up to
``decode_steps`` forward passes in a row, each fed the tokens chosen from the one before, and does its own work
(KV slots, stop checks, outputs) once for them all instead of once a token.

The tokens are those of single steps: a row's logits depend only on its own tokens (the kernels are
batch-invariant), a greedy row takes the same argmax, and a sampled row the same draw (kernels/sampling.py, with
the same uniforms: the group draws a request's K uniforms from its generator up front, as K single steps would
one by one), after the same bias and penalties, each step's token added to them. A request that stops early
keeps its tokens up to the stop; the KV of the ones after it is given back, as a rejected speculative draft's
is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.kernels.sampling import StepDraws, penalize
from radixlm.runtime.batch import ForwardBatch, make_decode_batch
from radixlm.runtime.decode.logprobs import record_output_logprob
from radixlm.runtime.decode.sampler import (
    SampleOutput,
    asked_logprobs,
    asking_rows,
    choose_tokens,
    row_penalties,
    row_settings,
)
from radixlm.runtime.decode.stopping import append_token
from radixlm.runtime.kv.cache_manager import KVCacheManager
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


def step_draws(reqs: list[Req], steps: int) -> StepDraws | None:
    """None when every request is greedy without bias or penalties; else every row's settings, each sampled
    request's next ``steps`` uniforms from its generator, drawn now (greedy rows' are 0 and unused), and the rows'
    bias and penalties."""
    penalties = row_penalties(reqs)
    if penalties is None and all(r.params.greedy for r in reqs):
        return None
    u = torch.zeros(len(reqs), steps, dtype=torch.float64)
    for i, r in enumerate(reqs):
        if not r.params.greedy:
            u[i] = torch.rand(steps, generator=r.generator, dtype=torch.float64)
    return StepDraws(row_settings(reqs), u, penalties)


# (batch, locs, draws, raw_rows) -> each request's tokens and, where raw_rows names rows, each step's logits of
# those rows [K, len(raw_rows), V]; or None
GroupedSteps = Callable[[ForwardBatch, list[torch.Tensor], StepDraws | None, list[int]],
                        tuple[list[list[int]], torch.Tensor | None] | None]


def run_steps(forward: Callable[[ForwardBatch], torch.Tensor], reqs: list[Req], locs: list[torch.Tensor],
              steps: int, in_one_call: GroupedSteps | None = None,
              cpu_isa: int | None = None) -> tuple[list[list[int]], list[SampleOutput] | None]:
    """``steps`` decode forwards, each request fed its last token and then its own chosen ones; locs[i]: request
    i's ``steps`` new KV slots -> tokens[i], its ``steps`` tokens in order, and where a request asked for logprobs,
    each step's tokens with them (as a single step's sample gives them). ``in_one_call`` (the runner's
    decode_steps) runs them all in one call where it can; ``cpu_isa``: the sampler's kernel path."""
    draws = step_draws(reqs, steps)
    asked = asking_rows(reqs)
    if in_one_call is not None:
        grouped = in_one_call(make_decode_batch(reqs, [loc[:1] for loc in locs]), locs, draws, asked)
        if grouped is not None:
            tokens, raw = grouped
            return tokens, step_logprobs(raw, asked, tokens, reqs, cpu_isa)
    ids = [r.output_ids[-1] for r in reqs]
    tokens: list[list[int]] = [[] for _ in reqs]
    raws = []
    for j in range(steps):
        batch = make_decode_batch(reqs, [loc[j:j + 1] for loc in locs], inputs=ids, offset=j)
        logits = forward(batch)
        if asked:
            raws.append(logits[asked])  # a copy
        if draws is not None and draws.penalties is not None:
            penalize(logits, draws.penalties.extended(tokens), cpu_isa)
        ids = choose_tokens(logits, reqs, cpu_isa, None if draws is None else draws.u[:, j].tolist()).tolist()
        for out, token in zip(tokens, ids, strict=True):
            out.append(token)
    return tokens, step_logprobs(torch.stack(raws) if raws else None, asked, tokens, reqs, cpu_isa)


def step_logprobs(raw: torch.Tensor | None, asked: list[int], tokens: list[list[int]], reqs: list[Req],
                  cpu_isa: int | None = None) -> list[SampleOutput] | None:
    """Each step's logits of the rows that asked [K, len(asked), V] and the tokens chosen -> each step's tokens
    with their logprobs (None: none kept). All the steps' rows in one call: a row's values are those of its step
    alone, as a single step's."""
    if raw is None:
        return None
    steps, b = raw.shape[0], len(reqs)
    chosen = [t[j] for j in range(steps) for t in tokens]  # step-major
    flat_asked = [j * b + i for j in range(steps) for i in asked]  # raw's rows, step-major
    flat = asked_logprobs(raw.reshape(steps * len(asked), -1), flat_asked, chosen, reqs * steps, cpu_isa)
    tops = flat.top_logprobs
    return [SampleOutput(flat.tokens[j * b:(j + 1) * b], flat.logprobs[j * b:(j + 1) * b],
                         None if tops is None else tops[j * b:(j + 1) * b]) for j in range(steps)]


def take_tokens(reqs: list[Req], tokens: list[list[int]], cache: KVCacheManager,
                decode: Callable[[list[int]], str], max_context: int,
                logprobs: list[SampleOutput] | None = None) -> list[int]:
    """Append each request's tokens (and their logprobs, where it asked) until it finishes, count their KV and
    give back the slots past it -> each request's output length before them."""
    starts = [len(r.output_ids) for r in reqs]
    for i, (req, out, start) in enumerate(zip(reqs, tokens, starts, strict=True)):
        for j, token in enumerate(out):
            if logprobs is not None:
                record_output_logprob(req, logprobs[j], i)
            append_token(req, token, decode, max_context)
            if req.finished:
                break
        req.kv_len += len(req.output_ids) - start  # step j's input was the token before its output
        cache.truncate(req, req.kv_len)
    return starts
