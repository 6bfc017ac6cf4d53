"""KV memory: the K/V tensors, a paged slot allocator, and the request -> token-slot table.

Slot s holds one token's K and V for every layer. Page p covers slots [p*P, (p+1)*P). Page 0 is reserved:
its slot 0 is the dummy that padded positions point at, so it is never handed out.
"""

from __future__ import annotations

import torch

from radixlm.runtime.config import ModelConfig


class KVPool:
    """K and V of every token slot, head-major: k_buffer[layer] is [Hkv, num_slots, D].

    One tensor per layer (not one [L, ...] tensor): the compiled CPU decode step writes each layer's new
    K/V in place, which torch.compile does only for a whole input tensor, not for a view into a bigger one.

    Head-major keeps each head's gathered keys contiguous, so attention runs as plain batched matmuls.
    Gathers go into two reused workspaces: a fresh tensor of tens of MB per layer would be page-faulted in
    on every call (it measured 6x slower than the copy itself on this CPU).
    """

    def __init__(self, cfg: ModelConfig, num_slots: int, dtype: torch.dtype, num_kv_heads: int,
                 device: torch.device | str = "cpu", head_major: bool = True) -> None:
        """``head_major=False``: token-major k_buffer[layer] [S, Hkv, D], the layout FlashInfer reads (NHD)."""
        per_layer = (num_kv_heads, num_slots, cfg.head_dim) if head_major else (num_slots, num_kv_heads, cfg.head_dim)
        self.k_buffer = [torch.zeros(per_layer, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v_buffer = [torch.zeros(per_layer, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.dtype = dtype
        self.num_slots, self.head_major, self.device = num_slots, head_major, torch.device(device)
        self._ws = [[torch.empty(0, dtype=dtype, device=device), torch.empty(0, dtype=dtype, device=device)]
                    for _ in range(2)]

    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """loc [T] slot indices; k, v [T, Hkv, D]."""
        if self.head_major:
            self.k_buffer[layer].index_copy_(1, loc, k.transpose(0, 1))
            self.v_buffer[layer].index_copy_(1, loc, v.transpose(0, 1))
        else:
            self.k_buffer[layer].index_copy_(0, loc, k)
            self.v_buffer[layer].index_copy_(0, loc, v)

    def gather(self, layer: int, idx: torch.Tensor, workspace: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """idx [N] slots -> K, V [Hkv, N, D]: views of workspace 0 or 1, valid until its next gather."""
        if not self.head_major:
            raise RuntimeError("gather needs the head-major layout (the torch backend's)")
        kb, vb = self.k_buffer[layer], self.v_buffer[layer]
        shape = (kb.shape[0], idx.numel(), kb.shape[2])
        need = shape[0] * shape[1] * shape[2]
        ws = self._ws[workspace]
        if ws[0].numel() < need:
            ws[:] = [torch.empty(need * 5 // 4, dtype=kb.dtype, device=kb.device) for _ in range(2)]
        k = torch.index_select(kb, 1, idx, out=ws[0][:need].view(shape))
        v = torch.index_select(vb, 1, idx, out=ws[1][:need].view(shape))
        return k, v

    def release(self) -> None:
        """Drop every layer's K and V and the gather workspaces (the engine is shut down)."""
        self.k_buffer.clear()
        self.v_buffer.clear()
        self._ws.clear()

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype, num_kv_heads: int) -> int:
        return 2 * cfg.num_layers * num_kv_heads * cfg.head_dim * torch.finfo(dtype).bits // 8


class PageAllocator:
    """Free list of pages. Invariant: a page is free, owned by one request, or held by the radix tree."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 2:
            raise ValueError(f"KV pool needs at least 2 pages, got {num_pages}")
        self.page_size = page_size
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, 0, -1))  # page 0 reserved; pop() hands out low pages first
        self._watchers: list[torch.Tensor] = []

    def watch(self, valid: torch.Tensor) -> None:
        """``valid`` [num_pages * P] bool: a second pool's per-slot flag (a draft model's KV at the same slots),
        cleared for every slot handed out, whose old contents belong to another token."""
        self._watchers.append(valid)

    @property
    def capacity(self) -> int:
        """Allocatable tokens (page 0 excluded)."""
        return (self.num_pages - 1) * self.page_size

    def available(self) -> int:
        return len(self._free) * self.page_size

    def alloc_pages(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        if self._watchers and pages:
            p = self.page_size
            slots = (torch.tensor(pages).unsqueeze(1) * p + torch.arange(p)).reshape(-1)
            for valid in self._watchers:
                valid[slots] = False
        return pages

    def free_slots(self, slots: list[int]) -> None:
        """Free the pages that hold ``slots`` (which must be whole pages, or a request's partial last page)."""
        pages = sorted({s // self.page_size for s in slots}, reverse=True)
        if pages and pages[-1] == 0:
            raise RuntimeError("attempt to free the reserved page 0")
        self._free.extend(pages)


class ReqToTokenPool:
    """table[row, pos] = KV slot of token ``pos`` of the request in ``row``; rows are recycled.

    Row ``num_rows`` (one past the last allocatable row) is the dummy row: all zeros, i.e. the reserved slot 0.
    Padding in a captured CUDA graph points there."""

    def __init__(self, num_rows: int, max_context: int, device: torch.device | str = "cpu") -> None:
        self.table = torch.zeros((num_rows + 1, max_context), dtype=torch.int64, device=device)
        self.dummy_row = num_rows
        self._free = list(range(num_rows - 1, -1, -1))
        self.max_context = max_context
        self.num_rows = num_rows

    def free_rows(self) -> set[int]:
        return set(self._free)

    def available(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, row: int) -> None:
        self._free.append(row)
