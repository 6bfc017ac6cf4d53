"""radixlm's C++ CPU kernels against their torch references, on every instruction-set path this CPU has
(portable C++ and AVX2 on any recent x86 CPU; the AVX512 paths where the CPU has them: those are the only
tests skipped elsewhere). The paths give bit-identical results; a row's result never depends on the batch
it is in; extend attention gives what decode attention gives at the same position; and an engine on the
kernels decodes like one on torch's ops."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlm.kernels import cpu_decode_attention as ca
from radixlm.kernels import cpu_ext
from radixlm.kernels import cpu_matmul as ck
from radixlm.kernels import cpu_norm_act as na
from radixlm.kernels.token_bitmask import (
    apply_token_bitmask,
    apply_token_bitmask_cpu,
    apply_token_bitmask_torch,
)
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import random_model

from .conftest import TINY

built = pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build (no C++ compiler?)")
PATH_PARAMS = [pytest.param(p, marks=pytest.mark.skipif(p not in cpu_ext.supported(), reason=f"this CPU has no {p}"))
               for p in cpu_ext.MACHINE_PATHS]


def isa(path: str) -> int:
    return cpu_ext.PATHS.index(path)


def same_on_every_path(fn):
    """fn(isa) on each supported path -> the result, checked bit-identical across the paths."""
    results = [fn(isa(p)) for p in cpu_ext.supported()]
    for other in results[1:]:
        assert torch.equal(other, results[0])
    return results[0]


def assert_close_to_reference(got: torch.Tensor, want: torch.Tensor) -> None:
    """A quantized matmul against its torch reference: float32 sums in another order; one bfloat16 rounding."""
    tol = 1e-5 if got.dtype == torch.float32 else 2**-7
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())


def _int4_weight(n: int, k: int, gen: torch.Generator):
    q = torch.randint(0, 16, (n, k), generator=gen)
    d = torch.rand(n, k // 32, generator=gen) * 0.02
    mn = -torch.rand(n, k // 32, generator=gen) * 0.15
    return q, d, mn


def _int8_weight(n: int, k: int, gen: torch.Generator):
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    return q, torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-4


def test_packing_round_trips():
    gen = torch.Generator().manual_seed(0)
    q, d, mn = _int4_weight(48, 128, gen)
    codes, dp, mp = ck.pack_int4(q, d, mn)
    assert codes.shape == (3, 32, 32) and dp.shape == (3, 4, 16)
    uq, ud, um = ck.unpack_int4(codes, dp, mp)
    assert torch.equal(uq, q.to(torch.uint8)) and torch.equal(ud, d.half()) and torch.equal(um, mn.half())
    w8, d8 = _int8_weight(32, 64, gen)
    q8, dp8 = ck.pack_int8(w8, d8)
    assert q8.shape == (2, 16, 16, 4) and dp8.shape == (2, 2, 16)
    uq8, ud8 = ck.unpack_int8(q8, dp8)
    assert torch.equal(uq8, w8) and torch.equal(ud8, d8.half())


def test_packing_rejects_shapes_the_kernels_cannot_tile():
    with pytest.raises(ValueError, match="N divisible by 16 and K by 64"):
        ck.pack_int8(torch.zeros(20, 64, dtype=torch.int8), torch.ones(20, 2))
    with pytest.raises(ValueError, match="N divisible by 16 and K by 64"):
        ck.pack_int4(torch.zeros(16, 96), torch.zeros(16, 3), torch.zeros(16, 3))


@built
def test_paths_resolve_and_refuse_what_the_cpu_lacks():
    paths = cpu_ext.supported()
    assert paths[0] == "portable" and cpu_ext.resolve("auto") == isa(paths[-1]) and cpu_ext.resolve("torch") is None
    with pytest.raises(ValueError, match="cpu_kernels must be"):
        cpu_ext.resolve("sse9")
    missing = [p for p in cpu_ext.PATHS if p not in paths]
    if missing:  # a path this CPU lacks (or $RADIXLM_CPU_CAPABILITY hides): a ValueError here
        with pytest.raises(ValueError, match="this CPU has no"):
            cpu_ext.resolve(missing[0])
    missing = [p for p in cpu_ext.PATHS if not torch.ops.radixlm_cpu.isa_supported(isa(p))]
    if missing:  # ... and one its hardware lacks: an error (never an illegal instruction) in the op
        codes, d, mn = ck.pack_int4(torch.zeros(16, 64), torch.ones(16, 2), torch.zeros(16, 2))
        with pytest.raises(RuntimeError, match="not supported by this CPU"):
            ck.int4_linear(torch.zeros(1, 64), codes, d, mn, isa(missing[0]))


@built
def test_the_capability_variable_makes_the_cpu_act_as_an_older_one(monkeypatch):
    full = cpu_ext.supported()
    try:
        for cap in full[:2]:  # portable, then the next path up: supported() and auto stop there
            monkeypatch.setenv(cpu_ext.CAPABILITY_ENV, cap)
            cpu_ext.supported.cache_clear()
            assert cpu_ext.supported() == full[:full.index(cap) + 1] and cpu_ext.resolve("auto") == isa(cap)
        monkeypatch.setenv(cpu_ext.CAPABILITY_ENV, "sse9")
        cpu_ext.supported.cache_clear()
        with pytest.raises(ValueError, match="RADIXLM_CPU_CAPABILITY"):
            cpu_ext.supported()
    finally:
        monkeypatch.undo()  # the variable as it was (set where the suite runs as an older CPU)
        cpu_ext.supported.cache_clear()
    assert cpu_ext.supported() == full


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 13, 40])  # every run of 8 / 4 / 2 / 1 rows, and prefill
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [64, 576, 768])
def test_matmuls_match_their_torch_reference(path, rows, dtype, k):
    gen = torch.Generator().manual_seed(rows * k)
    n = 96
    q4, d4, mn4 = _int4_weight(n, k, gen)
    codes, d, mn = ck.pack_int4(q4, d4, mn4)
    iq4, diq4 = ck.pack_iq4(q4, d4)  # the codes as indices into IQ4_NL's values
    q8, d8 = ck.pack_int8(*_int8_weight(n, k, gen))
    x = (torch.randn(rows, k, generator=gen) * torch.rand(1, k, generator=gen) * 4).to(dtype)
    x[0, :64] = 0  # an all-zero block (scale 0)
    cases = [(ck.int4_linear(x, codes, d, mn, isa(path)), ck.int4_linear_torch(x, codes, d, mn)),
             (ck.int4_linear(x, iq4, diq4, None, isa(path)), ck.int4_linear_torch(x, iq4, diq4, None)),
             (ck.int8_linear(x, q8, d8, isa(path)), ck.int8_linear_torch(x, q8, d8))]
    if k % 256 == 0:  # IQ4_XS: an int8 scale per 32, d per 256; the same codes into GRID_VALUES (IQ2_XXS, IQ1_S)
        xs, dxs = ck.pack_iq4(q4, d4[:, ::8] / 32, torch.randint(-32, 32, d4.shape, generator=gen))
        cases.append((ck.int4_linear(x, xs, dxs, None, isa(path)), ck.int4_linear_torch(x, xs, dxs, None)))
        grid = ck.GRID_VALUES
        cases.append((ck.int4_linear(x, xs, dxs, grid, isa(path)), ck.int4_linear_torch(x, xs, dxs, grid)))
        sub16 = torch.randint(-128, 128, (n, k // 16), generator=gen)  # the table form: an int8 scale per 16
        tq, td = ck.pack_table(q4, sub16, d4[:, ::8] / 64)
        cases.append((ck.int4_linear(x, tq, td, grid, isa(path)), ck.int4_linear_torch(x, tq, td, grid)))
    for got, want in cases:
        assert got.dtype == dtype and got.shape == (rows, n)
        assert_close_to_reference(got, want)


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmuls_are_identical_across_paths_and_batch_invariant(dtype):
    """Every path gives the same bits, and a row's result is the same alone or in any batch (the rows of
    x come in runs of 8 / 4 / 2 / 1 through different tile sizes): int4, int8, int4 in the IQ4 layout (IQ4_NL's
    values and GRID_VALUES) and in the table form."""
    gen = torch.Generator().manual_seed(7)
    q4, d4, mn4 = _int4_weight(64, 1536, gen)
    q4[:, :32] = 0  # IQ4's -127 where x is 127 below (the products at their largest)
    codes, d, mn = ck.pack_int4(q4, d4, mn4)
    iq4, diq4 = ck.pack_iq4(q4, d4)
    xs4, dxs4 = ck.pack_iq4(q4, d4[:, ::8] / 32, torch.full(d4.shape, -32))
    tq, td = ck.pack_table(q4, torch.full((64, 1536 // 16), -128), d4[:, ::8] / 64)  # the largest products
    q8, d8 = ck.pack_int8(*_int8_weight(64, 1536, gen))
    x = (torch.randn(13, 1536, generator=gen) * 3).to(dtype)
    x[:, :32] = 100.0
    for run in (lambda i, xs: ck.int4_linear(xs, codes, d, mn, i), lambda i, xs: ck.int8_linear(xs, q8, d8, i),
                lambda i, xs: ck.int4_linear(xs, iq4, diq4, None, i),
                lambda i, xs: ck.int4_linear(xs, iq4, diq4, ck.GRID_VALUES, i),
                lambda i, xs: ck.int4_linear(xs, xs4, dxs4, None, i),
                lambda i, xs: ck.int4_linear(xs, xs4, dxs4, ck.GRID_VALUES, i),
                lambda i, xs: ck.int4_linear(xs, tq, td, ck.GRID_VALUES, i)):
        full = same_on_every_path(lambda i, run=run: run(i, x))
        best = isa(cpu_ext.supported()[-1])
        for r in (0, 5, 12):
            assert torch.equal(run(best, x[r:r + 1].contiguous()), full[r:r + 1])
        assert torch.equal(run(best, x[3:10].contiguous()), full[3:10])


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_matmul_matches_its_reference_and_is_batch_invariant(path, dtype):
    """The dense kernel (k in order, one fused multiply-add chain per element): close to float32 x @ w^T, the
    same bits on every path, and a row's result the same alone or in any batch."""
    gen = torch.Generator().manual_seed(2)
    tiles = ck.pack_dense(torch.randn(96, 576, generator=gen).to(dtype))
    assert torch.equal(ck.unpack_dense(tiles), ck.unpack_dense(ck.pack_dense(ck.unpack_dense(tiles))))
    x = torch.randn(13, 576, generator=gen).to(dtype)
    got = ck.dense_linear(x, tiles, isa(path))
    tol = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(got.float(), ck.dense_linear_torch(x, tiles).float(), rtol=tol, atol=tol * 30)
    assert torch.equal(got, same_on_every_path(lambda i: ck.dense_linear(x, tiles, i)))
    for r in (0, 6, 12):
        assert torch.equal(ck.dense_linear(x[r:r + 1].contiguous(), tiles, isa(path)), got[r:r + 1])


