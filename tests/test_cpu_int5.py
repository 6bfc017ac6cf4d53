"""The int5 matmul (GGUF's 5-bit types: w = d q + mn, q in [0, 31], int4's nibbles plus a plane of fifth bits)
against its torch reference on every instruction-set path this CPU has; the paths give the same bits, a row's
result does not depend on its batch, and 5-bit codes that fit in 4 bits give the int4 kernel's bits."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels import cpu_matmul as ck

from .test_cpu_kernels import PATH_PARAMS, built, isa, same_on_every_path


def int5_weight(n: int, k: int, gen: torch.Generator, top: int = 31):
    q = torch.randint(0, top + 1, (n, k), generator=gen)
    return q, torch.rand(n, k // 32, generator=gen) * 0.01, -torch.rand(n, k // 32, generator=gen) * 0.15


def test_int5_packing_round_trips():
    q, d, mn = int5_weight(48, 128, torch.Generator().manual_seed(0))
    codes, dp, mp = ck.pack_int5(q, d, mn)
    assert codes.shape == (3, 32, 40) and dp.shape == (3, 4, 16) and mp.shape == (3, 4, 16)
    uq, ud, um = ck.unpack_int5(codes, dp, mp)
    assert torch.equal(uq, q.to(torch.uint8)) and torch.equal(ud, d.half()) and torch.equal(um, mn.half())
    w = ck.dequantize_int5(codes, dp, mp)
    assert torch.equal(w, (q.float().view(48, 4, 32) * d.half().float()[..., None] +
                           mn.half().float()[..., None]).view(48, 128))


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13])  # runs of 8 / 4 / 2 / 1 rows
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int5_matches_its_torch_reference(path, rows, dtype):
    gen = torch.Generator().manual_seed(rows)
    codes, d, mn = ck.pack_int5(*int5_weight(96, 576, gen))
    x = (torch.randn(rows, 576, generator=gen) * torch.rand(1, 576, generator=gen) * 4).to(dtype)
    x[0, :64] = 0  # an all-zero block (scale 0)
    got, want = ck.int5_linear(x, codes, d, mn, isa(path)), ck.int5_linear_torch(x, codes, d, mn)
    assert got.dtype == dtype and got.shape == (rows, 96)
    tol = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int5_is_the_same_on_every_path_in_any_batch_and_as_int4_below_16(dtype):
    gen = torch.Generator().manual_seed(9)
    q, d, mn = int5_weight(64, 1536, gen)
    codes, dp, mp = ck.pack_int5(q, d, mn)
    x = (torch.randn(13, 1536, generator=gen) * 3).to(dtype)
    full = same_on_every_path(lambda i: ck.int5_linear(x, codes, dp, mp, i))
    best = isa(cpu_ext.supported()[-1])
    for r in (0, 5, 12):
        assert torch.equal(ck.int5_linear(x[r:r + 1].contiguous(), codes, dp, mp, best), full[r:r + 1])
    q4 = q & 15  # the same weights through both kernels: the same integer dot products, the same bits
    assert torch.equal(ck.int5_linear(x, *ck.pack_int5(q4, d, mn), best), ck.int4_linear(x, *ck.pack_int4(q4, d, mn), best))


@built
def test_int5_rejects_a_bad_layout():
    codes, d, mn = ck.pack_int5(*int5_weight(16, 64, torch.Generator().manual_seed(1)))
    with pytest.raises(RuntimeError, match="int5 weight"):
        ck.int5_linear(torch.zeros(1, 64), codes[:, :, :32].contiguous(), d, mn, 0)
    with pytest.raises(RuntimeError, match="int5 weight"):
        ck.int5_linear(torch.zeros(1, 64), codes, d, torch.empty(0, dtype=torch.float16), 0)
