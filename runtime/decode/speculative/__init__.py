"""Speculative decoding's model-free parts: the n-gram proposer and per-request state (proposers.py) and the
scheduler's policy (policy.py). The executor runs the self-draft and the verify pass (runtime/execute/)."""

from radixlm.runtime.decode.speculative.policy import SpecPolicy
from radixlm.runtime.decode.speculative.proposers import NgramProposer, spec_state

__all__ = ["NgramProposer", "SpecPolicy", "spec_state"]
