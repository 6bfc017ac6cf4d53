"""Batched sampling: penalties, temperature, top-k / top-p / min-p, per-request seeds, logprobs.

Every row carries its own settings. Greedy rows take the argmax of the penalized logits; the others are
filtered and sampled (kernels/sampling.py) with a uniform from their own torch.Generator, so a seeded request
reproduces whatever it is batched with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixlm.kernels.sampling import RowSettings, sample_rows
from radixlm.kernels.token_bitmask import apply_token_bitmask
from radixlm.runtime.request import Req


@dataclass
class SampleOutput:
    tokens: list[int]
    logprobs: list[float] | None  # chosen-token logprob per row, for rows that asked (others 0.0)
    top_logprobs: list[list[tuple[int, float]]] | None


def apply_penalties(logits: torch.Tensor, reqs: list[Req]) -> None:
    """In place. Repetition penalty over prompt + output (HF semantics); frequency / presence over output."""
    for i, r in enumerate(reqs):
        p = r.params
        dev = logits.device
        if p.logit_bias:
            ids = torch.tensor([int(t) for t in p.logit_bias], device=dev)
            logits[i, ids] += torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype, device=dev)
        if not p.has_penalties:
            continue
        if p.repetition_penalty != 1:
            seen = torch.tensor(sorted(set(r.origin_input_ids) | set(r.output_ids)), dtype=torch.int64, device=dev)
            vals = logits[i, seen]
            logits[i, seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if r.output_ids and (p.frequency_penalty or p.presence_penalty):
            out = torch.tensor(r.output_ids, dtype=torch.int64, device=dev)
            counts = torch.zeros(logits.shape[1], device=dev).index_add_(0, out, torch.ones(len(out), device=dev))
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()


def block_early_stop(logits: torch.Tensor, reqs: list[Req]) -> None:
    """Before min_new_tokens, EOS and stop token ids cannot be sampled."""
    for i, r in enumerate(reqs):
        if len(r.output_ids) < r.params.min_new_tokens:
            ids = list(r.eos_ids) + list(r.params.stop_token_ids)
            if ids:
                logits[i, ids] = float("-inf")


def apply_grammars(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None) -> None:
    """Mask the tokens each constrained row's grammar forbids (rows without a grammar are untouched);
    ``cpu_isa``: the path of radixlm's C++ CPU kernels, None without them (apply_token_bitmask)."""
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
    if not rows:
        return
    bitmask = torch.full((len(reqs), (logits.shape[1] + 31) // 32), -1, dtype=torch.int32)
    need = [i for i in rows if reqs[i].grammar.fill_bitmask(bitmask, i)]
    if need:
        apply_token_bitmask(logits, bitmask, torch.tensor(need), cpu_isa)


def process_logits(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None) -> None:
    """In place: everything that shapes a row before temperature (bias, penalties, min tokens, grammar)."""
    apply_penalties(logits, reqs)
    block_early_stop(logits, reqs)
    apply_grammars(logits, reqs, cpu_isa)


def draw_tokens(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None,
                u: torch.Tensor | None = None) -> torch.Tensor:
    """Processed logits [R, V] of non-greedy rows -> int64 [R]: temperature, the filters, each request's own draw
    (kernels/sampling.py). u [R] float64: the rows' uniforms, by default one drawn now from each request's own
    generator; a row's token depends on its own logits, settings and u only, never on what shares its batch."""
    if u is None:
        u = torch.cat([torch.rand(1, generator=r.generator, dtype=torch.float64) for r in reqs])
    return sample_rows(logits, row_settings(reqs), u, cpu_isa)


def row_settings(reqs: list[Req]) -> RowSettings:
    """The requests' temperature (0 for greedy ones) and filters, a row each."""
    params = [r.params for r in reqs]
    return RowSettings.of([0.0 if p.greedy else p.temperature for p in params], [p.top_k for p in params],
                          [p.top_p for p in params], [p.min_p for p in params])


def choose_tokens(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None,
                  u: torch.Tensor | None = None) -> torch.Tensor:
    """Processed logits [B, V] -> int64 [B]: the argmax for greedy rows, draw_tokens for the others (u [B]:
    every row's uniform, greedy rows' unused; by default drawn now for the non-greedy rows)."""
    tokens = argmax_rows(logits)
    rand_rows = [i for i, r in enumerate(reqs) if not r.params.greedy]
    if rand_rows:
        rows = torch.tensor(rand_rows, device=logits.device)
        tokens[rows] = draw_tokens(logits[rows], [reqs[i] for i in rand_rows], cpu_isa,
                                   None if u is None else u[rand_rows])
    return tokens


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> int64 [B]: each row's first index of its maximum (a NaN counts as the maximum), as
    torch's argmax gives it. Float32 rows on the CPU go through numpy's vectorized argmax: torch's CPU argmax
    walks a row one element at a time (benchmarks/results/2026-12-05-notes.md)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(np.argmax(logits.numpy(), axis=-1))
    return logits.argmax(dim=-1)


def sample(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None) -> SampleOutput:
    """logits [B, V] float32 (modified in place) -> one token per request (``cpu_isa``: see apply_grammars)."""
    raw_logprobs = None
    if any(r.logprob.return_logprob for r in reqs):
        raw_logprobs = torch.log_softmax(logits, dim=-1)  # the model's own distribution, before processing
    process_logits(logits, reqs, cpu_isa)
    tokens = choose_tokens(logits, reqs, cpu_isa)
    token_list = tokens.tolist()
    if raw_logprobs is None:
        return SampleOutput(token_list, None, None)
    chosen = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    return SampleOutput(token_list, chosen, top_logprobs(raw_logprobs, [r.logprob.top_logprobs_num for r in reqs]))


def top_logprobs(logprobs: torch.Tensor, nums: list[int]) -> list[list[tuple[int, float]]] | None:
    k = max(nums, default=0)
    if k <= 0:
        return None
    vals, ids = logprobs.topk(k, dim=-1)
    return [list(zip(ids[i, :n].tolist(), vals[i, :n].tolist(), strict=True)) for i, n in enumerate(nums)]
