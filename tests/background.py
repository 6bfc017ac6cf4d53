"""Fixed-cost checks that depend on no test's state start when collection ends and run at idle priority
beside the tests: transformers' reference for SmolLM2, the Triton interpreter's checks, the AArch64 compiles.

A test module names its jobs in ``BACKGROUND_JOBS = {name: fn}``; conftest starts each job of every selected
module as a ``Job``, and the module's fixture waits for it with ``background(name).result()``. A job's processes
run at idle priority (see IDLE): they get CPU time only where the tests leave a core idle (the suite keeps
its two cores busy about two thirds of the time), so they do not slow the tests they run beside. The job's thread only
starts processes and waits for them; no torch work runs off the main thread.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

# Runs argv[1:] at idle priority: in a session of its own whose autogroup has nice 19, under SCHED_IDLE (both
# kept across exec and inherited by its children). Both are needed. With autogroups on (Linux's default),
# CFS first shares the CPU between sessions' groups as equals, so a SCHED_IDLE process in a group of its own
# competes with a server's session as an equal: one such busy process cut a server's batch-1 decode from
# ~85 to ~15 tok/s on the 2-core machine, because the forward's two threads meet at a barrier after each
# phase and one of them waited out the other's slices. A group at nice 19 weighs 15 against 1024.
_IDLE_CODE = """
import os, sys
os.setsid()
try:
    with open("/proc/self/autogroup", "w") as f:
        f.write("19")
except OSError:
    pass  # no autogroups: the policy below is enough
if hasattr(os, "SCHED_IDLE"):
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
os.execvp(sys.argv[1], sys.argv[1:])
"""
IDLE = [sys.executable, "-c", _IDLE_CODE]


class Job:
    """``fn(job)`` on a daemon thread; ``result()`` waits for what it returned (or raises what it raised)."""

    def __init__(self, name: str, fn: Callable[[Job], Any]) -> None:
        self.name = name
        self.tmp = tempfile.mkdtemp(prefix="radixlm-job-")  # the job's own folder, removed by close()
        self._procs: list[subprocess.Popen] = []
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._main, args=(fn,), name=f"job {name}", daemon=True).start()

    def _main(self, fn: Callable[[Job], Any]) -> None:
        try:
            self._value = fn(self)
        except BaseException as e:  # handed to whoever waits in result()
            self._error = e
        finally:
            self._done.set()

    def start(self, argv: list[str], **popen: Any) -> subprocess.Popen:
        """``argv`` started at idle priority, its stdout and stderr captured as text."""
        proc = subprocess.Popen(IDLE + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
        self._procs.append(proc)
        return proc

    def run(self, argv: list[str], timeout: float = 900, **popen: Any) -> subprocess.CompletedProcess:
        """``subprocess.run`` at idle priority (output captured as text)."""
        proc = self.start(argv, **popen)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def result(self, timeout: float = 1800) -> Any:
        if not self._done.wait(timeout):
            raise TimeoutError(f"background job {self.name!r} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value

    def close(self) -> None:
        """Kills what is still running (a session that ends before a job's tests ran); removes ``tmp``."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