@built
def test_int4_without_minimums_is_q4_0():
    """mn None (GGUF's Q4_0: w = d (q - 8)) gives the bits of a stored mn = -8 d."""
    gen = torch.Generator().manual_seed(4)
    q, d = torch.randint(0, 16, (32, 128), generator=gen), torch.rand(32, 4, generator=gen) * 0.01
    x = torch.randn(3, 128, generator=gen)
    without, stored = ck.pack_int4(q, d, None), ck.pack_int4(q, d, -8 * d.half().float())
    assert without[2] is None
    i = cpu_ext.resolve("auto")
    assert torch.equal(ck.int4_linear(x, *without, i), ck.int4_linear(x, *stored, i))
    torch.testing.assert_close(ck.dequantize_int4(*without), ck.dequantize_int4(*stored), rtol=0, atol=0)


@built
def test_activation_quantization_is_close_to_float_activations():
    """int8 activations per block of 64 against the same weights with float activations: within ~1%."""
    gen = torch.Generator().manual_seed(3)
    codes, d, mn = ck.pack_int4(*_int4_weight(256, 576, gen))
    x = torch.randn(4, 576, generator=gen)
    exact = x @ ck.dequantize_int4(codes, d, mn).t()
    err = (ck.int4_linear(x, codes, d, mn, cpu_ext.resolve("auto")) - exact).norm() / exact.norm()
    assert err < 0.01, err



