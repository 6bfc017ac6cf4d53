"""RMSNorm (optionally after the residual add) and SwiGLU's silu(gate) * up in one pass each
(cpu_norm_act.cpp, every instruction set; ``isa`` is the kernel path), beside their torch references. The eager CPU forward (prefill) uses them where
radixlm's CPU kernels are loaded; the compiled decode step keeps torch's ops, which inductor fuses.

Shapes: x, residual [T, H], weight [H] in x's dtype (float32 or bfloat16, H a multiple of 16); gate_up
[T, 2I] with the gate first. Results are computed in float32 and rounded once to x's dtype (silu rounded
before the product, as torch's two ops do).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels.cpu_ext import available

__all__ = ["add_rms_norm_", "available", "rms_norm", "silu_mul"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.rms_norm(x, weight, eps, isa)


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, isa: int) -> torch.Tensor:
    """residual += x (in place, rounded to its dtype) -> rms_norm(residual)."""
    return torch.ops.radixlm_cpu.add_rms_norm_(x, residual, weight, eps, isa)


def silu_mul(gate_up: torch.Tensor, isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.silu_mul(gate_up, isa)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def add_rms_norm_torch(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (rms_norm(x + residual), x + residual)."""
    total = x + residual
    return rms_norm_torch(total, weight, eps), total


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
