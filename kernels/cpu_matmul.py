"""int3 / int4 / int5 / int6 / int8 weight-only and dense matmuls (cpu_matmul.cpp, every instruction set) beside their
torch references.

``isa`` is the kernel path (``cpu_ext.resolve``); ``cpu_ext.available()`` builds and loads the kernels.

The quantized ones quantize x to int8 on the fly, one scale per group of 32 along K; the dense one widens x
to float32 and sums k in order; see the .cpp for the layouts. Shapes: x [M, K], y [M, N]; the weights as
pack_int4 / pack_int8 / pack_dense lay them out (16-row tiles). int4 minimums may be None (GGUF's Q4_0:
w = d (q - 8), the kernel takes mn = -8 d).
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu_codes import (
    BLOCK,
    bit_plane,
    five_bit,
    nibbles,
    pack_scales,
    pair_plane,
    tiles,
    unbit_plane,
    unfive,
    unnibble,
    unpack_scales,
    unpair_plane,
    untile,
)
from radixlm.kernels.cpu_ext import available

GROUP = 32  # int4 / int8 scale group along K
SUB, SUPER = 16, 256  # int6 / int3 (GGUF's Q6_K / Q3_K): an int8 scale per 16 along K, a float16 one per 256
SUB_QUAD = {6: 48, 3: 24, 2: 16}  # bytes a k-quad of int6 / int3 / int2 codes
SUB_OFFSET = {6: 32, 3: 4, 2: 0}  # w = d sc (q - offset) (int2: less dmin m)
SUB_BYTES = {4 * quad + (32 if bits == 2 else 16): bits for bits, quad in SUB_QUAD.items()}  # a sub-block's -> bits
IQ4_VALUES = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                          dtype=torch.int8)  # GGUF's IQ4_NL / IQ4_XS: w = d IQ4_VALUES[q]
# GGUF's IQ2_XXS grid values (8, 25, 43 with a sign) and IQ1_S's times 8 (8 g -+ 1 for g in -1, 0, 1: its delta is
# -+ 1 / 8), one table so both types' codes share the IQ4 layout: w = d sc GRID_VALUES[q] with d a 1 / 8 of theirs
GRID_VALUES = torch.tensor([-43, -25, -8, 8, 25, 43, -9, -7, -1, 1, 7, 9, 0, 0, 0, 0], dtype=torch.int8)
IQ4_GROUP_BYTES = {256: False, 272: True}  # the IQ4 layout's bytes a group of 32 -> IQ4_XS's (16 scales follow)
TABLE_BYTES = 4 * 32 + 16  # the table form's bytes a sub-block of 16: 4 k-quads of nibbles, then 16 scales
__all__ = ["BLOCK", "available", "dense_linear", "int2_linear", "int3_linear", "int4_linear", "int5_linear", "int6_linear",
           "int8_linear", "int8_rows", "pack_dense", "pack_int2", "pack_int3", "pack_int4", "pack_int5", "pack_int6",
           "pack_int8", "pack_iq4", "pack_table"]
NO_MINS = torch.empty(0, dtype=torch.float16)


def int4_linear(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor | None,
                isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.int4_linear(x, codes, d, NO_MINS if mn is None else mn, isa)


def int5_linear(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor, isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.int5_linear(x, codes, d, mn, isa)


def int6_linear(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.int6_linear(x, codes, d, isa)


def int2_linear(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor, isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.int2_linear(x, codes, d, mn, isa)


def int3_linear(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.int3_linear(x, codes, d, isa)


def dense_linear(x: torch.Tensor, w: torch.Tensor, isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.dense_linear(x, w, isa)


def int8_linear(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, isa: int) -> torch.Tensor:
    return torch.ops.radixlm_cpu.int8_linear(x, q, d, isa)


def int8_rows(q: torch.Tensor, d: torch.Tensor, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` [T] of pack_int8's (q, d) -> [T, K] in dtype, as dequantize_int8 gives them (an embedding lookup)."""
    return torch.ops.radixlm_cpu.int8_rows(q, d, ids, dtype)


