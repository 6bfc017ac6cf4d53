"""Weight-only int8 / int4 quantization for the CPU: the weights stay quantized in memory and torch's fused
weight-only kernels multiply activations by them directly (no dequantized copy per step).

- int8: symmetric, one scale per output row: w = q * s, q in [-127, 127]; ``aten._weight_int8pack_mm``.
- int4: asymmetric groups of 32 along K, the shape of GGUF's Q4_1 blocks: w = (q - 8) * s + z, q in [0, 15];
  ``aten._weight_int4pack_mm_for_cpu`` over torch's packed layout.

Batch-1 decode reads every weight once per token and is bound by memory bandwidth, so fewer bytes is more
speed: measured on a 2-core AVX512 CPU over SmolLM2's 30 layers, 15.2 ms (bf16) vs 7.6 (int8) vs 3.7 (int4)
per token. The kernels lose to the dense bf16 matmul once a batch has more than about 16 rows (prefill),
so a layer may also keep its dense weight for those batches (``keep_dense``), at the cost of its memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.config import QUANT_KINDS

INT4_GROUP = 32
# Largest batch (rows of x) for which the quantized kernel beats the dense bf16 matmul on the CPU
# (measured over SmolLM2's shapes: int4 3.7 vs 15.2 ms at 1 row, 21 vs 23 at 16, 82 vs 48 at 64). int8's
# kernel wins clearly only at one row (49k-row LM head: 1.8 vs 3.4 ms at 1 row, 3.0 vs 3.9 at 4, 5.6 vs 4.6
# at 8): one row only, which also keeps the compiled decode graph free of a batch-size branch.
QUANT_MAX_ROWS = {"int8": 1, "int4": 16}


@dataclass(frozen=True)
class QuantWeight:
    """A quantized [N, K] weight. int8: data int8 [N, K], scales [N]. int4: data uint8 [Np, K / 2] (torch's
    packed layout, Np = N rounded up to 16), scales [K / 32, Np, 2] holding (scale, zero) per group."""

    kind: str
    data: torch.Tensor
    scales: torch.Tensor
    out_features: int
    max_rows: int  # use the quantized kernel for x with at most this many rows when a dense weight exists

    @classmethod
    def quantize(cls, w: torch.Tensor, kind: str, act_dtype: torch.dtype) -> QuantWeight:
        """w [N, K] (any float dtype) -> its quantized form; activations will be ``act_dtype``."""
        if kind == "int8":
            data, scales = quantize_int8(w)
        elif kind == "int4":
            data, scales = quantize_int4(w)
        else:
            raise ValueError(f"quantization must be one of {QUANT_KINDS[1:]}, got {kind!r}")
        return cls(kind, data, scales.to(act_dtype), w.shape[0], QUANT_MAX_ROWS[kind])

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> x @ w^T [M, N] in x's dtype."""
        if self.kind == "int8" and x.shape[0] == 1 and torch.compiler.is_compiling():
            # traced, a dequantize-multiply-sum that inductor fuses into one pass over the int8 rows: the
            # 49k-row LM head took 1.3 ms this way vs 1.8 ms in the aten kernel (worse from 2 rows on)
            return ((x.float()[:, None, :] * self.data.float()[None]).sum(-1) * self.scales.float()).to(x.dtype)
        if self.kind == "int8":
            return torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.data, self.scales)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), self.data, INT4_GROUP, self.scales)
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]

    def preferred(self, rows: int, has_dense: bool) -> bool:
        """Whether x with ``rows`` rows goes through this quantized weight rather than the dense one. In the
        compiled decode step (batches up to torch_compile_max_bs, 16) int4 always: a branch on the batch size
        would split the graph, and int4 still matches bf16 at 16 rows."""
        if not has_dense:
            return True
        if self.kind == "int4" and torch.compiler.is_compiling():
            return True
        return rows <= self.max_rows

    def dequantize(self) -> torch.Tensor:
        """-> w [N, K] float32 as the kernels see it (tests compare the kernels against this)."""
        if self.kind == "int8":
            return self.data.float() * self.scales.float()[:, None]
        k = self.data.shape[1] * 2
        eye = torch.eye(k, dtype=self.scales.dtype)
        w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.data, INT4_GROUP, self.scales)  # [K, Np]
        return w_t.float().t()[: self.out_features].contiguous()


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q int8 [N, K], scales float32 [N]) with w ~= q * scale, symmetric per row."""
    w = w.float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-10)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (packed uint8 [Np, K / 2], scales [K / 32, Np, 2] float32) with per-group min/max.

    Each group of 32 along K maps [min, max] onto q in [0, 15]: w ~= (q - 8) * s + z with s = (max - min) / 15,
    z = min + 8 s. A Q4_1 block (w = d q + m) whose codes span 0..15 comes back exactly.
    """
    n, k = w.shape
    if k % INT4_GROUP:
        raise ValueError(f"int4 quantization needs in_features divisible by {INT4_GROUP}, got {k}")
    pad = -n % 16  # the packed kernel wants N divisible by 16: zero rows, sliced off after the matmul
    g = torch.nn.functional.pad(w.float(), (0, 0, 0, pad)).view(n + pad, k // INT4_GROUP, INT4_GROUP)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)  # [Np, G]
    s = ((hi - lo) / 15).clamp(min=1e-10)
    q = torch.round((g - lo[..., None]) / s[..., None]).clamp(0, 15).to(torch.int32).view(n + pad, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales = torch.stack((s, lo + 8 * s), dim=-1).transpose(0, 1).contiguous()  # [G, Np, 2]
    return packed, scales


def quantize_model(model: torch.nn.Module, kind: str, keep_dense: bool) -> None:
    """Quantize every layer that knows how (linear layers: ``kind``; embedding / LM head: int8), in place."""
    if kind not in QUANT_KINDS:
        raise ValueError(f"quantization must be one of {QUANT_KINDS}, got {kind!r}")
    if kind == "none":
        return
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError(f"quantization {kind!r} runs on the CPU only (torch's weight-only CPU kernels)")
    for module in list(model.modules()):
        if hasattr(module, "quantize") and getattr(module, "weight", None) is not None:
            module.quantize(kind, keep_dense)
