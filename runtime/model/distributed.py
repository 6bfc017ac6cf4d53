"""Tensor parallelism on torch.distributed: process-group setup and the batch plan rank 0 broadcasts.

Rank 0 runs the scheduler: it admits, allocates KV slots, samples. Before each forward pass it broadcasts the
batch plan (token ids, positions, KV slots and each request's slot list) over the CPU group; the other ranks
copy the slot lists into their own request table and run the same forward on their shard. Every rank sizes
its KV pool identically, so a slot index means the same token everywhere. Followers never sample: the next
plan carries the tokens rank 0 chose.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

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


@dataclass
class BatchPlan:
    """A ForwardBatch in plain arrays (cheap to pickle), plus the request-table entries it reads."""

    mode: str
    input_ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    out_cache_loc: np.ndarray  # [T]
    req_rows: np.ndarray  # [B]
    seq_lens: list[int]  # [B]
    extend_lens: list[int]  # [B]
    logit_rows: np.ndarray  # [R]
    slots: np.ndarray  # concatenation over requests of table[row, :seq_len]
    num_layers: int | None

    @classmethod
    def of(cls, batch: ForwardBatch, table: torch.Tensor) -> BatchPlan:
        rows = batch.req_rows.tolist()
        slots = torch.cat([table[r, :n] for r, n in zip(rows, batch.seq_lens, strict=True)]).cpu()
        return cls(batch.mode, batch.input_ids.numpy(), batch.positions.numpy(), batch.out_cache_loc.numpy(),
                   batch.req_rows.numpy(), batch.seq_lens, batch.extend_lens, batch.logit_rows.numpy(),
                   slots.numpy(), batch.num_layers)

    def apply(self, table: torch.Tensor) -> ForwardBatch:
        """Write the slot lists into this rank's request table; -> the batch to run."""
        slots, start = torch.from_numpy(self.slots), 0
        for row, n in zip(self.req_rows.tolist(), self.seq_lens, strict=True):
            table[row, :n] = slots[start:start + n]
            start += n
        t = torch.from_numpy
        return ForwardBatch(self.mode, t(self.input_ids), t(self.positions), t(self.out_cache_loc),
                            t(self.req_rows), self.seq_lens, self.extend_lens, t(self.logit_rows), self.num_layers)


class PlanBroadcaster:
    """Rank 0's end of the channel."""

    def __init__(self, table: torch.Tensor, group) -> None:
        self.table, self.group = table, group

    def send(self, batch: ForwardBatch) -> None:
        dist.broadcast_object_list([BatchPlan.of(batch, self.table)], src=0, group=self.group)

    def close(self) -> None:
        """Tell the followers to exit (a None plan)."""
        dist.broadcast_object_list([None], src=0, group=self.group)


def follow(runner, group) -> int:
    """A follower rank's loop: run every plan rank 0 broadcasts until it sends None; -> steps run."""
    steps = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=group)
        if box[0] is None:
            return steps
        batch = box[0].apply(runner.req_to_token.table)
        runner.forward(batch)
        steps += 1
