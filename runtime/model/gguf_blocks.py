"""A GGUF file's quantized matrices as the codes and scales radixlm's int4 / int8 kernels take (QuantBlocks).

Every quantized GGUF type loads at the width closest to the file's: 4 bits or fewer -> int4 (w = d q + mn per
group of 32, q in [0, 15]), 5 to 8 bits -> int8 (w = d q, q in [-127, 127]). Exact where the type fits that
form: Q4_0, Q4_1, Q5_0 and Q8_0 bit for bit, Q4_K up to float16 rounding of its sub-block scale and minimum
(d sc, dmin m); the other types (Q2_K, Q3_K, Q5_1, Q5_K, Q6_K, IQ4_*) through their float32 values, quantized
per group of 32 (int4_codes / int8_codes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixlm.runtime.model.quantization import int4_codes, int8_codes

FOUR_BIT = frozenset({"Q4_0", "Q4_1", "Q4_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS"})  # GGUF types kept as int4
EIGHT_BIT = frozenset({"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_K"})  # ... as int8
# bytes per block of the types decoded here: (d, m, 16 code bytes), (d, 16), (d, 4 high bits, 16), (d, 32 int8)
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q8_0": 34}
Q4_K_BYTES = 144  # a super-block of 256: d, dmin float16, 12 bytes of 6-bit scales and minimums, 128 of codes


@dataclass(frozen=True)
class QuantBlocks:
    """A weight [N, K] in groups of 32 along K. 4 bits: w = d q + m, codes q in [0, 15]; 8 bits: w = d q, q in
    [-127, 127]."""

    q: torch.Tensor  # [N, K] uint8 (4 bits) or int8 (8 bits)
    d: torch.Tensor  # [N, K / 32] float16
    m: torch.Tensor | None  # [N, K / 32] float16; None for Q4_0's w = d (q - 8), i.e. m = -8 d, and for 8 bits
    bits: int = 4

    @classmethod
    def from_gguf(cls, raw: np.ndarray, qtype: str, shape: list[int]) -> QuantBlocks:
        """A tensor's bytes as the file holds them ([N, K] its shape, rows first) -> its blocks."""
        n, k = shape
        data = np.ascontiguousarray(raw, dtype=np.uint8)
        if qtype in _BLOCK_BYTES:
            return _legacy_blocks(data.reshape(n * k // 32, _BLOCK_BYTES[qtype]), qtype, n, k)
        if qtype == "Q4_K":
            return _q4_k_blocks(data.reshape(n * k // 256, Q4_K_BYTES), n, k)
        if qtype not in FOUR_BIT | EIGHT_BIT:
            raise ValueError(f"model: GGUF type {qtype} has no int4 / int8 form")
        import gguf

        w = torch.from_numpy(np.asarray(gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]),
                                        dtype=np.float32).reshape(n, k))
        return cls.from_float(w, 4 if qtype in FOUR_BIT else 8)

    @classmethod
    def from_float(cls, w: torch.Tensor, bits: int) -> QuantBlocks:
        """w [N, K] float -> its blocks of ``bits`` bits, each group of 32 quantized alone."""
        if bits == 8:
            q, d = int8_codes(w)
            return cls(q, d, None, 8)
        q, d, mn = int4_codes(w)
        return cls(q.to(torch.uint8), d.to(torch.float16), mn.to(torch.float16), 4)

    def to_bits(self, bits: int) -> QuantBlocks:
        """These weights at ``bits`` bits: themselves, or requantized from their float32 values."""
        return self if bits == self.bits else QuantBlocks.from_float(self.dequantize(), bits)

    @classmethod
    def stack(cls, parts: list[QuantBlocks], bits: int | None = None) -> QuantBlocks:
        """Row blocks one after another (a stacked qkv or gate_up) at ``bits`` bits (None: the widest part's,
        so a Q4_K q and k stacked with a Q6_K v become int8: no part loses precision); 4-bit minimums stored
        unless no part has any."""
        bits = bits or max(p.bits for p in parts)
        parts = [p.to_bits(bits) for p in parts]
        mins = None if all(p.m is None for p in parts) else torch.cat([p.minimums() for p in parts])
        return cls(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]), mins, bits)

    def minimums(self) -> torch.Tensor:
        if self.bits == 8:
            return torch.zeros_like(self.d)
        return self.m if self.m is not None else (self.d.float() * -8).to(torch.float16)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def take_rows(self, index: torch.Tensor) -> QuantBlocks:
        return QuantBlocks(self.q[index], self.d[index], None if self.m is None else self.m[index], self.bits)

    def dequantize(self) -> torch.Tensor:
        """-> w [N, K] float32."""
        n, k = self.q.shape
        w = self.q.float().view(n, k // 32, 32) * self.d.float()[..., None] + self.minimums().float()[..., None]
        return w.view(n, k)


def _legacy_blocks(blocks: np.ndarray, qtype: str, n: int, k: int) -> QuantBlocks:
    """Blocks of 32 [N K / 32, bytes], each starting with d float16. Q4_1: (d, m, 16 bytes of codes); Q4_0: (d,
    16 bytes), w = d (q - 8), byte j holding code j in its low nibble and code j + 16 in its high one; Q5_0:
    (d, 32 high bits, 16 bytes of low nibbles), w = d (q - 16), held as int8 codes q - 16; Q8_0: (d, 32 int8)."""
    d = torch.from_numpy(blocks[:, 0:2].copy().view(np.float16)[:, 0].reshape(n, k // 32).copy())
    if qtype == "Q8_0":
        return QuantBlocks(torch.from_numpy(blocks[:, 2:].copy().view(np.int8).reshape(n, k)), d, None, bits=8)
    qs = blocks[:, blocks.shape[1] - 16:]
    low = np.concatenate((qs & 15, qs >> 4), axis=1)  # [N K / 32, 32]
    if qtype == "Q5_0":
        high = blocks[:, 2:6].copy().view(np.uint32)  # bit j: code j's fifth bit
        fifth = (high >> np.arange(32, dtype=np.uint32)) & 1
        q = (low.astype(np.int16) | (fifth.astype(np.int16) << 4)) - 16
        return QuantBlocks(torch.from_numpy(q.astype(np.int8).reshape(n, k)), d, None, bits=8)
    m = torch.from_numpy(blocks[:, 2:4].copy().view(np.float16)[:, 0].reshape(n, k // 32).copy()) \
        if qtype == "Q4_1" else None
    return QuantBlocks(torch.from_numpy(low.reshape(n, k)), d, m)


def _q4_k_blocks(blocks: np.ndarray, n: int, k: int) -> QuantBlocks:
    """Q4_K super-blocks [N K / 256, 144] -> 4-bit blocks of 32. Sub-block j of a super-block has a 6-bit scale
    sc_j and minimum m_j, w = d sc_j q - dmin m_j; its codes are the low (j even) or high (j odd) nibbles of
    code bytes 32 (j // 2) .. + 32."""
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32)  # [S]
    dmin = blocks[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float32)
    s = blocks[:, 4:16]  # [S, 12]: sc_0-3, m_0-3 in the low 6 bits of bytes 0-3, 4-7; sc_4-7, m_4-7 in 8-11's
    sc = np.concatenate((s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)), axis=1)  # [S, 8]
    mins = np.concatenate((s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)), axis=1)
    codes = blocks[:, 16:].reshape(-1, 4, 1, 32)
    q = np.concatenate((codes & 15, codes >> 4), axis=2)  # [S, 4, 2, 32]: sub-blocks 2c, 2c + 1
    scale = (d[:, None] * sc).astype(np.float16).reshape(n, k // 32)
    minimum = (-dmin[:, None] * mins).astype(np.float16).reshape(n, k // 32)
    return QuantBlocks(torch.from_numpy(q.reshape(n, k)), torch.from_numpy(scale), torch.from_numpy(minimum))
