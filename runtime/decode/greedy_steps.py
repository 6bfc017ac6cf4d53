"""Greedy decode steps back to back. When every running request takes the argmax of the model's raw logits
and nothing else waits for the scheduler, it runs up to ``decode_steps`` forward passes in a row, each fed
the argmax of the one before, and does its own work (KV slots, sampling, stop checks, outputs) once for them
all instead of once a token.

The tokens are those of single steps: a row's logits depend only on its own tokens (the kernels are
batch-invariant), so a request's steps do not see what shares its batch. A request that stops early keeps
its tokens up to the stop; the KV of the ones after it is given back, as a rejected speculative draft's is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.runtime.batch import ForwardBatch, make_decode_batch
from radixlm.runtime.decode.sampler import argmax_rows
from radixlm.runtime.decode.stopping import append_token
from radixlm.runtime.kv.cache_manager import KVCacheManager
from radixlm.runtime.request import Req


def plain_greedy(req: Req) -> bool:
    """Whether the request's next token is the argmax of the model's logits with nothing applied to them: greedy,
    no logit bias, penalties, grammar or logprobs, and past its min_new_tokens (no EOS blocked)."""
    p = req.params
    return (p.greedy and not p.logit_bias and not p.has_penalties and req.grammar is None
            and not req.logprob.return_logprob and len(req.output_ids) >= p.min_new_tokens)


def steps_for(reqs: list[Req], limit: int, max_context: int) -> int:
    """How many steps to run back to back: 1 unless every request is plain greedy, and never more than the
    fewest new tokens any request may still take (its max_new_tokens, the context)."""
    if limit <= 1 or not reqs or not all(plain_greedy(r) for r in reqs):
        return 1
    room = min(min(r.params.max_new_tokens - len(r.output_ids), max_context - len(r.fill_ids)) for r in reqs)
    return max(1, min(limit, room))


GreedySteps = Callable[[ForwardBatch, list[torch.Tensor]], list[list[int]] | None]


def run_steps(forward: Callable[[ForwardBatch], torch.Tensor], reqs: list[Req], locs: list[torch.Tensor],
              steps: int, in_one_call: GreedySteps | None = None) -> list[list[int]]:
    """``steps`` decode forwards, each request fed its last token and then its own argmax; locs[i]: request i's
    ``steps`` new KV slots -> tokens[i], its ``steps`` argmax tokens in order. ``in_one_call`` (the runner's
    greedy_steps) runs them all in one call where it can."""
    if in_one_call is not None:
        grouped = in_one_call(make_decode_batch(reqs, [loc[:1] for loc in locs]), locs)
        if grouped is not None:
            return grouped
    ids = [r.output_ids[-1] for r in reqs]
    tokens: list[list[int]] = [[] for _ in reqs]
    for j in range(steps):
        batch = make_decode_batch(reqs, [loc[j:j + 1] for loc in locs], inputs=ids, offset=j)
        ids = argmax_rows(forward(batch)).tolist()
        for out, token in zip(tokens, ids, strict=True):
            out.append(token)
    return tokens


def take_tokens(reqs: list[Req], tokens: list[list[int]], cache: KVCacheManager,
                decode: Callable[[list[int]], str], max_context: int) -> list[int]:
    """Append each request's tokens until it finishes, count their KV and give back the slots past it
    -> each request's output length before them."""
    starts = [len(r.output_ids) for r in reqs]
    for req, out, start in zip(reqs, tokens, starts, strict=True):
        for token in out:
            append_token(req, token, decode, max_context)
            if req.finished:
                break
        req.kv_len += len(req.output_ids) - start  # step j's input was the token before its output
        cache.truncate(req, req.kv_len)
    return starts