@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_rows_are_the_dequantized_rows(dtype):
    """The embedding lookup of an int8 table: the rows dequantize_int8 gives, rounded once to the dtype, exactly,
    in the order asked (repeats too); an id outside the table is refused, not read."""
    gen = torch.Generator().manual_seed(5)
    q, d = ck.pack_int8(*_int8_weight(64, 192, gen))
    ids = torch.tensor([0, 63, 17, 17, 40])
    assert torch.equal(ck.int8_rows(q, d, ids, dtype), ck.dequantize_int8(q, d)[ids].to(dtype))
    assert ck.int8_rows(q, d, ids[:0], dtype).shape == (0, 192)
    with pytest.raises(RuntimeError, match="row id 64 is outside the table's 64 rows"):
        ck.int8_rows(q, d, torch.tensor([3, 64]), dtype)

@built
def test_matmuls_reject_bad_inputs_with_a_message():
    codes, d, mn = ck.pack_int4(torch.zeros(16, 128), torch.ones(16, 4), torch.zeros(16, 4))
    with pytest.raises(RuntimeError, match="x has 64 columns; the weight has 128"):
        ck.int4_linear(torch.zeros(1, 64), codes, d, mn, 0)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ck.int4_linear(torch.zeros(1, 128, dtype=torch.float16), codes, d, mn, 0)
    with pytest.raises(RuntimeError, match="kernel path 9"):
        ck.int4_linear(torch.zeros(1, 128), codes, d, mn, 9)
    iq4, diq4 = ck.pack_iq4(torch.zeros(16, 128, dtype=torch.uint8), torch.ones(16, 4))
    with pytest.raises(RuntimeError, match="IQ4 layout"):  # IQ4 codes take no minimums
        ck.int4_linear(torch.zeros(1, 128), iq4, diq4, mn, 0)
    with pytest.raises(RuntimeError, match="int8 \\[16\\] table"):  # ... but a table of 16 values
        ck.int4_linear(torch.zeros(1, 128), iq4, diq4, ck.GRID_VALUES[:8], 0)
    tq, td = ck.pack_table(torch.zeros(16, 256, dtype=torch.uint8), torch.ones(16, 16), torch.ones(16, 1))
    with pytest.raises(RuntimeError, match="table form"):  # the table form needs its table
        ck.int4_linear(torch.zeros(1, 256), tq, td, None, 0)
    with pytest.raises(RuntimeError, match=r"each in \[-64, 63\]"):  # ... of values that fit its unsigned codes
        ck.int4_linear(torch.zeros(1, 256), tq, td, ck.IQ4_VALUES, 0)


