"""Logprobs: which positions of an extend step need logits, and recording prompt and output logprobs on the
request."""

from __future__ import annotations

import torch

from radixlm.kernels.sampling import row_logprobs
from radixlm.runtime.request import Req
from radixlm.runtime.step_plan import PromptLogprobs, Sampled


def logit_positions(req: Req, start: int, n: int) -> list[int]:
    """Absolute positions of positions [start, start + n) whose logits the request needs: its prompt
    logprobs (from logprob_start_len on), and the last position once its whole prompt is in (sampling)."""
    end = start + n
    lp = req.logprob
    positions = []
    if lp.return_logprob and lp.logprob_start_len >= 0 and not req.output_ids:
        first = max(start, lp.logprob_start_len - 1, 0)
        positions = list(range(first, min(end, len(req.origin_input_ids) - 1)))
    if end == len(req.fill_ids):
        positions.append(end - 1)
    return positions


def prompt_logprobs(req: Req, positions: list[int], logits: torch.Tensor,
                    cpu_isa: int | None = None) -> PromptLogprobs | None:
    """logits [len(positions), V] for ``positions`` -> the logprob of each next prompt token (and the top-k), as the
    output tokens' come (kernels/sampling.py's row_logprobs; ``cpu_isa``: the path of radixlm's C++ kernels); None
    when the positions hold only the sampling one."""
    n = len(positions) - (1 if positions and positions[-1] == len(req.fill_ids) - 1 else 0)
    if n <= 0:
        return None
    targets = [req.origin_input_ids[p + 1] for p in positions[:n]]
    k = req.logprob.top_logprobs_num
    chosen, ids, vals = row_logprobs(logits[:n], targets, k, cpu_isa)
    top = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), vals.tolist(), strict=True)] if k > 0 else None
    return PromptLogprobs(positions[0] == 0, chosen.tolist(), targets, top)


def record_prompt_logprobs(req: Req, lp: PromptLogprobs) -> None:
    if lp.first:
        req.input_token_logprobs.append((None, req.origin_input_ids[0]))
        req.input_top_logprobs.append(None)
    req.input_token_logprobs.extend(zip(lp.chosen, lp.targets, strict=True))
    if lp.top is not None:
        req.input_top_logprobs.extend(lp.top)


def record_output_logprob(req: Req, sampled: Sampled, j: int) -> None:
    """The request's j-th new token of a step, with its logprob (and top-k), if the request asked."""
    if req.logprob.return_logprob:
        req.output_token_logprobs.append((sampled.logprobs[j], sampled.tokens[j]))
        if sampled.top_logprobs is not None:
            req.output_top_logprobs.append(sampled.top_logprobs[j])
