"""GGUF's IQ3, IQ2_XXS and IQ1_S types decoded from their own bytes into codes a kernel form of ours holds exactly
(numpy only).

The IQ3s are grids of 4 bytes a point with a sign a weight, scaled by d (1 + 2 s) / c per group of 32 (d float16
per 256, s 4-bit): IQ3_S's grid holds the odd integers 1 .. 15 (c = 1), IQ3_XXS's 4, 12, .., 52 and 62 (c = 4).
IQ2_XXS's grid points are 8 bytes of 8, 25 or 43 with a sign a weight (c = 8, s 4-bit); IQ1_S's are 8 of -1, 0
or 1 plus a delta of -+ 1 / 8 per group (c = 1, s 3-bit), IQ1_M's the same with a delta a point and s per 16.
Their grid tables are gguf's (iq3s_grid, iq3xxs_grid,
iq2xxs_grid, iq1s_grid), and the sign bytes gguf's ksigns.
"""

from __future__ import annotations

import numpy as np

IQ3_S_BYTES = 110  # d float16, 64 bytes of grid indices' low bits, 8 of their high bits, 32 of signs, 4 of scales
IQ3_XXS_BYTES = 98  # d float16, 64 bytes of grid indices, 8 uint32 of 4 x 7 sign bits and a 4-bit scale
IQ2_XXS_BYTES = 66  # d float16, then per group of 32: 4 grid indices, a uint32 of 4 x 7 sign bits and a 4-bit scale
IQ1_S_BYTES = 50  # d float16, 32 bytes of grid indices' low bits, 8 uint16 of their high bits, a scale and a delta
IQ2_XS_BYTES = 74  # d float16, 32 uint16 of grid points and sign indices, 8 bytes of 4-bit scales
IQ2_S_BYTES = 82  # d float16, 32 bytes of grid points' low bits, 32 of signs, 8 of their high bits, 8 of scales
IQ1_M_BYTES = 56  # 32 bytes of grid indices' low bits, 16 of their high bits and deltas, 4 uint16 of scales and d
# GRID_VALUES' codes (cpu_matmul.py): -43, -25, -8, 8, 25, 43, then -9, -7, -1, 1, 7, 9 at 6 .. 11
_IQ2_CODE = {-43: 0, -25: 1, -8: 2, 8: 3, 25: 4, 43: 5}
_IQ1_CODE = {-9: 6, -7: 7, -1: 8, 1: 9, 7: 10, 9: 11}


