"""Fused RMSNorm with an optional residual add: s = x + residual (in x's dtype), out = s / rms(s) * w.

Matches radixlm.runtime.model.layers.RMSNorm: the sum is rounded to x's dtype (it is the next residual), the norm
is computed in float32 and rounded once. One program per token row; H must fit one block.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """x [T, H] -> out [T, H]; with residual: (out, x + residual)."""
    if residual is not None:
        x = x + residual
        residual = x
    out = F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)
    return out if residual is None else (out, residual)


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    import triton

    t, h = x.shape
    out = torch.empty(t, h, dtype=x.dtype, device=x.device)  # contiguous: the kernel writes row * H
    new_res = torch.empty_like(out) if residual is not None else out  # unused without a residual
    res_in = residual if residual is not None else x
    _kernel()[(t,)](x, res_in, weight, out, new_res, h, eps, x.stride(0), res_in.stride(0),
                    HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(h))
    return out if residual is None else (out, new_res)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, H, eps, stride_x, stride_r,
                       HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < H
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like torch's x + residual
            tl.store(new_res_ptr + row * H + offs, x, mask=mask)
        xf = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * H + offs, (xf * inv * w).to(x.dtype), mask=mask)

    return rmsnorm_kernel
