"""Decode attention straight from the paged KV pool on AVX512 CPUs (cpu_decode_attention.cpp) beside its
torch reference.

q [B, Hq, D]; k, v one layer's head-major pool [Hkv, S, D]; idx [B, Ls] int64, request b's own slots in
idx[b, :counts[b]]; prefix [P] int64, shared slots that the requests with member[b] attend to before their
own (P may be 0) -> out [B, Hq * D] in q's dtype. D must be 64 or 128.
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu_ext import available

__all__ = ["available", "decode_attention", "decode_attention_torch"]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, counts: torch.Tensor,
                     prefix: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    return torch.ops.radixlm_cpu.decode_attention(q, k, v, idx, counts, prefix, member)


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