def _decode_case(dtype, d, heads, gen):
    hq, hkv = heads
    k, v = (torch.randn(hkv, 600, d, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(5, hq, d, generator=gen).to(dtype)
    idx = torch.randint(1, 600, (5, 40), generator=gen)  # scattered slots, as a reused pool has them
    counts = torch.tensor([40, 1, 17, 33, 5])
    member = torch.tensor([True, False, True, True, False])
    return q, k, v, idx, counts, member


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (16, 1)])  # G = 3, 1, 16 query heads a KV head
def test_decode_attention_matches_its_reference(path, dtype, d, heads):
    gen = torch.Generator().manual_seed(d)
    q, k, v, idx, counts, member = _decode_case(dtype, d, heads, gen)
    for prefix in (torch.randint(1, 600, (70,), generator=gen), torch.zeros(0, dtype=torch.int64)):
        got = ca.decode_attention(q, k, v, idx, counts, prefix, member, isa(path))
        want = ca.decode_attention_torch(q, k, v, idx, counts, prefix, member)
        tol = 1e-5 if dtype == torch.float32 else 2**-7
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def _extend_case(dtype, d, gen):
    k, v = (torch.randn(3, 3000, d, generator=gen).to(dtype) for _ in range(2))
    seq, ext = torch.tensor([1030, 200, 70, 5]), torch.tensor([30, 200, 33, 1])
    table = torch.zeros(4, 1100, dtype=torch.int64)
    for r in range(4):
        table[r, : seq[r]] = torch.randperm(2999, generator=gen)[: seq[r]] + 1
    q = torch.randn(int(ext.sum()), 9, d, generator=gen).to(dtype)
    return q, k, v, table, seq, ext


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
def test_extend_attention_matches_its_reference(path, dtype, d):
    """Requests with a long cached prefix, a fresh 200-token prompt split into chunks, a short one, a single
    token; scattered slots."""
    gen = torch.Generator().manual_seed(d)
    q, k, v, table, seq, ext = _extend_case(dtype, d, gen)
    got = ca.extend_attention(q, k, v, table, seq, ext, isa(path))
    want = ca.extend_attention_torch(q, k, v, table, seq, ext)
    tol = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_attention_equals_decode_attention_at_every_position(path, dtype):
    """Cache invariance: a token's attention is the same bits whether it is computed in a long extend
    (one of 16-token tasks), in an extend of its own over a cached prefix, or as a decode step."""
    gen = torch.Generator().manual_seed(11)
    q, k, v, table, seq, ext = _extend_case(dtype, 64, gen)
    i = isa(path)
    full = ca.extend_attention(q, k, v, table, seq, ext, i)
    none, no = torch.zeros(0, dtype=torch.int64), torch.zeros(1, dtype=torch.bool)
    start = 30  # request 1: 200 new tokens, no cached prefix
    for j in (0, 15, 16, 99, 199):
        qj, row = q[start + j:start + j + 1].contiguous(), table[1:2]
        decoded = ca.decode_attention(qj, k, v, row[:, :j + 1].contiguous(), torch.tensor([j + 1]), none, no, i)
        alone = ca.extend_attention(qj, k, v, row.contiguous(), torch.tensor([j + 1]), torch.tensor([1]), i)
        assert torch.equal(decoded, full[start + j:start + j + 1])
        assert torch.equal(alone, full[start + j:start + j + 1])
    # the shared-prefix form of decode (prefix slots + own slots) reads the same keys in the same order
    row = table[0, :1030]
    split = ca.decode_attention(q[29:30].contiguous(), k, v, row[700:].reshape(1, -1).contiguous(),
                                torch.tensor([330]), row[:700].contiguous(), torch.tensor([True]), i)
    assert torch.equal(split, full[29:30])


