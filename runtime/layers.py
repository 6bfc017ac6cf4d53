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
from radixlm.kernels.rotary import rotary_triton
from radixlm.runtime.quantization import QuantWeight


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


def native_cpu_ok(x: torch.Tensor, native: bool) -> bool:
    """Whether radixlm's C++ elementwise kernels (cpu_norm_act) take x [T, H]: set up for this model (the
    model runner sets ``native_cpu``), eager (the compiled step keeps torch's ops for inductor to fuse),
    on the CPU, float32 / bfloat16, contiguous, H a multiple of 16."""
    return (native and not torch.compiler.is_compiling() and x.device.type == "cpu" and x.is_contiguous()
            and x.dtype in (torch.float32, torch.bfloat16) and x.shape[-1] % 16 == 0)


class RMSNorm(nn.Module):
    native_cpu = False  # radixlm's C++ kernel on the eager CPU path (ModelRunner turns it on)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [T, H] -> norm(x) [T, H]; with ``residual``: (norm(x + residual), x + residual), the sum written
        into ``residual`` on the CPU kernels' path."""
        if x.is_cuda:  # one fused kernel instead of add + cast + norm + cast
            return rmsnorm_triton(x, self.weight, self.eps, residual)
        if native_cpu_ok(x, self.native_cpu) and x.dim() == 2 and self.weight.dtype == x.dtype:
            if residual is None:
                return cpu_norm_act.rms_norm(x, self.weight, self.eps)
            if residual.is_contiguous() and residual.dtype == x.dtype:
                return cpu_norm_act.add_rms_norm_(x, residual, self.weight, self.eps), residual
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


class QuantizableLinear(nn.Module):
    """A linear layer whose weight [N, K] can be swapped for its quantized form (``quantize``)."""

    weight: torch.Tensor | None
    quant: QuantWeight | None = None

    def quantize(self, kind: str, keep_dense: bool, kernels: str = "auto") -> None:
        """Activations keep the weight's dtype; with ``keep_dense`` large batches still use the dense weight
        (unless the quantized kernel beats it at every batch size)."""
        self.quant = QuantWeight.quantize(self.weight, kind, self.weight.dtype, kernels)
        if not keep_dense or self.quant.replaces_dense:
            self.weight = None


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

    def load(self, shard: int, name: str, w: torch.Tensor) -> None:
        start, size = self.parts[shard]
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

    def load(self, shard: int, name: str, w: torch.Tensor) -> None:
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
        self.weight = nn.Parameter(torch.zeros(self.per_rank, dim), requires_grad=False)

    def quantize(self, kind: str, keep_dense: bool, kernels: str = "auto") -> None:
        """int8 rows whatever ``kind``: the precision GGUF files keep this table in (Q8_0). An int4 LM head
        raised SmolLM2's mean NLL by 1.5% (int4 layers: no measurable change). The lookup reads whole rows
        times their scale."""
        super().quantize("int8", keep_dense, kernels)

    def load(self, shard: int, name: str, w: torch.Tensor) -> None:
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
        """hidden [R, H] -> logits [R, vocab] in float32 (gathered across ranks)."""
        out = linear(hidden, self.weight, None, self.quant).float()
        if self.tp.size > 1:
            parts = [torch.empty_like(out) for _ in range(self.tp.size)]
            torch.distributed.all_gather(parts, out)
            out = torch.cat(parts, dim=-1)
        return out[:, : self.vocab_size]


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
