"""Speculative decoding's model-free parts: each request's bookkeeping, prompt lookup (n-gram), and cutting a draft
to what the grammar allows. (The self-draft runs the model: execute/self_draft.py.)

Every proposer proposes greedily, so a draft is a deterministic guess: verification (verify.py) samples each position as
plain decoding would and accepts draft token d iff the sample is d (with probability p(d)), so the output is
the tokens speculation-off decoding gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixlm.runtime.request import Req

if TYPE_CHECKING:
    from radixlm.runtime.decode.speculative.suffix import SuffixTable


@dataclass
class SpecState:
    """Per-request speculation bookkeeping (lives on the Req)."""

    index: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> position right after it
    indexed: int = 0  # tokens of prompt + output already in ``index``
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    recent: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) of the last steps
    cooldown: int = 0  # steps left without drafting (acceptance was low)
    strikes: int = 0  # poor windows in a row: each doubles the next cooldown (up to 16x)
    next_len: int | None = None  # the next draft's length (adaptive); None: the most allowed
    suffix: SuffixTable | None = None  # the request's own table (suffix decoding), once it drafted
    suffix_indexed: int = 0  # tokens of prompt + output already in ``suffix``

    def record(self, drafted: int, accepted: int, window: int, min_rate: float, pause: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.verify_steps += 1
        self.recent = [*self.recent[-(window - 1):], (drafted, accepted)]
        tried = sum(d for d, _ in self.recent)
        if len(self.recent) < window or not tried:
            return
        if sum(a for _, a in self.recent) / tried < min_rate:  # not paying off here: stop for a while
            self.cooldown, self.recent = pause << min(self.strikes, 4), []
            self.strikes += 1
        else:
            self.strikes = 0


def spec_state(req: Req) -> SpecState:
    if req.spec_state is None:
        req.spec_state = SpecState()
    return req.spec_state


class NgramProposer:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last n tokens
    (n from max_n down to min_n). The index grows by one entry per n and new token, so a step costs O(max_n)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"speculative ngram sizes must satisfy 1 <= min <= max, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, reqs: list[Req], ks: list[int]) -> list[list[int]]:
        return [self._one(r, k) if k > 0 else [] for r, k in zip(reqs, ks, strict=True)]

    def _one(self, req: Req, k: int) -> list[int]:
        seq, st = req.fill_ids, spec_state(req)
        # index every n-gram that ends before the last token, so a lookup never finds the suffix itself
        for end in range(max(st.indexed, 1), len(seq)):
            for n in range(self.min_n, self.max_n + 1):
                if end - n >= 0:
                    st.index[tuple(seq[end - n:end])] = end
        st.indexed = max(st.indexed, len(seq))
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(seq) > n:
                pos = st.index.get(tuple(seq[-n:]))
                if pos is not None:
                    return seq[pos:pos + k]
        return []


def cut_by_grammar(req: Req, draft: list[int]) -> list[int]:
    """The longest prefix of ``draft`` the request's grammar allows (the matcher is rolled back after)."""
    if req.grammar is None or not draft:
        return draft
    n = 0
    for t in draft:
        if req.grammar.is_terminated() or not req.grammar.accept_token(t):
            break
        n += 1
    if n:
        req.grammar.rollback(n)
    return draft[:n]
