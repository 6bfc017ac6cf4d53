"""The CPU decode step as one torch.compile'd graph: the CPU's answer to CUDA graphs.

Eager decode of SmolLM2 runs ~700 small torch ops a token (RMSNorm, RoPE, residuals, KV store, attention),
5-20 us each, which cost more than the int4 matmuls themselves. Inductor fuses the elementwise work into
a few C++ loops per layer and calls the matmul and attention kernels from one generated wrapper.

Three graphs, all compiled at startup so that no request waits on a compile: batch 1 (torch specializes
size 1), batches of 2..max_bs requests (sizes symbolic), and batches with one shared-prefix (cascade)
group. Batches with several prefix groups or more than max_bs requests run eagerly. Invariants: the graph
writes each layer's new K/V in place into the pool's per-layer tensors; padded key positions read the
reserved slot 0 and are masked out.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from radixlm.kernels import cpu_decode_attention as native_kernel
from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.kv.pool import KVPool
from radixlm.runtime.model.attention.cpu_decode import (
    MIN_SHARED,
    DecodeMeta,
    additive_bias,
    native_args,
    traced_decode_attention,
)
from radixlm.runtime.progress import Progress


@dataclass
class _GraphAttend:
    """``attend`` for the traced model: store the step's K/V, then attend (see traced_decode_attention)."""

    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]
    loc: torch.Tensor  # [B] slots the new tokens go to
    idx: torch.Tensor  # [B * Ls] each request's own slots, padded with slot 0
    mask: torch.Tensor  # [1, B, 1, Ls] bool, True = attend (with a group: its float32 additive_bias)
    members: torch.Tensor | None  # [n] requests of the shared-prefix group
    prefix: torch.Tensor | None  # [P] the group's shared slots
    native: tuple[torch.Tensor, ...] | None  # the C++ kernel's step inputs (native_args); None: torch's ops
    isa: int | None  # the C++ kernel's path

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        kb, vb = self.k_buffer[layer], self.v_buffer[layer]
        kb.index_copy_(1, self.loc, k.transpose(0, 1))
        vb.index_copy_(1, self.loc, v.transpose(0, 1))
        if self.native is not None:
            idx = self.idx.view(q.shape[0], -1)
            return native_kernel.decode_attention(q.contiguous(), kb, vb, idx, *self.native, self.isa)
        return traced_decode_attention(q, kb, vb, self.idx, self.mask, self.members, self.prefix)


class CompiledDecode:
    """ModelRunner's decode path on the CPU when --enable-torch-compile is set (see the module docstring)."""

    def __init__(self, model, pool: KVPool, max_bs: int, attention_isa: int | None = None) -> None:
        self.model, self.pool, self.max_bs, self.isa = model, pool, max_bs, attention_isa
        # The weights never change after loading, so guarding on every parameter is wasted work. Without
        # those guards nothing tells two engines' graphs apart, and torch caches graphs per code object:
        # each instance traces its own copy of _trace, so it never runs another engine's graph.
        trace = types.FunctionType(CompiledDecode._trace.__code__.replace(), globals(), "_trace")
        # The thread count is fixed in inductor's config, so it is part of the cache key: a graph compiled for
        # two threads, loaded from the on-disk cache by a process running one, crashed in torch's SDPA.
        self._step = torch.compile(types.MethodType(trace, self),
                                   options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
                                            "cpp.threads": torch.get_num_threads()})
        self._warm_up()

    def _trace(self, input_ids, positions, loc, idx, mask, members, prefix) -> torch.Tensor:
        native = None
        if self.isa is not None:  # once a step, not per layer: valid slots per row (the kernel's form of mask), the group
            native = native_args(mask.reshape(input_ids.shape[0], -1).sum(-1), members, prefix)
        elif members is not None:  # the cascade's fused kernel takes the mask as a bias
            mask = additive_bias(mask)
        attend = _GraphAttend(self.pool.k_buffer, self.pool.v_buffer, loc, idx, mask, members, prefix, native, self.isa)
        return self.model.compute(input_ids, positions, attend)

    def can_run(self, batch: ForwardBatch) -> bool:
        meta = batch.attn_meta
        return (batch.mode == "decode" and batch.num_layers is None and batch.batch_size <= self.max_bs
                and isinstance(meta, DecodeMeta) and len(meta.groups) <= 1)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """A decode batch (can_run) -> logits [B, vocab] float32."""
        meta: DecodeMeta = batch.attn_meta
        b, ls = batch.batch_size, meta.suffix_len
        idx = meta.idx.view(b, ls)
        mask = meta.mask.view(b, ls) if meta.mask is not None else torch.ones(b, ls, dtype=torch.bool)
        if ls == 1:  # a length-1 dimension would be specialized: pad to 2 (slot 0, masked)
            idx = torch.cat((idx, torch.zeros_like(idx)), dim=1)
            mask = torch.cat((mask, torch.zeros_like(mask)), dim=1)
        members, prefix = (meta.groups[0].members, meta.groups[0].slots) if meta.groups else (None, None)
        inputs = (batch.input_ids, batch.positions, batch.out_cache_loc, idx.reshape(-1), mask[None, :, None, :],
                  members, prefix)
        return self._call(*inputs)

    def _call(self, *inputs: torch.Tensor | None) -> torch.Tensor:
        """Only the batch's own sizes are symbolic (batch, suffix, group, prefix: every dim below but mask's
        1s), never a weight's; with them all symbolic, torch tied weight sizes to equal batch sizes.
        Inference tensors throughout, as in the warm-up: a tensor made outside inference mode fails the
        graph's guards (another dispatch key) and would recompile."""
        inputs = tuple(t if t is None or t.is_inference() else t.clone() for t in inputs)
        for t in inputs:
            for dim, size in enumerate(() if t is None else t.shape):
                if size > 1:
                    torch._dynamo.mark_dynamic(t, dim)
        return self._step(*inputs)

    def _warm_up(self) -> None:
        """Compile the three graphs now, on dummy batches that touch only the reserved slot 0. Every size
        differs from every other (batch 3, suffix 4, group of 2, prefix 40): torch gives equal sizes seen
        while tracing one symbol, which would tie them together in every later call."""
        shapes = ((1, 2, 0), (3, 4, 0), (3, 4, 2))
        with Progress("Compiling the decode step (torch.compile)", total=len(shapes), unit="graph") as bar:
            for b, ls, group in bar.wrap(shapes):
                self._compile_one(b, ls, group)

    @torch.inference_mode()
    def _compile_one(self, b: int, ls: int, group: int) -> None:
        """One dummy decode batch: b requests, suffix ls, a shared group of ``group`` (0: none). Distinct
        tensors: passing one for several inputs adds aliasing guards."""
        ids, positions, loc = (torch.zeros(b, dtype=torch.int64) for _ in range(3))
        members = torch.arange(group) if group else None
        prefix = torch.zeros(MIN_SHARED + 8, dtype=torch.int64) if group else None
        mask = torch.ones(1, b, 1, ls, dtype=torch.bool)
        self._call(ids, positions, loc, torch.zeros(b * ls, dtype=torch.int64), mask, members, prefix)
