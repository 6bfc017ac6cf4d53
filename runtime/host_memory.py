"""Blocks of host memory for what a CPU decode step streams (the weights, the KV pool).

A step at batch 1 reads every weight once and every cached token's K and V once, from addresses spread
over hundreds of MB: with 4 KB pages nearly every page is a TLB miss, and in a VM each miss is a nested
page walk. A private anonymous mapping, 2 MB aligned and advised for transparent huge pages before its first
touch, lets the kernel back it with 2 MB pages instead. Its pages read as zeros until written.
"""

from __future__ import annotations

import mmap

import torch

HUGE_PAGE = 2 << 20
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_page_block(nbytes: int) -> tuple[torch.Tensor, str | None]:
    """uint8 [nbytes], zeros, starting on a 2 MB boundary of a private anonymous mapping advised for huge
    pages -> (it, the kernel's THP setting or None). Not Linux / BSD: an ordinary allocation, still one block.
    Raises OSError where the system refuses the mapping."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.zeros(nbytes, dtype=torch.uint8), None
    block = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        block.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(block, dtype=torch.uint8)  # holds a reference to the mapping
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + nbytes], thp_setting()


def huge_page_tensors(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> tuple[list[torch.Tensor], str | None]:
    """Zero tensors of ``shapes`` in one huge-page block, each starting on a 2 MB boundary of it."""
    item = torch.empty(0, dtype=dtype).element_size()
    sizes = [item * _numel(s) for s in shapes]
    spans = [-(-n // HUGE_PAGE) * HUGE_PAGE for n in sizes]
    block, setting = huge_page_block(sum(spans))
    out, offset = [], 0
    for shape, n, span in zip(shapes, sizes, spans, strict=True):
        out.append(block[offset:offset + n].view(dtype).view(shape))
        offset += span
    return out, setting


def thp_setting() -> str | None:
    """The bracketed choice of the kernel's transparent huge page setting, e.g. 'madvise'."""
    try:
        with open(THP_SETTING) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
