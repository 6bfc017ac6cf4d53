"""When a request is done: length, EOS / stop token ids, stop strings matched on the decoded text."""

from __future__ import annotations

from collections.abc import Callable

from radixlm.runtime.decode.grammar import accept_sampled
from radixlm.runtime.request import FinishReason, Req


def check_finished(req: Req, decode: Callable[[list[int]], str], max_context: int) -> FinishReason | None:
    """Called after each new token. Stop strings are matched on the decoded output and trimmed later."""
    p, tok = req.params, req.output_ids[-1]
    if len(req.output_ids) >= p.min_new_tokens:
        if tok in req.eos_ids:
            return FinishReason("stop", matched=tok)
        if tok in p.stop_token_ids:
            return FinishReason("stop", matched=tok)
        if p.stop:
            text = decode(req.output_ids)  # earlier steps found nothing, so the first match is new
            for s in p.stop:
                if s in text:
                    return FinishReason("stop", matched=s)
    if len(req.output_ids) >= p.max_new_tokens:
        return FinishReason("length")
    if len(req.origin_input_ids) + len(req.output_ids) >= max_context:
        return FinishReason("length")
    return None


def append_token(req: Req, token: int, decode: Callable[[list[int]], str], max_context: int) -> None:
    """Append a chosen token: advance the grammar, then set ``req.finished`` if the request is done."""
    req.output_ids.append(token)
    if req.grammar is not None:
        req.finished = accept_sampled(req, token)
    req.finished = req.finished or check_finished(req, decode, max_context)
