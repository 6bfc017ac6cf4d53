"""Apply a packed token bitmask to logits: bit j of bitmask[r, w] allows token 32 * w + j of row r.

Disallowed tokens get -inf. Rows not listed in ``indices`` are untouched. The torch version is the
reference (and the CPU path without radixlm's C++ kernels); cpu_token_bitmask.cpp is the CPU path with them;
the Triton kernel is the GPU path (and runs on the CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch

from radixlm.kernels import cpu_ext

BLOCK = 1024


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bitmask [R, W] int32 -> allowed [R, vocab_size] bool."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [R, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor,
                              indices: torch.Tensor | None = None) -> None:
    """In place. logits [B, V]; bitmask [B, ceil(V/32)] int32; indices [R] rows to mask (default: all).

    Tokens beyond the bitmask's 32 * W (a logits width wider than the grammar's vocabulary) are masked.
    """
    rows = torch.arange(logits.shape[0]) if indices is None else indices
    if rows.numel() == 0:
        return
    vocab = logits.shape[1]
    width = min(vocab, bitmask.shape[1] * 32)
    allowed = unpack_bitmask(bitmask[rows], width)
    sub = logits[rows]
    sub[:, :width].masked_fill_(~allowed, float("-inf"))
    sub[:, width:] = float("-inf")
    logits[rows] = sub


def apply_token_bitmask_cpu(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None,
                            isa: int = 0) -> None:
    """The same as apply_token_bitmask_torch for float32 logits, in C++ on kernel path ``isa`` (cpu_ext)."""
    rows = torch.arange(logits.shape[0]) if indices is None else indices
    torch.ops.radixlm_cpu.apply_token_bitmask(logits, bitmask.contiguous(), rows, isa)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                               indices: torch.Tensor | None = None) -> None:
    """The same as apply_token_bitmask_torch, as one Triton launch over (rows, vocab blocks)."""
    import triton

    rows = torch.arange(logits.shape[0], device=logits.device) if indices is None else indices
    if rows.numel() == 0:
        return
    vocab = logits.shape[1]
    kernel = _kernel()
    grid = (rows.numel(), triton.cdiv(vocab, BLOCK))
    kernel[grid](logits, bitmask, rows.to(logits.device), vocab, bitmask.shape[1] * 32,
                 logits.stride(0), bitmask.stride(0), BLOCK=BLOCK)


_KERNEL = {}


def _kernel():
    """Built on first use, so importing this module never needs Triton."""
    if "k" not in _KERNEL:
        import triton
        import triton.language as tl

        @triton.jit
        def bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, vocab, mask_width, logits_stride, bitmask_stride,
                           BLOCK: tl.constexpr):
            row = tl.load(rows_ptr + tl.program_id(0))
            offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            in_vocab = offs < vocab
            in_mask = offs < mask_width
            words = tl.load(bitmask_ptr + row * bitmask_stride + offs // 32, mask=in_vocab & in_mask, other=0)
            allowed = ((words >> (offs % 32)) & 1) != 0
            tl.store(logits_ptr + row * logits_stride + offs, float("-inf"), mask=in_vocab & ~allowed)

        _KERNEL["k"] = bitmask_kernel
    return _KERNEL["k"]


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None,
                        isa: int | None = None) -> None:
    """Dispatch: Triton on CUDA; the C++ kernel on path ``isa`` where it takes the logits (cpu_ext.takes; None:
    the caller runs without radixlm's CPU kernels), torch's ops otherwise."""
    if logits.is_cuda:
        apply_token_bitmask_triton(logits, bitmask.to(logits.device, non_blocking=True), indices)
    elif cpu_ext.takes(logits, isa):
        apply_token_bitmask_cpu(logits, bitmask, indices, isa)
    else:
        apply_token_bitmask_torch(logits, bitmask, indices)
