"""Speculation's policy, the scheduler's side of it: how long a draft each request gets, the model-free drafts
(suffix decoding, n-gram lookup), each request's acceptance, and whether speculating pays at all. The executor
proposes the self-draft and verifies (execute/verify.py).

Adaptive, at two levels: a request's next draft is as long as its last one kept plus one (doubling while every
token is kept, up to the most allowed), and a request whose recent acceptance is poor stops drafting for a while;
and for the whole batch, speculation runs only where its measured tokens a second beat plain decoding's at that
batch size (PayCheck), so it turns itself off where it does not pay.

KV invariant after a verify step (postprocess keeps it): a request's computed KV covers exactly its accepted
tokens (kv_len), slots past kv_len are freed (whole pages) or reused next step (a partial page), and nothing
rejected reaches the radix tree (the tree only takes fill_ids[:kv_len]).
"""

from __future__ import annotations

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.decode.speculative.proposers import NgramProposer, cut_by_grammar, spec_state
from radixlm.runtime.decode.speculative.suffix import SuffixProposer
from radixlm.runtime.request import Req

ACCEPT_WINDOW = 4  # verify steps over which a request's acceptance is judged
COOLDOWN_STEPS = 16  # steps a request goes without drafting after a poor window
MARGIN = 1.1  # speculation must measure this much faster than plain decoding to run (the measures are noisy)


def size_class(batch: int) -> int:
    """Batch sizes measured together: 1, 2, 3-4, 5-8, 9-16, ... (a power of two's bits)."""
    return (batch - 1).bit_length()


