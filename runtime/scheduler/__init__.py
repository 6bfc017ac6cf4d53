"""The scheduler: queues and the step's plan (scheduler.py), prefill admission (prefill.py), decode step groups
(step_groups.py) and applying a step's result (postprocess.py). It never calls the model: the executor runs
its plans (runtime/execute/)."""

from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.step_plan import StepOutput, StepPlan

__all__ = ["Scheduler", "StepOutput", "StepPlan"]
