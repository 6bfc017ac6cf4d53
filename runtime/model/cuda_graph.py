"""CUDA graphs for decode batches: one graph per captured batch size, a batch padded to the next size.

Captured with the Triton backend (its decode launch has a fixed grid: split count fixed, lengths read from
tensors). Replay copies the batch into static buffers; padding rows use the dummy table row (all slot 0,
the reserved dummy slot) with length 1, so they read and write only slot 0.
Not exercised on this project's CPU machines: benchmarks/results/gpu/ holds what was measured on a GPU.
"""

from __future__ import annotations

import bisect

import torch

from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.model.attention.triton_gpu import TritonMeta
from radixlm.runtime.progress import Progress


def capture_sizes(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_bs + 1, 16))
    return sorted({s for s in sizes if s <= max_bs} | {max_bs})


class DecodeGraphs:
    def __init__(self, model, backend, dummy_row: int, max_bs: int) -> None:
        dev = next(model.parameters()).device
        self.model, self.backend, self.dummy_row = model, backend, dummy_row
        self.sizes = capture_sizes(max_bs)
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        self.req_rows = torch.full((n,), dummy_row, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int64, device=dev)
        self.ones = torch.ones(n, dtype=torch.int64, device=dev)  # extend lengths of a decode batch
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        with Progress("Capturing CUDA graphs", total=len(self.sizes), unit="graph") as bar:
            for bs in bar.wrap(reversed(self.sizes)):  # largest first: smaller graphs reuse its memory pool
                self._capture(bs)

    def _batch(self, bs: int) -> ForwardBatch:
        batch = ForwardBatch("decode", self.input_ids[:bs], self.positions[:bs], self.out_cache_loc[:bs],
                             self.req_rows[:bs], [1] * bs, [1] * bs, torch.arange(bs, device=self.input_ids.device))
        batch.attn_backend = self.backend
        batch.attn_meta = TritonMeta(self.req_rows[:bs], self.seq_lens[:bs], self.ones[:bs], 1)
        return batch

    @torch.inference_mode()
    def _capture(self, bs: int) -> None:
        batch = self._batch(bs)
        for _ in range(2):  # warm up: Triton compiles outside the capture
            self.model(batch)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[bs] = self.model(batch)
        self.pool = self.pool or graph.pool()
        self.graphs[bs] = graph

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.mode == "decode" and batch.num_layers is None and batch.batch_size <= self.sizes[-1]

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [B, vocab] of a decode batch (the graph's output rows beyond B are padding)."""
        b = batch.batch_size
        bs = self.sizes[bisect.bisect_left(self.sizes, b)]
        self.req_rows[b:bs].fill_(self.dummy_row)
        self.seq_lens[b:bs].fill_(1)
        self.out_cache_loc[b:bs].zero_()
        self.input_ids[:b].copy_(batch.input_ids, non_blocking=True)
        self.positions[:b].copy_(batch.positions, non_blocking=True)
        self.out_cache_loc[:b].copy_(batch.out_cache_loc, non_blocking=True)
        self.req_rows[:b].copy_(batch.req_rows, non_blocking=True)
        self.seq_lens[:b].copy_(torch.tensor(batch.seq_lens), non_blocking=True)
        self.graphs[bs].replay()
        return self.outputs[bs][:b]