def pack_int4(q: torch.Tensor, d: torch.Tensor, mn: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """codes q [N, K] in [0, 15], d and mn [N, K / 32] -> the kernel's (codes uint8 [N / 16, K / 4, 32],
    d float16 [N / 16, K / 32, 16], mn likewise or None): rows 0-7 of a tile in the low nibbles, 8-15 in
    the high."""
    return nibbles(q), pack_scales(d), None if mn is None else pack_scales(mn)


def pack_iq4(q: torch.Tensor, d: torch.Tensor, sc: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """codes q [N, K] in [0, 15] indexing IQ4_VALUES, d [N, K / 32] (w = d IQ4_VALUES[q] per group of 32, GGUF's
    IQ4_NL) -> the int4 kernel's IQ4 layout (codes uint8 [N / 16, K / 32, 256]: pack_int4's bytes, a group's 8
    k-quads in a row; d float16 [N / 16, K / 32, 16]). With sc int8 [N, K / 32] and d [N, K / 256] (IQ4_XS: w = d sc
    IQ4_VALUES[q]): each group's codes then the tile's 16 sc, [N / 16, K / 32, 272], d float16 [N / 16, K / 256, 16]."""
    n, k = q.shape
    codes = nibbles(q).view(n // 16, k // GROUP, 256)
    if sc is None:
        return codes, pack_scales(d)
    if k % SUPER:
        raise ValueError(f"IQ4_XS weights need K divisible by {SUPER}, got [{n}, {k}]")
    scales = sc.to(torch.int8).view(n // 16, 16, k // GROUP).transpose(1, 2).contiguous().view(torch.uint8)
    return torch.cat((codes, scales), dim=2).contiguous(), pack_scales(d)


def dequantize_iq4(codes: torch.Tensor, d: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
    """-> w [N, K] float32 = d kv[q] per group of 32 (IQ4_XS: d sc kv[q], d sc exact), kv ``values`` (int8 [16]) or,
    if None or empty, IQ4_VALUES."""
    kv = IQ4_VALUES if values is None or values.numel() == 0 else values
    if IQ4_GROUP_BYTES[codes.shape[2]]:
        return _values_with_scales(codes, d, kv, GROUP)
    nt, groups = codes.shape[:2]
    q = unnibble(codes.reshape(nt, groups * 8, 32))
    return (kv[q.long()].float().view(nt * 16, groups, GROUP) * unpack_scales(d).float()[..., None]).flatten(1)


def pack_table(q: torch.Tensor, sub: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes q [N, K] in [0, 15] into 16 values in [-64, 63], sub int8 [N, K / 16], d [N, K / 256] (w = d sub kv[q],
    GGUF's IQ2_XS / IQ2_S) -> the int4 kernel's table form (codes uint8 [N / 16, K / 16, 144]: per sub-block of 16
    pack_int4's 4 k-quads, then the tile's 16 sub; d float16 [N / 16, K / 256, 16])."""
    n, k = q.shape
    if k % SUPER:
        raise ValueError(f"table-form weights need K divisible by {SUPER}, got [{n}, {k}]")
    codes = nibbles(q).view(n // 16, k // SUB, 128)
    scales = sub.to(torch.int8).view(n // 16, 16, k // SUB).transpose(1, 2).contiguous().view(torch.uint8)
    return torch.cat((codes, scales), dim=2).contiguous(), pack_scales(d)


def dequantize_table(codes: torch.Tensor, d: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """-> w [N, K] float32 = d sub values[q] per sub-block of 16 (d sub exact)."""
    return _values_with_scales(codes, d, values, SUB)


def _values_with_scales(codes: torch.Tensor, d: torch.Tensor, kv: torch.Tensor, per: int) -> torch.Tensor:
    """Codes [N / 16, K / per, per * 8 + 16] (each group's int4 codes into kv, then the tile's 16 int8 sc; IQ4_XS's
    layout for per 32, the table form's for 16), d [N / 16, K / 256, 16] -> w [N, K] float32 = d sc kv[q]."""
    nt, groups = codes.shape[:2]
    q = unnibble(codes[:, :, :per * 8].reshape(nt, groups * per // 4, 32))
    sc = codes[:, :, per * 8:].contiguous().view(torch.int8).transpose(1, 2).reshape(nt * 16, groups)
    scale = unpack_scales(d).float().repeat_interleave(SUPER // per, 1) * sc.float()
    return (kv[q.long()].float().view(nt * 16, groups, per) * scale[..., None]).flatten(1)


def pack_int5(q: torch.Tensor, d: torch.Tensor, mn: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """codes q [N, K] in [0, 31], d and mn [N, K / 32] -> the kernel's (codes uint8 [N / 16, K / 4, 40], d, mn
    float16 [N / 16, K / 32, 16]): per k-quad pack_int4's 32 bytes of the low 4 bits, then 8 bytes holding lane
    l's fifth bit as bit l, the lanes in the nibbles' order (rows 0-7 of the low nibbles, then 8-15)."""
    return five_bit(q), pack_scales(d), pack_scales(mn)


KFORM_BYTES = {4: 288, 5: 352}  # bytes a group of 32 in the K-quant layout: the codes, then 16 scales, 16 minimums


def pack_kquant(q: torch.Tensor, sc: torch.Tensor, m: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor,
                bits: int) -> tuple[torch.Tensor, ...]:
    """GGUF's Q4_K / Q5_K form (w = d sc q - dmin m per group of 32; sc, m 6-bit [N, K / 32], d, dmin [N, K / 256],
    q [N, K] in [0, 2^bits - 1]) -> the kernel's K-quant layout (codes uint8 [N / 16, K / 32, 288 or 352]: per
    group pack_int4's or pack_int5's 8 k-quads, then the tile's 16 sc and 16 m; d and -dmin float16
    [N / 16, K / 256, 16])."""
    n, k = q.shape
    if k % SUPER:
        raise ValueError(f"K-quant weights need K divisible by {SUPER}, got [{n}, {k}]")
    per_group = (nibbles(q) if bits == 4 else five_bit(q)).view(n // 16, k // GROUP, -1)
    scale_tiles = [v.to(torch.uint8).view(n // 16, 16, k // GROUP).transpose(1, 2) for v in (sc, m)]
    return torch.cat((per_group, *scale_tiles), dim=2).contiguous(), pack_scales(d), pack_scales(-dmin.float())


def unpack_kquant(codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inverse of pack_kquant -> (q uint8 [N, K], sc, m uint8 [N, K / 32], d, -dmin float16 [N, K / 256])."""
    nt, groups, size = codes.shape
    quad = 32 if size == KFORM_BYTES[4] else 40
    quads = codes[:, :, :8 * quad].reshape(nt, groups * 8, quad).contiguous()
    q = unnibble(quads) if quad == 32 else unfive(quads)
    sc, m = (codes[:, :, 8 * quad + 16 * j:8 * quad + 16 * (j + 1)].transpose(1, 2).reshape(nt * 16, groups)
             for j in (0, 1))
    return q, sc, m, unpack_scales(d), unpack_scales(mn)


def dequantize_kquant(codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """-> w [N, K] float32 = (d sc) q + (-dmin) m per group of 32, each product exact in float32."""
    q, sc, m, d, mn = unpack_kquant(codes, d, mn)
    n, k = q.shape
    per = SUPER // GROUP
    dg = (d.float().repeat_interleave(per, 1) * sc.float())[..., None]
    mg = (mn.float().repeat_interleave(per, 1) * m.float())[..., None]
    return (q.float().view(n, k // GROUP, GROUP) * dg + mg).view(n, k)


def unpack_int5(codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inverse of pack_int5 -> (q uint8 [N, K], d [N, K / 32], mn likewise)."""
    return unfive(codes), unpack_scales(d), unpack_scales(mn)


def dequantize_int5(codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """-> w [N, K] float32 = d * q + mn per group of 32 (either layout)."""
    if codes.shape[2] == KFORM_BYTES[5]:
        return dequantize_kquant(codes, d, mn)
    q, d, mn = unpack_int5(codes, d, mn)
    return (q.float().view(q.shape[0], -1, GROUP) * d.float()[..., None] + mn.float()[..., None]).flatten(1)


def pack_int6(q: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes q [N, K] in [0, 63], sc int8 [N, K / 16], d [N, K / 256] (w = d sc (q - 32), GGUF's Q6_K) -> the
    kernel's (codes uint8 [N / 16, K / 16, 208], d float16 [N / 16, K / 256, 16]): per sub-block of 16 along K,
    4 k-quads of pack_int4's 32 bytes of the low 4 bits then 16 bytes holding lane l's high two bits at bits
    2 (l / 16) of byte l % 16, then the tile's 16 scales sc."""
    q = q.to(torch.uint8)
    return _pack_subblocks(torch.cat((nibbles(q & 15), pair_plane(q >> 4)), dim=2), sc, d)


def pack_int3(q: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes q [N, K] in [0, 7], sc int8 [N, K / 16], d [N, K / 256] (w = d sc (q - 4), GGUF's Q3_K) -> the kernel's
    (codes uint8 [N / 16, K / 16, 112], d float16 [N / 16, K / 256, 16]): per sub-block of 16 along K, 4 k-quads of
    16 bytes holding lane l's low two bits at bits 2 (l / 16) of byte l % 16 then 8 bytes holding its third bit as
    bit l, then the tile's 16 scales sc."""
    q = q.to(torch.uint8)
    return _pack_subblocks(torch.cat((pair_plane(q & 3), bit_plane(q >> 2)), dim=2), sc, d)


def pack_int2(q: torch.Tensor, sc: torch.Tensor, m: torch.Tensor, d: torch.Tensor,
              dmin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """codes q [N, K] in [0, 3], sc and m [N, K / 16] in [0, 15], d and dmin [N, K / 256] (w = d sc q - dmin m, GGUF's
    Q2_K) -> the kernel's (codes uint8 [N / 16, K / 16, 96], d, -dmin float16 [N / 16, K / 256, 16]): per sub-block
    of 16 along K, 4 k-quads of 16 bytes holding lane l's two bits at bits 2 (l / 16) of byte l % 16, then the tile's
    16 sc, then its 16 m."""
    codes, d16 = _pack_subblocks(pair_plane(q.to(torch.uint8)), torch.cat((sc, m), dim=1), d)
    return codes, d16, pack_scales(-dmin.float())


def _pack_subblocks(quads: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k-quads [N / 16, K / 4, B] of codes, sc [N, J K / 16] (J scale vectors side by side), d [N, K / 256] ->
    (codes [N / 16, K / 16, 4 B + 16 J], d)."""
    nt, kq = quads.shape[:2]
    if (4 * kq) % SUPER:
        raise ValueError(f"int6 / int3 / int2 weights need K divisible by {SUPER}, got [{16 * nt}, {4 * kq}]")
    subs = kq // 4
    scales = sc.to(torch.int8).view(nt, 16, -1, subs).permute(0, 3, 2, 1).reshape(nt, subs, -1).view(torch.uint8)
    return torch.cat((quads.reshape(nt, subs, -1), scales), dim=2).contiguous(), pack_scales(d)


def unpack_subblocks(codes: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inverse of pack_int6 / pack_int3 / pack_int2 (told apart by the bytes a sub-block) -> (q uint8 [N, K],
    sc int8 [N, K / 16] (int2: sc then m, [N, K / 8]), d float16 [N, K / 256], bits)."""
    nt, subs, size = codes.shape
    bits = SUB_BYTES[size]
    quads = codes[:, :, :4 * SUB_QUAD[bits]].reshape(nt, subs * 4, SUB_QUAD[bits])
    if bits == 6:
        q = unnibble(quads[:, :, :32].contiguous()) | (unpair_plane(quads[:, :, 32:]) << 4)
    else:
        q = unpair_plane(quads[:, :, :16])
        q = q if bits == 2 else q | (unbit_plane(quads[:, :, 16:]) << 2)
    sc = codes[:, :, 4 * SUB_QUAD[bits]:].contiguous().view(torch.int8).view(nt, subs, -1, 16)
    return q, sc.permute(0, 3, 2, 1).reshape(nt * 16, -1), unpack_scales(d), bits


def dequantize_subblocks(codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor | None = None) -> torch.Tensor:
    """int6, int3 or int2 -> w [N, K] float32 = d sc (q - 32), d sc (q - 4) or d sc q + (-dmin) m."""
    q, sc, d, bits = unpack_subblocks(codes, d)
    n, k = q.shape
    per = (n, k // SUPER, SUPER // SUB)
    w = (q.float() - SUB_OFFSET[bits]).view(*per, SUB) * sc[:, :k // SUB].float().view(*per, 1)
    w = w * d.float()[..., None, None]
    if bits == 2:
        w = w + (unpack_scales(mn).float()[..., None] * sc[:, k // SUB:].float().view(*per))[..., None]
    return w.view(n, k)



def subblock_rows(codes: torch.Tensor, d: torch.Tensor, ids: torch.Tensor,
                  mn: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``ids`` [T] of an int6, int3 or int2 weight -> float32 [T, K] as dequantize_subblocks gives them (an
    embedding lookup, read from the rows' own codes): row r of a tile is lanes l = 4 r + k % 4 of each k-quad. Its
    two bits of the pair plane are at bits 2 (r // 4) of byte l % 16 (int6: its high bits, after the 32 bytes of
    nibbles, r's in byte 4 (r % 8) + k % 4, the high nibble for r >= 8); int3's third bit is bit l % 8 of byte
    16 + l // 8; then the sub-block's 16 scales (int2: and 16 minimums)."""
    bits = SUB_BYTES[codes.shape[2]]
    tile, r = ids // 16, ids % 16
    t, subs = ids.shape[0], codes.shape[1]
    quads = codes[tile, :, :4 * SUB_QUAD[bits]].reshape(t, subs * 4, SUB_QUAD[bits])  # [T, K / 4, bytes]
    lane = (4 * r)[:, None, None] + torch.arange(4)  # [T, 1, 4]

    def gather(at: torch.Tensor) -> torch.Tensor:  # byte `at` [T, 1, 4] of every k-quad -> [T, K / 4, 4]
        return quads.gather(2, at.expand(t, subs * 4, 4))

    pairs = (gather(lane % 16 + (32 if bits == 6 else 0)) >> (2 * (r // 4)).to(torch.uint8)[:, None, None]) & 3
    if bits == 6:
        nibbles = gather((4 * (r % 8))[:, None, None] + torch.arange(4))  # byte 4 (r % 8) + k % 4
        nibbles = nibbles >> (4 * (r >= 8)).to(torch.uint8)[:, None, None]
        q = (nibbles & 15) | (pairs << 4)
    elif bits == 3:
        q = pairs | (((gather(16 + lane // 8) >> (lane % 8).to(torch.uint8)) & 1) << 2)
    else:
        q = pairs
    scales = codes[tile, :, 4 * SUB_QUAD[bits]:].contiguous().view(torch.int8)  # [T, K / 16, 16 J]
    rows = torch.arange(t)
    w = (q.view(t, subs, SUB).float() - SUB_OFFSET[bits]) * scales[rows, :, r].float()[..., None]
    w = w.view(t, -1, SUPER) * d[tile, :, r].float()[..., None]
    if bits == 2:  # + (-dmin) m per 16
        m = scales[rows, :, 16 + r].float().view(t, -1, SUPER // SUB)
        w = w.view(t, -1, SUPER // SUB, SUB) + (mn[tile, :, r].float()[..., None] * m)[..., None]
    return w.view(t, -1)


def pack_dense(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] -> [N / 16, K, 16]: 16 rows at a time, k-major."""
    n, k = w.shape
    if n % 16 or k % 16:
        raise ValueError(f"the dense CPU kernel needs N and K divisible by 16, got [{n}, {k}]")
    return w.view(n // 16, 16, k).transpose(1, 2).contiguous()


def unpack_dense(tiles: torch.Tensor) -> torch.Tensor:
    nt, k, _ = tiles.shape
    return tiles.transpose(1, 2).reshape(nt * 16, k)


def dense_linear_torch(x: torch.Tensor, tiles: torch.Tensor) -> torch.Tensor:
    """The reference: float32 x @ w^T."""
    return (x.float() @ unpack_dense(tiles).float().t()).to(x.dtype)


def pack_int8(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q int8 [N, K] in [-127, 127], d [N, K / 32] (w = d q per group of 32, GGUF's Q8_0) -> the kernel's
    (q [N / 16, K / 4, 16, 4], d float16 [N / 16, K / 32, 16])."""
    return tiles(q).contiguous(), pack_scales(d)


def unpack_int8(packed: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of pack_int8 -> (q int8 [N, K], d float16 [N, K / 32])."""
    return untile(packed), unpack_scales(d)


def dequantize_int8(packed: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """-> w [N, K] float32 = d * q per group of 32."""
    q, d = unpack_int8(packed, d)
    return (q.float().view(q.shape[0], -1, GROUP) * d.float()[..., None]).flatten(1)


def unpack_int4(codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The inverse of pack_int4 -> (q uint8 [N, K], d [N, K / 32], mn likewise, -8 d without minimums)."""
    return unnibble(codes), unpack_scales(d), unpack_scales(d) * -8 if mn is None else unpack_scales(mn)


def dequantize_int4(codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor | None) -> torch.Tensor:
    """-> w [N, K] float32 = d * q + mn per group of 32 (plain or K-quant layout), or d kv[q] (IQ4, mn the values kv
    or None for IQ4_VALUES)."""
    if codes.shape[2] == KFORM_BYTES[4]:
        return dequantize_kquant(codes, d, mn)
    if codes.shape[2] in IQ4_GROUP_BYTES:
        return dequantize_iq4(codes, d, mn)
    if codes.shape[2] == TABLE_BYTES:
        return dequantize_table(codes, d, mn)
    q, d, mn = unpack_int4(codes, d, mn)
    q = q.float().view(q.shape[0], -1, GROUP)
    return (q * d.float()[..., None] + mn.float()[..., None]).flatten(1)


def quantize_x_torch(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> x as the kernels see it: int8 per group of 32 (a = max|x| / 127), dequantized, float32."""
    xb = x.float().view(x.shape[0], -1, GROUP)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return (torch.round(xb * inv) * (amax / 127)).view(x.shape)


def int4_linear_torch(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor | None) -> torch.Tensor:
    """The reference: the same quantized activations times the dequantized weight, in float32."""
    return (quantize_x_torch(x) @ dequantize_int4(codes, d, mn).t()).to(x.dtype)


def int5_linear_torch(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    return (quantize_x_torch(x) @ dequantize_int5(codes, d, mn).t()).to(x.dtype)


def subblock_linear_torch(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor,
                          mn: torch.Tensor | None = None) -> torch.Tensor:
    """int6, int3 or int2 (with its -dmin mn)."""
    return (quantize_x_torch(x) @ dequantize_subblocks(codes, d, mn).t()).to(x.dtype)


def int8_linear_torch(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q, d as pack_int8 lays them out."""
    return (quantize_x_torch(x) @ dequantize_int8(q, d).t()).to(x.dtype)
