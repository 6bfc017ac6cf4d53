"""The byte layouts of the CPU matmuls' weight codes (cpu_matmul.cpp has them in full), shared by cpu_matmul's
packers: 16-row tiles with 4 consecutive k of a row together (a k-quad's 64 lanes, lane 4 row + k % 4, rows 0-7
then 8-15), and the planes of a k-quad's codes: nibbles, single bits, bit pairs; per-group scales side by side."""

from __future__ import annotations

import torch

BLOCK = 64  # K must be a multiple of it


def tiles(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N / 16, K / 4, 16, 4]: 16 rows at a time, 4 consecutive k of each row together."""
    n, k = w.shape
    if n % 16 or k % BLOCK:
        raise ValueError(f"the CPU kernels need N divisible by 16 and K by {BLOCK}, got [{n}, {k}]")
    return w.view(n // 16, 16, k // 4, 4).transpose(1, 2)


def untile(t: torch.Tensor) -> torch.Tensor:
    """The inverse of tiles: [N / 16, K / 4, 16, 4] -> [N, K]."""
    nt, kq = t.shape[:2]
    return t.transpose(1, 2).reshape(nt * 16, kq * 4)


def nibbles(q: torch.Tensor) -> torch.Tensor:
    """codes q [N, K] in [0, 15] -> uint8 [N / 16, K / 4, 32]: rows 0-7 of a tile in the low nibbles, 8-15 in
    the high (lane l = 4 row + k % 4)."""
    t = tiles(q.to(torch.uint8))
    return (t[:, :, :8].reshape(*t.shape[:2], 32) | (t[:, :, 8:].reshape(*t.shape[:2], 32) << 4)).contiguous()


def unnibble(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of nibbles -> q uint8 [N, K]."""
    nt, kq = codes.shape[:2]
    return untile(torch.cat(((codes & 15).view(nt, kq, 8, 4), (codes >> 4).view(nt, kq, 8, 4)), dim=2))


def bit_plane(b: torch.Tensor) -> torch.Tensor:
    """bits b [N, K] in {0, 1} -> uint8 [N / 16, K / 4, 8]: per k-quad lane l's bit as bit l % 8 of byte l // 8, the
    lanes in the nibbles' order (lane 4 row + k, rows 0-7 then 8-15)."""
    t = tiles(b.to(torch.uint8))
    return (t.reshape(*t.shape[:2], 8, 8) * (1 << torch.arange(8, dtype=torch.uint8))).sum(-1, dtype=torch.uint8)


def unbit_plane(plane: torch.Tensor) -> torch.Tensor:
    """The inverse of bit_plane -> b uint8 [N, K]."""
    bits = (plane[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1  # [N / 16, K / 4, 8, 8]: lane 8 b + i
    return untile(bits.reshape(*plane.shape[:2], 16, 4))


def pair_plane(v: torch.Tensor) -> torch.Tensor:
    """values v [N, K] in [0, 3] -> uint8 [N / 16, K / 4, 16]: per k-quad lane l's two bits at bits 2 (l / 16) of
    byte l % 16."""
    n, k = v.shape
    lanes = tiles(v.to(torch.uint8)).reshape(n // 16, k // 4, 4, 16)  # lane 16 j + p at [.., j, p]
    return (lanes << torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]).sum(2, dtype=torch.uint8)


def unpair_plane(plane: torch.Tensor) -> torch.Tensor:
    """The inverse of pair_plane -> v uint8 [N, K]."""
    nt, kq = plane.shape[:2]
    lanes = (plane[..., None] >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)) & 3  # [.., p, j]
    return untile(lanes.transpose(2, 3).reshape(nt, kq, 16, 4))


def five_bit(q: torch.Tensor) -> torch.Tensor:
    """codes q [N, K] in [0, 31] -> uint8 [N / 16, K / 4, 40]: per k-quad nibbles' 32 bytes of the low 4 bits,
    then 8 bytes holding lane l's fifth bit as bit l."""
    q = q.to(torch.uint8)
    return torch.cat((nibbles(q & 15), bit_plane(q >> 4)), dim=2).contiguous()


def unfive(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of five_bit -> q uint8 [N, K]."""
    return unnibble(codes[:, :, :32].contiguous()) | (unbit_plane(codes[:, :, 32:]) << 4)


def pack_scales(v: torch.Tensor) -> torch.Tensor:
    """Per-group values [N, K / 32] -> float16 [N / 16, K / 32, 16]: a tile's 16 rows side by side per group."""
    return v.to(torch.float16).view(-1, 16, v.shape[1]).transpose(1, 2).contiguous()


def unpack_scales(v: torch.Tensor) -> torch.Tensor:
    return v.transpose(1, 2).reshape(v.shape[0] * 16, -1)
