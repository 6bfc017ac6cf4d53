"""radixlm's C++ CPU kernels against their torch references. The AVX512-VNNI int4 / int8 matmuls
(cpu_quant_matmul.cpp): the packing round-trips, the outputs match the same quantized activations times the
dequantized weights, the activation quantization costs ~nothing against float activations. The decode
attention (cpu_decode_attention.cpp): matches per-request softmax attention with and without a shared
prefix, and an engine using it decodes the same greedy tokens as one on torch's ops."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlm.kernels import cpu_decode_attention as ca
from radixlm.kernels import cpu_quant_matmul as ck
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import random_model

from .conftest import TINY

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


@needs_vnni
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (16, 1)])  # G = 3, 1, 16 query heads a KV head
def test_decode_attention_matches_its_reference(dtype, d, heads):
    gen = torch.Generator().manual_seed(d)
    hq, hkv = heads
    k, v = (torch.randn(hkv, 600, d, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(5, hq, d, generator=gen).to(dtype)
    idx = torch.randint(1, 600, (5, 40), generator=gen)  # scattered slots, as a reused pool has them
    counts = torch.tensor([40, 1, 17, 33, 5])
    member = torch.tensor([True, False, True, True, False])
    for prefix in (torch.randint(1, 600, (70,), generator=gen), torch.zeros(0, dtype=torch.int64)):
        got = ca.decode_attention(q, k, v, idx, counts, prefix, member)
        want = ca.decode_attention_torch(q, k, v, idx, counts, prefix, member)
        tol = 1e-5 if dtype == torch.float32 else 2**-7
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@needs_vnni
def test_decode_attention_rejects_bad_inputs_with_a_message():
    k = torch.zeros(2, 10, 32)
    q, idx, counts = torch.zeros(1, 4, 32), torch.zeros(1, 3, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    none, member = torch.zeros(0, dtype=torch.int64), torch.zeros(1, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="head dim must be 64 or 128, got 32"):
        ca.decode_attention(q, k, k, idx, counts, none, member)
    with pytest.raises(RuntimeError, match="idx must be a contiguous int64"):
        ca.decode_attention(torch.zeros(1, 4, 64), torch.zeros(2, 10, 64), torch.zeros(2, 10, 64), idx.int(),
                            counts, none, member)


@needs_vnni
def test_engine_on_the_cpu_kernels_decodes_like_torch_ops():
    """float32, head dim 64, int8 weights: greedy tokens of single requests, a batch and a shared prefix."""
    cfg = dataclasses.replace(TINY, num_heads=2, num_kv_heads=1, head_dim=64)
    greedy = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    prefix = list(range(3, 70))
    prompts = [[5, 6, 7], list(range(10, 60)), prefix + [1, 2], prefix + [9]]
    outs = []
    for kernels in ("auto", "torch"):
        engine = Engine.from_model(random_model(cfg, seed=0), None, quantization="int8", cpu_kernels=kernels,
                                   max_total_tokens=2048, check_invariants=True)
        assert engine.runner.backend.native_decode == (kernels == "auto")
        engine.generate(input_ids=prefix, sampling_params={**greedy, "max_new_tokens": 1})
        outs.append([r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=greedy)])
        engine.check_invariants()
    assert outs[0] == outs[1]


needs_bf16 = pytest.mark.skipif(not ca.extend_available(), reason="needs AVX512-BF16 and the built kernels")


@needs_bf16
@pytest.mark.parametrize("d", [64, 128])
def test_extend_attention_matches_its_reference(d):
    """Requests with a long cached prefix, a fresh 200-token prompt split into chunks, a short one, a single
    token; scattered slots."""
    gen = torch.Generator().manual_seed(d)
    k, v = (torch.randn(3, 3000, d, generator=gen).to(torch.bfloat16) for _ in range(2))
    seq, ext = torch.tensor([1030, 200, 70, 5]), torch.tensor([30, 200, 33, 1])
    table = torch.zeros(4, 1100, dtype=torch.int64)
    for r in range(4):
        table[r, : seq[r]] = torch.randperm(2999, generator=gen)[: seq[r]] + 1
    q = torch.randn(int(ext.sum()), 9, d, generator=gen).to(torch.bfloat16)
    got = ca.extend_attention(q, k, v, table, seq, ext)
    want = ca.extend_attention_torch(q, k, v, table, seq, ext)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)


@needs_bf16
def test_extend_attention_rejects_inconsistent_lengths():
    k = torch.zeros(1, 10, 64, dtype=torch.bfloat16)
    q = torch.zeros(3, 1, 64, dtype=torch.bfloat16)
    table = torch.zeros(1, 8, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="q has 3 rows; the requests extend by 2"):
        ca.extend_attention(q, k, k, table, torch.tensor([4]), torch.tensor([2]))
    with pytest.raises(RuntimeError, match="request 0: bad lengths"):
        ca.extend_attention(q, k, k, table, torch.tensor([2]), torch.tensor([3]))


@needs_bf16
def test_bf16_engine_on_the_cpu_kernels_scores_text_like_torch_ops(smol_files, smol_tokenizer):
    """SmolLM2 in bfloat16: prompt logprobs of a README passage, prefilled over a cached prefix (extend) and
    then decoded, agree with torch's ops: mean NLL within 0.5% and the same first greedy token (bfloat16
    sums in another order flip near-ties later on: here at the 4th token)."""
    from radixlm.runtime.model.loader import load_model

    text = open(__file__.replace("tests/test_cpu_kernels.py", "README.md")).read()[:3000]
    ids = smol_tokenizer(text)["input_ids"][:300]
    results = []
    for kernels in ("auto", "torch"):
        engine = Engine.from_model(load_model(smol_files, torch.bfloat16, progress=False), smol_tokenizer,
                                   max_total_tokens=2048, cpu_kernels=kernels)
        assert engine.runner.backend.native_extend == (kernels == "auto")
        engine.generate(input_ids=ids[:200], sampling_params={"temperature": 0, "max_new_tokens": 1})  # cached
        res = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 8},
                              return_logprob=True, logprob_start_len=0)
        logprobs = [x[0] for x in res["meta_info"]["input_token_logprobs"][1:]]
        results.append((-torch.tensor(logprobs).mean().item(), res["output_ids"]))
    (nll_native, out_native), (nll_torch, out_torch) = results
    assert abs(nll_native - nll_torch) < 0.005 * nll_torch
    assert out_native[0] == out_torch[0]


@needs_vnni
@pytest.mark.parametrize("vocab,words", [(49152, 1536), (40, 2), (100, 3), (1000, 40)])
def test_token_bitmask_kernel_matches_its_reference(vocab, words):
    """cpu_token_bitmask.cpp against apply_token_bitmask_torch: random masks, rows listed out of order, a
    bitmask narrower than the vocabulary (100 tokens, 96 bits: the last 4 masked) and wider (1000, 1280)."""
    from radixlm.kernels.token_bitmask import apply_token_bitmask, apply_token_bitmask_torch

    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (6, words), generator=gen, dtype=torch.int32)
    rows = torch.tensor([4, 0, 2, 5])
    want, got = logits.clone(), logits.clone()
    apply_token_bitmask_torch(want, bitmask, rows)
    apply_token_bitmask(got, bitmask, rows, native=True)
    assert torch.equal(got, want)
    assert torch.equal(got[1], logits[1]) and torch.isinf(got[0]).any()


@needs_vnni
def test_token_bitmask_kernel_rejects_bad_inputs_with_a_message():
    from radixlm.kernels.token_bitmask import apply_token_bitmask_cpu

    logits, bitmask = torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="row index 2 out of range for 2 rows"):
        apply_token_bitmask_cpu(logits, bitmask, torch.tensor([2]))
    with pytest.raises(RuntimeError, match="one row per logits row"):
        apply_token_bitmask_cpu(logits, bitmask[:1], torch.tensor([0]))
    with pytest.raises(RuntimeError, match="logits must be a float32"):
        apply_token_bitmask_cpu(logits.half(), bitmask, torch.tensor([0]))


@needs_vnni
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_activation_kernels_match_their_reference(dtype):
    """cpu_norm_act.cpp: RMSNorm (float32 accumulation, one rounding), the residual add written in place
    exactly as torch's add rounds it, and silu(gate) * up equal to torch's two ops (bfloat16: bit for bit)."""
    from radixlm.kernels import cpu_norm_act as na

    gen = torch.Generator().manual_seed(1)
    for rows in (1, 7, 64):
        x = (torch.randn(rows, 576, generator=gen) * 3).to(dtype)
        residual = torch.randn(rows, 576, generator=gen).to(dtype)
        w = torch.randn(576, generator=gen).to(dtype)
        tol = 1e-6 if dtype == torch.float32 else 8e-3  # bfloat16: one rounding step apart at most
        torch.testing.assert_close(na.rms_norm(x, w, 1e-5), na.rms_norm_torch(x, w, 1e-5), rtol=tol, atol=tol)
        want, want_sum = na.add_rms_norm_torch(x, residual, w, 1e-5)
        got = na.add_rms_norm_(x, residual, w, 1e-5)
        assert torch.equal(residual, want_sum)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        gate_up = (torch.randn(rows, 3072, generator=gen) * 4).to(dtype)
        got, want = na.silu_mul(gate_up), na.silu_mul_torch(gate_up)
        if dtype == torch.bfloat16:
            assert torch.equal(got, want)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@needs_vnni
def test_norm_and_activation_kernels_reject_bad_inputs_with_a_message():
    from radixlm.kernels import cpu_norm_act as na

    with pytest.raises(RuntimeError, match="H a multiple of 16"):
        na.rms_norm(torch.zeros(2, 20), torch.ones(20), 1e-5)
    with pytest.raises(RuntimeError, match="weight must be"):
        na.rms_norm(torch.zeros(2, 32), torch.ones(16), 1e-5)
    with pytest.raises(RuntimeError, match="residual must be"):
        na.add_rms_norm_(torch.zeros(2, 32), torch.zeros(3, 32), torch.ones(32), 1e-5)
    with pytest.raises(RuntimeError, match="gate_up must be"):
        na.silu_mul(torch.zeros(2, 48))
