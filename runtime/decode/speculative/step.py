"""The speculative decode step: choose draft lengths, propose, verify in one extend pass, give back the
KV of rejected positions. The scheduler calls it instead of a plain decode step when speculation is on.

KV invariant after a step: a request's computed KV covers exactly its accepted tokens (kv_len), slots past
kv_len are freed (whole pages) or reused next step (a partial page), and nothing rejected reaches the
radix tree (the tree only takes fill_ids[:kv_len]).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.runtime.batch import ForwardBatch, make_verify_batch
from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.decode.speculative.proposers import (
    NgramProposer,
    SelfDraftProposer,
    cut_by_grammar,
    spec_state,
)
from radixlm.runtime.decode.speculative.verify import verify
from radixlm.runtime.kv.cache_manager import KVCacheManager
from radixlm.runtime.request import Req

ACCEPT_WINDOW = 4  # verify steps over which a request's acceptance is judged
COOLDOWN_STEPS = 16  # steps a request goes without drafting after a poor window


class SpecDecoder:
    def __init__(self, cfg: SpeculativeConfig, forward: Callable[[ForwardBatch], torch.Tensor], cache: KVCacheManager,
                 decode: Callable[[list[int]], str], max_context: int, cpu_isa: int | None = None) -> None:
        self.cfg, self.forward, self.cache, self.cpu_isa = cfg, forward, cache, cpu_isa
        self.decode, self.max_context = decode, max_context
        self.k = cfg.speculative_num_draft_tokens
        self.ngram = NgramProposer(cfg.speculative_ngram_min, cfg.speculative_ngram_max) \
            if cfg.speculative_algorithm == "ngram" else None
        self.draft = SelfDraftProposer(forward, cfg.speculative_draft_layers) \
            if cfg.speculative_algorithm == "draft" else None
        self.stats = {"spec_verify_steps": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0}

    def plan(self, reqs: list[Req]) -> list[list[int]] | list[int]:
        """Draft lengths before allocation: ngram proposes now (exact lengths); the self-draft needs its
        slots first, so it gets budgets and proposes in ``run``."""
        budgets = [self._budget(r) for r in reqs]
        if self.ngram is None:
            return budgets
        return [cut_by_grammar(r, d) for r, d in zip(reqs, self.ngram.propose(reqs, budgets), strict=True)]

    @staticmethod
    def sizes(plan: list[list[int]] | list[int]) -> list[int]:
        return [len(p) if isinstance(p, list) else p for p in plan]

    def _budget(self, req: Req) -> int:
        st = spec_state(req)
        if st.cooldown > 0:
            st.cooldown -= 1
            return 0
        room = min(req.params.max_new_tokens - len(req.output_ids), self.max_context - len(req.fill_ids)) - 1
        return max(0, min(self.k, room))

    def run(self, reqs: list[Req], locs: list[torch.Tensor], plan) -> list[int]:
        """Verify; -> each request's output length before this step (its new tokens follow)."""
        if self.draft is not None:
            drafts = [cut_by_grammar(r, d) for r, d in zip(reqs, self.draft.propose(reqs, plan, locs), strict=True)]
        else:
            drafts = plan
        logits = self.forward(make_verify_batch(reqs, drafts, locs))
        rows = list(logits.split([1 + len(d) for d in drafts]))
        starts, before = [len(r.output_ids) for r in reqs], [r.kv_len for r in reqs]
        accepted = verify(rows, reqs, drafts, self.decode, self.max_context, self.cpu_isa)
        for r, d, a, kv in zip(reqs, drafts, accepted, before, strict=True):
            r.kv_len = min(kv + 1 + a, len(r.fill_ids) - 1)  # the newest token has no KV yet
            self.cache.truncate(r, r.kv_len)
            if d:
                spec_state(r).record(len(d), a, ACCEPT_WINDOW, self.cfg.speculative_min_accept_rate, COOLDOWN_STEPS)
                self.stats["spec_verify_steps"] += 1
                self.stats["spec_draft_tokens"] += len(d)
                self.stats["spec_accepted_tokens"] += a
        return starts
