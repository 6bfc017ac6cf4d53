"""Attention backends over the paged KV pool. The torch backend is the CPU path and the reference."""

from __future__ import annotations

import os
from typing import Protocol

import torch
import torch.nn.functional as F

from radixlm.kernels import cpu_decode_attention as native_kernel
from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.decode_attention import decode_attention, plan_decode
from radixlm.runtime.kv_pool import KVPool, ReqToTokenPool


class AttentionBackend(Protocol):
    def prepare(self, batch: ForwardBatch) -> None:
        """Build per-batch metadata once (before the layers run)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        """Store k, v [T, Hkv, D] at batch.out_cache_loc, then attend q [T, Hq, D] -> [T, Hq * D]."""


class TorchAttentionBackend:
    """Extend: per request, causal attention of the new tokens over prefix (read from the pool) + themselves.
    Decode: see decode_attention.py (padded batch over each request's own slots + shared prefixes once)."""

    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool, native_decode: bool = False) -> None:
        self.pool = pool
        self.req_to_token = req_to_token
        self.native_decode = native_decode  # decode through the C++ kernel (decode_attention.native_fits)
        # extend too, where that kernel has its bfloat16 form (AVX512-BF16)
        self.native_extend = native_decode and pool.dtype == torch.bfloat16 and native_kernel.extend_available()

    def prepare(self, batch: ForwardBatch) -> None:
        table = self.req_to_token.table
        if batch.mode == "decode":
            batch.attn_meta = plan_decode(table, batch.req_rows, batch.seq_lens, self.native_decode)
            return
        if self.native_extend:
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
        if batch.mode == "decode":
            return decode_attention(q, self.pool, layer, batch.attn_meta, self.native_decode)
        if self.native_extend:
            kb, vb = self.pool.k_buffer[layer], self.pool.v_buffer[layer]
            return native_kernel.extend_attention(q.contiguous(), kb, vb, *batch.attn_meta)
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
        groups = q.shape[1] // k.shape[1]
        for s, e, kv_idx, mask in batch.attn_meta:
            qi = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
            if kv_idx is None:
                ki, vi = k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)  # [Hkv, n, D]
            else:
                ki, vi = self.pool.gather(layer, kv_idx)  # [Hkv, L, D]: cached prefix + new tokens
            # explicit head repeat + a batch dim: measured ~1.7x faster than enable_gqa on this CPU
            ki = ki.repeat_interleave(groups, 0).unsqueeze(0)  # [1, Hq, L, D]
            vi = vi.repeat_interleave(groups, 0).unsqueeze(0)
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, is_causal=mask is None)
            out[s:e] = o[0].transpose(0, 1).reshape(e - s, -1)
        return out


def resolve_backend(name: str, device: torch.device) -> str:
    """auto: flashinfer if importable on CUDA, else triton on CUDA, else torch."""
    if name != "auto":
        if name in ("triton", "flashinfer") and device.type != "cuda" and not _triton_interpreted():
            raise ValueError(f"attention_backend {name!r} needs CUDA (or TRITON_INTERPRET=1 for triton)")
        return name
    if device.type != "cuda":
        return "torch"
    try:
        import flashinfer  # noqa: F401
        return "flashinfer"
    except ImportError:
        return "triton"


def _triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def make_backend(name: str, pool: KVPool, req_to_token: ReqToTokenPool, page_size: int, num_q_heads: int,
                 native_decode: bool = False):
    if name == "triton":
        from radixlm.runtime.attention_triton import TritonAttentionBackend

        return TritonAttentionBackend(pool, req_to_token)
    if name == "flashinfer":
        from radixlm.runtime.attention_flashinfer import FlashInferAttentionBackend

        return FlashInferAttentionBackend(pool, req_to_token, page_size, num_q_heads)
    return TorchAttentionBackend(pool, req_to_token, native_decode)
