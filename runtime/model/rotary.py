"""Rotate-half RoPE with optional llama3 / linear frequency scaling: tables built once, applied per batch.

Shapes: T = tokens in the batch, D = head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixlm.kernels.rotary import rotary_triton


class RotaryEmbedding:
    """Rotate-half RoPE with an optional llama3 / linear frequency scaling; cos/sin cached per position.

    A plain object, not a module: its float32 tables stay float32 (and on the CPU) whatever the model dtype.
    """

    def __init__(self, head_dim: int, max_pos: int, theta: float, scaling: dict | None) -> None:
        # float32 throughout, as transformers computes it, so positions agree bit for bit
        ar = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()
        inv_freq = _scale_inv_freq(1.0 / (theta ** (ar / head_dim)), scaling)
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32, device="cpu"), inv_freq)  # [max_pos, D/2]
        self.cos, self.sin = freqs.cos(), freqs.sin()

    def at(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeAt:
        """The rotation for one batch's positions [T], built once per forward and applied in every layer."""
        if self.cos.device != positions.device:  # first call on a GPU: the tables follow, once
            self.cos, self.sin = self.cos.to(positions.device), self.sin.to(positions.device)
        if positions.is_cuda:
            return RopeAt(positions, self.cos, self.sin, None, None)
        cos, sin = self.cos[positions], self.sin[positions]  # [T, D/2]
        c = torch.cat((cos, cos), dim=-1).unsqueeze(1).to(dtype)  # [T, 1, D]
        s = torch.cat((-sin, sin), dim=-1).unsqueeze(1).to(dtype)
        return RopeAt(positions, self.cos, self.sin, c, s)


@dataclass(frozen=True)
class RopeAt:
    """Rotate-half RoPE at fixed positions: on CUDA one in-place Triton launch for q and k; on the CPU
    x * [cos, cos] + (x2, x1) * [-sin, sin] in the model's dtype (as transformers computes it), 4 ops a tensor."""

    positions: torch.Tensor  # [T]
    cos_table: torch.Tensor  # [max_pos, D/2] float32
    sin_table: torch.Tensor
    cos: torch.Tensor | None  # [T, 1, D] in the model dtype (CPU only)
    sin: torch.Tensor | None  # [T, 1, D], sign folded in

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hkv, D] -> rotated q, k."""
        if self.cos is None:
            return rotary_triton(self.positions, q, k, self.cos_table, self.sin_table)
        return self._rotate(q), self._rotate(k)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        t, h, d = x.shape
        swapped = x.view(t, h, 2, d // 2).flip(2).view(t, h, d)  # (x2, x1)
        return x * self.cos + swapped * self.sin


def _scale_inv_freq(inv_freq: torch.Tensor, scaling: dict | None) -> torch.Tensor:
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":  # as in Meta's reference and HF's _compute_llama3_parameters
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        out = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        medium = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
        return torch.where(medium, smoothed, out)
    raise ValueError(f"model: unsupported rope scaling {kind!r}")
