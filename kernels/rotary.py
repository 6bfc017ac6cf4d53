"""Rotate-half rotary embedding of q and k at given positions, in place, with float32 cos/sin tables.

x1, x2 = halves of x in float32, out = (x1 cos - x2 sin, x2 cos + x1 sin), rounded to x's dtype (the CPU
path in radixlm.runtime.model.layers.RopeAt computes the same in the model's dtype, as transformers does).
"""

from __future__ import annotations

import functools

import torch


def rotary_torch(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T]; q [T, Hq, D]; k [T, Hkv, D]; cos, sin [max_pos, D/2] float32 -> rotated (q, k)."""
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)

    return rot(q), rot(k)


def rotary_triton(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same, in place on q and k (which must have a contiguous last dim); returns them."""
    t, hq, d = q.shape
    hk = k.shape[1]
    if t:
        _kernel()[(t, hq + hk)](q, k, positions, cos, sin, hq, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                cos.stride(0), HALF=d // 2)
    return q, k


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rotary_kernel(q_ptr, k_ptr, pos_ptr, cos_ptr, sin_ptr, HQ, stride_qt, stride_qh, stride_kt, stride_kh,
                      stride_c, HALF: tl.constexpr):
        t, h = tl.program_id(0), tl.program_id(1)
        pos = tl.load(pos_ptr + t)
        offs = tl.arange(0, HALF)
        c = tl.load(cos_ptr + pos * stride_c + offs)
        s = tl.load(sin_ptr + pos * stride_c + offs)
        if h < HQ:
            base = q_ptr + t * stride_qt + h * stride_qh
        else:
            base = k_ptr + t * stride_kt + (h - HQ) * stride_kh
        x1 = tl.load(base + offs)
        x2 = tl.load(base + HALF + offs)
        x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
        tl.store(base + offs, (x1f * c - x2f * s).to(x1.dtype))
        tl.store(base + HALF + offs, (x2f * c + x1f * s).to(x1.dtype))

    return rotary_kernel