@built
def test_attention_is_identical_across_paths():
    """Every path but AVX512-BF16 (bfloat16 products in hardware) gives the same bits."""
    gen = torch.Generator().manual_seed(5)
    paths = [p for p in cpu_ext.supported() if p != "avx512_bf16"]
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, idx, counts, member = _decode_case(dtype, 64, (9, 3), gen)
        prefix = torch.randint(1, 600, (70,), generator=gen)
        outs = [ca.decode_attention(q, k, v, idx, counts, prefix, member, isa(p)) for p in paths]
        qe, ke, ve, table, seq, ext = _extend_case(dtype, 128, gen)
        outs_e = [ca.extend_attention(qe, ke, ve, table, seq, ext, isa(p)) for p in paths]
        assert all(torch.equal(o, outs[0]) for o in outs) and all(torch.equal(o, outs_e[0]) for o in outs_e)


@built
def test_attention_rejects_bad_inputs_with_a_message():
    k = torch.zeros(2, 10, 32)
    q, idx, counts = torch.zeros(1, 4, 32), torch.zeros(1, 3, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    none, member = torch.zeros(0, dtype=torch.int64), torch.zeros(1, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="head dim must be 64 or 128, got 32"):
        ca.decode_attention(q, k, k, idx, counts, none, member, 0)
    with pytest.raises(RuntimeError, match="idx must be a contiguous int64"):
        ca.decode_attention(torch.zeros(1, 4, 64), torch.zeros(2, 10, 64), torch.zeros(2, 10, 64), idx.int(),
                            counts, none, member, 0)
    k = torch.zeros(1, 10, 64, dtype=torch.bfloat16)
    q = torch.zeros(3, 1, 64, dtype=torch.bfloat16)
    table = torch.zeros(1, 8, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="q has 3 rows; the requests extend by 2"):
        ca.extend_attention(q, k, k, table, torch.tensor([4]), torch.tensor([2]), 0)
    with pytest.raises(RuntimeError, match="request 0: bad lengths"):
        ca.extend_attention(q, k, k, table, torch.tensor([2]), torch.tensor([3]), 0)


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("vocab,words", [(49152, 1536), (40, 2), (100, 3), (1000, 40)])
def test_token_bitmask_kernel_matches_its_reference(path, vocab, words):
    """Random masks, rows listed out of order, a bitmask narrower than the vocabulary (100 tokens, 96 bits:
    the last 4 masked) and wider (1000, 1280)."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (6, words), generator=gen, dtype=torch.int32)
    bitmask[:, ::3] = -1  # runs of 16 all allowed (skipped), none allowed, and each half of a word alone
    bitmask[:, 1::5] = 0
    bitmask[:, 2::7] = 0xFFFF
    rows = torch.tensor([4, 0, 2, 5])
    want, got = logits.clone(), logits.clone()
    apply_token_bitmask_torch(want, bitmask, rows)
    apply_token_bitmask(got, bitmask, rows, isa(path))
    assert torch.equal(got, want)
    assert torch.equal(got[1], logits[1]) and torch.isinf(got[0]).any()


@built
def test_token_bitmask_kernel_rejects_bad_inputs_with_a_message():
    logits, bitmask = torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="row index 2 out of range for 2 rows"):
        apply_token_bitmask_cpu(logits, bitmask, torch.tensor([2]))
    with pytest.raises(RuntimeError, match="one row per logits row"):
        apply_token_bitmask_cpu(logits, bitmask[:1], torch.tensor([0]))
    with pytest.raises(RuntimeError, match="logits must be a float32"):
        apply_token_bitmask_cpu(logits.half(), bitmask, torch.tensor([0]))


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_activation_kernels_match_their_reference(path, dtype):
    """RMSNorm (float32 accumulation, one rounding), the residual add written in place exactly as torch's
    add rounds it, and silu(gate) * up equal to torch's two ops (bfloat16: bit for bit)."""
    gen = torch.Generator().manual_seed(1)
    i = isa(path)
    for rows in (1, 7, 64):
        x = (torch.randn(rows, 576, generator=gen) * 3).to(dtype)
        residual = torch.randn(rows, 576, generator=gen).to(dtype)
        w = torch.randn(576, generator=gen).to(dtype)
        tol = 1e-6 if dtype == torch.float32 else 8e-3  # bfloat16: one rounding step apart at most
        torch.testing.assert_close(na.rms_norm(x, w, 1e-5, i), na.rms_norm_torch(x, w, 1e-5), rtol=tol, atol=tol)
        want, want_sum = na.add_rms_norm_torch(x, residual, w, 1e-5)
        got = na.add_rms_norm_(x, residual, w, 1e-5, i)
        assert torch.equal(residual, want_sum)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        gate_up = (torch.randn(rows, 3072, generator=gen) * 4).to(dtype)
        got, want = na.silu_mul(gate_up, i), na.silu_mul_torch(gate_up)
        if dtype == torch.bfloat16:
            assert torch.equal(got, want)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    same_on_every_path(lambda j: na.rms_norm(x, w, 1e-5, j))
    same_on_every_path(lambda j: na.silu_mul(gate_up, j))


@built
def test_norm_and_activation_kernels_reject_bad_inputs_with_a_message():
    with pytest.raises(RuntimeError, match="H a multiple of 16"):
        na.rms_norm(torch.zeros(2, 20), torch.ones(20), 1e-5, 0)
    with pytest.raises(RuntimeError, match="weight must be"):
        na.rms_norm(torch.zeros(2, 32), torch.ones(16), 1e-5, 0)
    with pytest.raises(RuntimeError, match="residual must be"):
        na.add_rms_norm_(torch.zeros(2, 32), torch.zeros(3, 32), torch.ones(32), 1e-5, 0)
    with pytest.raises(RuntimeError, match="gate_up must be"):
        na.silu_mul(torch.zeros(2, 48), 0)


@built
def test_engine_on_the_cpu_kernels_decodes_like_torch_ops():
    """float32, head dim 64, int8 weights: greedy tokens of single requests, a batch and a shared prefix, on
    every path against torch's ops."""
    cfg = dataclasses.replace(TINY, num_heads=2, num_kv_heads=1, head_dim=64)
    greedy = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    prefix = list(range(3, 70))
    prompts = [[5, 6, 7], list(range(10, 60)), prefix + [1, 2], prefix + [9]]
    outs = []
    for kernels in ("torch", *cpu_ext.supported()):
        engine = Engine.from_model(random_model(cfg, seed=0), None, quantization="int8", cpu_kernels=kernels,
                                   deterministic=kernels != "torch", max_total_tokens=2048, check_invariants=True)
        assert engine.runner.backend.isa == cpu_ext.resolve(kernels)
        engine.generate(input_ids=prefix, sampling_params={**greedy, "max_new_tokens": 1})
        outs.append([r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=greedy)])
        engine.check_invariants()
    assert all(o == outs[0] for o in outs)


