"""Writes pages on a thread of its own, so that the scheduler's step does not wait for the disk.

The thread does file I/O only (no torch work: see the shared reference on libgomp and second threads). A
page waits in a bounded queue; when more than ``max_pending_bytes`` wait, new pages are skipped (counted),
not queued: the tier is a cache, and a page not written is only a later recompute.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref

from radixlm.radix_cache.disk.store import DiskStore


class PageWriter:
    def __init__(self, store: DiskStore, max_pending_bytes: int = 256 << 20) -> None:
        self.store, self.max_pending = store, max_pending_bytes
        self.pending_bytes = 0
        self.skipped = 0  # pages dropped because too many bytes were waiting
        self._pending: set[bytes] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="radixlm-kv-disk-writer", daemon=True)
        self._thread.start()
        self._closed = False
        atexit.register(_close_at_exit, weakref.ref(self))  # an engine never shut down still writes its queue

    def pending(self, key: bytes) -> bool:
        return key in self._pending

    def submit(self, key: bytes, tokens: list[int], payload: memoryview, keepalive: object = None) -> bool:
        """Queue one page (``keepalive``: the object that owns ``payload``'s memory); False when skipped."""
        size = len(payload)
        with self._lock:
            if key in self._pending:
                return True
            if self.pending_bytes + size > self.max_pending:
                self.skipped += 1
                return False
            self._pending.add(key)
            self.pending_bytes += size
        self._queue.put((key, tokens, payload, keepalive))
        return True

    def flush(self) -> None:
        """Wait until every queued page is written (or failed)."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued and stop the thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:  # the lowest priority on Linux: the forward pass's threads go first (its barriers wait for each)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while (item := self._queue.get()) is not None:
            key, tokens, payload, _ = item
            try:
                self.store.put(key, tokens, payload)
            except Exception as e:  # noqa: BLE001 - a bug here must not kill the thread and hang flush()
                self.store.stats.errors.append(repr(e))
            with self._lock:
                self._pending.discard(key)
                self.pending_bytes -= len(payload)
            self._queue.task_done()
        self._queue.task_done()


def _close_at_exit(ref: weakref.ref) -> None:
    writer = ref()
    if writer is not None:
        writer.close()
