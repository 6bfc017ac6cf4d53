"""The radix cache's disk tier on the runtime's side: K/V blocks between the KV pool and a DiskStore.

A block is ``block`` tokens of one sequence, whole (a sequence's tail shorter than a block stays in RAM only).
Its payload is the block's K and V for every layer, in the pool's own layout and dtype:
    [2 * num_layers, Hkv, block, D] (head-major pool) or [2 * num_layers, block, Hkv, D] (token-major),
rows ordered K0, V0, K1, V1, ... The bytes loaded back are the bytes that were computed, so an answer over a
prefix from disk is bitwise the answer over the same prefix computed again (the pool is cache-invariant).

Gathers and scatters run on the caller's thread (the scheduler's main thread); only file I/O runs on the
writer's thread.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from radixlm.radix_cache.disk import DiskStore, PageWriter, block_keys, chain_seed
from radixlm.runtime.kv.pool import KVPool

EMA = 0.2  # weight of a new measurement in the load and prefill rate estimates


@dataclass
class TierCounters:
    saved_blocks: int = 0  # queued for writing
    loaded_tokens: int = 0  # tokens whose KV came back from disk
    loads: int = 0
    load_s: float = 0.0  # total seconds spent loading (read + scatter)
    save_s: float = 0.0  # total seconds spent gathering blocks for the writer (the step's share)
    skipped_loads: int = 0  # disk held the prefix, but recomputing was expected to be faster


class DiskTier:
    def __init__(self, pool: KVPool, store: DiskStore, block: int, max_pending_bytes: int = 256 << 20) -> None:
        self.pool, self.store, self.block = pool, store, block
        self.writer = PageWriter(store, max_pending_bytes)
        self.counters = TierCounters()
        self._seeds: dict[Hashable, bytes] = {}
        self._slot_dim = 1 if pool.head_major else 0
        self.load_s_per_token: float | None = None  # measured; None until the first load
        self.prefill_s_per_token: float | None = None  # measured by the caller (note_prefill)

    @property
    def on(self) -> bool:
        return self.store.on

    def keys(self, namespace: Hashable, tokens: list[int], n_blocks: int | None = None) -> list[bytes]:
        seed = self._seeds.get(namespace)
        if seed is None:
            seed = self._seeds[namespace] = chain_seed(self.store.fingerprint, namespace)
        return block_keys(seed, tokens, self.block, n_blocks)

    # ------------------------------------------------------------ write through
    def save(self, namespace: Hashable, tokens: list[int], slots: torch.Tensor) -> int:
        """Queue the whole blocks of ``tokens`` (KV in ``slots``, [len(tokens)]) that disk lacks -> blocks queued."""
        if not self.on or len(tokens) < self.block:
            return 0
        t0 = time.perf_counter()
        keys = self.keys(namespace, tokens)
        new = [i for i, k in enumerate(keys) if not self.store.known(k) and not self.writer.pending(k)]
        if not new:
            return 0
        b = self.block
        idx = torch.cat([slots[i * b:(i + 1) * b] for i in new]).to(self.pool.device)
        blocks = self._gather(idx, len(new))  # [nb, 2L, ...block layout], contiguous, on the CPU
        queued = 0
        for j, i in enumerate(new):
            payload = blocks[j].reshape(-1).view(torch.uint8).numpy().data
            queued += self.writer.submit(keys[i], tokens[i * b:(i + 1) * b], payload, keepalive=blocks)
        self.counters.saved_blocks += queued
        self.counters.save_s += time.perf_counter() - t0
        return queued

    def _gather(self, idx: torch.Tensor, nb: int) -> torch.Tensor:
        """K/V at slots ``idx`` ([nb * block]) -> [nb, 2L, <one block in the pool's layout>]."""
        d = self._slot_dim
        rows = [buf.index_select(d, idx) for k, v in zip(self.pool.k_buffer, self.pool.v_buffer, strict=True)
                for buf in (k, v)]
        full = torch.stack(rows)  # [2L, Hkv, nb*B, D] or [2L, nb*B, Hkv, D]
        shape = list(full.shape)
        split = shape[:1 + d] + [nb, self.block] + shape[2 + d:]
        order = [1 + d] + [i for i in range(len(split)) if i != 1 + d]
        return full.view(split).permute(order).contiguous().cpu()

    # ------------------------------------------------------------ load back
    def run_on_disk(self, keys: list[bytes], first: int) -> int:
        """How many consecutive blocks of ``keys`` (``keys`` of one sequence) from block ``first`` disk holds."""
        return self.store.run_length(keys[first:]) if self.on else 0

    def pays(self, tokens: int) -> bool:
        """Loading ``tokens`` is expected to be faster than computing them (true until both are measured)."""
        if self.load_s_per_token is None or self.prefill_s_per_token is None:
            return True
        ok = self.load_s_per_token < self.prefill_s_per_token
        self.counters.skipped_loads += not ok
        return ok

    def load(self, keys: list[bytes], tokens: list[int], first: int, n: int, slots: torch.Tensor) -> int:
        """Read blocks [first, first + n) of ``tokens`` (``keys``: its blocks' keys) into ``slots`` ([n * block],
        the blocks' new slots) -> blocks loaded (fewer where one is missing or corrupt: the rest is recomputed)."""
        t0, b = time.perf_counter(), self.block
        payloads = []
        for i in range(first, first + n):
            p = self.store.get(keys[i], tokens[i * b:(i + 1) * b])
            if p is None:
                break
            payloads.append(p)
        if payloads:
            self._scatter(payloads, slots[: len(payloads) * b])
            dt = time.perf_counter() - t0
            per_token = dt / (len(payloads) * b)
            self.load_s_per_token = _ema(self.load_s_per_token, per_token)
            self.counters.loads += 1
            self.counters.loaded_tokens += len(payloads) * b
            self.counters.load_s += dt
        return len(payloads)

    def _scatter(self, payloads: list[memoryview], slots: torch.Tensor) -> None:
        d, pool = self._slot_dim, self.pool
        layers = len(pool.k_buffer)
        blocks = [torch.frombuffer(p, dtype=torch.uint8).view(pool.dtype) for p in payloads]
        block_shape = list(pool.k_buffer[0].shape)
        block_shape[d] = self.block
        full = torch.stack([blk.view([2 * layers, *block_shape]) for blk in blocks], dim=1 + d)
        shape = list(full.shape)  # [2L, (Hkv,) nb, B, ...]: the nb blocks next to each other along the slots
        full = full.reshape(shape[:1 + d] + [shape[1 + d] * shape[2 + d]] + shape[3 + d:]).to(pool.device)
        slots = slots.to(pool.device)
        for layer in range(layers):
            pool.k_buffer[layer].index_copy_(d, slots, full[2 * layer])
            pool.v_buffer[layer].index_copy_(d, slots, full[2 * layer + 1])

    def tier_of(self, namespace: Hashable, path: list[int], edge: int) -> str:
        """"ram+disk" where disk holds every whole block that ends in the last ``edge`` tokens of ``path`` (the
        tokens from the root through a node), else "ram"."""
        b, start = self.block, len(path) - edge
        ends = [i for i in range(len(path) // b) if (i + 1) * b > start]
        if not ends or not self.on:
            return "ram"
        keys = self.keys(namespace, path)
        return "ram+disk" if all(self.store.known(keys[i]) for i in ends) else "ram"

    def note_prefill(self, tokens: int, seconds: float) -> None:
        """A prefill step computed ``tokens`` in ``seconds`` (the recompute side of ``pays``)."""
        if tokens > 0:
            self.prefill_s_per_token = _ema(self.prefill_s_per_token, seconds / tokens)

    def close(self) -> None:
        self.writer.close()


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new