@built
def test_bf16_engine_on_the_cpu_kernels_scores_text_like_torch_ops(smol_files, smol_tokenizer):
    """SmolLM2 in bfloat16: prompt logprobs of a README passage, prefilled over a cached prefix (extend) and
    then decoded, agree with torch's ops: mean NLL within 0.5% and the same first greedy token (bfloat16
    sums in another order flip near-ties later on)."""
    from radixlm.runtime.model.loader import load_model

    text = open(__file__.replace("tests/test_cpu_kernels.py", "README.md")).read()[:3000]
    ids = smol_tokenizer(text)["input_ids"][:300]
    results = []
    for kernels in ("auto", "torch"):
        engine = Engine.from_model(load_model(smol_files, torch.bfloat16, progress=False), smol_tokenizer,
                                   max_total_tokens=2048, cpu_kernels=kernels, deterministic=kernels != "torch")
        assert (engine.runner.backend.isa is not None) == (kernels == "auto")
        engine.generate(input_ids=ids[:200], sampling_params={"temperature": 0, "max_new_tokens": 1})  # cached
        res = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 8},
                              return_logprob=True, logprob_start_len=0)
        logprobs = [x[0] for x in res["meta_info"]["input_token_logprobs"][1:]]
        results.append((-torch.tensor(logprobs).mean().item(), res["output_ids"]))
    (nll_native, out_native), (nll_torch, out_torch) = results
    assert abs(nll_native - nll_torch) < 0.005 * nll_torch
    assert out_native[0] == out_torch[0]
