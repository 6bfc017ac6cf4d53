"""The scheduler's grammar work: waiting for compiles, accepting sampled tokens, jump-forward."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait

from radixlm.runtime.request import FinishReason, Req


def poll_compiles(queue: list[Req], timeout_s: float, block_s: float = 0.0) -> tuple[list[Req], list[Req]]:
    """Split the grammar queue into (ready, failed); the rest stay queued. May block up to ``block_s``."""
    if block_s and queue and not any(r.grammar_future.done() for r in queue):
        wait([r.grammar_future for r in queue], timeout=block_s, return_when=FIRST_COMPLETED)
    ready, failed, now = [], [], time.monotonic()
    for req in list(queue):
        fut = req.grammar_future
        if fut.done():
            queue.remove(req)
            try:
                req.grammar = fut.result().matcher()
                ready.append(req)
            except ValueError as e:
                req.finished = FinishReason("abort", message=str(e), status=400)
                failed.append(req)
        elif now - req.arrival > timeout_s:
            queue.remove(req)
            req.finished = FinishReason("abort", status=400,
                                        message=f"{req.constraint.kind}: compiling took over {timeout_s:.0f} s")
            failed.append(req)
    return ready, failed


def accept_sampled(req: Req, token: int) -> FinishReason | None:
    """Advance the request's matcher; the grammar ends the request once it accepted a stop token."""
    if not req.grammar.accept_token(token):  # the mask should make this impossible
        return FinishReason("abort", message=f"the grammar rejected sampled token {token}", status=500)
    if req.grammar.is_terminated():
        return FinishReason("stop", matched=token)
    return None


def jump_forward(req: Req, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                 limit: int) -> int:
    """Append the text the grammar forces next, as canonical tokens; returns how many were appended.

    The last sampled token has no KV yet, so it is re-tokenized together with the forced text (so token
    boundaries stay what the tokenizer would produce) and may be replaced. The final token of the forced
    run is left for the model, since a longer token might start with it. On any mismatch, nothing changes.
    """
    forced = req.grammar.jump_forward_string()
    if not forced:
        return 0
    last = req.output_ids[-1]
    ids = encode(decode([last]) + forced)[:-1][: limit + 1]
    if len(ids) < 2 or decode(ids) != (decode([last]) + forced)[: len(decode(ids))]:
        return 0
    req.grammar.rollback(1)
    accepted = 0
    for t in ids:
        if not req.grammar.accept_token(t):
            req.grammar.rollback(accepted)
            req.grammar.accept_token(last)
            return 0
        accepted += 1
    req.output_ids[-1:] = ids
    return len(ids) - 1
