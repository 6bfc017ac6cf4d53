"""Weight-only int8 / int4 quantization for the CPU: the weights stay quantized in memory and the kernels multiply
activations by them directly (no dequantized copy per step).

- int8: symmetric, w = d q with q in [-127, 127]: natively a float16 d per group of 32 along K (GGUF's Q8_0, whose
  blocks load exactly); torch's backend one scale per output row.
- int4: asymmetric groups of 32 along K, the shape of GGUF's Q4_1 blocks: w = d q + mn, q in [0, 15].

Batch-1 decode reads every weight once per token and is bound by memory bandwidth, so fewer bytes is more
speed. Two backends: ``native`` (radixlm.kernels.cpu_matmul on one of its instruction-set paths: int8
activations times the codes, 16-row tiles), used wherever the shapes fit (N % 16, K % 64), and ``torch``
(``aten._weight_int8pack_mm`` and ``aten._weight_int4pack_mm_for_cpu`` over torch's packed layout)
otherwise or with ``--cpu-kernels torch``. The native kernels replace the dense weight (``replaces_dense``:
they are used at every batch size, prefill included); torch's lose to the dense bf16 matmul beyond about
16 rows, so with them a layer may keep its dense weight for those batches (``keep_dense``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from radixlm.kernels import cpu_matmul as native
from radixlm.runtime.config import QUANT_KINDS

GROUP = 32  # int4 and int8 scale groups along K (and torch's int4 kernel's group size)
# torch backend: largest batch (rows of x) for which the quantized kernel beats the dense bf16 matmul over
# SmolLM2's shapes (int4 up to 16 rows; int8 only at one row, which also keeps the compiled decode graph
# free of a batch-size branch).
QUANT_MAX_ROWS = {"int8": 1, "int4": 16}
ALL_ROWS = 1 << 62  # native backend: every batch


@dataclass(frozen=True)
class QuantWeight:
    """A quantized [N, K] weight.

    backend torch: int8: data int8 [N, K], scales [N]; int4: data uint8 [Np, K / 2] (torch's packed layout,
    Np = N rounded up to 16), scales [K / 32, Np, 2] holding (scale, zero) per group.
    backend native (16-row tiles, see cpu_matmul; ``isa`` its path): int8: data [N / 16, K / 4, 16, 4], scales
    float16 [N / 16, K / 32, 16] (w = d q per group of 32, GGUF's Q8_0); int4: data uint8 [N / 16, K / 4, 32],
    scales and mins float16 [N / 16, K / 32, 16] (w = d q + mn; mins None for Q4_0's w = d (q - 8)); int5
    (from GGUF's 5-bit types only): data uint8 [N / 16, K / 4, 40], scales and mins as int4's; int4 / int5 from
    Q4_K / Q5_K in the K-quant layout: data [N / 16, K / 32, 288 or 352] (each group's codes, then its 6-bit
    scales and minimums), scales d and mins -dmin float16 [N / 16, K / 256, 16]; int6 (GGUF's Q6_K only): data
    uint8 [N / 16, K / 16, 208] (codes and sub-block scales), scales float16 [N / 16, K / 256, 16]; int3 (Q3_K only):
    as int6's with [N / 16, K / 16, 112]; int2 (Q2_K only): as int6's with [N / 16, K / 16, 96] and mins -dmin
    like scales; int4 from IQ4_NL / IQ4_XS in the IQ4 layout: data [N / 16, K / 32, 256 or
    272] (codes indexing IQ4_NL's values, or with mins an int8 [16] table of its own: IQ2_XXS's and IQ1_S's
    GRID_VALUES; IQ4_XS's int8 scales after each group's), scales float16 per 32 or 256; int4 from IQ2_XS / IQ2_S
    in the table form: data [N / 16, K / 16, 144] (codes into mins' GRID_VALUES, int8 scales per 16), scales per 256;
    dense:
    data [N / 16, K, 16] in the activation dtype, no scales (the batch-invariant dense matmul, for bfloat16
    models: ``tile_dense``).

    ``tail`` (native only): the last rows of a stacked weight whose parts differ in width (a Q4_K_M file's qkv,
    q and k in Q4_K, v in Q6_K), each part in its own layout: data, scales, mins then hold the rows before them,
    and out_features counts both (``with_tail``)."""

    kind: str
    data: torch.Tensor
    scales: torch.Tensor
    out_features: int
    in_features: int
    max_rows: int  # use the quantized kernel for x with at most this many rows when a dense weight exists
    act_dtype: torch.dtype = torch.float32
    backend: str = "torch"
    mins: torch.Tensor | None = None
    isa: int | None = None
    tail: QuantWeight | None = None

    @classmethod
    def quantize(cls, w: torch.Tensor, kind: str, act_dtype: torch.dtype, isa: int | None = None) -> QuantWeight:
        """w [N, K] (any float dtype) -> its quantized form; activations will be ``act_dtype``. ``isa`` (a
        path of radixlm's kernels, cpu_ext.resolve): the native backend where the shape fits (N % 16, K % 64),
        else torch's."""
        if kind not in ("int8", "int4"):
            raise ValueError(f"quantization must be int8 or int4, got {kind!r}")
        n, k = w.shape
        fits = n % 16 == 0 and k % native.BLOCK == 0 and act_dtype in (torch.float32, torch.bfloat16)
        if isa is not None and fits and w.device.type == "cpu":
            return cls._quantize_native(w, kind, act_dtype, isa)
        data, scales = quantize_int8(w) if kind == "int8" else quantize_int4(w)
        return cls(kind, data, scales.to(act_dtype), n, k, QUANT_MAX_ROWS[kind], act_dtype)

    @classmethod
    def from_int4_codes(cls, q: torch.Tensor, d: torch.Tensor, mn: torch.Tensor | None, act_dtype: torch.dtype,
                        isa: int) -> QuantWeight:
        """A 4-bit weight given as its codes q [N, K] in [0, 15] with d, mn [N, K / 32] (w = d q + mn per group,
        GGUF's Q4_1 form; mn None: Q4_0's -8 d) -> the native backend's layout, exactly."""
        n, k = q.shape
        codes, d16, mn16 = native.pack_int4(q, d, mn)
        return cls("int4", codes, d16, n, k, ALL_ROWS, act_dtype, "native", mn16, isa)

    @classmethod
    def from_int5_codes(cls, q: torch.Tensor, d: torch.Tensor, mn: torch.Tensor, act_dtype: torch.dtype,
                        isa: int) -> QuantWeight:
        """A 5-bit weight given as its codes q [N, K] in [0, 31] with d, mn [N, K / 32] (w = d q + mn per group,
        GGUF's Q5_1 / Q5_K form) -> the native backend's layout, exactly."""
        n, k = q.shape
        codes, d16, mn16 = native.pack_int5(q, d, mn)
        return cls("int5", codes, d16, n, k, ALL_ROWS, act_dtype, "native", mn16, isa)

    @classmethod
    def from_kquant(cls, q: torch.Tensor, kq, bits: int, act_dtype: torch.dtype, isa: int) -> QuantWeight:
        """A Q4_K / Q5_K weight given as its codes q [N, K] and its own scales (gguf_blocks.KScales: w = d sc q -
        dmin m per group of 32) -> int4 / int5 in the native backend's K-quant layout, exactly; a Q2_K one (bits 2,
        the scales per 16) -> int2."""
        n, k = q.shape
        pack = native.pack_int2 if bits == 2 else lambda *a: native.pack_kquant(*a, bits)
        codes, d16, mn16 = pack(q, kq.sc, kq.m, kq.d, kq.dmin)
        return cls(f"int{bits}", codes, d16, n, k, ALL_ROWS, act_dtype, "native", mn16, isa)

    @classmethod
    def from_subblock_codes(cls, q: torch.Tensor, sub: torch.Tensor, d: torch.Tensor, bits: int,
                            act_dtype: torch.dtype, isa: int) -> QuantWeight:
        """A Q6_K (bits 6) or Q3_K (bits 3) weight given as its codes q [N, K] in [0, 2^bits - 1], sub-block scales
        sub int8 [N, K / 16] and d [N, K / 256] (w = d sub (q - 2^(bits - 1))) -> the native backend's layout,
        exactly."""
        n, k = q.shape
        codes, d16 = (native.pack_int6 if bits == 6 else native.pack_int3)(q, sub, d)
        return cls(f"int{bits}", codes, d16, n, k, ALL_ROWS, act_dtype, "native", isa=isa)

    @classmethod
    def from_iq4_codes(cls, q: torch.Tensor, d: torch.Tensor, sub: torch.Tensor | None, act_dtype: torch.dtype,
                       isa: int, values: torch.Tensor | None = None) -> QuantWeight:
        """An IQ4_NL weight given as its codes q [N, K] in [0, 15] and d [N, K / 32] (w = d kv[q]), or an IQ4_XS
        one with sub int8 [N, K / 32] and d [N, K / 256] (w = d sub kv[q]) -> int4 in the native backend's IQ4
        layout, exactly; kv IQ4_VALUES, or ``values`` (int8 [16], kept as the weight's mins). With sub per 16
        ([N, K / 16], IQ2_XS / IQ2_S; values needed, in [-64, 63]): the table form."""
        n, k = q.shape
        per_16 = sub is not None and sub.shape[1] * 16 == k
        codes, d16 = native.pack_table(q, sub, d) if per_16 else native.pack_iq4(q, d, sub)
        table = None if values is None else values.to(torch.int8).contiguous()
        return cls("int4", codes, d16, n, k, ALL_ROWS, act_dtype, "native", table, isa)

    @classmethod
    def from_int8_codes(cls, q: torch.Tensor, d: torch.Tensor, act_dtype: torch.dtype, isa: int) -> QuantWeight:
        """An 8-bit weight given as its codes q int8 [N, K] with d [N, K / 32] (w = d q per group, GGUF's Q8_0)
        -> the native backend's layout, exactly."""
        n, k = q.shape
        codes, d16 = native.pack_int8(q, d)
        return cls("int8", codes, d16, n, k, ALL_ROWS, act_dtype, "native", isa=isa)

    @classmethod
    def tile_dense(cls, w: torch.Tensor, isa: int) -> QuantWeight:
        """A dense weight [N, K] (N a multiple of 16, K of 64) for radixlm's dense kernel, in its own dtype."""
        n, k = w.shape
        return cls("dense", native.pack_dense(w), torch.empty(0), n, k, ALL_ROWS, w.dtype, "native", isa=isa)

    @classmethod
    def _quantize_native(cls, w: torch.Tensor, kind: str, act_dtype: torch.dtype, isa: int) -> QuantWeight:
        n, k = w.shape
        if kind == "int8":
            return cls.from_int8_codes(*int8_codes(w), act_dtype, isa)
        q, d, mn = int4_codes(w)
        codes, d, mn = native.pack_int4(q, d, mn)
        return cls(kind, codes, d, n, k, ALL_ROWS, act_dtype, "native", mn, isa)

    def with_tail(self, tail: QuantWeight) -> QuantWeight:
        """This weight with ``tail``'s rows after its own, each in its own layout (see ``tail``)."""
        if self.backend != "native" or tail.backend != "native" or "dense" in (self.kind, tail.kind):
            raise ValueError("a weight's tail: both parts must be quantized on radixlm's kernels")
        if tail.in_features != self.in_features or self.tail is not None or tail.tail is not None:
            raise ValueError(f"a weight's tail must have its {self.in_features} columns and no tail of its own")
        return dataclasses.replace(self, out_features=self.out_features + tail.out_features, tail=tail)

    @property
    def kinds(self) -> frozenset[str]:
        """The layouts of this weight's parts (its own and its tail's)."""
        return frozenset({self.kind} | ({self.tail.kind} if self.tail is not None else set()))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> x @ w^T [M, N] in x's dtype."""
        if self.tail is not None:
            x = x.contiguous()
            return torch.cat([self._own_matmul(x), self.tail.matmul(x)], dim=1)
        return self._own_matmul(x)

    def _own_matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "native":
            x = x.contiguous()
            if self.kind == "int8":
                return native.int8_linear(x, self.data, self.scales, self.isa)
            if self.kind == "dense":
                return native.dense_linear(x, self.data, self.isa)
            if self.kind == "int5":
                return native.int5_linear(x, self.data, self.scales, self.mins, self.isa)
            if self.kind == "int6":
                return native.int6_linear(x, self.data, self.scales, self.isa)
            if self.kind == "int3":
                return native.int3_linear(x, self.data, self.scales, self.isa)
            if self.kind == "int2":
                return native.int2_linear(x, self.data, self.scales, self.mins, self.isa)
            return native.int4_linear(x, self.data, self.scales, self.mins, self.isa)
        if self.kind == "int8" and x.shape[0] == 1 and torch.compiler.is_compiling():
            # traced, a dequantize-multiply-sum that inductor fuses into one pass over the int8 rows (faster
            # than the aten kernel for one row, slower from two)
            return ((x.float()[:, None, :] * self.data.float()[None]).sum(-1) * self.scales.float()).to(x.dtype)
        if self.kind == "int8":
            return torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.data, self.scales)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), self.data, GROUP, self.scales)
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]

    @property
    def replaces_dense(self) -> bool:
        """Whether this weight's kernel beats the dense matmul at every batch size (no dense copy kept)."""
        return self.max_rows == ALL_ROWS

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
        if self.tail is not None:
            return torch.cat([self._own_dequantize(), self.tail.dequantize()])
        return self._own_dequantize()

    def _own_dequantize(self) -> torch.Tensor:
        if self.backend == "native" and self.kind == "int8":
            return native.dequantize_int8(self.data, self.scales)
        if self.kind == "dense":
            return native.unpack_dense(self.data).float()
        if self.kind == "int5":
            return native.dequantize_int5(self.data, self.scales, self.mins)
        if self.kind in ("int6", "int3", "int2"):
            return native.dequantize_subblocks(self.data, self.scales, self.mins)
        if self.backend == "native":
            return native.dequantize_int4(self.data, self.scales, self.mins)
        if self.kind == "int8":
            return self.data.float() * self.scales.float()[:, None]
        k = self.data.shape[1] * 2
        eye = torch.eye(k, dtype=self.scales.dtype)
        w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.data, GROUP, self.scales)  # [K, Np]
        return w_t.float().t()[: self.out_features].contiguous()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` [T] of w -> [T, K] in the activation dtype (an embedding lookup), as dequantize gives them."""
        if self.tail is not None:
            raise ValueError("rows of a weight with a tail: an embedding table is one block")
        if self.kind in ("int6", "int3", "int2"):
            return native.subblock_rows(self.data, self.scales, ids, self.mins).to(self.act_dtype)
        if self.kind == "dense":  # row r is tile r // 16, lane r % 16 of every k
            return self.data[ids // 16, :, ids % 16]
        if self.kind == "int4" and self.data.shape[2] == native.TABLE_BYTES:  # the rows' tiles, then their lanes
            tiles = native.dequantize_table(self.data[ids // 16], self.scales[ids // 16], self.mins)  # [T 16, K]
            return tiles.view(ids.shape[0], 16, -1)[torch.arange(ids.shape[0]), ids % 16].to(self.act_dtype)
        if self.kind in ("int4", "int5"):
            return self._nibble_rows(ids)
        if self.backend == "native":
            return native.int8_rows(self.data, self.scales, ids, self.act_dtype)
        return self.data[ids].to(self.act_dtype) * self.scales[ids].unsqueeze(-1).to(self.act_dtype)

    def _nibble_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Native int4 / int5 rows: a row's codes are one nibble of every k-quad's bytes of its tile; int5's fifth bit
        of lane l = 4 (row % 16) + k % 4 is bit l % 8 of the k-quad's byte 32 + l // 8. In the K-quant layout each
        group's code bytes are followed by the tile's 16 scales and 16 minimums."""
        if self.backend != "native":
            raise ValueError(f"{self.kind} rows: only the native layout")
        tile, lane, t = ids // 16, ids % 16, torch.arange(ids.shape[0])
        code_bytes = 320 if self.kind == "int5" else 256  # a group's 8 k-quads
        groups = self.data[tile].view(ids.shape[0], self.in_features // GROUP, -1)  # [T, K / 32, bytes]
        quads = groups[:, :, :code_bytes].reshape(ids.shape[0], self.in_features // 4, -1)  # [T, K / 4, 32 or 40]
        nib = quads[:, :, :32].reshape(ids.shape[0], -1, 8, 4)[t, :, lane % 8]  # byte 4 (lane % 8) + k % 4
        q = torch.where((lane >= 8)[:, None, None], nib >> 4, nib & 15)  # [T, K / 4, 4]
        if self.kind == "int5":
            bit = (4 * lane)[:, None, None] + torch.arange(4)  # [T, 1, 4]
            plane = quads[:, :, 32:].gather(2, (bit // 8).expand(-1, quads.shape[1], -1))
            q = q | (((plane >> (bit % 8).to(torch.uint8)) & 1) << 4)
        q = q.reshape(ids.shape[0], self.in_features)
        d = self.scales[tile, :, lane].float()  # [T, K / 32], or [T, K / 256] with the K-quant or IQ4_XS layout
        if self.data.shape[2] in native.IQ4_GROUP_BYTES:  # w = d kv[q], IQ4_XS: d sc per group
            if native.IQ4_GROUP_BYTES[self.data.shape[2]]:
                d = d.repeat_interleave(8, 1) * groups[t, :, 256 + lane].view(torch.int8).float()
            kv = native.IQ4_VALUES if self.mins is None else self.mins
            w = kv[q.long()].float().view(ids.shape[0], -1, GROUP) * d[..., None]
            return w.view(ids.shape[0], self.in_features).to(self.act_dtype)
        mn = self.mins[tile, :, lane].float() if self.mins is not None else -8 * d
        if groups.shape[2] == code_bytes + 32:  # the K-quant layout: d sc, -dmin m per group of 32
            d = d.repeat_interleave(8, 1) * groups[t, :, code_bytes + lane].float()  # 8 groups a super-block
            mn = mn.repeat_interleave(8, 1) * groups[t, :, code_bytes + 16 + lane].float()
        w = q.float().view(ids.shape[0], -1, GROUP) * d[..., None] + mn[..., None]
        return w.view(ids.shape[0], self.in_features).to(self.act_dtype)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q int8 [N, K], scales float32 [N]) with w ~= q * scale, symmetric per row."""
    w = w.float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-10)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def _groups(w: torch.Tensor, kind: str) -> torch.Tensor:
    """w [N, K] -> float32 [N, K / 32, 32], its groups of 32 along K."""
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"{kind} quantization needs in_features divisible by {GROUP}, got {k}")
    return w.float().view(n, k // GROUP, GROUP)


def int8_codes(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q int8 [N, K] in [-127, 127], d [N, K / 32] float16) with w ~= d q per group of 32, as GGUF's
    Q8_0 (d = max|w| / 127, stored in float16); a Q8_0 tensor dequantized to float32 comes back exactly."""
    n, k = w.shape
    g = _groups(w, "int8")
    d = (g.abs().amax(dim=-1) / 127).to(torch.float16)
    q = torch.round(g / d.float().clamp(min=1e-30)[..., None]).clamp(-127, 127).to(torch.int8).view(n, k)
    return q, d  # a group too small for float16's d (0) keeps q but contributes 0


def int4_codes(w: torch.Tensor, top: int = 15) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (codes [N, K] in [0, top], d [N, K / 32], mn [N, K / 32]) with w ~= d q + mn per group of 32,
    mapping each group's [min, max] onto [0, top] (15; 31 for int5); a Q4_1 block whose codes span 0..15 comes
    back exactly."""
    n, k = w.shape
    g = _groups(w, "int4")
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)  # [N, G]
    d = ((hi - lo) / top).clamp(min=1e-10)
    q = torch.round((g - lo[..., None]) / d[..., None]).clamp(0, top).to(torch.int32).view(n, k)
    return q, d, lo


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (packed uint8 [Np, K / 2], scales [K / 32, Np, 2] float32) with per-group min/max.

    Each group of 32 along K maps [min, max] onto q in [0, 15]: w ~= (q - 8) * s + z with s = (max - min) / 15,
    z = min + 8 s. A Q4_1 block (w = d q + m) whose codes span 0..15 comes back exactly.
    """
    n = w.shape[0]
    pad = -n % 16  # the packed kernel wants N divisible by 16: zero rows, sliced off after the matmul
    q, s, lo = int4_codes(torch.nn.functional.pad(w.float(), (0, 0, 0, pad)))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales = torch.stack((s, lo + 8 * s), dim=-1).transpose(0, 1).contiguous()  # [G, Np, 2]
    return packed, scales


def quantize_model(model: torch.nn.Module, kind: str, keep_dense: bool, isa: int | None = None,
                   deterministic: bool = True) -> None:
    """Quantize every layer that knows how (linear layers: ``kind``, or with ``mixed`` a GGUF file's blocks at
    their own width; embedding / LM head: int8, or int4 if the file holds it so), in place. ``none``: dense
    weights, which on radixlm's kernels (``isa``) go into the dense kernel's tiles: always in bfloat16 (faster than torch's bf16 matmul), in float32 when
    ``deterministic`` (its results do not depend on the batch, unlike torch's matmul)."""
    if kind not in QUANT_KINDS:
        raise ValueError(f"quantization must be one of {QUANT_KINDS}, got {kind!r}")
    if kind == "none":
        tiled = (torch.bfloat16, torch.float32) if deterministic else (torch.bfloat16,)
        for module in list(model.modules()):
            if hasattr(module, "materialize"):
                module.materialize()
                if isa is not None and module.weight is not None and module.weight.dtype in tiled:
                    module.tile_dense(isa)
        return
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError(f"quantization {kind!r} runs on the CPU only (torch's weight-only CPU kernels)")
    for module in list(model.modules()):
        if hasattr(module, "quantize") and getattr(module, "weight", None) is not None:
            module.quantize(kind, keep_dense, isa)
