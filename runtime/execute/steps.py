"""Decode steps back to back: ``steps`` forward passes in a row, each fed the tokens chosen from the one before
(the scheduler plans them where no running request needs it between its tokens: scheduler/step_groups.py), and
the step's bookkeeping (KV slots, stop checks, outputs) done once for them all in postprocess.

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
from radixlm.runtime.execute.sampler import (
    asked_logprobs,
    asking_rows,
    choose_tokens,
    row_penalties,
    row_settings,
)
from radixlm.runtime.request import Req
from radixlm.runtime.step_plan import Sampled, SampleOutput


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
              cpu_isa: int | None = None) -> list[Sampled]:
    """``steps`` decode forwards, each request fed its last token and then its own chosen ones; locs[i]: request
    i's ``steps`` new KV slots -> each request's ``steps`` tokens in order, and where it asked for logprobs, theirs
    (as a single step's sample gives them). ``in_one_call`` (the runner's fused steps) runs them all in one call
    where it can; ``cpu_isa``: the sampler's kernel path."""
    draws = step_draws(reqs, steps)
    asked = asking_rows(reqs)
    if in_one_call is not None:
        grouped = in_one_call(make_decode_batch(reqs, [loc[:1] for loc in locs]), locs, draws, asked)
        if grouped is not None:
            tokens, raw = grouped
            return per_request(reqs, tokens, step_logprobs(raw, asked, tokens, reqs, cpu_isa))
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
    return per_request(reqs, tokens, step_logprobs(torch.stack(raws) if raws else None, asked, tokens, reqs, cpu_isa))


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


def per_request(reqs: list[Req], tokens: list[list[int]], steps: list[SampleOutput] | None) -> list[Sampled]:
    """Each request's tokens and each step's logprobs over the batch -> each request's tokens with their logprobs."""
    if steps is None:
        return [Sampled(t) for t in tokens]
    out = [Sampled.empty(r) for r in reqs]
    for step in steps:
        for i, got in enumerate(out):
            got.extend(step, i)
    return out
