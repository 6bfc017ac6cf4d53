"""The contract of one step: the scheduler's plan, the executor's result.

A step is ``plan = scheduler.schedule()``, ``result = executor.run(plan)``, ``scheduler.postprocess(plan, result)``.
The scheduler chooses requests and KV slots and never calls the model; the executor runs the forward passes and
all sampling and never touches a queue or the allocator; postprocess appends tokens, stops, releases, jumps
forward and inserts into the radix tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.batch import ExtendEntry

if TYPE_CHECKING:
    from radixlm.runtime.request import Req


@dataclass
class StepPlan:
    """What one step runs. ``mode``:

    - "idle": no forward (``ended`` may still hold requests that ended without one);
    - "prefill": ``entries`` (new, chunked or jumped-forward requests: positions [start, start + n) of their fill
      ids) and ``riders`` (running requests decoding one token in the same batch, a mixed chunk) in one extend;
    - "decode": ``reqs`` each feed their last token, ``steps`` forwards back to back; locs[i]: request i's
      ``steps`` new KV slots;
    - "verify": ``reqs`` feed their last token and a draft in one extend; ``drafts[i]`` is request i's draft
      (tokens), or for the 'draft' method its length (the executor's drafter proposes it into its slots);
      locs[i]: 1 + that many.

    ``sampled``: the requests whose next tokens the step chooses, in the order of the result's rows: in a prefill
    the riders, then each entry that completes its fill ids (unless it asked for no new tokens); else ``reqs``.
    Invariant: every request in ``sampled`` holds the KV slots its plan names, and no request appears twice.
    """

    mode: str = "idle"
    entries: list[ExtendEntry] = field(default_factory=list)
    riders: list[ExtendEntry] = field(default_factory=list)
    reqs: list[Req] = field(default_factory=list)
    locs: list[torch.Tensor] = field(default_factory=list)
    steps: int = 1
    drafts: list[list[int] | int] | None = None
    sampled: list[Req] = field(default_factory=list)
    ended: list[Req] = field(default_factory=list)  # aborted, failed or timed out before this step's forward


@dataclass
class SampleOutput:
    """The sampler's answer for one batch of rows: a token each and, where any row asked, logprobs."""

    tokens: list[int]
    logprobs: list[float] | None  # chosen-token logprob per row, for rows that asked (others 0.0)
    top_logprobs: list[list[tuple[int, float]]] | None  # per row, where any row asked for top logprobs


@dataclass
class Sampled:
    """One request's new tokens from a step, in order, and where it asked for logprobs each one's (and its top
    logprobs, where it asked for them: top_logprobs_num > 0)."""

    tokens: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None

    def extend(self, out: SampleOutput, row: int) -> None:
        """Append row ``row`` of a sampler's output (a batch where this request is that row)."""
        self.tokens.append(out.tokens[row])
        if self.logprobs is not None:
            self.logprobs.append(out.logprobs[row])
        if self.top_logprobs is not None:
            self.top_logprobs.append(out.top_logprobs[row])

    @classmethod
    def empty(cls, req: Req) -> Sampled:
        """No tokens yet, with room for the logprobs the request asked for."""
        lp = req.logprob
        return cls([], [] if lp.return_logprob else None, [] if lp.return_logprob and lp.top_logprobs_num else None)


@dataclass
class PromptLogprobs:
    """The logprobs of prompt tokens computed in an extend: ``first`` when the chunk starts the prompt (its first
    token has none), then each next token's logprob and, where asked, its top ones."""

    first: bool
    chosen: list[float]
    targets: list[int]
    top: list[list[tuple[int, float]]] | None


@dataclass
class StepResult:
    """The executor's answer to a plan: ``sampled[i]`` for plan.sampled[i]; ``prompt_logprobs[i]`` for
    plan.entries[i] (None: not asked); ``drafts``: the drafts verified (verify mode); ``seconds``: how long the
    forward passes and sampling took; ``catch_up_seconds``: of those, the draft model's catch-up on tokens it
    had not seen (a prompt's, once a request: its prefill, not a cost of each speculative step)."""

    sampled: list[Sampled] = field(default_factory=list)
    prompt_logprobs: list[PromptLogprobs | None] = field(default_factory=list)
    drafts: list[list[int]] | None = None
    seconds: float = 0.0
    catch_up_seconds: float = 0.0


@dataclass
class StepOutput:
    """What a step did for one request: its new tokens (after postprocess) and whether it is done."""

    req: Req
    new_tokens: list[int]
    finished: bool
