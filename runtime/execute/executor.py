"""The executor: runs a StepPlan's forward passes and all of its sampling, and returns tokens and logprobs.

One place for every mode: a prefill (with riders), decode steps (one, or several back to back, in one fused
C++ call where the runner has it), and a speculative verify (after the self-draft proposes, where it drafts).
It reads requests (their tokens, settings, grammar matchers, generators) and draws from their generators; it
never appends a token, touches a queue or allocates KV: postprocess does (scheduler/).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from radixlm.runtime.batch import ForwardBatch, make_decode_batch, make_extend_batch, make_verify_batch
from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.decode.logprobs import prompt_logprobs
from radixlm.runtime.decode.speculative.proposers import cut_by_grammar
from radixlm.runtime.execute.draft_model import DraftModelProposer
from radixlm.runtime.execute.sampler import sample
from radixlm.runtime.execute.self_draft import SelfDraftProposer
from radixlm.runtime.execute.steps import GroupedSteps, run_steps
from radixlm.runtime.execute.verify import verify
from radixlm.runtime.step_plan import Sampled, StepPlan, StepResult


class Executor:
    """``forward``: a ForwardBatch -> logits [R, vocab] float32 (the model runner's); ``fused_steps``: several
    decode steps in one call, where the runner has it (None: one forward a step); ``cpu_isa``: the path of
    radixlm's C++ CPU kernels the sampler uses (None: torch's ops)."""

    def __init__(self, forward: Callable[[ForwardBatch], torch.Tensor], fused_steps: GroupedSteps | None = None,
                 cpu_isa: int | None = None, speculative: SpeculativeConfig | None = None,
                 draft_model: DraftModelProposer | None = None) -> None:
        """``draft_model``: the separate draft model's proposer (--speculative-draft-model), the 'draft' method's
        drafter; without one, the self-draft drafts for it (where the server speculates)."""
        self.forward, self.fused_steps, self.cpu_isa = forward, fused_steps, cpu_isa
        self.draft_model = draft_model
        self.self_draft = SelfDraftProposer(forward, speculative.speculative_draft_layers) \
            if speculative is not None and speculative.speculative_algorithm is not None and draft_model is None \
            else None

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> StepResult:
        start = time.monotonic()
        if plan.mode == "prefill":
            result = self._prefill(plan)
        elif plan.mode == "verify":
            result = self._verify(plan)
        elif plan.steps > 1:
            result = StepResult(run_steps(self.forward, plan.reqs, plan.locs, plan.steps, self.fused_steps,
                                          self.cpu_isa))
        else:
            result = self._sample(self.forward(make_decode_batch(plan.reqs, plan.locs)), plan.reqs)
        result.seconds = time.monotonic() - start
        return result

    def _sample(self, logits: torch.Tensor, reqs: list) -> StepResult:
        """One token for each request from its row of ``logits`` [len(reqs), V] (modified in place)."""
        out = sample(logits, reqs, self.cpu_isa)
        sampled = [Sampled.empty(r) for r in reqs]
        for i, got in enumerate(sampled):
            got.extend(out, i)
        return StepResult(sampled)

    def _prefill(self, plan: StepPlan) -> StepResult:
        """One extend over the entries and riders: the entries' prompt logprobs where asked, and a token for each
        rider and each entry whose fill ids the step completes (plan.sampled, riders first)."""
        logits = self.forward(make_extend_batch(plan.entries + plan.riders))
        lps, last, row = [], {}, 0
        for e in plan.entries:  # each entry's rows are its logit positions, in order
            k = len(e.logit_positions)
            asked = e.req.logprob.return_logprob and not e.req.output_ids
            lps.append(prompt_logprobs(e.req, e.logit_positions, logits[row:row + k], self.cpu_isa) if asked else None)
            last[id(e.req)] = row + k - 1
            row += k
        for i, r in enumerate(plan.riders):  # a rider's one row comes after every entry's
            last[id(r.req)] = row + i
        rows = [last[id(r)] for r in plan.sampled]
        result = self._sample(logits[rows], plan.sampled) if rows else StepResult()
        result.prompt_logprobs = lps
        return result

    def _verify(self, plan: StepPlan) -> StepResult:
        """Each request's draft verified in one extend: the model-free methods' as planned, the 'draft' method's
        (a length in the plan) proposed now into its slots by the draft model or the self-draft."""
        drafts = plan.drafts
        if any(isinstance(d, int) for d in drafts):
            ks = [d if isinstance(d, int) else 0 for d in drafts]
            proposed = (self.draft_model or self.self_draft).propose(plan.reqs, ks, plan.locs)
            drafts = [cut_by_grammar(r, p) if isinstance(d, int) else d
                      for r, d, p in zip(plan.reqs, drafts, proposed, strict=True)]
        logits = self.forward(make_verify_batch(plan.reqs, drafts, plan.locs))
        rows = list(logits.split([1 + len(d) for d in drafts]))
        sampled = verify(rows, plan.reqs, drafts, self.cpu_isa)
        if self.draft_model is None:
            return StepResult(sampled, drafts=drafts)
        self.draft_model.rejected(plan.locs, drafts, [len(s.tokens) - 1 for s in sampled])
        return StepResult(sampled, drafts=drafts, catch_up_seconds=self.draft_model.last_catch_up_s)
