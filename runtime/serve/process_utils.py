"""Child-process hygiene: die with the parent, never linger as an orphan."""

from __future__ import annotations

import ctypes
import logging
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


def exit_now(code: int) -> None:
    """End this process with ``code`` once it has closed what it owns (sockets, process groups): flush the logs
    and skip the interpreter's teardown of every module, torch's the slowest, which made up most of a stop."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def tp_process_name(rank: int) -> str:
    return f"tp-rank-{rank}"
