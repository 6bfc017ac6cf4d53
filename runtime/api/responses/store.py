"""Stored Responses: a SQLite table of the responses made with ``store: true``, each scoped to its tenant.

A record keeps what OpenAI's API returns for it (the response object and its input items) and the
conversation up to and including its output (``history``, as Responses input items), so that a request with
``previous_response_id`` continues it with its own input appended: the chat prompt renders the earlier turns
as they were, and their KV is the radix cache's prefix (RAM or disk).

Bounds: a record expires ``ttl_s`` after it was made; beyond ``max_records`` the oldest go first. Every query
names the tenant: another tenant's id reads as absent (404), exactly like an unknown one.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    history TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
"""


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]  # the conversation's input items through this response's output


class ResponseStore:
    def __init__(self, path: str, ttl_s: float, max_records: int) -> None:
        """Opens (creating) the database at ``path`` (OSError / sqlite3.Error when it cannot be)."""
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        self.path, self.ttl_s, self.max_records = path, ttl_s, max_records
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=30, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")  # several servers may share the file
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def put(self, tenant: str | None, record: StoredResponse) -> None:
        now = time.time()
        row = (record.response["id"], _tenant(tenant), now, now + self.ttl_s, json.dumps(record.response),
               json.dumps(record.input_items), json.dumps(record.history))
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)", row)
            self._db.execute("DELETE FROM responses WHERE expires < ?", (now,))
            self._db.execute("DELETE FROM responses WHERE rowid IN (SELECT rowid FROM responses ORDER BY created "
                             "DESC LIMIT -1 OFFSET ?)", (self.max_records,))

    def get(self, tenant: str | None, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute("SELECT response, input_items, history FROM responses WHERE tenant = ? AND "
                                   "id = ? AND expires >= ?", (_tenant(tenant), response_id, time.time())).fetchone()
        return None if row is None else StoredResponse(*(json.loads(x) for x in row))

    def delete(self, tenant: str | None, response_id: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM responses WHERE tenant = ? AND id = ?", (_tenant(tenant), response_id))
        return cur.rowcount > 0

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _tenant(tenant: str | None) -> str:
    return "" if tenant is None else tenant
