"""Speculative decoding: propose draft tokens (proposers.py), verify them in one extend pass (verify.py), and
the scheduler's speculative decode step that ties both to the KV cache (step.py)."""

from radixlm.runtime.decode.speculative.proposers import NgramProposer, SelfDraftProposer, spec_state
from radixlm.runtime.decode.speculative.step import SpecDecoder

__all__ = ["NgramProposer", "SelfDraftProposer", "SpecDecoder", "spec_state"]
