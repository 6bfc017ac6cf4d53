"""The CPU attention backend (torch ops, and radixlm's C++ kernels where they fit); also the reference the GPU
backends are checked against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels import cpu_decode_attention as native_kernel
from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.kv.pool import KVPool, ReqToTokenPool
from radixlm.runtime.model.attention.cpu_decode import decode_attention, plan_decode


class TorchAttentionBackend:
    """Extend: per request, causal attention of the new tokens over prefix (read from the pool) + themselves.
    Decode: see cpu_decode.py (padded batch over each request's own slots + shared prefixes once)."""

    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool, isa: int | None = None,
                 windows: list[int | None] | None = None) -> None:
        self.pool = pool
        self.req_to_token = req_to_token
        self.isa = isa  # decode and extend through radixlm's C++ kernels on this path (cpu_decode.native_fits)
        self.windows = windows or []  # per layer: a sliding window (Gemma 3's local layers), else None

    def prepare(self, batch: ForwardBatch) -> None:
        table = self.req_to_token.table
        if batch.mode == "decode":
            batch.attn_meta = plan_decode(table, batch.req_rows, batch.seq_lens, self.isa)
            return
        if self.isa is not None:
            rows = table[batch.req_rows, : max(batch.seq_lens)]  # [R, L]: cached prefix, then the new tokens
            batch.attn_meta = (rows, torch.tensor(batch.seq_lens), torch.tensor(batch.extend_lens))
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
        if layer < len(self.windows) and self.windows[layer] is not None:
            return self.windowed(q, layer, batch, self.windows[layer])
        if batch.mode == "decode":
            return decode_attention(q, self.pool, layer, batch.attn_meta, self.isa)
        if self.isa is not None:
            kb, vb = self.pool.k_buffer[layer], self.pool.v_buffer[layer]
            return native_kernel.extend_attention(q.contiguous(), kb, vb, *batch.attn_meta, self.isa)
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
        groups = q.shape[1] // k.shape[1]
        for s, e, kv_idx, mask in batch.attn_meta:
            qi = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
            if kv_idx is None:
                ki, vi = k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)  # [Hkv, n, D]
            else:
                ki, vi = self.pool.gather(layer, kv_idx)  # [Hkv, L, D]: cached prefix + new tokens
            # explicit head repeat + a batch dim: faster than SDPA's enable_gqa here (measured, results notes)
            ki = ki.repeat_interleave(groups, 0).unsqueeze(0)  # [1, Hq, L, D]
            vi = vi.repeat_interleave(groups, 0).unsqueeze(0)
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, is_causal=mask is None)
            out[s:e] = o[0].transpose(0, 1).reshape(e - s, -1)
        return out

    def windowed(self, q: torch.Tensor, layer: int, batch: ForwardBatch, window: int) -> torch.Tensor:
        """Sliding-window attention, request by request, from the pool: a query at position p sees the keys at
        positions p - window + 1 .. p, whatever the cache holds before them (a prefix hit reads only the
        window's slots). q [T, Hq, D] -> [T, Hq D]."""
        table, hkv = self.req_to_token.table, self.pool.k_buffer[layer].shape[0]
        exts = [1] * len(batch.seq_lens) if batch.mode == "decode" else batch.extend_lens
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
        start = 0
        for row, seq_len, ext in zip(batch.req_rows.tolist(), batch.seq_lens, exts, strict=True):
            first = seq_len - ext  # the first query's position
            lo = max(0, first - window + 1)
            ki, vi = self.pool.gather(layer, table[row, lo:seq_len])  # [Hkv, L, D]
            q_pos, k_pos = torch.arange(first, seq_len).unsqueeze(1), torch.arange(lo, seq_len).unsqueeze(0)
            mask = (k_pos <= q_pos) & (q_pos - k_pos < window)  # [ext, L]
            groups = q.shape[1] // hkv
            qi = q[start:start + ext].transpose(0, 1).unsqueeze(0)  # [1, Hq, ext, D]
            ki, vi = ki.repeat_interleave(groups, 0).unsqueeze(0), vi.repeat_interleave(groups, 0).unsqueeze(0)
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask)
            out[start:start + ext] = o[0].transpose(0, 1).reshape(ext, -1)
            start += ext
        return out
