"""GGUF's IQ3 types decoded from their own bytes into codes a kernel form of ours holds exactly (numpy only).

Both are grids of 4 bytes a point with a sign a weight, scaled by d (1 + 2 s) / c per group of 32 (d float16 per
256, s 4-bit): IQ3_S's grid holds the odd integers 1 .. 15 (c = 1), IQ3_XXS's 4, 12, .., 52 and 62 (c = 4). Their
grid tables are gguf's (iq3s_grid, iq3xxs_grid), and IQ3_XXS's sign bytes gguf's ksigns.
"""

from __future__ import annotations

import numpy as np

IQ3_S_BYTES = 110  # d float16, 64 bytes of grid indices' low bits, 8 of their high bits, 32 of signs, 4 of scales
IQ3_XXS_BYTES = 98  # d float16, 64 bytes of grid indices, 8 uint32 of 4 x 7 sign bits and a 4-bit scale


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
