"""The sub-block matmuls, int6 (GGUF's Q6_K: w = d sc (q - 32), q in [0, 63]; int4's nibbles plus a plane of high
bit pairs), int3 (Q3_K: w = d sc (q - 4), q in [0, 7]; a plane of low bit pairs plus one of third bits) and int2
(Q2_K: w = d sc q - dmin m, q in [0, 3], sc and m 4-bit; the plane of bit pairs), each with scales per 16 along K
and a float16 d per 256, against their torch reference on every
instruction-set path this CPU has; the paths give the same bits, a row's result does not depend on its batch, the
packing round-trips, and an int6 embedding row read from the packed codes is the dequantized row."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels import cpu_matmul as ck

from .test_cpu_kernels import PATH_PARAMS, assert_close_to_reference, built, isa, same_on_every_path

# bits -> (pack, kernel, torch reference, bytes a sub-block of a tile); the packed weight is (codes, d) or, for
# int2, (codes, d, -dmin)
FORMS = {6: (ck.pack_int6, ck.int6_linear, ck.subblock_linear_torch, 208),
         3: (ck.pack_int3, ck.int3_linear, ck.subblock_linear_torch, 112),
         2: (ck.pack_int2, ck.int2_linear, ck.subblock_linear_torch, 96)}


def subblock_weight(n: int, k: int, gen: torch.Generator, bits: int = 6):
    """(q, sc, d), or for int2 (q, sc, m, d, dmin)."""
    q = torch.randint(0, 2**bits, (n, k), generator=gen)
    d = torch.rand(n, k // 256, generator=gen) * 2e-4
    if bits == 2:
        sc, m = (torch.randint(0, 16, (n, k // 16), generator=gen) for _ in range(2))
        return q, sc, m, d, torch.rand(n, k // 256, generator=gen) * 2e-4
    return q, torch.randint(-128, 128, (n, k // 16), generator=gen).to(torch.int8), d


@pytest.mark.parametrize("bits", FORMS)
def test_packing_round_trips(bits):
    pack, _, _, size = FORMS[bits]
    weight = subblock_weight(48, 512, torch.Generator().manual_seed(0), bits)
    q, sc, d = weight[0], torch.cat(weight[1:-2 if bits == 2 else 2], dim=1), weight[-2 if bits == 2 else 2]
    packed = pack(*weight)
    codes, dp = packed[:2]
    assert codes.shape == (3, 32, size) and dp.shape == (3, 2, 16)
    uq, usc, ud, ubits = ck.unpack_subblocks(codes, dp)
    assert torch.equal(uq, q.to(torch.uint8)) and torch.equal(usc.long(), sc.long()) and ubits == bits
    assert torch.equal(ud, d.half())
    w = ck.dequantize_subblocks(*packed)
    offset = 0 if bits == 2 else 2 ** (bits - 1)
    want = (q.float() - offset).view(48, 32, 16) * sc[:, :32].float()[..., None]
    want = want.view(48, 2, 256) * d.half().float()[..., None]
    if bits == 2:  # less dmin m per 16
        mins = weight[4].half().float().repeat_interleave(16, 1) * weight[2].float()
        want = want.view(48, 32, 16) - mins[..., None]
    assert torch.equal(w, want.view(48, 512))
    ids = torch.tensor([0, 5, 8, 13, 16, 47, 31, 5])
    assert torch.equal(ck.subblock_rows(codes, dp, ids, packed[2] if bits == 2 else None), w[ids])
    with pytest.raises(ValueError, match="divisible by 256"):
        pack(*(t[:, :t.shape[1] // 4] for t in weight))


@built
@pytest.mark.parametrize("bits", FORMS)
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13])  # runs of 8 / 4 / 2 / 1 rows
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_its_torch_reference(bits, path, rows, dtype):
    pack, kernel, reference, _ = FORMS[bits]
    gen = torch.Generator().manual_seed(rows)
    packed = pack(*subblock_weight(96, 768, gen, bits))
    x = (torch.randn(rows, 768, generator=gen) * torch.rand(1, 768, generator=gen) * 4).to(dtype)
    x[0, :64] = 0  # an all-zero block (scale 0)
    got, want = kernel(x, *packed, isa(path)), reference(x, *packed)
    assert got.dtype == dtype and got.shape == (rows, 96)
    assert_close_to_reference(got, want)


@built
@pytest.mark.parametrize("bits", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_same_on_every_path_in_any_batch(bits, dtype):
    pack, kernel, _, _ = FORMS[bits]
    gen = torch.Generator().manual_seed(9)
    weight = subblock_weight(64, 1536, gen, bits)
    weight[0][:, :16] = 2**bits - 1  # the extremes: maddubs pairs at their largest
    weight[1][:, 0] = 15 if bits == 2 else -128
    packed = pack(*weight)
    x = (torch.randn(13, 1536, generator=gen) * 3).to(dtype)
    x[:, :16] = 100.0  # quantizes to 127 in its block
    full = same_on_every_path(lambda i: kernel(x, *packed, i))
    best = isa(cpu_ext.supported()[-1])
    for r in (0, 5, 12):
        assert torch.equal(kernel(x[r:r + 1].contiguous(), *packed, best), full[r:r + 1])


@built
@pytest.mark.parametrize("bits", FORMS)
def test_a_bad_layout_is_refused(bits):
    pack, kernel, _, size = FORMS[bits]
    codes, d, *mn = pack(*subblock_weight(16, 256, torch.Generator().manual_seed(1), bits))
    with pytest.raises(RuntimeError, match=f"int{bits} weight"):
        kernel(torch.zeros(1, 256), codes[:, :, :size - 16].contiguous(), d, *mn, 0)
    with pytest.raises(RuntimeError, match=f"int{bits} weight"):
        kernel(torch.zeros(1, 256), codes, d[:, :, :8].contiguous(), *mn, 0)
    if bits == 2:
        with pytest.raises(RuntimeError, match="minimums likewise"):
            kernel(torch.zeros(1, 256), codes, d, d[:, :, :8].contiguous(), 0)
