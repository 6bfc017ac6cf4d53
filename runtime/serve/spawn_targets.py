"""Spawn targets of the launcher's child processes.

The parent pickles a target by reference, so it must import the target's module: these import the scheduler's
and the TP worker's modules (torch, the model) in the child only, which keeps torch out of the API process. A
target that returns has stopped cleanly; one that raises exits as before. (Its own module: the processes it starts
import process_utils, so the targets there made a cycle.)
"""

from __future__ import annotations

from radixlm.runtime.serve.process_utils import exit_now


def scheduler_main(*args) -> None:
    from radixlm.runtime.serve.scheduler_process import run_scheduler

    run_scheduler(*args)
    exit_now(0)


def tp_worker_main(*args) -> None:
    from radixlm.runtime.serve.tp_worker import run_tp_worker

    run_tp_worker(*args)
    exit_now(0)
