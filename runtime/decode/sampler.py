"""Batched sampling: penalties, temperature, top-k / top-p / min-p, per-request seeds, logprobs.

Every row carries its own settings. Greedy rows take the argmax of the penalized logits; the others are
filtered and sampled with their own torch.Generator, so a seeded request reproduces whatever it is batched with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

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


def filter_probs(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [B, V]; top_k [B] (0 = off), top_p [B], min_p [B] -> (weights [B, k], token ids [B, k]): each row's
    top k candidates in descending order, the dropped ones weighted 0.

    Ranked by probability, a token stays iff its rank is below top_k, the mass ranked before it is below top_p,
    and it has at least min_p times the top probability; the first always stays. Each filter keeps a prefix of
    the ranking, so only the top candidates are ranked: k grows (256, 4,096, V) until every row drops its k-th
    candidate, and then no token past it could stay. A full sort of V ranks every token for nothing. The rows
    are not renormalized (draw scales by each row's own total), and a row's kept prefix, its weights and so its
    draw do not depend on the k its batch needed."""
    vocab = probs.shape[1]
    k = min(vocab, 256)
    while True:
        vals, idx = probs.topk(k, dim=-1)  # [B, k], descending
        keep = _kept_prefix(vals, top_k, top_p, min_p)
        if k == vocab or not keep[:, -1].any():
            return vals * keep, idx
        k = min(vocab, k * 16)


def _kept_prefix(vals: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """vals [B, k] descending -> bool [B, k]: which of them the three filters keep (a prefix of each row)."""
    rank = torch.arange(vals.shape[1], device=vals.device).unsqueeze(0)
    keep = (rank < top_k.unsqueeze(1)) | (top_k.unsqueeze(1) <= 0)
    keep &= (vals.cumsum(dim=-1) - vals) < top_p.unsqueeze(1)  # the smallest prefix whose mass reaches top_p
    keep &= vals >= min_p.unsqueeze(1) * vals[:, :1]
    keep[:, 0] = True
    return keep


def process_logits(logits: torch.Tensor, reqs: list[Req], cpu_isa: int | None = None) -> None:
    """In place: everything that shapes a row before temperature (bias, penalties, min tokens, grammar)."""
    apply_penalties(logits, reqs)
    block_early_stop(logits, reqs)
    apply_grammars(logits, reqs, cpu_isa)


def draw_tokens(logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
    """Processed logits [R, V] of non-greedy rows -> int64 [R]: temperature, the filters, each request's own draw.

    A row with a filter (top_k, top_p, min_p) draws among its ranked candidates, a row without one over V in
    vocabulary order. The two kinds are drawn apart, so a row's token never depends on what shares its batch."""
    params, dev = [r.params for r in reqs], logits.device
    temps = torch.tensor([p.temperature for p in params], device=dev).unsqueeze(1)
    probs = torch.softmax(logits / temps, dim=-1)
    has_filter = [p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params]
    if not any(has_filter):
        return draw(probs, reqs)
    if all(has_filter):
        return _draw_filtered(probs, reqs)
    tokens = torch.empty(len(reqs), dtype=torch.int64, device=dev)
    plain = [i for i, f in enumerate(has_filter) if not f]
    filtered = [i for i, f in enumerate(has_filter) if f]
    for part, fn in ((plain, draw), (filtered, _draw_filtered)):
        rows = torch.tensor(part, device=dev)
        tokens[rows] = fn(probs[rows], [reqs[i] for i in part])
    return tokens


def _draw_filtered(probs: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
    """probs [R, V] of rows with a filter -> int64 [R]: each row's draw among the candidates its filters keep."""
    params, dev = [r.params for r in reqs], probs.device
    weights, ids = filter_probs(probs, torch.tensor([p.top_k for p in params], device=dev),
                                torch.tensor([p.top_p for p in params], device=dev),
                                torch.tensor([p.min_p for p in params], device=dev))
    return ids.gather(1, draw(weights, reqs).unsqueeze(1)).squeeze(1)


def draw(probs: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
    """One column per row of probs [B, C] (non-negative weights, not necessarily normalized) -> int64 [B].

    Inverse transform sampling: u ~ U[0, 1) from each request's own generator (one host draw per token), and
    the row's first column whose running sum exceeds u * its total: one batched cumsum and searchsorted on any
    device. A row's pick depends only on its own weights and generator, never on the batch (zero columns
    appended to a row change nothing). A column of weight 0 (grammar-masked, filtered) is never drawn: its
    running sum equals its predecessor's, and the target stays below the total. torch.multinomial and the
    exponential race draw C random numbers a token. A row of NaNs or zeros, which no valid model and grammar
    give, still yields a column below C."""
    u = torch.cat([torch.rand(1, generator=r.generator, dtype=torch.float64) for r in reqs])
    cdf = probs.cumsum(dim=-1)  # [B, C], non-decreasing (the CPU accumulates in double)
    total = cdf[:, -1:]
    target = torch.minimum(u.to(probs.device, non_blocking=True).to(cdf.dtype).unsqueeze(1) * total,
                           torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


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
    tokens = argmax_rows(logits)
    rand_rows = [i for i, r in enumerate(reqs) if not r.params.greedy]
    if rand_rows:
        rows = torch.tensor(rand_rows, device=logits.device)
        rand_reqs = [reqs[i] for i in rand_rows]
        tokens[rows] = draw_tokens(logits[rows], rand_reqs)
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
