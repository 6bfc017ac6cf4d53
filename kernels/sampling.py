"""Shape and draw one token per row of logits: logit bias and penalties (penalize), then temperature, top-k /
top-p / min-p and inverse transform sampling with a given uniform u per row (the caller draws u from each
request's own generator, so a row's token depends on its own logits, settings and u only, never on its batch).

The torch versions are the reference (and the path on GPUs and without radixlm's C++ kernels); cpu_sample.cpp
and cpu_penalties.cpp are the CPU path with them, which the fused layers also run between the decode steps of
one call.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from radixlm.kernels import cpu_ext


@dataclass(frozen=True)
class RowSettings:
    """Each row's sampling settings, a value a row: temperature (0: the argmax), top_k (0: off), top_p (1: off),
    min_p (0: off). Plain lists: the C++ op takes them as they are."""

    temperature: list[float]
    top_k: list[int]
    top_p: list[float]
    min_p: list[float]

    def filtered(self) -> list[bool]:
        """The rows with a filter (they draw among ranked candidates, the others in vocabulary order)."""
        return [k > 0 or p < 1 or m > 0 for k, p, m in zip(self.top_k, self.top_p, self.min_p, strict=True)]


@dataclass(frozen=True)
class RowPenalties:
    """Each row's logit bias and penalties: repetition (1: off) over ``seen`` (the prompt's and output's tokens),
    frequency and presence (0: off) over ``outputs`` (the output's tokens, repeats counted), ``bias`` added to
    its tokens' logits. A row without any has 1, 0, 0 and empty lists."""

    repetition: list[float]
    frequency: list[float]
    presence: list[float]
    seen: list[list[int]]
    outputs: list[list[int]]
    bias: list[dict[int, float]]

    def extended(self, tokens: list[list[int]]) -> RowPenalties:
        """The same rows after each row's new output ``tokens``."""
        return dataclasses.replace(self, seen=[s + t for s, t in zip(self.seen, tokens, strict=True)],
                                   outputs=[o + t for o, t in zip(self.outputs, tokens, strict=True)])

    def packed(self) -> tuple[list[float], list[torch.Tensor]]:
        """The C++ ops' form: settings [3R] (repetition, frequency, presence a row) and seen ids, their offsets
        [R + 1], output ids, offsets, bias ids, values (float32), offsets."""
        settings = [x for row in zip(self.repetition, self.frequency, self.presence, strict=True) for x in row]
        return settings, [*_flat(self.seen), *_flat(self.outputs), *_flat_bias(self.bias)]


def _flat(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged int lists -> (values [N] int64, offsets [R + 1] int64)."""
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    values = np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(offsets[-1]))
    return torch.from_numpy(values), torch.from_numpy(offsets)


def _flat_bias(rows: list[dict[int, float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids, offsets = _flat([list(b) for b in rows])
    values = np.fromiter(itertools.chain.from_iterable(b.values() for b in rows), np.float32, ids.numel())
    return ids, torch.from_numpy(values), offsets


def penalize_torch(logits: torch.Tensor, pen: RowPenalties) -> None:
    """In place, logits [R, V]: each row's bias, then its repetition penalty over the tokens seen (HF semantics),
    then frequency * count + presence subtracted for each output token. Only the columns of those tokens are
    read and written."""
    dev = logits.device
    for i, row in enumerate(logits):
        if pen.bias[i]:
            row[_ids(pen.bias[i], dev)] += torch.tensor(list(pen.bias[i].values()), dtype=logits.dtype, device=dev)
        if pen.repetition[i] != 1 and pen.seen[i]:
            seen = _ids(set(pen.seen[i]), dev)
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / pen.repetition[i], vals * pen.repetition[i])
        if pen.outputs[i] and (pen.frequency[i] or pen.presence[i]):
            counts = collections.Counter(pen.outputs[i])
            n = torch.from_numpy(np.fromiter(counts.values(), np.float32, len(counts))).to(dev, logits.dtype)
            row[_ids(counts, dev)] -= pen.frequency[i] * n + pen.presence[i]


def _ids(ids: Iterable[int], dev: torch.device) -> torch.Tensor:
    """Token ids -> int64 tensor (torch.tensor walks a list an element at a time)."""
    ids = list(ids)
    return torch.from_numpy(np.fromiter(ids, np.int64, len(ids))).to(dev)


def penalize_cpu(logits: torch.Tensor, pen: RowPenalties) -> None:
    """The same as penalize_torch for float32 logits, in C++ (cpu_penalties.cpp)."""
    settings, tokens = pen.packed()
    torch.ops.radixlm_cpu.penalize_rows(logits, logits.shape[1], settings, tokens)


def penalize(logits: torch.Tensor, pen: RowPenalties, isa: int | None = None) -> None:
    """Dispatch: the C++ op where it takes the logits (cpu_ext.takes), torch's ops otherwise."""
    if cpu_ext.takes(logits, isa):
        penalize_cpu(logits, pen)
    else:
        penalize_torch(logits, pen)


@dataclass(frozen=True)
class StepDraws:
    """What K decode steps run back to back choose their tokens with: every row's settings (temperature 0 for
    greedy rows), uniforms u [B, K] float64 (step k's in column k; greedy rows' unused), and the rows' bias and
    penalties as they stand before the first step (None: no row has any)."""

    rows: RowSettings
    u: torch.Tensor
    penalties: RowPenalties | None = None


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


def draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One column per row of weights [B, C] (non-negative, not necessarily normalized), u [B] float64 in [0, 1)
    -> int64 [B]: the row's first column whose running sum exceeds u times its total, one batched cumsum and
    searchsorted on any device. A row's pick depends only on its own weights and u (zero columns appended to a
    row change nothing), and a column of weight 0 (grammar-masked, filtered) is never drawn: its running sum
    equals its predecessor's, and the target stays below the total. torch.multinomial and the exponential race
    draw C random numbers a token. A row of NaNs or zeros, which no valid model and grammar give, still yields
    a column below C."""
    cdf = weights.cumsum(dim=-1)  # [B, C], non-decreasing (the CPU accumulates in double)
    total = cdf[:, -1:]
    target = torch.minimum(u.to(weights.device, non_blocking=True).to(cdf.dtype).unsqueeze(1) * total,
                           torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=weights.shape[1] - 1)


def sample_rows_torch(logits: torch.Tensor, rows: RowSettings, u: list[float]) -> torch.Tensor:
    """logits [R, V], each row's settings and uniform in [0, 1) -> int64 [R] (the semantics: cpu_sample.cpp)."""
    dev, u = logits.device, torch.tensor(u, dtype=torch.float64)
    temperature = torch.tensor(rows.temperature, dtype=torch.float32)
    greedy = temperature <= 0
    scale = (1 / torch.where(greedy, 1.0, temperature)).to(dev).unsqueeze(1)
    probs = torch.softmax(logits * scale, dim=-1)
    tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=dev)
    filtered = torch.tensor(rows.filtered(), dtype=torch.bool) & ~greedy
    plain = ~filtered & ~greedy
    if plain.any():
        tokens[plain.to(dev)] = draw(probs[plain.to(dev)], u[plain])
    if filtered.any():
        f = filtered.to(dev)
        weights, ids = filter_probs(probs[f], torch.tensor(rows.top_k, device=dev)[f],
                                    torch.tensor(rows.top_p, dtype=torch.float32, device=dev)[f],
                                    torch.tensor(rows.min_p, dtype=torch.float32, device=dev)[f])
        tokens[f] = ids.gather(1, draw(weights, u[filtered]).unsqueeze(1)).squeeze(1)
    if greedy.any():
        tokens[greedy.to(dev)] = logits[greedy.to(dev)].argmax(dim=-1)
    return tokens


