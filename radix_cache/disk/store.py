"""A folder of KV page files, bounded by bytes (least recently used go first), shared by processes.

Invariants:
  * a page file is either complete or absent under its name: it is written to a temporary name and renamed
    into place (a process killed mid-write leaves only a temporary file, removed by the next start);
  * ``used_bytes`` is the sum of the sizes of the files in the index, and stays <= ``capacity`` after a put;
  * a page that fails its checks on read is removed and counted, never returned.

Several processes (the DP replicas of one machine) may share a folder: each keeps its own index, learns of
the others' pages on a miss (one stat), and treats a page that vanished under it as a miss.

Recency is each file's mtime (a read touches it), so the LRU order survives a restart. Any OSError writing
(a full disk, a failing one) turns the store off with one log line; serving goes on without it.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from radixlm.radix_cache.disk.keys import token_bytes
from radixlm.radix_cache.disk.page_file import CorruptPage, decode_page, encode_header

SUFFIX = ".kv"
log = logging.getLogger("radixlm.kv_disk")


@dataclass
class DiskStats:
    pages_written: int = 0
    bytes_written: int = 0
    pages_read: int = 0
    bytes_read: int = 0
    corrupt_dropped: int = 0  # pages that failed their checks on read (removed, recomputed instead)
    evicted_pages: int = 0  # removed to stay within the capacity
    vanished: int = 0  # indexed pages another process removed
    off_reason: str | None = None  # why the store turned itself off (None: on)
    errors: list[str] = field(default_factory=list)


class DiskStore:
    def __init__(self, folder: str, capacity_bytes: int, fingerprint: str) -> None:
        """Opens (creating) ``folder``; OSError/ValueError when it cannot be used (the caller names the flag)."""
        if capacity_bytes <= 0:
            raise ValueError(f"capacity must be > 0 bytes, got {capacity_bytes}")
        self.folder, self.capacity, self.fingerprint = folder, capacity_bytes, fingerprint
        self.stats = DiskStats()
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # key -> file size, least recently used first
        self.used_bytes = 0
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".probe.{os.getpid()}.tmp")
        with open(probe, "wb") as f:  # raises where the folder cannot be written
            f.write(b"ok")
        os.remove(probe)
        self._scan()

    @property
    def pages(self) -> int:
        return len(self._index)

    @property
    def on(self) -> bool:
        return self.stats.off_reason is None

    def path(self, key: bytes) -> str:
        return os.path.join(self.folder, key.hex() + SUFFIX)

    # ------------------------------------------------------------ lookups
    def known(self, key: bytes) -> bool:
        """In this process's index (no file system call)."""
        return key in self._index

    def find(self, key: bytes) -> bool:
        """On disk: in the index, or written by another process since (one stat)."""
        if not self.on:
            return False
        if key in self._index:
            return True
        try:
            size = os.stat(self.path(key)).st_size
        except OSError:
            return False
        with self._lock:
            if key not in self._index:
                self._index[key] = size
                self.used_bytes += size
        return True

    def run_length(self, keys: list[bytes]) -> int:
        """How many of ``keys``, from the first, are on disk."""
        n = 0
        while n < len(keys) and self.find(keys[n]):
            n += 1
        return n

    # ------------------------------------------------------------ read and write
    def get(self, key: bytes, tokens: list[int]) -> memoryview | None:
        """The payload of ``key``'s page, checked; None when absent, unreadable or corrupt (then removed)."""
        if not self.on:
            return None
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)  # writable: the runtime views it as a tensor
                f.readinto(data)
            payload = decode_page(data, self.fingerprint, key, tokens)
        except FileNotFoundError:
            self._forget(key, vanished=True)
            return None
        except CorruptPage as e:
            log.warning("KV disk tier: dropped page %s (%s); its tokens are recomputed", key.hex()[:16], e)
            self.stats.corrupt_dropped += 1
            self._remove(key)
            return None
        except OSError as e:
            self._turn_off(f"reading {path}: {e}")
            return None
        self.stats.pages_read += 1
        self.stats.bytes_read += len(data)
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
        try:
            os.utime(path)
        except OSError:
            pass
        return payload

    def put(self, key: bytes, tokens: list[int], payload: memoryview | bytes) -> bool:
        """Write ``key``'s page atomically (thread-safe); False when the store is off or the write failed."""
        if not self.on:
            return False
        path = self.path(key)
        tmp = os.path.join(self.folder, f".{key.hex()}.{os.getpid()}.{threading.get_ident()}.tmp")
        head = encode_header(self.fingerprint, key, token_bytes(tokens), payload)
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(payload)
            os.replace(tmp, path)
        except OSError as e:
            _unlink(tmp)
            full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            self._turn_off(f"{'the disk is full' if full else 'a write failed'} writing {path}: {e}")
            return False
        size = len(head) + len(payload)
        self.stats.pages_written += 1
        self.stats.bytes_written += size
        with self._lock:
            self.used_bytes += size - self._index.pop(key, 0)
            self._index[key] = size
        self._shrink(keep=key)
        return True

    # ------------------------------------------------------------ bookkeeping
    def _shrink(self, keep: bytes) -> None:
        """Remove least recently used pages until the store fits its capacity (never ``keep``)."""
        while True:
            with self._lock:
                if self.used_bytes <= self.capacity or len(self._index) <= 1:
                    return
                victim = next(iter(self._index))
                if victim == keep:
                    self._index.move_to_end(victim)
                    victim = next(iter(self._index))
                self.used_bytes -= self._index.pop(victim)
            _unlink(self.path(victim))
            self.stats.evicted_pages += 1

    def _remove(self, key: bytes) -> None:
        self._forget(key)
        _unlink(self.path(key))

    def _forget(self, key: bytes, vanished: bool = False) -> None:
        with self._lock:
            size = self._index.pop(key, None)
            if size is not None:
                self.used_bytes -= size
                self.stats.vanished += vanished

    def _turn_off(self, reason: str) -> None:
        if self.stats.off_reason is None:
            self.stats.off_reason = reason
            log.error("KV disk tier off: %s; serving goes on with the RAM cache alone", reason)

    def _scan(self) -> None:
        """Index the folder's pages, oldest first; remove temporary files whose writer is gone."""
        pages = []
        with os.scandir(self.folder) as it:
            for entry in it:
                if entry.name.endswith(".tmp"):
                    if not _writer_alive(entry.name):
                        _unlink(entry.path)
                    continue
                if not entry.name.endswith(SUFFIX):
                    continue
                try:
                    key = bytes.fromhex(entry.name[: -len(SUFFIX)])
                    st = entry.stat()
                except (ValueError, OSError):
                    continue
                pages.append((st.st_mtime_ns, key, st.st_size))
        for _, key, size in sorted(pages):
            self._index[key] = size
            self.used_bytes += size
        if pages:
            log.info("KV disk tier: %d pages (%.1f MB) in %s", len(pages), self.used_bytes / 1e6, self.folder)
        self._shrink(keep=b"")


def _writer_alive(tmp_name: str) -> bool:
    """A temporary file's writer (``.KEY.PID.TID.tmp``) is still running."""
    try:
        pid = int(tmp_name.split(".")[2])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
