"""KV slots for requests: prefix matching in the radix tree, allocation with eviction, and release.

Ownership invariant, at every step boundary:
    free pages * P + tree.total_size() + sum(pages owned by admitted requests) * P == allocator.capacity
A request's row holds tree slots in [0, prefix_len) (locked via req.last_node) and its own pages after that.
"""

from __future__ import annotations

import torch

from radixlm.radix_cache import RadixCache
from radixlm.runtime.kv.disk_tier import DiskTier
from radixlm.runtime.kv.pool import PageAllocator, ReqToTokenPool
from radixlm.runtime.request import Req


class KVCacheManager:
    def __init__(self, allocator: PageAllocator, req_to_token: ReqToTokenPool, tree: RadixCache | None,
                 disk: DiskTier | None = None) -> None:
        self.alloc = allocator
        self.req_to_token = req_to_token
        self.tree = tree  # None: radix cache disabled, every request keeps private KV
        self.disk = disk  # None: no disk tier (it needs the tree)
        self.page = allocator.page_size

    # ------------------------------------------------------------ admission
    def peek_prefix_len(self, req: Req) -> int:
        return self.tree.peek_prefix_len(req.fill_ids, req.namespace) if self.tree else 0

    def admit(self, req: Req) -> bool:
        """Take a table row and lock the longest cached prefix (at least one token is left to compute). False:
        no row is free, or the prefix continues on disk and the pool has no room to load it until running
        requests give some back (computing it instead would take longer and need the same room)."""
        row = self.req_to_token.alloc()
        if row is None:
            return False
        req.row, req.prefix_len, req.kv_len, req.alloc_len, req.disk_prefix_len = row, 0, 0, 0, 0
        req.last_node = self.tree.root if self.tree is not None else None  # locking the root is a no-op
        limit = len(req.fill_ids) - 1
        if req.logprob.return_logprob and req.logprob.logprob_start_len >= 0 and not req.output_ids:
            limit = min(limit, max(req.logprob.logprob_start_len - 1, 0))  # prompt logprobs need those logits
        if self.tree is not None and limit > 0:
            m = self.tree.match_prefix(req.fill_ids[:limit], req.namespace)
            self.tree.lock(m.last_node)
            req.last_node, req.prefix_len = m.last_node, len(m.slots)
            if m.slots:
                self.req_to_token.table[row, : len(m.slots)] = torch.tensor(m.slots)
            if self.disk is not None and self.disk.on and not self._load_from_disk(req, limit):
                self.tree.unlock(req.last_node)
                self.req_to_token.free(row)
                req.row, req.last_node, req.prefix_len, req.disk_prefix_len = None, None, 0, 0
                return False
        req.kv_len = req.alloc_len = req.prefix_len
        return True

    def _load_from_disk(self, req: Req, limit: int) -> bool:
        """Continue ``req``'s locked RAM prefix with the blocks the disk tier holds (whole blocks within
        ``limit``): load them into fresh pages, insert them into the tree and lock the longer match. The
        block that holds the RAM prefix's end is loaded whole; its part already in RAM is freed again.
        False: the blocks do not fit the pool now, but will once running requests finish (wait for them)."""
        b, ram = self.disk.block, req.prefix_len
        first = ram // b
        keys = self.disk.keys(req.namespace, req.fill_ids, limit // b)
        n = self.disk.run_on_disk(keys, first)
        if n == 0 or (first + n) * b <= ram or not self.disk.pays((first + n) * b - ram):
            return True
        start = first * b
        pages = n * b // self.page
        if not self.ensure_free_pages(pages):
            others = self.alloc.capacity - self.available() - ram  # what running requests hold, beyond our prefix
            return others <= 0  # nothing to wait for: compute it
        p = self.page
        slots = torch.tensor([s for page in self.alloc.alloc_pages(pages) for s in range(page * p, page * p + p)],
                             dtype=torch.int64)
        end = start + self.disk.load(keys, req.fill_ids, first, n, slots) * b
        if end <= ram:  # nothing past the RAM prefix loaded
            self.alloc.free_slots(slots.tolist())
            return True
        row = self.req_to_token.table[req.row]
        present = self.tree.insert(req.fill_ids[:end], row[:start].tolist() + slots[:end - start].tolist(),
                                   req.namespace)
        self.alloc.free_slots(slots[: present - start].tolist())  # duplicates of what the tree holds
        self.alloc.free_slots(slots[end - start:].tolist())  # blocks that did not load
        m = self.tree.match_prefix(req.fill_ids[:end], req.namespace)
        self.tree.lock(m.last_node)
        self.tree.unlock(req.last_node)
        row[: len(m.slots)] = torch.tensor(m.slots, dtype=torch.int64)
        req.last_node, req.prefix_len = m.last_node, len(m.slots)
        req.disk_prefix_len = req.prefix_len - ram
        return True

    def owned_pages(self, req: Req) -> int:
        return -(-req.alloc_len // self.page) - req.prefix_len // self.page

    # ------------------------------------------------------------ allocation
    def available(self) -> int:
        return self.alloc.available() + (self.tree.evictable_size if self.tree else 0)

    def pages_needed(self, req: Req, n: int) -> int:
        return -(-(req.alloc_len + n) // self.page) - -(-req.alloc_len // self.page)

    def ensure_free_pages(self, num_pages: int) -> bool:
        short = num_pages * self.page - self.alloc.available()
        if short > 0 and self.tree is not None:
            self.alloc.free_slots(self.tree.evict(short))
        return self.alloc.available() >= num_pages * self.page

    def extend(self, req: Req, n: int) -> torch.Tensor | None:
        """Slots for positions [alloc_len, alloc_len + n) of ``req``, written to its row; None if out of KV."""
        pages_n = self.pages_needed(req, n)
        if not self.ensure_free_pages(pages_n):
            return None
        row, start, p = self.req_to_token.table[req.row], req.alloc_len, self.page
        slots: list[int] = []
        if start % p:  # finish the partially filled last page first
            last = int(row[start - 1])
            slots.extend(range(last + 1, last + 1 + min(n, p - start % p)))
        for page in self.alloc.alloc_pages(pages_n):
            slots.extend(range(page * p, page * p + p))
        loc = torch.tensor(slots[:n], dtype=torch.int64)
        row[start:start + n] = loc
        req.alloc_len += n
        return loc

    def truncate(self, req: Req, n: int) -> None:
        """Give back the slots of positions [n, alloc_len) (rejected speculative drafts); n >= kv_len.
        Whole pages past position n are freed; a partly used last page stays owned and is refilled later."""
        if not req.kv_len <= n <= req.alloc_len:
            raise ValueError(f"truncate to {n}: outside [kv_len {req.kv_len}, alloc_len {req.alloc_len}]")
        keep = -(-n // self.page) * self.page
        if req.alloc_len > keep:
            self.alloc.free_slots(self.req_to_token.table[req.row, keep:req.alloc_len].tolist())
        req.alloc_len = n

    # ------------------------------------------------------------ release
    def cache_unfinished(self, req: Req) -> None:
        """After a prefill chunk: put the computed prefix in the tree and lock it, so others can share it."""
        if self.tree is None:
            return
        key, row = req.fill_ids[: req.kv_len], self.req_to_token.table[req.row]
        aligned = req.kv_len - req.kv_len % self.page
        if self.disk is not None:
            self.disk.save(req.namespace, key, row[: req.kv_len])
        present = self.tree.insert(key, row[: req.kv_len].tolist(), req.namespace)
        if present > req.prefix_len:  # our copy duplicates what the tree already holds
            self.alloc.free_slots(row[req.prefix_len:present].tolist())
        m = self.tree.match_prefix(key[:aligned], req.namespace)
        row[:aligned] = torch.tensor(m.slots, dtype=torch.int64)
        self.tree.lock(m.last_node)
        self.tree.unlock(req.last_node)
        req.last_node, req.prefix_len = m.last_node, aligned

    def release(self, req: Req, insert: bool) -> None:
        """Free a request's KV. ``insert``: its computed tokens (prompt and output) go into the tree first."""
        if req.row is None:
            return
        row = self.req_to_token.table[req.row]
        owned_from = req.prefix_len
        if insert and self.tree is not None:
            if self.disk is not None:
                self.disk.save(req.namespace, req.fill_ids[: req.kv_len], row[: req.kv_len])
            present = self.tree.insert(req.fill_ids[: req.kv_len], row[: req.kv_len].tolist(), req.namespace)
            if present > req.prefix_len:
                self.alloc.free_slots(row[req.prefix_len:present].tolist())
            owned_from = max(req.kv_len - req.kv_len % self.page, req.prefix_len)  # the tree took the rest
        if req.alloc_len > owned_from:
            self.alloc.free_slots(row[owned_from:req.alloc_len].tolist())
        if self.tree is not None and req.last_node is not None:
            self.tree.unlock(req.last_node)
        self.req_to_token.free(req.row)
        req.row, req.last_node, req.prefix_len, req.kv_len, req.alloc_len = None, None, 0, 0, 0

    # ------------------------------------------------------------ checks
    def check(self, live: list[Req]) -> str | None:
        """None if KV accounting holds; else a message naming what leaked."""
        rows = {r.row: r.rid for r in live if r.row is not None}
        free_rows = self.req_to_token.free_rows()
        if len(rows) + len(free_rows) != self.req_to_token.num_rows or set(rows) & free_rows:
            lost = set(range(self.req_to_token.num_rows)) - free_rows - set(rows)
            return (f"request-table leak: rows {sorted(lost)[:8]} are neither free nor owned; "
                    f"live rows {sorted(rows.items())[:8]}")
        tree_total = self.tree.total_size() if self.tree else 0
        owned = {r.rid: self.owned_pages(r) * self.page for r in live if r.row is not None}
        total = self.alloc.available() + tree_total + sum(owned.values())
        if total == self.alloc.capacity:
            return None
        holders = ", ".join(f"{rid}: {n}" for rid, n in owned.items()) or "none"
        return (f"KV leak: free {self.alloc.available()} + tree {tree_total} + owned {sum(owned.values())} "
                f"!= capacity {self.alloc.capacity} (owners: {holders})")
