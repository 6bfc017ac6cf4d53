"""A GGUF file's quantized matrices as the codes and scales radixlm's int2 - int6 and int8 kernels take (QuantBlocks).

Every quantized GGUF type loads at the width closest to the file's:
- Q2_K -> int2, its own form: w = d sc q - dmin m, q in [0, 3], 4-bit sc and m per 16, d and dmin per 256;
- Q3_K -> int3, its own form: w = d sc (q - 4), q in [0, 7], an int8 sc per 16, d per 256;
- IQ4_NL / IQ4_XS -> int4 codes indexing IQ4_NL's 16 values: w = d kv[q], d per 32; IQ4_XS: w = d sc kv[q], an int8
  sc per 32, d per 256; IQ2_XXS and IQ1_S likewise into their grids' values (cpu_matmul.GRID_VALUES, d / 8), IQ2_XS,
  IQ2_S and IQ1_M too with sc per 16 (the kernels' table form);
- the other 4-bit types -> int4 (w = d q + mn per group of 32, q in [0, 15]), 5 bits -> int5 (q in [0, 31]);
- Q6_K -> int6, its own form: w = d sc (q - 32), q in [0, 63], sc and d as int3's; 8 bits -> int8 (w = d q);
- types with no form of their own, in the nearest one that holds them: TQ1_0 / TQ2_0 (ternary) in Q2_K's, IQ3_S in
  Q4_K's, IQ3_XXS in Q6_K's (gguf_iq.py decodes them and the IQ1 / IQ2 types).
Exact where the type fits that form: Q2_K, Q3_K, Q4_0, Q4_1, Q5_0, Q5_1, Q6_K, Q8_0, IQ4_NL, IQ4_XS, IQ3_XXS and
the TQ types bit for bit, IQ1 and IQ2 but where d / 8 falls below float16's normal range, Q4_K and Q5_K through
their own scales (KScales, which the kernels' K-quant layout keeps), IQ3_S but for 15 d's float16 rounding, or up
to float16 rounding of d sc and dmin m once mixed with other types; a stack of forms no kernel layout shares goes
through its float32 values, quantized per group of 32 (int4_codes / int8_codes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from radixlm.kernels.cpu_matmul import GRID_VALUES, IQ4_VALUES
from radixlm.runtime.model import gguf_iq
from radixlm.runtime.model.quantization import int4_codes, int8_codes

TWO_BIT = frozenset({"Q2_K", "TQ1_0", "TQ2_0"})  # GGUF types kept as int2 (the ternary ones exactly: q - 1)
THREE_BIT = frozenset({"Q3_K"})  # ... as int3
# GGUF types kept as int4 codes into GRID_VALUES: with IQ4_XS's scales per 32, or per 16 (the kernels' table form)
GRIDS = {"IQ2_XXS": gguf_iq.iq2_xxs_codes, "IQ1_S": gguf_iq.iq1_s_codes,
         "IQ2_XS": partial(gguf_iq.iq2_per_16_codes, qtype="IQ2_XS"),
         "IQ2_S": partial(gguf_iq.iq2_per_16_codes, qtype="IQ2_S"), "IQ1_M": gguf_iq.iq1_m_codes}
FOUR_BIT = frozenset({"Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS", "IQ3_S", *GRIDS})  # ... as int4
FIVE_BIT = frozenset({"Q5_0", "Q5_1", "Q5_K"})  # ... as int5
SIX_BIT = frozenset({"Q6_K", "IQ3_XXS"})  # ... as int6
EIGHT_BIT = frozenset({"Q8_0", "Q8_K"})  # ... as int8
WIDTHS = {qtype: bits for types, bits in ((TWO_BIT, 2), (THREE_BIT, 3), (FOUR_BIT, 4), (FIVE_BIT, 5), (SIX_BIT, 6),
                                          (EIGHT_BIT, 8)) for qtype in types}
# bytes per block of 32: (d, 16 code bytes), (d, m, 16), (d, 32 fifth bits, 16), (d, m, 32 fifth bits, 16), (d, 32)
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}
# super-blocks of 256: d, dmin float16, 12 bytes of 6-bit scales and minimums, (Q5_K: 32 bytes of fifth bits,)
# 128 bytes of codes
_SUPER_BYTES = {"Q4_K": 144, "Q5_K": 176}
_Q6_K_BYTES = 210  # 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d float16
_Q3_K_BYTES = 110  # 32 bytes of third bits, 64 of low bit pairs, 12 of 6-bit scales, d float16
_IQ4_BYTES = {"IQ4_NL": 18, "IQ4_XS": 136}  # (d, 16 code bytes) per 32; (d, 2 + 4 bytes of 6-bit scales, 128) per 256
OWN_FORMS = frozenset({2, 3, 6})  # widths whose form (scales per 16) no other width shares (int3 codes fit int6's)
_Q2_K_BYTES = 84  # 16 bytes of 4-bit scales and minimums, 64 of bit pairs, d, dmin float16
_TERNARY_D_AT = {"TQ1_0": 52, "TQ2_0": 64}  # where the float16 d of a super-block of 256 trits sits (its last bytes)


@dataclass(frozen=True)
class KScales:
    """Q4_K / Q5_K's own scales, beside a QuantBlocks' float16 d, m (which round d sc, -dmin m): w = d sc q - dmin m
    per group of 32, sc and m 6-bit, d and dmin float16 per 256 (the kernels' K-quant layout keeps them so); Q2_K's
    likewise per 16, 4-bit."""

    sc: torch.Tensor  # [N, K / 32] uint8 ([N, K / 16] for Q2_K)
    m: torch.Tensor  # likewise
    d: torch.Tensor  # [N, K / 256] float16
    dmin: torch.Tensor  # [N, K / 256] float16

    def take_rows(self, index: torch.Tensor) -> KScales:
        return KScales(self.sc[index], self.m[index], self.d[index], self.dmin[index])

    @staticmethod
    def cat(parts: list[KScales]) -> KScales:
        return KScales(*(torch.cat([getattr(p, f) for p in parts]) for f in ("sc", "m", "d", "dmin")))

    def dequantize(self, q: torch.Tensor) -> torch.Tensor:
        """codes q [N, K] -> w [N, K] float32, each product exact."""
        n, k = q.shape
        groups, per = self.sc.shape[1], self.sc.shape[1] // self.d.shape[1]
        d = self.d.float().repeat_interleave(per, 1) * self.sc.float()
        mn = -self.dmin.float().repeat_interleave(per, 1) * self.m.float()
        return (q.float().view(n, groups, k // groups) * d[..., None] + mn[..., None]).view(n, k)


@dataclass(frozen=True)
class QuantBlocks:
    """A weight [N, K] in groups of 32 along K. 4 and 5 bits: w = d q + m, codes q in [0, 15] or [0, 31]; 8 bits:
    w = d q, q in [-127, 127]; 6 bits (Q6_K): w = d sub (q - 32), q in [0, 63], sub per 16 along K, d per 256;
    3 bits (Q3_K): w = d sub (q - 4), q in [0, 7], sub and d as 6 bits'; 2 bits (Q2_K): w = d sc q - dmin m, its
    scales in kq (per 16); iq4 (4 bits, IQ4_NL / IQ4_XS): w = d
    kv[q] with kv IQ4_NL's values (cpu_matmul.IQ4_VALUES), or w = d sub kv[q] with sub per 32, d per 256 (IQ4_XS);
    grid: kv GRID_VALUES (IQ2_XXS, IQ1_S in IQ4_XS's form; IQ2_XS, IQ2_S, IQ1_M with sub per 16)."""

    q: torch.Tensor  # [N, K] uint8 (2 - 6 bits) or int8 (8 bits)
    d: torch.Tensor  # [N, K / 32] float16 ([N, K / 256] for 2, 3 and 6 bits, and IQ4_XS)
    m: torch.Tensor | None  # [N, K / 32] float16; None for Q4_0's w = d (q - 8), i.e. m = -8 d, and the others
    bits: int = 4
    sub: torch.Tensor | None = None  # 3, 6 bits: [N, K / 16] int8 sub-block scales; IQ4_XS: [N, K / 32]; grid: either
    kq: KScales | None = None  # Q4_K / Q5_K / Q2_K: their own scales
    iq4: bool = False  # 4-bit codes indexing IQ4_NL's values (d per 32, or per 256 with sub)
    grid: bool = False  # iq4's codes index GRID_VALUES instead

    @property
    def form(self) -> str:
        """What parts must share to stack as they are: the width, and for 4 bits the IQ4 forms apart."""
        if self.grid:
            return "grid16" if self.scale_group == 16 else "grid"
        return ("iq4_xs" if self.sub is not None else "iq4_nl") if self.iq4 else f"int{self.bits}"

    @property
    def scale_group(self) -> int:
        """IQ4 codes: the weights an int8 scale covers along K (32; 16 for the grids with scales per 16)."""
        return 16 if self.sub is not None and self.sub.shape[1] * 16 == self.q.shape[1] else 32

    @property
    def values(self) -> torch.Tensor:
        """The 16 int8 values IQ4 codes index."""
        return GRID_VALUES if self.grid else IQ4_VALUES

    @classmethod
    def from_gguf(cls, raw: np.ndarray, qtype: str, shape: list[int]) -> QuantBlocks:
        """A tensor's bytes as the file holds them ([N, K] its shape, rows first) -> its blocks."""
        n, k = shape
        data = np.ascontiguousarray(raw, dtype=np.uint8)
        if qtype in _BLOCK_BYTES:
            return _legacy_blocks(data.reshape(n * k // 32, _BLOCK_BYTES[qtype]), qtype, n, k)
        if qtype in _SUPER_BYTES:
            return _k_blocks(data.reshape(n * k // 256, _SUPER_BYTES[qtype]), n, k)
        if qtype == "Q6_K":
            return _q6_k_blocks(data.reshape(n * k // 256, _Q6_K_BYTES), n, k)
        if qtype == "Q3_K":
            return _q3_k_blocks(data.reshape(n * k // 256, _Q3_K_BYTES), n, k)
        if qtype == "Q2_K":
            return _q2_k_blocks(data.reshape(n * k // 256, _Q2_K_BYTES), n, k)
        if qtype in _TERNARY_D_AT:
            return _ternary_blocks(data, qtype, n, k)
        if qtype == "IQ3_S":
            return _iq3_s_blocks(data, n, k)
        if qtype == "IQ3_XXS":
            return _iq3_xxs_blocks(data, n, k)
        if qtype in GRIDS:
            q, sc, d = (torch.from_numpy(a) for a in GRIDS[qtype](data, n, k))
            return cls(q, d.half(), None, 4, sc, iq4=True, grid=True)
        if qtype in _IQ4_BYTES:
            per = 32 if qtype == "IQ4_NL" else 256
            return _iq4_blocks(data.reshape(n * k // per, _IQ4_BYTES[qtype]), n, k)
        if qtype not in WIDTHS:
            raise ValueError(f"model: GGUF type {qtype} has no int2 - int8 form")
        import gguf

        w = torch.from_numpy(np.asarray(gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]),
                                        dtype=np.float32).reshape(n, k))
        return cls.from_float(w, WIDTHS[qtype])

    @classmethod
    def from_float(cls, w: torch.Tensor, bits: int) -> QuantBlocks:
        """w [N, K] float -> its blocks of ``bits`` bits (4, 5 or 8), each group of 32 quantized alone."""
        if bits not in (4, 5, 8):
            raise ValueError(f"model: no {bits}-bit form quantized from float weights (int2, int3 and int6 are "
                             "Q2_K's, Q3_K's and Q6_K's own)")
        if bits == 8:
            q, d = int8_codes(w)
            return cls(q, d, None, 8)
        q, d, mn = int4_codes(w, 2**bits - 1)
        return cls(q.to(torch.uint8), d.to(torch.float16), mn.to(torch.float16), bits)

    def to_bits(self, bits: int) -> QuantBlocks:
        """These weights at ``bits`` bits: themselves, 4-bit codes as 5-bit ones, Q5_0's (m = -16 d) as 8-bit codes
        q - 16 and 3-bit ones as 6-bit codes q + 28 (all exact), or requantized from their float32 values."""
        if bits == self.bits:
            return self
        if self.iq4:
            return QuantBlocks.from_float(self.dequantize(), bits)
        if (self.bits, bits) == (3, 6):
            return QuantBlocks(self.q + 28, self.d, None, 6, self.sub)
        if bits in OWN_FORMS:
            raise ValueError(f"model: {self.bits}-bit blocks have no exact int{bits} (Q{bits}_K) form")
        if (self.bits, bits) == (4, 5):
            return QuantBlocks(self.q, self.d, self.minimums(), 5, kq=self.kq)
        if (self.bits, bits) == (5, 8) and torch.equal(self.minimums(), (self.d.float() * -16).to(torch.float16)):
            return QuantBlocks((self.q.to(torch.int16) - 16).to(torch.int8), self.d, None, 8)
        return QuantBlocks.from_float(self.dequantize(), bits)

    @classmethod
    def stack(cls, parts: list[QuantBlocks], bits: int | None = None) -> QuantBlocks:
        """Row blocks one after another (a stacked qkv or gate_up) at ``bits`` bits (None: the widest part's,
        so a Q4_K q and k stacked with a Q5_K v become int5, Q3_K ones with a Q6_K v int6, or int8 where int3 or
        int6, whose form no other width shares, meets another: no part loses precision; stack_runs keeps such a v
        apart instead); minimums stored unless no part has any."""
        if any(p.iq4 for p in parts):
            if len({p.form for p in parts}) == 1 and bits in (None, 4):
                sub = None if parts[0].sub is None else torch.cat([p.sub for p in parts])
                return cls(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]), None, 4, sub, iq4=True,
                           grid=parts[0].grid)
            parts = [QuantBlocks.from_float(p.dequantize(), bits or 8) if p.iq4 else p for p in parts]
        widths = {p.bits for p in parts}
        bits = bits or (max(widths) if len(widths) == 1 or widths == {3, 6} or not widths & OWN_FORMS else 8)
        parts = [p.to_bits(bits) for p in parts]
        if bits == 2:
            return cls(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]), None, 2,
                       kq=KScales.cat([p.kq for p in parts]))
        if bits in OWN_FORMS:
            return cls(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "d")), None, bits,
                       torch.cat([p.sub for p in parts]))
        mins = None if all(p.m is None for p in parts) else torch.cat([p.minimums() for p in parts])
        kq = KScales.cat([p.kq for p in parts]) if all(p.kq is not None for p in parts) else None
        return cls(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]), mins, bits, kq=kq)

    @classmethod
    def stack_runs(cls, parts: list[QuantBlocks]) -> list[QuantBlocks]:
        """Row blocks one after another, the last run of parts of one form kept at it: [the stack] where every
        part shares a form, else [the stack of the parts before that run, the run's stack] (a Q4_K_M qkv: q and k
        in Q4_K, v in Q6_K), which the kernels take as a weight and its tail."""
        j = len(parts) - 1
        while j > 0 and parts[j - 1].form == parts[-1].form:
            j -= 1
        return [cls.stack(parts)] if j == 0 else [cls.stack(parts[:j]), cls.stack(parts[j:])]

    def minimums(self) -> torch.Tensor:
        if self.iq4:
            raise ValueError("model: IQ4 blocks have no minimums")
        if self.bits in OWN_FORMS:
            raise ValueError(f"model: int{self.bits} (Q{self.bits}_K) blocks have no minimums")
        if self.bits == 8:
            return torch.zeros_like(self.d)
        return self.m if self.m is not None else (self.d.float() * -8).to(torch.float16)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def take_rows(self, index: torch.Tensor) -> QuantBlocks:
        return QuantBlocks(self.q[index], self.d[index], None if self.m is None else self.m[index], self.bits,
                           None if self.sub is None else self.sub[index],
                           None if self.kq is None else self.kq.take_rows(index), self.iq4, self.grid)

    def dequantize(self) -> torch.Tensor:
        """-> w [N, K] float32."""
        n, k = self.q.shape
        if self.kq is not None:
            return self.kq.dequantize(self.q)
        if self.iq4:
            per = self.scale_group
            d = self.d.float()
            if self.sub is not None:
                d = d.repeat_interleave(256 // per, 1) * self.sub.float()
            return (self.values[self.q.long()].float().view(n, k // per, per) * d[..., None]).view(n, k)
        if self.bits in OWN_FORMS:
            w = (self.q.float() - 2 ** (self.bits - 1)).view(n, k // 16, 16) * self.sub.float()[..., None]
            return (w.view(n, k // 256, 256) * self.d.float()[..., None]).view(n, k)
        w = self.q.float().view(n, k // 32, 32) * self.d.float()[..., None] + self.minimums().float()[..., None]
        return w.view(n, k)


def _legacy_blocks(blocks: np.ndarray, qtype: str, n: int, k: int) -> QuantBlocks:
    """Blocks of 32 [N K / 32, bytes], each starting with d float16, then m float16 (Q4_1, Q5_1), then 32 fifth
    bits (Q5_0, Q5_1), then 16 bytes of codes, byte j holding code j in its low nibble and code j + 16 in its
    high one; Q8_0: (d, 32 int8). w = d q + m; Q4_0: m = -8 d, Q5_0: m = -16 d."""
    d = torch.from_numpy(blocks[:, 0:2].copy().view(np.float16)[:, 0].reshape(n, k // 32).copy())
    if qtype == "Q8_0":
        return QuantBlocks(torch.from_numpy(blocks[:, 2:].copy().view(np.int8).reshape(n, k)), d, None, bits=8)
    m = torch.from_numpy(blocks[:, 2:4].copy().view(np.float16)[:, 0].reshape(n, k // 32).copy()) \
        if qtype in ("Q4_1", "Q5_1") else None
    qs = blocks[:, blocks.shape[1] - 16:]
    q = np.concatenate((qs & 15, qs >> 4), axis=1)  # [N K / 32, 32]
    if qtype in ("Q5_0", "Q5_1"):
        at = 4 if qtype == "Q5_1" else 2
        high = blocks[:, at:at + 4].copy().view(np.uint32)  # bit j: code j's fifth bit
        q = q | (((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4)
        m = m if m is not None else (d.float() * -16).to(torch.float16)  # exact: a power of two
    return QuantBlocks(torch.from_numpy(q.reshape(n, k)), d, m, 5 if qtype.startswith("Q5") else 4)


def _k_blocks(blocks: np.ndarray, n: int, k: int) -> QuantBlocks:
    """Q4_K / Q5_K super-blocks [N K / 256, 144 or 176] -> 4- / 5-bit blocks of 32. Sub-block j of a super-block
    has a 6-bit scale sc_j and minimum m_j, w = d sc_j q - dmin m_j; its codes are the low (j even) or high (j
    odd) nibbles of code bytes 32 (j // 2) .. + 32, and for Q5_K bit j of the 32 bytes before them adds 16."""
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32)  # [S]
    dmin = blocks[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float32)
    s = blocks[:, 4:16]  # [S, 12]: sc_0-3, m_0-3 in the low 6 bits of bytes 0-3, 4-7; sc_4-7, m_4-7 in 8-11's
    sc = np.concatenate((s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)), axis=1)  # [S, 8]
    mins = np.concatenate((s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)), axis=1)
    codes = blocks[:, -128:].reshape(-1, 4, 1, 32)
    q = np.concatenate((codes & 15, codes >> 4), axis=2).reshape(-1, 8, 32)  # [S, 8, 32]: sub-blocks in order
    five = blocks.shape[1] == _SUPER_BYTES["Q5_K"]
    if five:
        high = blocks[:, 16:48]  # [S, 32]: bit j of byte l is sub-block j's code l's fifth bit
        q = q | ((high[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4
    scale = (d[:, None] * sc).astype(np.float16).reshape(n, k // 32)
    minimum = (-dmin[:, None] * mins).astype(np.float16).reshape(n, k // 32)
    kq = KScales(*(torch.from_numpy(np.ascontiguousarray(v).reshape(n, -1)) for v in (sc, mins)),
                 *(torch.from_numpy(v.astype(np.float16).reshape(n, -1)) for v in (d, dmin)))
    return QuantBlocks(torch.from_numpy(np.ascontiguousarray(q).reshape(n, k)), torch.from_numpy(scale),
                       torch.from_numpy(minimum), 5 if five else 4, kq=kq)


def _q6_k_blocks(blocks: np.ndarray, n: int, k: int) -> QuantBlocks:
    """Q6_K super-blocks [N K / 256, 210] -> 6-bit blocks, exactly. Each half h of a super-block (128 weights) has
    64 bytes ql and 32 qh: weight 32 p + l (p = 0..3, l < 32) has ql[32 (p % 2) + l]'s low (p < 2) or high nibble
    and bits 2 p .. + 1 of qh[l] as its top two; sub-block j (16 weights in order) has scale sc_j."""
    ql = blocks[:, :128].reshape(-1, 2, 2, 32)  # [S, h, p % 2, l]
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)  # [S, h, 1, l]
    low = np.concatenate((ql & 15, ql >> 4), axis=2)  # [S, h, p, l]
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    q = (low | (high << 4)).reshape(n, k)
    sc = blocks[:, 192:208].copy().view(np.int8).reshape(n, k // 16)
    d = blocks[:, 208:210].copy().view(np.float16)[:, 0].reshape(n, k // 256)
    return QuantBlocks(torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(d.copy()), None, 6,
                       torch.from_numpy(sc.copy()))


def _q3_k_blocks(blocks: np.ndarray, n: int, k: int) -> QuantBlocks:
    """Q3_K super-blocks [N K / 256, 110] -> 3-bit blocks, exactly. Weight e = 128 h + 32 j + l (h < 2, j < 4, l <
    32) has bits 2 j .. + 1 of qs[32 h + l] as its low two and bit 4 h + j of hmask[l] as its third (set: +4, so q
    = low + 4 third and w = d sc (q - 4)); sub-block e // 16 has the 6-bit scale sc - 32, its low 4 bits in the
    nibbles of bytes 0-7 of the 12 (sub-blocks 0-7 low nibbles, 8-15 high) and its top 2 in bytes 8-11 (bits 2 (i //
    4) .. + 1 of byte 8 + i % 4 for sub-block i)."""
    hmask, qs, packed = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108]
    e = np.arange(256)
    h, j, lane = e // 128, (e % 128) // 32, e % 32
    low = (qs[:, 32 * h + lane] >> (2 * j).astype(np.uint8)) & 3
    third = (hmask[:, lane] >> (4 * h + j).astype(np.uint8)) & 1
    i = np.arange(16)
    nib = np.where(i < 8, packed[:, i % 8] & 15, packed[:, i % 8] >> 4)
    top = (packed[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 3
    sc = (nib | (top << 4)).astype(np.int8) - np.int8(32)
    d = blocks[:, 108:110].copy().view(np.float16)[:, 0].reshape(n, k // 256)
    q = (low | (third << 2)).astype(np.uint8).reshape(n, k)
    return QuantBlocks(torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(d.copy()), None, 3,
                       torch.from_numpy(np.ascontiguousarray(sc).reshape(n, k // 16)))


def _iq4_blocks(blocks: np.ndarray, n: int, k: int) -> QuantBlocks:
    """IQ4_NL blocks [N K / 32, 18] (d, then 16 code bytes as Q4_0's: code j in byte j's low nibble, j + 16 in its
    high one) or IQ4_XS super-blocks [N K / 256, 136] (d, scales_h uint16, 4 bytes scales_l, then 8 groups of 16
    code bytes as IQ4_NL's; group g's scale is the low (g even) or high nibble of scales_l[g // 2] with bits 2 g ..
    + 1 of scales_h on top, less 32) -> IQ4 blocks, exactly."""
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0]
    qs = blocks[:, -128:] if blocks.shape[1] == _IQ4_BYTES["IQ4_XS"] else blocks[:, 2:]
    qs = qs.reshape(-1, 1, 16)
    q = np.concatenate((qs & 15, qs >> 4), axis=1).reshape(n, k)  # [groups, 2, 16] -> each group's 32 in order
    if blocks.shape[1] == _IQ4_BYTES["IQ4_NL"]:
        return QuantBlocks(torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(d.reshape(n, k // 32).copy()),
                           None, 4, iq4=True)
    g = np.arange(8)
    high = (blocks[:, 2:4].copy().view(np.uint16) >> (2 * g).astype(np.uint16)) & 3  # [S, 8]
    low = (blocks[:, 4 + g // 2] >> (4 * (g % 2)).astype(np.uint8)) & 15
    sc = (low | (high.astype(np.uint8) << 4)).astype(np.int8) - np.int8(32)
    return QuantBlocks(torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(d.reshape(n, k // 256).copy()),
                       None, 4, torch.from_numpy(np.ascontiguousarray(sc).reshape(n, k // 32)), iq4=True)


def _q2_k_blocks(blocks: np.ndarray, n: int, k: int) -> QuantBlocks:
    """Q2_K super-blocks [N K / 256, 84] -> 2-bit blocks, exactly. Weight e = 128 h + 32 j + l (h < 2, j < 4, l < 32)
    has bits 2 j .. + 1 of qs[32 h + l] as its code; sub-block e // 16 has scales[e // 16]'s low nibble as sc and its
    high one as m: w = d sc q - dmin m."""
    scales, qs = blocks[:, :16], blocks[:, 16:80]
    e = np.arange(256)
    h, j, lane = e // 128, (e % 128) // 32, e % 32
    q = ((qs[:, 32 * h + lane] >> (2 * j).astype(np.uint8)) & 3).astype(np.uint8).reshape(n, k)
    d, dmin = (blocks[:, at:at + 2].copy().view(np.float16)[:, 0].reshape(n, k // 256) for at in (80, 82))
    sc, m = (torch.from_numpy(np.ascontiguousarray(v).reshape(n, k // 16)) for v in (scales & 15, scales >> 4))
    kq = KScales(sc, m, torch.from_numpy(d.copy()), torch.from_numpy(dmin.copy()))
    return QuantBlocks(torch.from_numpy(np.ascontiguousarray(q)), kq.d, None, 2, kq=kq)


def _ternary_blocks(data: np.ndarray, qtype: str, n: int, k: int) -> QuantBlocks:
    """TQ1_0 / TQ2_0 (w = d t, t in {-1, 0, 1}, d per 256) -> 2-bit blocks, exactly: q = t + 1 in Q2_K's form with
    sc = m = 1 and dmin = d (w = d q - d). The trits come from gguf's dequantization (w / d is exact)."""
    import gguf

    w = np.asarray(gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]), dtype=np.float32)
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][1]
    at = _TERNARY_D_AT[qtype]
    d = data.reshape(n * k // 256, size)[:, at:at + 2].copy().view(np.float16).reshape(n, k // 256)
    scale = np.repeat(d.astype(np.float32), 256, axis=1)
    t = np.divide(w.reshape(n, k), scale, out=np.zeros((n, k), dtype=np.float32), where=scale != 0)
    ones = torch.ones(n, k // 16, dtype=torch.uint8)
    kq = KScales(ones, ones.clone(), torch.from_numpy(d.copy()), torch.from_numpy(d.copy()))
    q = torch.from_numpy(np.rint(t).astype(np.int8) + 1).view(torch.uint8)
    return QuantBlocks(q, kq.d, None, 2, kq=kq)


def _iq3_s_blocks(data: np.ndarray, n: int, k: int) -> QuantBlocks:
    """IQ3_S -> the int4 K-quant form: w = d sc (2 q - 15) = (2 d) sc q - (15 d) m with m = sc, exact but for 15 d's
    float16 rounding."""
    q, sc, d = gguf_iq.iq3_s_codes(data, n, k)
    kq = KScales(torch.from_numpy(sc), torch.from_numpy(sc.copy()),
                 *(torch.from_numpy((f * d).astype(np.float16)) for f in (2, 15)))
    scale = (kq.d.float().repeat_interleave(8, 1) * kq.sc.float()).half()
    minimum = (-kq.dmin.float().repeat_interleave(8, 1) * kq.m.float()).half()
    return QuantBlocks(torch.from_numpy(q), scale, minimum, 4, kq=kq)


def _iq3_xxs_blocks(data: np.ndarray, n: int, k: int) -> QuantBlocks:
    """IQ3_XXS -> 6-bit blocks (Q6_K's form, its sc per 32 given to both sub-blocks of 16): w = (d / 2) sc (q - 32),
    exact (d / 2 in float16 but below its normal range)."""
    q, sc, d = gguf_iq.iq3_xxs_codes(data, n, k)
    return QuantBlocks(torch.from_numpy(q), torch.from_numpy((d / 2).astype(np.float16)), None, 6,
                       torch.from_numpy(np.repeat(sc, 2, axis=1)))
