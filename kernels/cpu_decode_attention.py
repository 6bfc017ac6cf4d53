"""Decode and extend attention straight from the paged KV pool (cpu_decode_attention.cpp, every instruction
set; ``isa`` is the kernel path) beside their torch references.

q [B, Hq, D]; k, v one layer's head-major pool [Hkv, S, D]; idx [B, Ls] int64, request b's own slots in
idx[b, :counts[b]]; prefix [P] int64, shared slots that the requests with member[b] attend to before their
own (P may be 0) -> out [B, Hq * D] in q's dtype. D must be 64 or 128.
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu_ext import available

__all__ = ["available", "decode_attention", "decode_attention_torch", "extend_attention", "extend_attention_torch"]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, counts: torch.Tensor,
                     prefix: torch.Tensor, member: torch.Tensor, isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.decode_attention(q, k, v, idx, counts, prefix, member, isa)


def decode_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                           counts: torch.Tensor, prefix: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """The reference: one request at a time, float32 softmax(q k^T / sqrt(D)) v over its slot list."""
    b, hq, d = q.shape
    hkv = k.shape[0]
    out = torch.empty(b, hq, d, dtype=q.dtype)
    for i in range(b):
        own = idx[i, : int(counts[i])]
        slots = torch.cat((prefix, own)) if bool(member[i]) else own
        kk, vv = k[:, slots].float(), v[:, slots].float()  # [Hkv, L, D]
        qq = q[i].float().view(hkv, hq // hkv, d)  # [Hkv, G, D]
        p = torch.softmax(qq @ kk.transpose(1, 2) / d**0.5, dim=-1)
        out[i] = (p @ vv).reshape(hq, d).to(q.dtype)
    return out.view(b, hq * d)


def extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, seq_lens: torch.Tensor,
                     ext_lens: torch.Tensor, isa: int) -> torch.Tensor:
    """Prefill / extend: request r's ext_lens[r] new tokens, rows of q [T, Hq, D] in request order, attend
    causally to its slots table[r, :seq_lens[r]] (the cached prefix, then the new tokens, already stored)
    -> [T, Hq * D]. A token's result equals the decode kernel's at its position, bit for bit."""
    return torch.ops.radixlm_cpu.extend_attention(q, k, v, table, seq_lens, ext_lens, isa)


def extend_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor,
                           seq_lens: torch.Tensor, ext_lens: torch.Tensor) -> torch.Tensor:
    """The reference: per request, float32 causal softmax attention of its new tokens over its slots."""
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[0]
    out, start = [], 0
    for r in range(table.shape[0]):
        n, total = int(ext_lens[r]), int(seq_lens[r])
        slots = table[r, :total]
        kk, vv = k[:, slots].float(), v[:, slots].float()  # [Hkv, L, D]
        qq = q[start:start + n].float().view(n, hkv, hq // hkv, d).permute(1, 0, 2, 3)  # [Hkv, n, G, D]
        s = torch.einsum("hngd,hld->hngl", qq, kk) / d**0.5
        visible = torch.arange(total)[None, :] <= (total - n + torch.arange(n))[:, None]  # [n, L]
        p = torch.softmax(s.masked_fill(~visible[None, :, None, :], float("-inf")), dim=-1)
        out.append(torch.einsum("hngl,hld->nhgd", p, vv).reshape(n, hq * d).to(q.dtype))
        start += n
    return torch.cat(out)