def _signed(points: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Grid points [S, 8, 8, 4] (group, point, byte) and sign bytes [S, 8, 4] (group, byte l: weights 8 l .. + 7 of
    the group, bit b for weight 8 l + b) -> the signed grid values [S, 8, 32] int16."""
    negative = (signs[..., None] >> np.arange(8, dtype=np.uint8)) & 1
    return points.reshape(-1, 8, 32).astype(np.int16) * (1 - 2 * negative.reshape(-1, 8, 32).astype(np.int16))


def iq3_s_codes(data: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ3_S super-blocks of an [n, k] weight -> (q uint8 [n, k] in [0, 15], sc uint8 [n, k / 32], d float32
    [n, k / 256]) with w = d sc (2 q - 15), exactly: group j's weights 4 p .. 4 p + 3 are the bytes of grid point
    qs[8 j + p] + 256 (bit p of qh[j]), weight e's sign bit e % 8 of signs[4 j + e // 8], sc = 1 + 2 s_j with s_j
    the low (j even) or high nibble of scales byte j // 2."""
    from gguf.quants import IQ3_S

    IQ3_S.init_grid()
    grid = IQ3_S.grid.reshape(512, 4).astype(np.uint8)
    blocks = data.reshape(n * k // 256, IQ3_S_BYTES)
    qs, qh = blocks[:, 2:66].reshape(-1, 8, 8), blocks[:, 66:74]
    point = qs.astype(np.int64) | (((qh[:, :, None] >> np.arange(8, dtype=np.uint8)) & 1).astype(np.int64) << 8)
    g = _signed(grid[point], blocks[:, 74:106].reshape(-1, 8, 4))
    j = np.arange(8)
    sc = 1 + 2 * ((blocks[:, 106 + j // 2] >> (4 * (j % 2)).astype(np.uint8)) & 15)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32)
    return ((g + 15) // 2).astype(np.uint8).reshape(n, k), sc.astype(np.uint8).reshape(n, -1), d.reshape(n, -1)


def iq3_xxs_codes(data: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ3_XXS super-blocks of an [n, k] weight -> (q uint8 [n, k] in [1, 63], sc int8 [n, k / 32], d float32
    [n, k / 256]) with w = (d / 2) sc (q - 32), exactly (the grid's values are even: q - 32 is half of one): group
    j's weights 4 p .. 4 p + 3 are the bytes of grid point qs[8 j + p]; its uint32 word j holds 4 x 7 sign bits
    (ksigns adds the eighth, the parity) and s_j in bits 28-31, sc = 1 + 2 s_j."""
    from gguf.quants import IQ2_XXS, IQ3_XXS

    IQ3_XXS.init_grid()
    grid = IQ3_XXS.grid.reshape(256, 4).astype(np.uint8)
    blocks = data.reshape(n * k // 256, IQ3_XXS_BYTES)
    words = blocks[:, 66:98].copy().view(np.uint32)  # [S, 8]
    ksigns = np.frombuffer(IQ2_XXS.ksigns, dtype=np.uint8)
    signs = ksigns[(words[:, :, None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 127]  # [S, 8, 4]
    g = _signed(grid[blocks[:, 2:66].reshape(-1, 8, 8)], signs)
    sc = (1 + 2 * (words >> 28)).astype(np.int8)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32)
    return (g // 2 + 32).astype(np.uint8).reshape(n, k), sc.reshape(n, -1), d.reshape(n, -1)


def _codes(values: np.ndarray, table: dict[int, int]) -> np.ndarray:
    """Integer values -> their codes in ``table`` (uint8)."""
    lookup = np.zeros(max(table) - min(table) + 1, dtype=np.uint8)
    for v, c in table.items():
        lookup[v - min(table)] = c
    return lookup[values - min(table)]


def iq2_xxs_codes(data: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ2_XXS super-blocks of an [n, k] weight -> (q uint8 [n, k] in [0, 5], sc int8 [n, k / 32], d float32 [n, k /
    256]) with w = (d / 8) sc GRID_VALUES[q], exactly: group j's 8 bytes are 4 grid indices (weights 8 p .. 8 p + 7
    are grid point p's bytes) and a uint32 with 4 x 7 sign bits (ksigns adds the parity) and s_j in bits 28-31;
    gguf's d (0.5 + s) / 4 is (d / 8) (1 + 2 s)."""
    from gguf.quants import IQ2_XXS

    IQ2_XXS.init_grid()
    grid = IQ2_XXS.grid.reshape(256, 8).astype(np.uint8)
    blocks = data.reshape(n * k // 256, IQ2_XXS_BYTES)
    groups = blocks[:, 2:].reshape(-1, 8, 8)
    words = groups[:, :, 4:].copy().view(np.uint32)[..., 0]  # [S, 8]
    ksigns = np.frombuffer(IQ2_XXS.ksigns, dtype=np.uint8)
    signs = ksigns[(words[:, :, None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 127]  # [S, 8, 4]
    g = _signed(grid[groups[:, :, :4]], signs)  # points [S, 8, 4, 8]: as _signed's [S, 8, 8, 4] once flat
    sc = (1 + 2 * (words >> 28)).astype(np.int8)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32) / 8
    return _codes(g, _IQ2_CODE).reshape(n, k), sc.reshape(n, -1), d.reshape(n, -1)


def iq1_s_codes(data: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ1_S super-blocks of an [n, k] weight -> (q uint8 [n, k] in [6, 11], sc int8 [n, k / 32], d float32 [n, k /
    256]) with w = (d / 8) sc GRID_VALUES[q], exactly: group j's weights 8 p .. 8 p + 7 are grid point qs[4 j + p]
    + 256 (bits 3 p .. 3 p + 2 of qh[j]), with s_j in qh[j]'s bits 12-14 and the delta's sign in bit 15; gguf's
    d (1 + 2 s) (g -+ 1 / 8) is (d / 8) (1 + 2 s) (8 g -+ 1)."""
    from gguf.quants import IQ1_S

    IQ1_S.init_grid()
    grid = IQ1_S.grid.reshape(2048, 8).astype(np.int16)
    blocks = data.reshape(n * k // 256, IQ1_S_BYTES)
    qs, qh = blocks[:, 2:34].reshape(-1, 8, 4), blocks[:, 34:50].copy().view(np.uint16)  # [S, 8, 4], [S, 8]
    point = qs.astype(np.int64) | (((qh[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7) << 8)
    delta = np.where(qh & 0x8000, -1, 1).astype(np.int16)  # [S, 8]
    g = 8 * grid[point].reshape(-1, 8, 32) + delta[:, :, None]
    sc = (1 + 2 * ((qh >> 12) & 7)).astype(np.int8)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32) / 8
    return _codes(g, _IQ1_CODE).reshape(n, k), sc.reshape(n, -1), d.reshape(n, -1)


def iq1_m_codes(data: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ1_M super-blocks of an [n, k] weight -> (q uint8 [n, k] in [6, 11], sub int8 [n, k / 16], d float32 [n, k /
    256]) with w = (d / 8) sub GRID_VALUES[q] (the table form), exactly: weights 8 p .. 8 p + 7 (p < 32) are grid
    point qs[p] + 256 (bits 0-2 of nibble p % 2 of qh[p // 2]) plus the delta -+ 1 / 8 (minus where the nibble's bit
    3 is set);
    sub-block j's s is bits 3 (j % 4) .. + 2 of the scales' uint16 j // 4, sub = 1 + 2 s, and d the float16 made of
    the four uint16s' top nibbles. gguf's d (1 + 2 s) (g -+ 1 / 8) is (d / 8) sub (8 g -+ 1)."""
    from gguf.quants import IQ1_M

    IQ1_M.init_grid()
    grid = IQ1_M.grid.reshape(2048, 8).astype(np.int16)
    blocks = data.reshape(n * k // 256, IQ1_M_BYTES)
    nibbles = ((blocks[:, 32:48, None] >> np.array([0, 4], dtype=np.uint8)) & 15).reshape(-1, 32)  # [S, 32]
    point = blocks[:, :32].astype(np.int64) | ((nibbles & 7).astype(np.int64) << 8)
    g = 8 * grid[point] + np.where(nibbles & 8, -1, 1).astype(np.int16)[..., None]  # [S, 32, 8]
    words = blocks[:, 48:56].copy().view(np.uint16)  # [S, 4]
    sub = (1 + 2 * ((words[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7)).astype(np.int8)
    top = (words >> 12).astype(np.uint16) << np.array([0, 4, 8, 12], dtype=np.uint16)
    d = np.bitwise_or.reduce(top, axis=1).view(np.float16).astype(np.float32) / 8
    return _codes(g, _IQ1_CODE).reshape(n, k), sub.reshape(n, -1), d.reshape(n, -1)


def iq2_per_16_codes(data: np.ndarray, n: int, k: int, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ2_XS / IQ2_S super-blocks of an [n, k] weight -> (q uint8 [n, k] in [0, 5], sub int8 [n, k / 16], d float32
    [n, k / 256]) with w = (d / 8) sub GRID_VALUES[q], exactly. Both start with d and end in 8 bytes of 4-bit s per
    16 (low nibble first), sub = 1 + 2 s. IQ2_XS: 32 uint16, each a 9-bit point of iq2xs_grid and a 7-bit ksigns
    index for weights 8 p .. 8 p + 7; IQ2_S: 32 low bytes of 10-bit points of iq2s_grid, 32 sign bytes (bit b for
    weight 8 p + b), then the points' high bit pairs (bits 2 (p % 4) of byte p // 4)."""
    from gguf.quants import IQ2_S, IQ2_XS, IQ2_XXS

    blocks = data.reshape(n * k // 256, IQ2_XS_BYTES if qtype == "IQ2_XS" else IQ2_S_BYTES)
    if qtype == "IQ2_XS":
        IQ2_XS.init_grid()
        words = blocks[:, 2:66].copy().view(np.uint16)  # [S, 32]
        points = IQ2_XS.grid.reshape(512, 8).astype(np.uint8)[words & 511]
        signs = np.frombuffer(IQ2_XXS.ksigns, dtype=np.uint8)[words >> 9]
    else:
        IQ2_S.init_grid()
        high = (blocks[:, 66:74, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3  # [S, 8, 4]
        points = IQ2_S.grid.reshape(1024, 8).astype(np.uint8)[blocks[:, 2:34] | (high.reshape(-1, 32).astype(
            np.int64) << 8)]
        signs = blocks[:, 34:66]
    g = _signed(points.reshape(-1, 8, 4, 8), signs.reshape(-1, 8, 4))  # [S, 8, 32]
    s = np.stack((blocks[:, -8:] & 15, blocks[:, -8:] >> 4), axis=2).reshape(-1, 16)  # [S, 16]
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32) / 8
    return _codes(g, _IQ2_CODE).reshape(n, k), (1 + 2 * s).astype(np.int8).reshape(n, -1), d.reshape(n, -1)
