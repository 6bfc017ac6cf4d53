"""The CPU kernels' weights moved into one block of memory, in the order a decode step reads them.

A decode step at batch 1 streams every weight once, so its speed is the speed at which memory delivers
them. Left where the loader's allocations put them (4 KB pages scattered through physical memory), the
same bytes streamed slower than a fresh copy of them (benchmarks/bench_weight_block.py measures it); the likely
cost is the TLB: a miss per page, each a page walk that a VM nests through the hypervisor's tables. One
private anonymous mapping, 2 MB aligned, holds them instead: the layers' weights in layer order (each layer's
qkv, o, gate_up, down, each as codes, scales, minimums), then the LM head. The kernels read the same bytes from
the new addresses, so no result changes.

The block is advised for transparent huge pages once it is filled, not before its first touch: huge-page faults
made filling it much slower on a VM, for a decode rate within the machine's drift (bench_startup.py); advised
afterwards, the kernel's khugepaged may collapse the block in the background. Where the kernel grants no huge pages
(``/sys/kernel/mm/transparent_hugepage/enabled`` set to ``never``) the block is still one fresh mapping.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import mmap
from dataclasses import dataclass

import torch
from torch import nn

from radixlm.runtime.model.quantization import QuantWeight

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
log = logging.getLogger("radixlm.model")


@dataclass(frozen=True)
class WeightArena:
    """The block: ``buffer`` uint8 [nbytes] (the tensors are views of it); ``huge_pages`` the kernel's THP
    setting (always / madvise / never) or None where it has none."""

    buffer: torch.Tensor
    tensors: int
    huge_pages: str | None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()

    def holds(self, t: torch.Tensor) -> bool:
        start = self.buffer.data_ptr()
        return start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= start + self.nbytes


def read_order(model: nn.Module) -> list[nn.Module]:
    """The modules whose weights radixlm's kernels read, in the order a forward pass reads them: every
    module with a native QuantWeight in registration order (the layers in turn), the LM head last (tied to
    the embedding, it is registered first but read after the layers)."""
    mods = [m for m in model.modules() if isinstance(getattr(m, "quant", None), QuantWeight)
            and m.quant.backend == "native"]
    head = getattr(model, "lm_head", None)
    return [m for m in mods if m is not head] + [m for m in mods if m is head]


def weight_tensors(q: QuantWeight) -> list[torch.Tensor]:
    """The tensors of ``q`` the kernels read: codes, scales, minimums (none empty or missing), then its tail's."""
    own = [t for t in (q.data, q.scales, q.mins) if t is not None and t.numel() > 0]
    return own + (weight_tensors(q.tail) if q.tail is not None else [])


def move_to_arena(model: nn.Module) -> WeightArena | None:
    """Copy the native weights of ``model`` (CPU) into one arena and point its QuantWeights at the copies;
    None when it has none, or when the system refuses the mapping (the weights then stay where they are).
    The old tensors are freed as their last references go."""
    mods = read_order(model)
    if not mods:
        return None
    tensors = [t for m in mods for t in weight_tensors(m.quant)]
    total = sum(_aligned(t.numel() * t.element_size()) for t in tensors)
    try:
        buffer, block = allocate(total)
    except OSError as e:  # an address-space limit, no memory for the mapping: a slower step, not a failure
        log.warning("weights left in place: could not map %.1f MB for them (%s)", total / 1e6, e)
        return None
    offset = 0

    def place(t: torch.Tensor | None) -> torch.Tensor | None:
        nonlocal offset
        if t is None or t.numel() == 0:
            return t
        n = t.numel() * t.element_size()
        copy = buffer[offset:offset + n].view(t.dtype).view(t.shape).copy_(t)
        offset += _aligned(n)
        return copy

    def moved(q: QuantWeight) -> QuantWeight:
        return dataclasses.replace(q, data=place(q.data), scales=place(q.scales), mins=place(q.mins),
                                   tail=moved(q.tail) if q.tail is not None else None)

    for m in mods:
        m.quant = moved(m.quant)
    release_freed_heap()
    return WeightArena(buffer, len(tensors), advise_huge_pages(block))


def release_freed_heap() -> bool:
    """Hand the heap pages freed by the move (and by loading) back to the system: glibc keeps freed heap
    memory mapped, so the old weights' copies would stay in the process's resident memory. False where
    there is no glibc."""
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded into the process, the C library's among them
    except (OSError, TypeError):  # Windows has no such handle
        return False
    if not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def allocate(nbytes: int) -> tuple[torch.Tensor, mmap.mmap | None]:
    """-> (uint8 [nbytes] starting on a 2 MB boundary of a fresh private anonymous mapping, the mapping: None
    where the system has no anonymous mappings and the block is an ordinary allocation)."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):  # not Linux / BSD: an ordinary allocation, still one block
        return torch.empty(nbytes, dtype=torch.uint8), None
    block = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(block, dtype=torch.uint8)  # holds a reference to the mapping
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + nbytes], block


def advise_huge_pages(block: mmap.mmap | None) -> str | None:
    """Advise a filled block for transparent huge pages -> the kernel's THP setting (None: no advice given)."""
    if block is None or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    block.madvise(mmap.MADV_HUGEPAGE)
    return _thp_setting()


def _thp_setting() -> str | None:
    """The bracketed choice of the kernel's transparent huge page setting, e.g. 'madvise'."""
    try:
        with open(THP_SETTING) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None
