"""Building blocks of the decoder, with linear layers laid out for Megatron-style tensor parallelism.

Shapes: T = tokens in the batch (flattened over requests), H = hidden size, D = head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import cpu_norm_act
from radixlm.kernels.rmsnorm import rmsnorm_triton
from radixlm.runtime.model.gguf_blocks import QuantBlocks
from radixlm.runtime.model.quantization import QuantWeight


@dataclass(frozen=True)
class TPInfo:
    """This rank's place in the tensor-parallel group."""

    rank: int = 0
    size: int = 1


def split_range(n: int, rank: int, size: int) -> tuple[int, int]:
    """Balanced contiguous split of range(n) over ``size`` ranks -> (start, count) of ``rank``'s part."""
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class HeadShard:
    """The query and KV heads one rank holds: [q_start, q_start + q_count), [kv_start, kv_start + kv_count).

    Invariant: every query head sits on the rank that holds its KV head (grouped-query attention stays
    local). With at least as many KV heads as ranks, KV heads are split (unevenly if they must: SmolLM2's
    3 KV heads over 2 ranks give 2 + 1) and query heads follow their group; with fewer, each KV head is
    replicated on ``size / num_kv_heads`` ranks that split its query group.
    """

    q_start: int
    q_count: int
    kv_start: int
    kv_count: int

    @classmethod
    def of(cls, num_heads: int, num_kv_heads: int, tp: TPInfo) -> HeadShard:
        group = num_heads // num_kv_heads
        if num_kv_heads >= tp.size:
            kv_start, kv_count = split_range(num_kv_heads, tp.rank, tp.size)
            return cls(kv_start * group, kv_count * group, kv_start, kv_count)
        rep = tp.size // num_kv_heads
        if tp.size % num_kv_heads or group % rep:
            raise ValueError(f"tp_size {tp.size} cannot split {num_heads} query / {num_kv_heads} KV heads")
        kv = tp.rank // rep
        return cls(kv * group + (tp.rank % rep) * (group // rep), group // rep, kv, 1)

    @staticmethod
    def max_kv_heads(num_heads: int, num_kv_heads: int, size: int) -> int:
        """Most KV heads on any rank: every rank sizes its KV pool by it, so slot indices agree."""
        return max(HeadShard.of(num_heads, num_kv_heads, TPInfo(r, size)).kv_count for r in range(size))


def native_cpu_ok(x: torch.Tensor, isa: int | None) -> bool:
    """Whether radixlm's C++ elementwise kernels (cpu_norm_act) take x [T, H]: set up for this model (the
    model runner sets ``cpu_isa``), eager (the compiled step keeps torch's ops for inductor to fuse),
    on the CPU, float32 / bfloat16, contiguous, H a multiple of 16."""
    return (isa is not None and not torch.compiler.is_compiling() and x.device.type == "cpu" and x.is_contiguous()
            and x.dtype in (torch.float32, torch.bfloat16) and x.shape[-1] % 16 == 0)


class RMSNorm(nn.Module):
    cpu_isa: int | None = None  # radixlm's C++ kernel on the eager CPU path, on this path (set by ModelRunner)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [T, H] -> norm(x) [T, H]; with ``residual``: (norm(x + residual), x + residual), the sum written
        into ``residual`` on the CPU kernels' path."""
        if x.is_cuda:  # one fused kernel instead of add + cast + norm + cast
            return rmsnorm_triton(x, self.weight, self.eps, residual)
        if native_cpu_ok(x, self.cpu_isa) and x.dim() == 2 and self.weight.dtype == x.dtype:
            if residual is None:
                return cpu_norm_act.rms_norm(x, self.weight, self.eps, self.cpu_isa)
            if residual.is_contiguous() and residual.dtype == x.dtype:
                return cpu_norm_act.add_rms_norm_(x, residual, self.weight, self.eps, self.cpu_isa), residual
        if residual is not None:
            x = x + residual
            residual = x
        # in the model dtype: the kernel accumulates in float32 either way (bf16: within 1 ulp of the
        # float32 path, 2 casts fewer per call)
        out = F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return out if residual is None else (out, residual)


def linear(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
           quant: QuantWeight | None) -> torch.Tensor:
    """x [T, K] -> [T, N]: the quantized kernel for small batches (or always, once the dense weight is
    dropped), the dense matmul otherwise."""
    if quant is not None and quant.preferred(x.shape[0], weight is not None):
        y = quant.matmul(x)
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


def native_weight(b: QuantBlocks, act_dtype: torch.dtype, isa: int) -> QuantWeight:
    """Loaded blocks -> the native kernels' weight at their own width, exactly."""
    if b.iq4:  # IQ4_NL / IQ4_XS: int4 codes into IQ4_NL's values (IQ2_XXS / IQ1_S: into GRID_VALUES)
        return QuantWeight.from_iq4_codes(b.q, b.d, b.sub, act_dtype, isa, b.values if b.grid else None)
    if b.kq is not None:  # Q4_K / Q5_K / Q2_K with their own scales (int4 / int5 / int2)
        return QuantWeight.from_kquant(b.q, b.kq, b.bits, act_dtype, isa)
    if b.bits == 4:
        return QuantWeight.from_int4_codes(b.q, b.d, b.m, act_dtype, isa)
    if b.bits == 5:
        return QuantWeight.from_int5_codes(b.q, b.d, b.m, act_dtype, isa)
    if b.bits in (3, 6):
        return QuantWeight.from_subblock_codes(b.q, b.sub, b.d, b.bits, act_dtype, isa)
    return QuantWeight.from_int8_codes(b.q, b.d, act_dtype, isa)


class QuantizableLinear(nn.Module):
    """A linear layer whose weight [N, K] can be swapped for its quantized form (``quantize``). A GGUF file's
    quantized blocks may be loaded instead of a dense weight (``blocks``, one per stacked sub-matrix): quantize
    then takes them as they are, or materialize writes them into the dense weight."""

    weight: torch.Tensor | None
    quant: QuantWeight | None = None
    blocks: dict[int, QuantBlocks] | None = None

    def quantize(self, kind: str, keep_dense: bool, isa: int | None = None) -> None:
        """Activations keep the weight's dtype; with ``keep_dense`` large batches still use the dense weight
        (unless the quantized kernel beats it at every batch size). ``isa``: radixlm's kernel path. ``mixed``:
        loaded blocks keep their width (int2 - int6 or int8; a stack whose last parts come in another width
        keeps them as its tail), dense weights become int4."""
        runs = self._whole_blocks({"int4": 4, "int8": 8}.get(kind)) if isa is not None else None
        if runs is not None:
            head, *tail = (native_weight(b, self.weight.dtype, isa) for b in runs)
            self.quant = head.with_tail(tail[0]) if tail else head
        if self.quant is None:
            self.materialize()
            self.quant = QuantWeight.quantize(self.weight, "int4" if kind == "mixed" else kind, self.weight.dtype, isa)
        self.blocks = None
        if not keep_dense or self.quant.replaces_dense:
            self.weight = None

    def tile_dense(self, isa: int) -> None:
        """The dense weight into radixlm's dense kernel's tiles (where its shape fits them)."""
        if self._tiles() and self.weight.device.type == "cpu":
            self.quant, self.weight = QuantWeight.tile_dense(self.weight, isa), None

    def _tiles(self) -> bool:
        """Whether the weight [N, K] fits radixlm's kernels: 16-row tiles, K in blocks of 64."""
        n, k = self.weight.shape
        return n % 16 == 0 and k % 64 == 0

    def _whole_blocks(self, bits: int | None) -> list[QuantBlocks] | None:
        """The loaded blocks stacked at ``bits`` bits (None: each run at its own width, QuantBlocks.stack_runs), if
        they are the whole weight and fit the kernels."""
        if not self.blocks or not self._tiles():
            return None
        parts = [self.blocks[i] for i in sorted(self.blocks)]
        runs = [QuantBlocks.stack(parts, bits)] if bits is not None else QuantBlocks.stack_runs(parts)
        rows = sum(b.shape[0] for b in runs)
        return runs if (rows, runs[0].shape[1]) == tuple(self.weight.shape) else None  # else some parts came dense

    def load_blocks(self, shard: int, blocks: QuantBlocks) -> None:
        self.blocks = {**(self.blocks or {}), shard: blocks}

    def materialize(self) -> None:
        """Loaded blocks -> the dense weight (dequantized)."""
        if self.blocks:
            for shard, b in sorted(self.blocks.items()):
                self.load(shard, "weight", b.dequantize().to(self.weight.dtype))
        self.blocks = None


class ColumnParallelLinear(QuantizableLinear):
    """y = x W^T with W's rows (outputs) split across ranks.

    W stacks logical sub-matrices (q, k, v or gate, up); ``parts[i] = (start, rows)`` is the slice of
    sub-matrix i this rank holds, so ``load(i, name, w)`` copies it out of a full HF tensor.
    """

    def __init__(self, in_features: int, parts: list[tuple[int, int]], bias: bool) -> None:
        super().__init__()
        self.parts = parts
        rows = sum(n for _, n in parts)
        self.weight = nn.Parameter(torch.empty(rows, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(rows), requires_grad=False) if bias else None

    @classmethod
    def even(cls, in_features: int, out_sizes: list[int], bias: bool, tp: TPInfo) -> ColumnParallelLinear:
        return cls(in_features, [split_range(s, tp.rank, tp.size) for s in out_sizes], bias)

    def load(self, shard: int, name: str, w: torch.Tensor | QuantBlocks) -> None:
        start, size = self.parts[shard]
        if isinstance(w, QuantBlocks):  # this rank's rows of sub-matrix `shard`
            self.load_blocks(shard, w.take_rows(torch.arange(start, start + size)))
            return
        target = self.weight if name == "weight" else self.bias
        offset = sum(n for _, n in self.parts[:shard])
        target.data[offset:offset + size].copy_(w[start:start + size])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.quant)


class RowParallelLinear(QuantizableLinear):
    """y = x W^T with W's columns (inputs) [start, start + count) on this rank, followed by an all-reduce."""

    def __init__(self, part: tuple[int, int], out_features: int, tp: TPInfo) -> None:
        super().__init__()
        self.tp, self.start = tp, part[0]
        self.weight = nn.Parameter(torch.empty(out_features, part[1]), requires_grad=False)

    def load(self, shard: int, name: str, w: torch.Tensor | QuantBlocks) -> None:
        if isinstance(w, QuantBlocks):
            if self.tp.size > 1:  # the columns would split groups of 32: take the dense weight
                w = w.dequantize().to(self.weight.dtype)
            else:
                self.load_blocks(0, w)
                return
        self.weight.data.copy_(w[:, self.start:self.start + self.weight.shape[1]])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, None, self.quant)
        if self.tp.size > 1:
            torch.distributed.all_reduce(y)
        return y


class VocabParallelEmbedding(QuantizableLinear):
    """Embedding (and, tied or not, LM head) with the vocabulary split across ranks."""

    def __init__(self, vocab_size: int, dim: int, tp: TPInfo) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.per_rank = math.ceil(vocab_size / tp.size)
        self.start = tp.rank * self.per_rank
        # rows past the vocabulary (on the last TP rank) are zeros; the others are filled by load, so they are not
        # zeroed first (a 150k-token table is half a GB to write for nothing)
        self.weight = nn.Parameter(torch.empty(self.per_rank, dim), requires_grad=False)
        self.weight.data[max(0, vocab_size - self.start):].zero_()

    def quantize(self, kind: str, keep_dense: bool, isa: int | None = None) -> None:
        """int8 rows, the precision GGUF files usually keep this table in (Q8_0): an int4 LM head made from
        SmolLM2's raised its mean NLL by 1.5% (int4 layers: no measurable change). A file that holds the table
        in 4 bits keeps it so with int4 (or mixed), one in 5 bits, Q6_K (as Q4_K_M files do), Q3_K or Q2_K keeps it
        as int5, int6, int3 or int2 with mixed on radixlm's kernels. The lookup reads whole rows times their scale."""
        widths = {b.bits for b in self.blocks.values()} if self.blocks else set()
        if kind in ("int4", "mixed") and widths == {4}:
            kind = "int4"
        elif not (kind == "mixed" and widths in ({2}, {3}, {5}, {6}) and isa is not None):
            kind = "int8"
        super().quantize(kind, keep_dense, isa)

    def load(self, shard: int, name: str, w: torch.Tensor | QuantBlocks) -> None:
        if isinstance(w, QuantBlocks):
            if self.tp.size == 1:
                self.load_blocks(0, w)
                return
            w = w.dequantize().to(self.weight.dtype)
        part = w[self.start:self.start + self.per_rank]
        self.weight.data[: part.shape[0]].copy_(part)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            return F.embedding(ids, self.weight)
        return self.quant.rows(ids)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self._lookup(ids)
        local = ids - self.start
        inside = (local >= 0) & (local < self.per_rank)
        out = self._lookup(local.clamp(0, self.per_rank - 1)) * inside.unsqueeze(-1)
        torch.distributed.all_reduce(out)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [R, H] -> logits [R, vocab] in float32 (gathered across ranks). A quantized head's sums stay
        float32 (radixlm's kernels quantize bfloat16 and float32 rows alike), as the fused layers' head gives them."""
        q = self.quant
        native = q is not None and q.backend == "native" and "dense" not in q.kinds
        if native and q.preferred(hidden.shape[0], self.weight is not None):
            hidden = hidden.float()
        out = linear(hidden, self.weight, None, q).float()
        if self.tp.size > 1:
            parts = [torch.empty_like(out) for _ in range(self.tp.size)]
            torch.distributed.all_gather(parts, out)
            out = torch.cat(parts, dim=-1)
        return out[:, : self.vocab_size]
