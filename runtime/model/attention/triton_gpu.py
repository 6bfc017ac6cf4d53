"""The Triton attention backend: store K/V, then extend or split-K decode attention, one launch each per layer.

Deterministic (the default): decode rows go through the extend kernel too, one query each. Its key blocks
are aligned to absolute positions and merged in order, so a query's result is the same bits whether its
keys were cached, from an earlier chunk or computed in the same pass, and whether it was decoded or
extended; split-K decode (``deterministic=False``) splits by the sequence's length instead.

It runs wherever Triton does: natively on NVIDIA GPUs, and on the CPU under TRITON_INTERPRET=1 (how CI checks
it end to end against the torch backend). Metadata is built once per batch in ``prepare``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.kernels.decode_attention import decode_attention_triton
from radixlm.kernels.extend_attention import extend_attention_triton
from radixlm.kernels.store_kv import store_kv_triton
from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.kv.pool import KVPool, ReqToTokenPool


@dataclass
class TritonMeta:
    req_rows: torch.Tensor  # [B] on the pool's device
    seq_lens: torch.Tensor  # [B]
    extend_lens: torch.Tensor  # [B]
    max_extend: int


class TritonAttentionBackend:
    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool, num_splits: int = 8,
                 deterministic: bool = True) -> None:
        self.pool, self.req_to_token, self.num_splits = pool, req_to_token, num_splits
        self.deterministic = deterministic

    def prepare(self, batch: ForwardBatch) -> None:
        dev = self.pool.device
        batch.attn_meta = TritonMeta(batch.req_rows.to(dev), torch.tensor(batch.seq_lens, device=dev),
                                     torch.tensor(batch.extend_lens, device=dev), max(batch.extend_lens))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        """q [T, Hq, D], k, v [T, Hkv, D] -> [T, Hq * D]."""
        pool, meta, table = self.pool, batch.attn_meta, self.req_to_token.table
        kb, vb = pool.k_buffer[layer], pool.v_buffer[layer]
        store_kv_triton(kb, vb, batch.out_cache_loc, k, v, pool.head_major)
        scale = q.shape[-1] ** -0.5
        if batch.mode == "decode" and not self.deterministic:
            out = decode_attention_triton(q, kb, vb, table, meta.req_rows, meta.seq_lens, scale, pool.head_major,
                                          num_splits=self.num_splits)
        else:
            out = extend_attention_triton(q, kb, vb, table, meta.req_rows, meta.seq_lens, meta.extend_lens, scale,
                                          pool.head_major, max_extend=meta.max_extend)
        return out.view(q.shape[0], -1)
