"""The executor: a step plan's forward passes and sampling (executor.py), the sampler (sampler.py), decode steps
back to back (steps.py), the self-draft (self_draft.py) and speculative verification (verify.py)."""

from radixlm.runtime.execute.executor import Executor

__all__ = ["Executor"]
