"""Verify drafts against the target's logits by sampling each position exactly as a plain decode step would.

For request r with draft d_1..d_k the verify pass gives logits rows 0..k (row j predicts the token after
d_j). Position j is sampled by ``sample`` itself, the plain decode step's sampler, given the tokens chosen so
far: it sees the request as it will be once they are appended (``Ahead``: penalties and blocked stops see them),
its grammar matcher has accepted them (rolled back when the step is done, for postprocess to accept them for
good), and its generator has made one draw per earlier token. The draft d_{j+1} is accepted iff the sampled
token equals it; the first token that differs (or the token after k accepted drafts) ends the request's step.

Because the verify pass is an extend whose logits equal decode's bit for bit (the batch- and cache-invariant
kernels), every token is the one speculation-off decoding gives: greedy or seeded, with penalties or a
grammar, with logprobs. The draft is a deterministic guess (q one-hot), so accepting when the sample equals
it accepts d with probability p(d), the same rate as rejection sampling. A request may end (a stop, EOS) on an
accepted token before its draft does: postprocess keeps the tokens up to its end, as decoding one at a time
would have stopped there.
"""

from __future__ import annotations

import torch

from radixlm.runtime.execute.sampler import argmax_rows, row_penalties, sample
from radixlm.runtime.request import Req
from radixlm.runtime.step_plan import Sampled


class Ahead:
    """A request as sampling sees it once ``pending`` tokens are appended: its output_ids include them; every
    other attribute is the request's own."""

    def __init__(self, req: Req, pending: list[int]) -> None:
        self.req, self.output_ids = req, req.output_ids + pending

    def __getattr__(self, name: str):
        return getattr(self.req, name)


def verify(logits: list[torch.Tensor], reqs: list[Req], drafts: list[list[int]],
           cpu_isa: int | None = None) -> list[Sampled]:
    """logits[i]: [len(drafts[i]) + 1, V] float32 for reqs[i] (modified) -> each request's chosen tokens: its
    accepted draft tokens and the one after them."""
    if all(r.params.greedy and r.grammar is None and not r.logprob.return_logprob for r in reqs) \
            and row_penalties(reqs) is None:
        return _verify_greedy(logits, reqs, drafts)
    out = [Sampled.empty(r) for r in reqs]
    accepted = [0] * len(reqs)  # tokens each grammar matcher accepted here, rolled back at the end
    active = list(range(len(reqs)))
    for j in range(max(len(d) for d in drafts) + 1):
        batch = [Ahead(reqs[i], out[i].tokens) for i in active]
        result = sample(torch.stack([logits[i][j] for i in active]), batch, cpu_isa)
        still = []
        for row, i in enumerate(active):
            tok = result.tokens[row]
            out[i].extend(result, row)
            if j < len(drafts[i]) and drafts[i][j] == tok and _advance(reqs[i], tok, accepted, i):
                still.append(i)
        active = still
        if not active:
            break
    for req, n in zip(reqs, accepted, strict=True):
        if n:
            req.grammar.rollback(n)
    return out


def _advance(req: Req, token: int, accepted: list[int], i: int) -> bool:
    """Whether sampling may go on past ``token``: always without a grammar; with one, if its matcher accepts the
    token and is not terminated by it (then the request ends there)."""
    if req.grammar is None:
        return True
    if not req.grammar.accept_token(token):
        return False
    accepted[i] += 1
    return not req.grammar.is_terminated()


def _verify_greedy(logits: list[torch.Tensor], reqs: list[Req], drafts: list[list[int]]) -> list[Sampled]:
    """Every row greedy, with nothing that shapes its logits (no bias, penalty, blocked stop or grammar, which
    row_penalties being None for the first position rules out for the later ones too), no logprobs: each
    position's token is the argmax of its raw logits, so all positions are chosen in one call (``reqs``: whose
    rows they are, for a test that watches them)."""
    best = argmax_rows(torch.cat(logits)).tolist()
    out, start = [], 0
    for rows, draft in zip(logits, drafts, strict=True):
        tokens = best[start:start + len(rows)]
        start += len(rows)
        n = 0
        while n < len(draft) and tokens[n] == draft[n]:
            n += 1
        out.append(Sampled(tokens[:n + 1]))
    return out
