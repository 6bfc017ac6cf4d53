"""Verify drafts against the target's logits by sampling each position exactly as a plain decode step would.

For request r with draft d_1..d_k the verify pass gives logits rows 0..k (row j predicts the token after
d_j). Position j is sampled by ``sample`` itself, the plain decode step's sampler, given the tokens accepted
so far (penalties see them, the grammar matcher has accepted them, the request's generator has made one draw
per earlier token). The draft d_{j+1} is accepted iff the sampled token equals it; the first token that
differs (or the token after k accepted drafts) ends the request's step.

Because the verify pass is an extend whose logits equal decode's bit for bit (the batch- and cache-invariant
kernels), every token is the one speculation-off decoding gives: greedy or seeded, with penalties or a
grammar, with logprobs. The draft is a deterministic guess (q one-hot), so accepting when the sample equals
it accepts d with probability p(d), the same rate as rejection sampling.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.runtime.decode.logprobs import record_output_logprob
from radixlm.runtime.decode.sampler import sample
from radixlm.runtime.decode.stopping import append_token
from radixlm.runtime.request import Req


def verify(logits: list[torch.Tensor], reqs: list[Req], drafts: list[list[int]],
           decode: Callable[[list[int]], str], max_context: int, cpu_isa: int | None = None) -> list[int]:
    """logits[i]: [len(drafts[i]) + 1, V] float32 for reqs[i] (modified). Appends the chosen tokens to each
    request's output (and grammar, and logprobs), sets ``finished`` where due; -> accepted draft tokens per
    request."""
    accepted = [0] * len(reqs)
    active = list(range(len(reqs)))
    for j in range(max(len(d) for d in drafts) + 1):
        batch = [reqs[i] for i in active]
        result = sample(torch.stack([logits[i][j] for i in active]), batch, cpu_isa)
        still = []
        for row, (i, req) in enumerate(zip(active, batch, strict=True)):
            tok = result.tokens[row]
            record_output_logprob(req, result, row)
            append_token(req, tok, decode, max_context)
            took_draft = j < len(drafts[i]) and drafts[i][j] == tok
            accepted[i] += took_draft
            if took_draft and req.finished is None:
                still.append(i)
        active = still
        if not active:
            break
    return accepted
