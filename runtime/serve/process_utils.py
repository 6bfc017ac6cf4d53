"""Child-process hygiene: die with the parent, never linger as an orphan."""

from __future__ import annotations

import ctypes
import os
import signal
import sys


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent exits (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


def tp_process_name(rank: int) -> str:
    return f"tp-rank-{rank}"


# Spawn targets. The parent pickles a target by reference, so it must import the target's module: these
# import the scheduler's and the TP worker's modules (torch, the model) in the child only, which keeps
# torch out of the API process.

def scheduler_main(*args) -> None:
    from radixlm.runtime.serve.scheduler_process import run_scheduler

    run_scheduler(*args)


def tp_worker_main(*args) -> None:
    from radixlm.runtime.serve.tp_worker import run_tp_worker

    run_tp_worker(*args)
