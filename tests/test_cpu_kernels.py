"""radixlm's AVX512-VNNI int4 / int8 matmuls (kernels/cpu_quant_matmul.cpp) against their torch references:
the packing round-trips, the outputs match the same quantized activations times the dequantized weights,
and the activation quantization itself costs nothing measurable against plain float activations."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_quant_matmul as ck

needs_vnni = pytest.mark.skipif(not ck.available(), reason="needs an AVX512-VNNI CPU and a C++ compiler")


def _int4_weight(n: int, k: int, gen: torch.Generator):
    q = torch.randint(0, 16, (n, k), generator=gen)
    d = torch.rand(n, k // 32, generator=gen) * 0.02
    mn = -torch.rand(n, k // 32, generator=gen) * 0.15
    return q, d, mn


def test_packing_round_trips():
    gen = torch.Generator().manual_seed(0)
    q, d, mn = _int4_weight(48, 128, gen)
    codes, dp, mp = ck.pack_int4(q, d, mn)
    assert codes.shape == (3, 32, 32) and dp.shape == (3, 4, 16)
    uq, ud, um = ck.unpack_int4(codes, dp, mp)
    assert torch.equal(uq, q.to(torch.uint8)) and torch.equal(ud, d.half()) and torch.equal(um, mn.half())
    w8 = torch.randint(-127, 128, (32, 64), generator=gen, dtype=torch.int8)
    assert torch.equal(ck.unpack_int8(ck.pack_int8(w8)), w8)


def test_packing_rejects_shapes_the_kernels_cannot_tile():
    with pytest.raises(ValueError, match="N divisible by 16 and K by 64"):
        ck.pack_int8(torch.zeros(20, 64, dtype=torch.int8))
    with pytest.raises(ValueError, match="N divisible by 16 and K by 64"):
        ck.pack_int4(torch.zeros(16, 96), torch.zeros(16, 3), torch.zeros(16, 3))


@needs_vnni
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 13, 16, 40])  # every run of 8 / 4 / 2 / 1 rows, and prefill
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [64, 576, 1536])
def test_kernels_match_their_torch_reference(rows, dtype, k):
    gen = torch.Generator().manual_seed(rows * k)
    n = 96
    codes, d, mn = ck.pack_int4(*_int4_weight(n, k, gen))
    q8, s8 = ck.pack_int8(torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)), torch.rand(n) * 0.01
    x = (torch.randn(rows, k, generator=gen) * torch.rand(1, k, generator=gen) * 4).to(dtype)
    x[0, :64] = 0  # an all-zero block (scale 0)
    for got, want in ((ck.int4_linear(x, codes, d, mn), ck.int4_linear_torch(x, codes, d, mn)),
                      (ck.int8_linear(x, q8, s8), ck.int8_linear_torch(x, q8, s8))):
        assert got.dtype == dtype and got.shape == (rows, n)
        tol = 1e-5 if dtype == torch.float32 else 2**-7  # float32 sums in another order; one bf16 rounding
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())


@needs_vnni
def test_activation_quantization_is_close_to_float_activations():
    """int8 activations per block of 64 against the same weights with float activations: within ~1%."""
    gen = torch.Generator().manual_seed(3)
    codes, d, mn = ck.pack_int4(*_int4_weight(256, 576, gen))
    x = torch.randn(4, 576, generator=gen)
    exact = x @ ck.dequantize_int4(codes, d, mn).t()
    err = (ck.int4_linear(x, codes, d, mn) - exact).norm() / exact.norm()
    assert err < 0.01, err


@needs_vnni
def test_kernels_reject_bad_inputs_with_a_message():
    codes, d, mn = ck.pack_int4(torch.zeros(16, 128), torch.ones(16, 4), torch.zeros(16, 4))
    with pytest.raises(RuntimeError, match="x has 64 columns; the weight has 128"):
        ck.int4_linear(torch.zeros(1, 64), codes, d, mn)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ck.int4_linear(torch.zeros(1, 128, dtype=torch.float16), codes, d, mn)