class PayCheck:
    """Tokens a second of recent verify steps and of recent plain decode steps, per batch size class (exponential
    averages), and the choice between them: measure speculation first, then plain decoding, then run speculation
    only where it is faster by MARGIN, giving the other one step every ``probe_every`` (4x that where one is 1.5x
    the other) to keep its measure fresh. A class not yet measured both ways follows the nearest one that is."""

    def __init__(self, probe_every: int = 16) -> None:
        self.rate: dict[tuple[str, int], float] = {}
        self.probe_every, self.steps, self.batch = probe_every, 0, 0

    def observe(self, mode: str, batch: int, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        key, now = (mode, size_class(batch)), tokens / seconds
        old = self.rate.get(key)
        self.rate[key] = now if old is None else 0.5 * old + 0.5 * now

    def rates(self, cls: int) -> tuple[float | None, float | None]:
        """(speculation's, plain decoding's) tokens a second at size class ``cls``; None where not measured."""
        return self.rate.get(("verify", cls)), self.rate.get(("decode", cls))

    def speedup(self) -> float | None:
        """Speculation's tokens a second over plain decoding's at the batch size last decided (None: not both
        measured there)."""
        spec, plain = self.rates(self.batch)
        return spec / plain if spec and plain else None

    def speculate(self, batch: int) -> bool:
        self.steps, self.batch = self.steps + 1, size_class(batch)
        faster, (spec, plain) = self._faster(self.batch), self.rates(self.batch)
        if faster is None:  # nothing to go by: measure speculation first, then plain decoding
            return spec is None
        far = spec is not None and plain is not None and max(spec, plain) > 1.5 * min(spec, plain)
        return faster != (self.steps % (self.probe_every * (4 if far else 1)) == 0)  # now and then, the other

    def probing(self) -> bool:
        """The last ``speculate`` chose speculation though it measured slower there: a probe."""
        return self._faster(self.batch) is False

    def _faster(self, cls: int) -> bool | None:
        """Whether speculation beats plain decoding by MARGIN at this size class, or where it is not measured
        both ways, at the nearest class that is (None: at none)."""
        both = [c for c in {c for _, c in self.rate} if None not in self.rates(c)]
        if not both:
            return None
        spec, plain = self.rates(min(both, key=lambda c: (abs(c - cls), c)))
        return spec >= MARGIN * plain


class SpecPolicy:
    """Each request speculates with its method: the one it names (its ``speculative``), else the server's
    (--speculative-algorithm). The model-free methods are always offered (they cost nothing until a request uses
    them); 'draft' is the draft model where the server loaded one, else the self-draft."""

    def __init__(self, cfg: SpeculativeConfig, max_context: int) -> None:
        self.cfg, self.max_context = cfg, max_context
        self.k, self.default = cfg.speculative_num_draft_tokens, cfg.speculative_algorithm
        self.ngram = NgramProposer(cfg.speculative_ngram_min, cfg.speculative_ngram_max)
        self.suffix = SuffixProposer(cfg.speculative_ngram_min, cfg.speculative_ngram_max,
                                     cfg.speculative_suffix_min_share, cfg.speculative_suffix_memory_tokens)
        self.pays = PayCheck() if cfg.speculative_adaptive else None
        self.draft_model = cfg.speculative_draft_model is not None  # (a draft model built in-process: core sets it)
        self.stats = {"spec_verify_steps": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0,
                      "spec_off_steps": 0}
        self.by_method: dict[str, list[int]] = {}  # method -> [drafted, accepted] tokens since start

    def method(self, req: Req) -> str | None:
        """The request's speculation method (None: it does not speculate)."""
        choice = req.params.speculative
        return choice if isinstance(choice, str) else self.default if choice else None

    def plan(self, reqs: list[Req]) -> list[list[int] | int] | None:
        """Each request's draft before allocation, or None where speculating does not pay at this batch size:
        the model-free methods' exact tokens now; a 'draft' request's length (its drafter needs the slots
        first, so the executor proposes)."""
        if self.pays is not None and not self.pays.speculate(len(reqs)):
            self.stats["spec_off_steps"] += 1
            return None
        methods = [self.method(r) for r in reqs]
        budgets = [self._budget(r) if m else 0 for r, m in zip(reqs, methods, strict=True)]
        if self.draft_model and self.pays is not None and self.pays.probing():
            # a draft model first runs a request's whole prompt: a probe takes only requests it has run before
            budgets = [0 if m == "draft" and not spec_state(r).verify_steps else b
                       for r, m, b in zip(reqs, methods, budgets, strict=True)]
            if not any(budgets):
                self.stats["spec_off_steps"] += 1
                return None
        plan: list[list[int] | int] = [[] if m != "draft" else b for m, b in zip(methods, budgets, strict=True)]
        for name, propose in (("ngram", self.ngram.propose), ("suffix", self._suffix)):
            rows = [i for i, m in enumerate(methods) if m == name and budgets[i]]
            for i, d in zip(rows, propose([reqs[i] for i in rows], [budgets[i] for i in rows]), strict=True):
                plan[i] = cut_by_grammar(reqs[i], d)
        return plan

    def _suffix(self, reqs: list[Req], budgets: list[int]) -> list[list[int]]:
        return self.suffix.propose(reqs, budgets, [spec_state(r) for r in reqs])

    @staticmethod
    def sizes(plan: list[list[int] | int]) -> list[int]:
        return [len(p) if isinstance(p, list) else p for p in plan]

    def _budget(self, req: Req) -> int:
        st = spec_state(req)
        if st.cooldown > 0:
            st.cooldown -= 1
            return 0
        room = min(req.params.max_new_tokens - len(req.output_ids), self.max_context - len(req.fill_ids)) - 1
        return max(0, min(self.k if st.next_len is None else st.next_len, room))

    def record(self, req: Req, draft: list[int], tokens: list[int]) -> None:
        """After a verify step: the request's draft and the tokens it kept (each accepted draft token, then the
        one after them, unless it ended on a draft token)."""
        if not draft:
            return
        accepted = sum(j < len(draft) and draft[j] == t for j, t in enumerate(tokens))
        st = spec_state(req)
        st.next_len = min(self.k, 2 * len(draft) if accepted == len(draft) else accepted + 1)
        st.record(len(draft), accepted, ACCEPT_WINDOW, self.cfg.speculative_min_accept_rate, COOLDOWN_STEPS)
        self.stats["spec_verify_steps"] += 1
        self.stats["spec_draft_tokens"] += len(draft)
        self.stats["spec_accepted_tokens"] += accepted
        counts = self.by_method.setdefault(self.method(req) or "none", [0, 0])
        counts[0], counts[1] = counts[0] + len(draft), counts[1] + accepted

    def accept_rates(self) -> dict[str, float]:
        """Each method's accepted / drafted tokens since start (the methods that drafted)."""
        return {m: accepted / drafted for m, (drafted, accepted) in self.by_method.items() if drafted}

    def observe(self, mode: str, batch: int, tokens: int, seconds: float) -> None:
        """A decode or verify step's tokens and time, for the pay check."""
        if self.pays is not None:
            self.pays.observe(mode, batch, tokens, seconds)

    def finished(self, req: Req) -> None:
        """A request's output joins its namespace's suffix table where suffix decoding is the server's method
        or the request's."""
        if req.output_ids and "suffix" in (self.default, self.method(req)):
            self.suffix.finished(req)
