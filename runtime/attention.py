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
            batch.attn_meta = (idx, mask[:, None, None, :])  # mask [B, 1, 1, Lmax] (True = attend)
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
        groups = q.shape[1] // k.shape[1]
        for s, e, kv_idx, mask in batch.attn_meta:
            qi = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
            if kv_idx is None:
                ki, vi = k[s:e], v[s:e]
            else:
                ki, vi = k_buf[kv_idx], v_buf[kv_idx]  # [L, Hkv, D]
            # explicit head repeat + a batch dim: measured ~1.7x faster than enable_gqa on this CPU
            ki = ki.transpose(0, 1).repeat_interleave(groups, 0).unsqueeze(0)  # [1, Hq, L, D]
            vi = vi.transpose(0, 1).repeat_interleave(groups, 0).unsqueeze(0)
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, is_causal=mask is None)
            out[s:e] = o[0].transpose(0, 1).reshape(e - s, -1)
        return out

    def _decode(self, q, layer, batch):
        """Grouped matmuls instead of SDPA: bf16 SDPA with a mask falls back to a path ~17x slower here."""
        idx, mask = batch.attn_meta
        b, hq, d = q.shape
        k = self.pool.k_buffer[layer][idx]  # [B, Lmax, Hkv, D]
        v = self.pool.v_buffer[layer][idx]
        hkv = k.shape[2]
        qg = q.view(b, hkv, hq // hkv, d)  # [B, Hkv, G, D]: query heads grouped by their KV head
        scores = torch.matmul(qg, k.permute(0, 2, 3, 1)).float() * d**-0.5  # [B, Hkv, G, Lmax]
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        return torch.matmul(probs, v.transpose(1, 2)).reshape(b, hq * d)  # [B, Hkv, G, D] -> [B, Hq D]
