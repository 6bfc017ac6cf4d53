"""Speculation's policy, the scheduler's side of it: how long a draft each request gets, the n-gram drafts, and
each request's acceptance, which turns drafting off for a while where it does not pay. The executor proposes
the self-draft and verifies (execute/verify.py).

KV invariant after a verify step (postprocess keeps it): a request's computed KV covers exactly its accepted
tokens (kv_len), slots past kv_len are freed (whole pages) or reused next step (a partial page), and nothing
rejected reaches the radix tree (the tree only takes fill_ids[:kv_len]).
"""

from __future__ import annotations

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.decode.speculative.proposers import NgramProposer, cut_by_grammar, spec_state
from radixlm.runtime.request import Req

ACCEPT_WINDOW = 4  # verify steps over which a request's acceptance is judged
COOLDOWN_STEPS = 16  # steps a request goes without drafting after a poor window


class SpecPolicy:
    def __init__(self, cfg: SpeculativeConfig, max_context: int) -> None:
        self.cfg, self.max_context = cfg, max_context
        self.k = cfg.speculative_num_draft_tokens
        self.ngram = NgramProposer(cfg.speculative_ngram_min, cfg.speculative_ngram_max) \
            if cfg.speculative_algorithm == "ngram" else None
        self.stats = {"spec_verify_steps": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0}

    def plan(self, reqs: list[Req]) -> list[list[int]] | list[int]:
        """Drafts before allocation: n-gram drafts now (their exact tokens); the self-draft needs its slots first,
        so it gets lengths and the executor proposes."""
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

    def record(self, req: Req, draft: list[int], tokens: list[int]) -> None:
        """After a verify step: the request's draft and the tokens it kept (each accepted draft token, then the
        one after them, unless it ended on a draft token)."""
        if not draft:
            return
        accepted = sum(j < len(draft) and draft[j] == t for j, t in enumerate(tokens))
        spec_state(req).record(len(draft), accepted, ACCEPT_WINDOW, self.cfg.speculative_min_accept_rate,
                               COOLDOWN_STEPS)
        self.stats["spec_verify_steps"] += 1
        self.stats["spec_draft_tokens"] += len(draft)
        self.stats["spec_accepted_tokens"] += accepted
