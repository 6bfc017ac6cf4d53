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
