"""Verify drafts against the target's logits, position by position, with every sampling setting applied.

For request r with draft d_1..d_k the verify pass gives logits rows 0..k (row j predicts the token after
d_j). At position j the row is processed exactly as a plain decode step would be, given the tokens accepted
so far (penalties see them, the grammar matcher has accepted them), so:
  * greedy: accept d_{j+1} iff it is the argmax; on a mismatch the argmax is the next token;
  * sampling: accept d_{j+1} with probability p(d_{j+1}) (the draft is deterministic, q = one-hot), else
    draw from p with d_{j+1} removed and renormalized. Marginally that is exactly p.
After k accepted drafts, row k gives one more token. A request stops early when a token finishes it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.runtime.decode.sampler import draw, process_logits, sampling_probs
from radixlm.runtime.decode.stopping import append_token
from radixlm.runtime.request import Req


def verify(logits: list[torch.Tensor], reqs: list[Req], drafts: list[list[int]],
           decode: Callable[[list[int]], str], max_context: int) -> list[int]:
    """logits[i]: [len(drafts[i]) + 1, V] float32 for reqs[i] (modified). Appends the chosen tokens to each
    request's output (and grammar), sets ``finished`` where due; -> accepted draft tokens per request."""
    accepted = [0] * len(reqs)
    active = list(range(len(reqs)))
    for j in range(max(len(d) for d in drafts) + 1):
        rows = torch.stack([logits[i][j] for i in active])
        process_logits(rows, [reqs[i] for i in active])
        tokens = _decide(rows, [reqs[i] for i in active], [drafts[i][j] if j < len(drafts[i]) else None
                                                           for i in active])
        still = []
        for i, (tok, took_draft) in zip(active, tokens, strict=True):
            req = reqs[i]
            append_token(req, tok, decode, max_context)
            accepted[i] += took_draft
            if took_draft and req.finished is None:
                still.append(i)
        active = still
        if not active:
            break
    return accepted


def _decide(rows: torch.Tensor, reqs: list[Req], drafted: list[int | None]) -> list[tuple[int, bool]]:
    """One position for a set of requests -> (token, whether it is the draft token) each."""
    out: list[tuple[int, bool]] = [(0, False)] * len(reqs)
    best = rows.argmax(dim=-1).tolist()
    rand = [i for i, r in enumerate(reqs) if not r.params.greedy]
    for i, r in enumerate(reqs):
        if r.params.greedy:
            out[i] = (best[i], drafted[i] == best[i])
    if rand:
        probs = sampling_probs(rows[torch.tensor(rand)], [reqs[i] for i in rand])
        for p, i in zip(probs, rand, strict=True):
            d, gen = drafted[i], reqs[i].generator
            if d is not None:
                if torch.rand(1, generator=gen).item() < p[d].item():
                    out[i] = (d, True)
                    continue
                p = p.clone()
                p[d] = 0.0
                if p.sum() <= 0:  # p was one-hot on d (rounding): d is the only choice
                    out[i] = (d, True)
                    continue
            out[i] = (int(draw(p.unsqueeze(0), [reqs[i]])[0]), False)
    return out

