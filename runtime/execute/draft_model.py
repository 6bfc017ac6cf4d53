"""Speculation with a separate draft model: a smaller model of the same vocabulary drafts, greedily.

The draft keeps its KV in a pool of its own at the target's slot indices (its runner shares the target's
allocator and request table: ModelRunner(slots_of=...)), so a request's row, the radix tree's prefixes and
the disk tier's loads name the same slots for both models. ``valid`` [slots] says which slots hold the
draft's KV for the token the target holds there; the allocator clears it for every slot it hands out.

Each request's draft KV catches up on the positions from its first slot the draft lacks (a new prompt, a
prefix computed by the target alone, tokens decoded without speculation, the last token kept by the
verify) in the first draft step, an extend through the request's last token; then the draft feeds its own
guesses, one decode step each, into the slots the scheduler planned for the verify. The draft never decides a
token: the target verifies every position as it would decode it, so a stale or poor draft costs acceptance,
never exactness.

A constrained request drafts within its grammar: each draft step masks what the grammar forbids before the
argmax, and the matcher takes the guess (all rolled back after the draft), so every drafted token is one the
grammar allows, and what it forces (a schema's keys and punctuation) is drafted even by a poor draft.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from radixlm.runtime.batch import ExtendEntry, ForwardBatch, make_decode_batch, make_extend_batch
from radixlm.runtime.execute.sampler import apply_grammars, argmax_rows
from radixlm.runtime.request import Req

CHUNK = 1024  # most positions of one request a catch-up extend runs
LAG_IN_STEP = 8  # a lag up to this many positions is run inside the first draft step, not caught up apart


class DraftModelProposer:
    def __init__(self, forward: Callable[[ForwardBatch], torch.Tensor], valid: torch.Tensor,
                 table: torch.Tensor, cpu_isa: int | None = None) -> None:
        """``forward``: the draft runner's; ``valid`` [slots] bool; ``table``: the request -> slot table;
        ``cpu_isa``: the grammar masks' kernel path (sampler.apply_grammars)."""
        self.forward, self.valid, self.table, self.cpu_isa = forward, valid, table, cpu_isa
        self.caught_up_tokens = 0  # positions run through the draft to catch up, since start
        self.last_catch_up_s = 0.0  # seconds the last propose spent catching up

    def propose(self, reqs: list[Req], ks: list[int], locs: list[torch.Tensor]) -> list[list[int]]:
        """Up to ks[i] greedy draft tokens for request i, written into locs[i][:ks[i]] of the draft's pool.

        The first draft step is one extend a request over the positions its draft KV lacks, through its last
        token (in steady state the one drafted token the verify kept last time, then the last token); a lag
        longer than ``LAG_IN_STEP`` (a prompt, or tokens decoded without speculation) is caught up before,
        timed apart (``last_catch_up_s``). Then one decode step per further draft token."""
        live = [i for i, k in enumerate(ks) if k > 0]
        starts = {i: self._first_missing(reqs[i]) for i in live}
        far = {i: s for i, s in starts.items() if reqs[i].kv_len - s > LAG_IN_STEP}
        t0 = time.perf_counter()
        self._catch_up({reqs[i]: s for i, s in far.items()})
        self.last_catch_up_s = time.perf_counter() - t0
        starts.update({i: reqs[i].kv_len for i in far})  # caught up through kv_len
        drafts: list[list[int]] = [[] for _ in reqs]
        if not live:
            return drafts
        entries = []
        for i, start in starts.items():
            r = reqs[i]
            entries.append(ExtendEntry(r, start, r.kv_len + 1 - start, self.table[r.row, start:r.kv_len + 1].clone(),
                                       [r.kv_len]))
        held: dict[int, int] = {}  # request -> tokens its grammar took during this draft
        try:
            self._choose(self.forward(make_extend_batch(entries)), live, reqs, drafts, held)
            self.valid[torch.cat([e.loc for e in entries])] = True
            for j in range(1, max(ks)):
                step = [i for i in live if ks[i] > j and len(drafts[i]) == j and not _ended(reqs[i])]
                if not step:
                    break
                step_locs = [locs[i][j:j + 1] for i in step]
                batch = make_decode_batch([reqs[i] for i in step], step_locs, [drafts[i][-1] for i in step],
                                          offset=j)
                self._choose(self.forward(batch), step, reqs, drafts, held)
                self.valid[torch.cat(step_locs)] = True
        finally:
            for i, n in held.items():
                reqs[i].grammar.rollback(n)
        return drafts

    def _choose(self, logits: torch.Tensor, rows: list[int], reqs: list[Req], drafts: list[list[int]],
                held: dict[int, int]) -> None:
        """Append to drafts[i] the greedy token of logits' row for each request i of ``rows``: a constrained
        request's among what its grammar allows, which its matcher then takes (counted in ``held``); none where
        the grammar has ended or takes nothing more."""
        apply_grammars(logits, [reqs[i] for i in rows], self.cpu_isa)
        for i, t in zip(rows, argmax_rows(logits).tolist(), strict=True):
            g = reqs[i].grammar
            if g is not None:
                if _ended(reqs[i]) or not g.accept_token(t):
                    continue
                held[i] = held.get(i, 0) + 1
            drafts[i].append(t)

    def _first_missing(self, r: Req) -> int:
        """The first of positions [0, kv_len) whose slot lacks the draft's KV (kv_len: none)."""
        missing = (~self.valid[self.table[r.row, : r.kv_len]]).nonzero()
        return int(missing[0]) if missing.numel() else r.kv_len

    def rejected(self, locs: list[torch.Tensor], drafts: list[list[int]], accepted: list[int]) -> None:
        """The draft's KV at rejected positions names tokens the target did not keep."""
        for loc, d, n in zip(locs, drafts, accepted, strict=True):
            if n < len(d):
                self.valid[loc[1 + n:1 + len(d)]] = False

    def _catch_up(self, starts: dict[Req, int]) -> None:
        """Run positions [starts[r], kv_len) of each request r through the draft, in extends of at most ``CHUNK``
        positions a request (a long prompt's catch-up is chunked like its prefill)."""
        while starts:
            entries = []
            for r, start in starts.items():
                n = min(r.kv_len - start, CHUNK)
                entries.append(ExtendEntry(r, start, n, self.table[r.row, start:start + n].clone(), [start + n - 1]))
            self.forward(make_extend_batch(entries))
            for e in entries:
                self.valid[e.loc] = True
                self.caught_up_tokens += e.n
            starts = {e.req: e.start + e.n for e in entries if e.start + e.n < e.req.kv_len}


def _ended(req: Req) -> bool:
    """Whether the request's grammar took its last token (its draft ends there)."""
    return req.grammar is not None and req.grammar.is_terminated()
