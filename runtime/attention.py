"""Attention backends over the paged KV pool. The torch backend is the CPU path and the reference."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.kv_pool import KVPool, ReqToTokenPool


class AttentionBackend(Protocol):
    def prepare(self, batch: ForwardBatch) -> None:
        """Build per-batch metadata once (before the layers run)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        """Store k, v [T, Hkv, D] at batch.out_cache_loc, then attend q [T, Hq, D] -> [T, Hq * D]."""


class TorchAttentionBackend:
    """Extend: per request, causal attention of the new tokens over prefix (read from the pool) + themselves.
    Decode: one query per request over its slots, padded to the longest and masked, in one SDPA call."""

    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool) -> None:
        self.pool = pool
        self.req_to_token = req_to_token

    def prepare(self, batch: ForwardBatch) -> None:
        table = self.req_to_token.table
        if batch.mode == "decode":
            lens = torch.tensor(batch.seq_lens)
            max_len = int(lens.max())
            idx = table[batch.req_rows, :max_len]  # [B, Lmax]; entries past a request's length are masked
            mask = torch.arange(max_len).unsqueeze(0) < lens.unsqueeze(1)
            batch.attn_meta = (idx, mask[:, None, None, :])  # mask [B, 1, 1, Lmax]
            return
        meta, start = [], 0
        for row, seq_len, ext in zip(batch.req_rows.tolist(), batch.seq_lens, batch.extend_lens, strict=True):
            prefix = seq_len - ext
            kv_idx = table[row, :seq_len] if prefix else None
            mask = None
            if prefix:  # query i (absolute position prefix + i) sees keys 0 .. prefix + i
                mask = torch.ones(ext, seq_len, dtype=torch.bool).tril(diagonal=prefix)
            meta.append((start, start + ext, kv_idx, mask))
            start += ext
        batch.attn_meta = meta

    def forward(self, q, k, v, layer, batch):
        self.pool.store(layer, batch.out_cache_loc, k, v)
        if batch.mode == "decode":
            return self._decode(q, layer, batch)
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
        k_buf, v_buf = self.pool.k_buffer[layer], self.pool.v_buffer[layer]
        for s, e, kv_idx, mask in batch.attn_meta:
            qi = q[s:e].transpose(0, 1)  # [Hq, n, D]
            if kv_idx is None:
                ki, vi = k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)
            else:
                ki, vi = k_buf[kv_idx].transpose(0, 1), v_buf[kv_idx].transpose(0, 1)  # [Hkv, L, D]
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, is_causal=mask is None,
                                               enable_gqa=True)
            out[s:e] = o.transpose(0, 1).reshape(e - s, -1)
        return out

    def _decode(self, q, layer, batch):
        idx, mask = batch.attn_meta
        k = self.pool.k_buffer[layer][idx].transpose(1, 2)  # [B, Hkv, Lmax, D]
        v = self.pool.v_buffer[layer][idx].transpose(1, 2)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, enable_gqa=True)  # [B,Hq,1,D]
        return o.reshape(q.shape[0], -1)
