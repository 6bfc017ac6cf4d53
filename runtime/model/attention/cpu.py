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
        batch.window_meta = {w: plan_window(table, batch, w) for w in set(self.windows) if w is not None}
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
            return self.windowed(q, layer, batch.window_meta[self.windows[layer]])
        if batch.mode == "decode":
            return decode_attention(q, self.pool, layer, batch.attn_meta, self.isa)
        if self.isa is not None:
            kb, vb = self.pool.k_buffer[layer], self.pool.v_buffer[layer]
            return native_kernel.extend_attention(q.contiguous(), kb, vb, *batch.attn_meta, self.isa)
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
        for s, e, kv_idx, mask in batch.attn_meta:
            if kv_idx is None:
                ki, vi = k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)  # [Hkv, n, D]
            else:
                ki, vi = self.pool.gather(layer, kv_idx)  # [Hkv, L, D]: cached prefix + new tokens
            out[s:e] = attend_rows(q[s:e], ki, vi, mask)
        return out

    def windowed(self, q: torch.Tensor, layer: int, plan: list[tuple]) -> torch.Tensor:
        """Sliding-window attention, request by request, over the slots plan_window chose. q [T, Hq, D] ->
        [T, Hq D]."""
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
        for s, e, slots, mask in plan:
            ki, vi = self.pool.gather(layer, slots)  # [Hkv, L, D]
            out[s:e] = attend_rows(q[s:e], ki, vi, mask)
        return out


def plan_window(table: torch.Tensor, batch: ForwardBatch, window: int) -> list[tuple]:
    """Once a step, for the layers with this window: per request (start, end of its queries in T, its slots
    [L], mask [n, L]). A query at position p sees the keys at positions p - window + 1 .. p, whatever the cache
    holds before them: a prefix hit reads only the window's slots."""
    exts = [1] * len(batch.seq_lens) if batch.mode == "decode" else batch.extend_lens
    plan, start = [], 0
    for row, seq_len, ext in zip(batch.req_rows.tolist(), batch.seq_lens, exts, strict=True):
        first = seq_len - ext  # the first query's position
        lo = max(0, first - window + 1)
        q_pos, k_pos = torch.arange(first, seq_len).unsqueeze(1), torch.arange(lo, seq_len).unsqueeze(0)
        plan.append((start, start + ext, table[row, lo:seq_len], (k_pos <= q_pos) & (q_pos - k_pos < window)))
        start += ext
    return plan


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """One request's queries q [n, Hq, D] over its keys k, v [Hkv, L, D] (mask [n, L], True = attend; None:
    causal) -> [n, Hq D]."""
    groups = q.shape[1] // k.shape[0]
    # explicit head repeat + a batch dim: faster than SDPA's enable_gqa here (measured, results notes)
    k, v = k.repeat_interleave(groups, 0).unsqueeze(0), v.repeat_interleave(groups, 0).unsqueeze(0)  # [1, Hq, L, D]
    o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k, v, attn_mask=mask, is_causal=mask is None)
    return o[0].transpose(0, 1).reshape(q.shape[0], -1)
