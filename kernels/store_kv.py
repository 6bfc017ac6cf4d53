"""Write the K and V of new tokens into the KV pool: buf[h, loc[t], :] = x[t, h, :] (one layer).

The pool buffer may be head-major [Hkv, S, D] (the CPU layout) or token-major [S, Hkv, D] (the GPU layout,
FlashInfer's NHD with page size folded in): the kernel takes its strides, so both work.
"""

from __future__ import annotations

import functools

import torch


def store_kv_torch(k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, head_major: bool = True) -> None:
    """In place. loc [T] int64 slots; k, v [T, Hkv, D]; buffers [Hkv, S, D] (head_major) or [S, Hkv, D]."""
    if head_major:
        k_buf.index_copy_(1, loc, k.transpose(0, 1))
        v_buf.index_copy_(1, loc, v.transpose(0, 1))
    else:
        k_buf.index_copy_(0, loc, k)
        v_buf.index_copy_(0, loc, v)


def store_kv_triton(k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, head_major: bool = True) -> None:
    t, h, d = k.shape
    if t == 0:
        return
    s_dim, h_dim = (1, 0) if head_major else (0, 1)
    _kernel()[(t, h)](k_buf, v_buf, loc, k, v, k_buf.stride(s_dim), k_buf.stride(h_dim), k.stride(0), k.stride(1),
                      v.stride(0), v.stride(1), D=d)


@functools.cache
def _kernel():
    """Built on first use, so importing this module never needs Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def store_kv_kernel(k_buf, v_buf, loc_ptr, k_ptr, v_ptr, stride_bs, stride_bh, stride_kt, stride_kh,
                        stride_vt, stride_vh, D: tl.constexpr):
        t, h = tl.program_id(0), tl.program_id(1)
        slot = tl.load(loc_ptr + t)
        offs = tl.arange(0, D)
        dst = slot * stride_bs + h * stride_bh + offs
        tl.store(k_buf + dst, tl.load(k_ptr + t * stride_kt + h * stride_kh + offs))
        tl.store(v_buf + dst, tl.load(v_ptr + t * stride_vt + h * stride_vh + offs))

    return store_kv_kernel