def sample_rows_cpu(logits: torch.Tensor, rows: RowSettings, u: list[float], isa: int = 0) -> torch.Tensor:
    """The same as sample_rows_torch for float32 logits, in C++ on kernel path ``isa`` (cpu_ext)."""
    return torch.ops.radixlm_cpu.sample_rows(logits, logits.shape[1], rows.temperature, rows.top_k, rows.top_p,
                                             rows.min_p, u, isa)


def sample_rows(logits: torch.Tensor, rows: RowSettings, u: list[float], isa: int | None = None) -> torch.Tensor:
    """Dispatch: the C++ kernel on path ``isa`` where it takes the logits (cpu_ext.takes), torch's ops
    otherwise."""
    if cpu_ext.takes(logits, isa):
        return sample_rows_cpu(logits, rows, u, isa)
    return sample_rows_torch(logits, rows, u)


def row_logprobs_torch(logits: torch.Tensor, tokens: list[int], n: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [R, V] -> each row's log-softmax at its token [R], and its top n columns [R, n] with their values
    [R, n] (largest first)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, torch.tensor(tokens, device=logits.device).unsqueeze(1)).squeeze(1)
    vals, ids = lp.topk(n, dim=-1)
    return chosen, ids, vals


def row_logprobs(logits: torch.Tensor, tokens: list[int], n: int, isa: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dispatch: the C++ op on path ``isa`` (ties in the top n: the lower column first) where it takes the logits
    (cpu_ext.takes), torch's ops otherwise."""
    if cpu_ext.takes(logits, isa):
        return torch.ops.radixlm_cpu.logprob_rows(logits, logits.shape[1], tokens, n, isa)
    return row_logprobs_torch(logits, tokens, n)
