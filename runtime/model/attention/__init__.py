"""Attention backends over the paged KV pool, chosen per device: ``cpu`` (torch ops and radixlm's C++ CPU
kernels; the reference), ``triton_gpu`` (Triton kernels, also run on the CPU under TRITON_INTERPRET=1) and
``flashinfer_gpu``."""

from __future__ import annotations

import os
from typing import Protocol

import torch

from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.kv.pool import KVPool, ReqToTokenPool
from radixlm.runtime.model.attention.cpu import TorchAttentionBackend


class AttentionBackend(Protocol):
    def prepare(self, batch: ForwardBatch) -> None:
        """Build per-batch metadata once (before the layers run)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        """Store k, v [T, Hkv, D] at batch.out_cache_loc, then attend q [T, Hq, D] -> [T, Hq * D]."""


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
                 cpu_isa: int | None = None, deterministic: bool = True, windows: list[int | None] | None = None):
    """``cpu_isa``: the CPU backend runs radixlm's C++ attention on that path (None: torch's ops);
    ``deterministic``: Triton decodes through its extend kernel (see triton_gpu.py); ``windows``: each layer's
    sliding window or None (the CPU backend's torch path only)."""
    if any(w is not None for w in windows or []) and name != "torch":
        raise ValueError(f"attention_backend: {name} has no sliding-window attention (this model's local layers); "
                         "use the CPU (torch) backend")
    if name == "triton":
        from radixlm.runtime.model.attention.triton_gpu import TritonAttentionBackend

        return TritonAttentionBackend(pool, req_to_token, deterministic=deterministic)
    if name == "flashinfer":
        from radixlm.runtime.model.attention.flashinfer_gpu import FlashInferAttentionBackend

        return FlashInferAttentionBackend(pool, req_to_token, page_size, num_q_heads)
    return TorchAttentionBackend(pool, req_to_token, cpu_isa, windows)
