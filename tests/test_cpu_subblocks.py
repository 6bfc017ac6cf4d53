"""The sub-block matmuls, int6 (GGUF's Q6_K: w = d sc (q - 32), q in [0, 63]; int4's nibbles plus a plane of high
bit pairs) and int3 (Q3_K: w = d sc (q - 4), q in [0, 7]; a plane of low bit pairs plus one of third bits), each
with an int8 scale sc per 16 along K and a float16 d per 256, against their torch reference on every
instruction-set path this CPU has; the paths give the same bits, a row's result does not depend on its batch, the
packing round-trips, and an int6 embedding row read from the packed codes is the dequantized row."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels import cpu_matmul as ck

from .test_cpu_kernels import PATH_PARAMS, assert_close_to_reference, built, isa, same_on_every_path

# bits -> (pack, kernel, torch reference, bytes a sub-block of a tile)
FORMS = {6: (ck.pack_int6, ck.int6_linear, ck.int6_linear_torch, 208),
         3: (ck.pack_int3, ck.int3_linear, ck.int3_linear_torch, 112)}


def subblock_weight(n: int, k: int, gen: torch.Generator, bits: int = 6):
    q = torch.randint(0, 2**bits, (n, k), generator=gen)
    sc = torch.randint(-128, 128, (n, k // 16), generator=gen).to(torch.int8)
    return q, sc, torch.rand(n, k // 256, generator=gen) * 2e-4


@pytest.mark.parametrize("bits", FORMS)
def test_packing_round_trips(bits):
    pack, _, _, size = FORMS[bits]
    q, sc, d = subblock_weight(48, 512, torch.Generator().manual_seed(0), bits)
    codes, dp = pack(q, sc, d)
    assert codes.shape == (3, 32, size) and dp.shape == (3, 2, 16)
    uq, usc, ud, ubits = ck.unpack_subblocks(codes, dp)
    assert torch.equal(uq, q.to(torch.uint8)) and torch.equal(usc, sc) and torch.equal(ud, d.half()) and ubits == bits
    w = ck.dequantize_subblocks(codes, dp)
    want = (q.float() - 2 ** (bits - 1)).view(48, 32, 16) * sc.float()[..., None]
    assert torch.equal(w, (want.view(48, 2, 256) * d.half().float()[..., None]).view(48, 512))
    if bits == 6:
        ids = torch.tensor([0, 5, 8, 13, 16, 47, 31])
        assert torch.equal(ck.int6_rows(codes, dp, ids), w[ids])
    with pytest.raises(ValueError, match="divisible by 256"):
        pack(q[:, :128], sc[:, :8], d[:, :1])


@built
@pytest.mark.parametrize("bits", FORMS)
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13])  # runs of 8 / 4 / 2 / 1 rows
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_its_torch_reference(bits, path, rows, dtype):
    pack, kernel, reference, _ = FORMS[bits]
    gen = torch.Generator().manual_seed(rows)
    codes, d = pack(*subblock_weight(96, 768, gen, bits))
    x = (torch.randn(rows, 768, generator=gen) * torch.rand(1, 768, generator=gen) * 4).to(dtype)
    x[0, :64] = 0  # an all-zero block (scale 0)
    got, want = kernel(x, codes, d, isa(path)), reference(x, codes, d)
    assert got.dtype == dtype and got.shape == (rows, 96)
    assert_close_to_reference(got, want)


@built
@pytest.mark.parametrize("bits", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_same_on_every_path_in_any_batch(bits, dtype):
    pack, kernel, _, _ = FORMS[bits]
    gen = torch.Generator().manual_seed(9)
    q, sc, d = subblock_weight(64, 1536, gen, bits)
    q[:, :16] = 2**bits - 1  # the extremes: maddubs pairs at their largest
    sc[:, 0] = -128
    codes, dp = pack(q, sc, d)
    x = (torch.randn(13, 1536, generator=gen) * 3).to(dtype)
    x[:, :16] = 100.0  # quantizes to 127 in its block
    full = same_on_every_path(lambda i: kernel(x, codes, dp, i))
    best = isa(cpu_ext.supported()[-1])
    for r in (0, 5, 12):
        assert torch.equal(kernel(x[r:r + 1].contiguous(), codes, dp, best), full[r:r + 1])


@built
@pytest.mark.parametrize("bits", FORMS)
def test_a_bad_layout_is_refused(bits):
    pack, kernel, _, size = FORMS[bits]
    codes, d = pack(*subblock_weight(16, 256, torch.Generator().manual_seed(1), bits))
    with pytest.raises(RuntimeError, match=f"int{bits} weight"):
        kernel(torch.zeros(1, 256), codes[:, :, :size - 16].contiguous(), d, 0)
    with pytest.raises(RuntimeError, match=f"int{bits} weight"):
        kernel(torch.zeros(1, 256), codes, d[:, :, :8].contiguous(), 0)
