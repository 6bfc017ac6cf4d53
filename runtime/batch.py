"""ForwardBatch: the one tensor-level description of a step, built from scheduled requests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ForwardBatch:
    """Per-step tensors. T = new tokens in the batch, B = requests, R = rows that need logits.

    Invariant: requests appear in the same order in every per-request field, and their new tokens are laid
    out contiguously in that order along T.
    """

    mode: str  # "extend" (prefill chunks, new tokens over a cached prefix) | "decode" (one token each)
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64, KV slots the new tokens are written to
    req_rows: torch.Tensor  # [B] int64, rows of the req->token table
    seq_lens: list[int]  # [B] KV length after this step (prefix + new)
    extend_lens: list[int]  # [B] new tokens per request
    logit_rows: torch.Tensor  # [R] int64 indices into T
    num_layers: int | None = None  # run only the first layers (self-speculative drafts); None: all
    attn_backend: Any = None
    attn_meta: Any = field(default=None, repr=False)
    window_meta: Any = field(default=None, repr=False)  # sliding window -> its layers' plan (attention/cpu.py)

    def to(self, device: torch.device) -> ForwardBatch:
        """The same batch with its index tensors on ``device`` (the per-request lists stay on the host)."""
        move = {name: getattr(self, name).to(device, non_blocking=True)
                for name in ("input_ids", "positions", "out_cache_loc", "req_rows", "logit_rows")}
        return dataclasses.replace(self, **move)

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)


@dataclass
class ExtendEntry:
    """One request's share of an extend step: positions [start, start + n) of its fill ids."""

    req: Any
    start: int
    n: int
    loc: torch.Tensor  # [n] KV slots
    logit_positions: list[int]  # absolute positions whose logits are needed (prompt logprobs, sampling)

    @property
    def completes(self) -> bool:
        """Whether the entry computes the request's last fill id (then its next token is sampled)."""
        return self.start + self.n == len(self.req.fill_ids)


def make_extend_batch(entries: list[ExtendEntry]) -> ForwardBatch:
    ids, rows, offset = [], [], 0
    for e in entries:
        ids.extend(e.req.fill_ids[e.start:e.start + e.n])
        rows.extend(offset + p - e.start for p in e.logit_positions)
        offset += e.n
    return ForwardBatch(
        mode="extend",
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.cat([torch.arange(e.start, e.start + e.n) for e in entries]),
        out_cache_loc=torch.cat([e.loc for e in entries]),
        req_rows=torch.tensor([e.req.row for e in entries], dtype=torch.int64),
        seq_lens=[e.start + e.n for e in entries],
        extend_lens=[e.n for e in entries],
        logit_rows=torch.tensor(rows, dtype=torch.int64),
    )


def make_verify_batch(reqs: list, drafts: list[list[int]], locs: list[torch.Tensor]) -> ForwardBatch:
    """Speculative verify: each request feeds its last token and its draft; every position gets logits."""
    ids = [t for r, d in zip(reqs, drafts, strict=True) for t in (r.output_ids[-1], *d)]
    return ForwardBatch(
        mode="extend",
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.cat([torch.arange(r.kv_len, r.kv_len + 1 + len(d)) for r, d in zip(reqs, drafts, strict=True)]),
        out_cache_loc=torch.cat([loc[: 1 + len(d)] for loc, d in zip(locs, drafts, strict=True)]),
        req_rows=torch.tensor([r.row for r in reqs], dtype=torch.int64),
        seq_lens=[r.kv_len + 1 + len(d) for r, d in zip(reqs, drafts, strict=True)],
        extend_lens=[1 + len(d) for d in drafts],
        logit_rows=torch.arange(len(ids)),
    )


def make_decode_batch(reqs: list, locs: list[torch.Tensor], inputs: list[int] | None = None, offset: int = 0,
                      num_layers: int | None = None) -> ForwardBatch:
    """Each request feeds one token at position kv_len + offset: its last output token, or ``inputs[i]``
    (the self-draft feeds its own guesses at offsets 1, 2, ... through its first ``num_layers`` layers)."""
    return ForwardBatch(
        mode="decode",
        input_ids=torch.tensor(inputs if inputs is not None else [r.output_ids[-1] for r in reqs], dtype=torch.int64),
        positions=torch.tensor([r.kv_len + offset for r in reqs], dtype=torch.int64),
        out_cache_loc=torch.cat(locs),
        req_rows=torch.tensor([r.row for r in reqs], dtype=torch.int64),
        seq_lens=[r.kv_len + offset + 1 for r in reqs],
        extend_lens=[1] * len(reqs),
        logit_rows=torch.arange(len(reqs)),
        num_layers=num_layers,
    )
