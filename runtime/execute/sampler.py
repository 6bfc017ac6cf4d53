"""Batched sampling: penalties, temperature, top-k / top-p / min-p, per-request seeds, logprobs.

Every row carries its own settings. Greedy rows take the argmax of the penalized logits; the others are
filtered and sampled (kernels/sampling.py) with a uniform from their own torch.Generator, so a seeded request
reproduces whatever it is batched with.
"""

from __future__ import annotations

import numpy as np
import torch

from radixlm.kernels.sampling import RowPenalties, RowSettings, penalize, row_logprobs, sample_rows
from radixlm.kernels.token_bitmask import apply_token_bitmask
from radixlm.runtime.request import Req
from radixlm.runtime.step_plan import SampleOutput


def early_stop_bias(req: Req) -> dict[int, float]:
    """Before min_new_tokens, EOS and the stop token ids cannot be chosen: a bias of -inf on them (the penalties
    leave -inf as it is)."""
    if len(req.output_ids) >= req.params.min_new_tokens:
        return {}
    return dict.fromkeys([*req.eos_ids, *req.params.stop_token_ids], float("-inf"))


def row_penalties(reqs: list[Req]) -> RowPenalties | None:
    """The requests' logit bias (with EOS and the stop tokens blocked before min_new_tokens) and penalties over
    their prompt and output so far; None when no request has any."""
    blocked = [early_stop_bias(r) for r in reqs]
    if not any(r.params.logit_bias or r.params.has_penalties for r in reqs) and not any(blocked):
        return None
    params = [r.params for r in reqs]
    return RowPenalties([p.repetition_penalty for p in params], [p.frequency_penalty for p in params],
                        [p.presence_penalty for p in params],
                        [r.origin_input_ids + r.output_ids if r.params.repetition_penalty != 1 else [] for r in reqs],
                        [list(r.output_ids) if r.params.frequency_penalty or r.params.presence_penalty else []
                         for r in reqs],
                        [{**(p.logit_bias or {}), **b} for p, b in zip(params, blocked, strict=True)])


def apply_grammars(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None) -> None:
    """Mask the tokens each constrained row's grammar forbids (rows without a grammar, or whose grammar has
    ended, are untouched: a draft may run past its stop token); ``cpu_isa``: the path of radixlm's C++ CPU
    kernels, None without them (apply_token_bitmask)."""
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None and not r.grammar.is_terminated()]
    if not rows:
        return
    bitmask = torch.full((len(reqs), (logits.shape[1] + 31) // 32), -1, dtype=torch.int32)
    need = [i for i in rows if reqs[i].grammar.fill_bitmask(bitmask, i)]
    if need:
        apply_token_bitmask(logits, bitmask, torch.tensor(need), cpu_isa)


def process_logits(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None) -> None:
    """In place: everything that shapes a row before temperature (bias, min tokens, penalties, grammar)."""
    pen = row_penalties(reqs)
    if pen is not None:
        penalize(logits, pen, cpu_isa)
    apply_grammars(logits, reqs, cpu_isa)


def row_settings(reqs: list[Req]) -> RowSettings:
    """The requests' temperature (0 for greedy ones) and filters, a row each."""
    params = [r.params for r in reqs]
    return RowSettings([0.0 if p.greedy else p.temperature for p in params], [p.top_k for p in params],
                       [p.top_p for p in params], [p.min_p for p in params])


def choose_tokens(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None,
                  u: list[float] | None = None) -> torch.Tensor:
    """Processed logits [B, V] -> int64 [B]: the argmax for greedy rows; for the others temperature, the filters
    and a draw with the row's uniform (kernels/sampling.py), by default one drawn now from the request's own
    generator (u: every row's, greedy rows' unused). All rows go in one call of sample_rows, which takes the
    argmax of a row of temperature 0; a row's token depends on its own logits, settings and u only."""
    if all(r.params.greedy for r in reqs):
        return argmax_rows(logits)
    if u is None:
        u = [0.0 if r.params.greedy else torch.rand(1, generator=r.generator, dtype=torch.float64).item()
             for r in reqs]
    return sample_rows(logits, row_settings(reqs), u, cpu_isa)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> int64 [B]: each row's first index of its maximum (a NaN counts as the maximum), as
    torch's argmax gives it. Float32 rows on the CPU go through numpy's vectorized argmax: torch's CPU argmax
    walks a row one element at a time."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(np.argmax(logits.numpy(), axis=-1))
    return logits.argmax(dim=-1)


def sample(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None) -> SampleOutput:
    """logits [B, V] float32 (modified in place) -> one token per request (``cpu_isa``: see apply_grammars)."""
    asked = asking_rows(reqs)
    # the model's own distribution of the rows that asked for logprobs, before processing: [len(asked), V], a copy
    raw = logits[asked] if asked else None
    process_logits(logits, reqs, cpu_isa)
    tokens = choose_tokens(logits, reqs, cpu_isa).tolist()
    if raw is None:
        return SampleOutput(tokens, None, None)
    return asked_logprobs(raw, asked, tokens, reqs, cpu_isa)


def asking_rows(reqs: list[Req]) -> list[int]:
    """The rows whose requests asked for logprobs."""
    return [i for i, r in enumerate(reqs) if r.logprob.return_logprob]


def asked_logprobs(rows: torch.Tensor, asked: list[int], tokens: list[int], reqs: list[Req],
                   cpu_isa: int | None = None) -> SampleOutput:
    """The chosen tokens with their logprobs and each row's top ones (its top_logprobs_num), from the model's own
    logits of the rows that asked: rows [len(asked), V], row j that of request asked[j] (kernels/sampling.py's
    row_logprobs; ``cpu_isa``: see apply_grammars). The other requests get 0.0 and no top ones."""
    nums = [reqs[i].logprob.top_logprobs_num for i in asked]
    chosen, ids, vals = row_logprobs(rows, [tokens[i] for i in asked], max(nums, default=0), cpu_isa)
    logprobs, top = [0.0] * len(reqs), [[] for _ in reqs]
    for i, lp, row_ids, row_vals, n in zip(asked, chosen.tolist(), ids.tolist(), vals.tolist(), nums, strict=True):
        logprobs[i], top[i] = lp, list(zip(row_ids[:n], row_vals[:n], strict=True))
    return SampleOutput(tokens, logprobs, top if max(nums, default=0) > 0 else None)
