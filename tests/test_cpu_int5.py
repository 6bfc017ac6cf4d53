"""The int5 matmul (GGUF's 5-bit types: w = d q + mn, q in [0, 31], int4's nibbles plus a plane of fifth bits)
against its torch reference on every instruction-set path this CPU has; the paths give the same bits, a row's
result does not depend on its batch, and 5-bit codes that fit in 4 bits give the int4 kernel's bits. Also the
K-quant layout of int4 and int5 (GGUF's Q4_K / Q5_K scales kept as they are: 6-bit sc, m per 32, d, dmin per
256)."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels import cpu_matmul as ck

from .test_cpu_kernels import PATH_PARAMS, assert_close_to_reference, built, isa, same_on_every_path


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
    from radixlm.runtime.model.quantization import QuantWeight

    table = QuantWeight("int5", codes, dp, 48, 128, 1, torch.float32, "native", mp, 0)  # an embedding's rows
    ids = torch.tensor([0, 9, 31, 16, 47, 9])
    assert torch.equal(table.rows(ids), w[ids])


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
    assert_close_to_reference(got, want)


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


def kquant_weight(n: int, k: int, bits: int, gen: torch.Generator):
    """GGUF's Q4_K / Q5_K form: codes, 6-bit sc and m per 32, d and dmin per 256."""
    q = torch.randint(0, 2**bits, (n, k), generator=gen)
    sc, m = (torch.randint(0, 64, (n, k // 32), generator=gen).to(torch.uint8) for _ in range(2))
    return q, sc, m, torch.rand(n, k // 256, generator=gen) * 1e-3, torch.rand(n, k // 256, generator=gen) * 1e-3


@pytest.mark.parametrize("bits", [4, 5])
def test_k_quant_layout_round_trips_and_reads_rows(bits):
    q, sc, m, d, dmin = kquant_weight(32, 512, bits, torch.Generator().manual_seed(bits))
    codes, dp, mp = ck.pack_kquant(q, sc, m, d, dmin, bits)
    assert codes.shape == (2, 16, ck.KFORM_BYTES[bits]) and dp.shape == mp.shape == (2, 2, 16)
    uq, usc, um, ud, umn = ck.unpack_kquant(codes, dp, mp)
    assert torch.equal(uq, q.to(torch.uint8)) and torch.equal(usc, sc) and torch.equal(um, m)
    assert torch.equal(ud, d.half()) and torch.equal(umn, -dmin.half())
    dg = d.half().float().repeat_interleave(8, 1) * sc.float()
    mg = -dmin.half().float().repeat_interleave(8, 1) * m.float()
    want = (q.float().view(32, 16, 32) * dg[..., None] + mg[..., None]).view(32, 512)
    got = (ck.dequantize_int4 if bits == 4 else ck.dequantize_int5)(codes, dp, mp)
    assert torch.equal(got, want)
    from radixlm.runtime.model.quantization import QuantWeight

    w = QuantWeight(f"int{bits}", codes, dp, 32, 512, 1, torch.float32, "native", mp, 0)
    ids = torch.tensor([0, 9, 31, 16])
    assert torch.equal(w.rows(ids), want[ids])


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("bits", [4, 5])
@pytest.mark.parametrize("rows", [1, 13])
def test_k_quant_layout_matches_its_reference_and_the_float16_layout(path, bits, rows):
    """Against the torch reference; and against the same weights in the ordinary layout where d sc and -dmin m
    are float16 exactly (d, dmin powers of two): the same bits."""
    gen = torch.Generator().manual_seed(rows + bits)
    q, sc, m, _, _ = kquant_weight(64, 768, bits, gen)
    d, dmin = 2.0 ** -torch.randint(10, 14, (64, 3), generator=gen), 2.0 ** -torch.randint(8, 12, (64, 3), generator=gen)
    kform = ck.pack_kquant(q, sc, m, d, dmin, bits)
    x = (torch.randn(rows, 768, generator=gen) * 3).to(torch.bfloat16 if rows == 13 else torch.float32)
    linear = ck.int4_linear if bits == 4 else ck.int5_linear
    got = linear(x, *kform, isa(path))
    want = (ck.int4_linear_torch if bits == 4 else ck.int5_linear_torch)(x, *kform)
    assert_close_to_reference(got, want)
    per32 = (d.repeat_interleave(8, 1) * sc.float(), -dmin.repeat_interleave(8, 1) * m.float())
    plain = ck.pack_int4(q, *per32) if bits == 4 else ck.pack_int5(q, *per32)
    assert torch.equal(got, linear(x, *plain, isa(path)))


@built
def test_k_quant_layout_rejects_missing_minimums():
    codes, d, mn = ck.pack_kquant(*kquant_weight(16, 256, 4, torch.Generator().manual_seed(2)), 4)
    with pytest.raises(RuntimeError, match="K-quant layout"):
        ck.int4_linear(torch.zeros(1, 256), codes, d, None, 0)
