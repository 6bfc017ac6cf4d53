"""Tensor parallelism on torch.distributed: process-group setup and the batch plan rank 0 broadcasts.

Rank 0 runs the scheduler: it admits, allocates KV slots, samples. Before each forward pass it broadcasts the
batch plan (token ids, positions, KV slots and each request's slot list) over the CPU group; the other ranks
copy the slot lists into their own request table and run the same forward on their shard. Every rank sizes
its KV pool identically, so a slot index means the same token everywhere. Followers never sample: the next
plan carries the tokens rank 0 chose.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from radixlm.runtime.batch import ForwardBatch

log = logging.getLogger("radixlm.tp")
# a follower waits in a broadcast while the server is idle: the group must not time out under it
IDLE_TIMEOUT = timedelta(days=7)


def init_tp_group(init_addr: str, rank: int, world_size: int):
    """Join the tensor-parallel group; returns the CPU (gloo) group used for batch plans."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":  # one GPU per rank on each node: "cuda" means this rank's device from here on
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://{init_addr}", rank=rank, world_size=world_size,
                            timeout=IDLE_TIMEOUT)
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT) if backend == "nccl" else dist.group.WORLD


def _raw(t: torch.Tensor) -> bytes:
    return t.to(torch.int64).contiguous().numpy().tobytes()


def _tensor(b: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(b, dtype=np.int64).copy())


class BatchPlan(msgspec.Struct, frozen=True):
    """A ForwardBatch as msgpack: int64 arrays as raw little-endian bytes, plus the request-table entries it
    reads. Typed on both ends (no pickle): a follower only ever decodes this struct."""

    mode: str
    input_ids: bytes  # [T]
    positions: bytes  # [T]
    out_cache_loc: bytes  # [T]
    req_rows: bytes  # [B]
    seq_lens: list[int]  # [B]
    extend_lens: list[int]  # [B]
    logit_rows: bytes  # [R]
    slots: bytes  # concatenation over requests of table[row, :seq_len]
    num_layers: int | None

    @classmethod
    def of(cls, batch: ForwardBatch, table: torch.Tensor) -> BatchPlan:
        rows = batch.req_rows.tolist()
        slots = torch.cat([table[r, :n] for r, n in zip(rows, batch.seq_lens, strict=True)]).cpu()
        return cls(batch.mode, _raw(batch.input_ids), _raw(batch.positions), _raw(batch.out_cache_loc),
                   _raw(batch.req_rows), list(batch.seq_lens), list(batch.extend_lens), _raw(batch.logit_rows),
                   _raw(slots), batch.num_layers)

    def apply(self, table: torch.Tensor) -> ForwardBatch:
        """Write the slot lists into this rank's request table; -> the batch to run."""
        slots, start, rows = _tensor(self.slots), 0, _tensor(self.req_rows)
        for row, n in zip(rows.tolist(), self.seq_lens, strict=True):
            table[row, :n] = slots[start:start + n]
            start += n
        return ForwardBatch(self.mode, _tensor(self.input_ids), _tensor(self.positions), _tensor(self.out_cache_loc),
                            rows, self.seq_lens, self.extend_lens, _tensor(self.logit_rows), self.num_layers)


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(BatchPlan).decode


def broadcast_bytes(payload: bytes | None, group) -> bytes | None:
    """Rank 0 sends ``payload`` (None: the end), every other rank receives it: a length, then the bytes, as
    uint8 tensors over the CPU group (no objects, no pickle)."""
    n = torch.tensor([-1 if payload is None else len(payload)], dtype=torch.int64)
    dist.broadcast(n, src=0, group=group)
    if n.item() < 0:
        return None
    buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload is not None else \
        torch.empty(int(n.item()), dtype=torch.uint8)
    if buf.numel():
        dist.broadcast(buf, src=0, group=group)
    return payload if payload is not None else buf.numpy().tobytes()


class PlanBroadcaster:
    """Rank 0's end of the channel."""

    def __init__(self, table: torch.Tensor, group) -> None:
        self.table, self.group = table, group

    def send(self, batch: ForwardBatch) -> None:
        broadcast_bytes(_encode(BatchPlan.of(batch, self.table)), self.group)

    def close(self) -> None:
        """Tell the followers to exit."""
        broadcast_bytes(None, self.group)


def follow(runner, group) -> int:
    """A follower rank's loop: run every plan rank 0 broadcasts until it sends the end; -> steps run."""
    steps = 0
    while True:
        raw = broadcast_bytes(None, group)
        if raw is None:
            return steps
        runner.forward(_decode(raw).apply(runner.req_to_token.table))
        steps += 1
