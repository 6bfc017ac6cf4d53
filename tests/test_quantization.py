"""Weight-only int8 / int4 quantization: the kernels against their dequantized weights, Q4_1 blocks recovered
exactly, and the quantized SmolLM2 against the float32 model on real text."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import random_model
from radixlm.runtime.model.quantization import QuantWeight, quantize_int4, quantize_model

from .conftest import TINY


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("shape", [(960, 576), (100, 64)])  # 100 rows: int4 pads N to a multiple of 16
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernels", ["torch", *cpu_ext.supported()])
def test_kernel_matches_its_dequantized_weight(kind, shape, dtype, kernels):
    """Both backends, radixlm's on every path this CPU has (never for the 100-row weight: 16-row tiles)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=gen)
    q = QuantWeight.quantize(w, kind, dtype, cpu_ext.resolve(kernels))
    vnni = kernels != "torch" and shape[0] % 16 == 0
    assert q.backend == ("native" if vnni else "torch")
    dq = q.dequantize()
    assert dq.shape == w.shape
    step = (w.abs().amax(1, keepdim=True) / 127) if kind == "int8" else (w.view(shape[0], -1, 32).aminmax(dim=-1))
    scale_err = 0 if dtype == torch.float32 else w.abs() * 2**-8  # scales are stored in the activation dtype
    if kind == "int8":
        if vnni:  # per group of 32 with a float16 d (Q8_0's form): d's rounding moves q d by <= max|w| 2^-11
            gmax = w.view(shape[0], -1, 32).abs().amax(-1).repeat_interleave(32, dim=1)
            step, scale_err = gmax / 127, gmax * 2**-11
        assert ((dq - w).abs() <= step / 2 + scale_err + 1e-6).all()  # round to nearest
    else:
        lo, hi = step
        half_code = ((hi - lo) / 15 / 2).repeat_interleave(32, dim=1)
        scale_err = 0 if dtype == torch.float32 else (w.abs() + 8 * half_code) * 2**-7  # bf16 scale and zero
        if vnni:  # float16 scale and minimum: |d q + mn| rounding <= (15 d + |mn|) 2^-11
            scale_err = (w.abs() + 60 * half_code) * 2**-10
        assert ((dq - w).abs() <= half_code * 1.001 + scale_err + 1e-6).all()
    for rows in (1, 5, 40):
        x = torch.randn(rows, shape[1], generator=gen).to(dtype)
        got = q.matmul(x)
        assert got.dtype == dtype and got.shape == (rows, shape[0])
        want = x.float() @ dq.t()
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_int4_recovers_q4_1_blocks_exactly():
    """A Q4_1 block w = d q + m whose codes span 0..15 is re-encoded without loss (GGUF files map 1:1)."""
    gen = torch.Generator().manual_seed(1)
    n, k = 32, 128
    codes = torch.randint(0, 16, (n, k), generator=gen)
    codes[:, ::32], codes[:, 1::32] = 0, 15  # every block uses its full range
    d = 2.0 ** -torch.randint(3, 8, (n, k // 32), generator=gen).float()  # exactly representable scales
    m = -torch.randint(1, 64, (n, k // 32), generator=gen).float() / 64
    w = codes.float() * d.repeat_interleave(32, 1) + m.repeat_interleave(32, 1)
    q = QuantWeight.quantize(w, "int4", torch.float32)
    assert torch.equal(q.dequantize(), w)


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
def test_a_weight_with_a_tail_multiplies_as_its_two_parts():
    """with_tail: the tail's rows after the weight's own, each in its own layout; the matmul and dequantize are the
    parts' side by side; a dense or torch-backend part, other columns or a second tail are refused by name."""
    isa = cpu_ext.resolve("auto")
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(0))
    head, tail = QuantWeight.quantize(w[:32], "int4", torch.float32, isa), QuantWeight.quantize(w[32:], "int8",
                                                                                               torch.float32, isa)
    both = head.with_tail(tail)
    assert (both.out_features, both.kinds) == (48, {"int4", "int8"})
    x = torch.randn(3, 128)
    assert torch.equal(both.matmul(x), torch.cat([head.matmul(x), tail.matmul(x)], dim=1))
    assert torch.equal(both.dequantize(), torch.cat([head.dequantize(), tail.dequantize()]))
    with pytest.raises(ValueError, match="both parts must be quantized"):
        head.with_tail(QuantWeight.tile_dense(w[32:], isa))
    with pytest.raises(ValueError, match="both parts must be quantized"):
        head.with_tail(QuantWeight.quantize(w[32:], "int8", torch.float32))  # torch's backend
    with pytest.raises(ValueError, match="128 columns"):
        head.with_tail(QuantWeight.quantize(w[32:, :64], "int8", torch.float32, isa))
    with pytest.raises(ValueError, match="no tail of its own"):
        both.with_tail(tail)
    with pytest.raises(ValueError, match="a tail"):
        both.rows(torch.tensor([0]))


def test_int4_rejects_in_features_not_divisible_by_its_group():
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize_int4(torch.randn(16, 48))


def test_bad_quantization_settings_fail_clearly():
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig.from_flat(quantization="int3")
    model = random_model(TINY, seed=3)
    with pytest.raises(ValueError, match="quantization must be one of"):
        quantize_model(model, "fp8", keep_dense=True)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("quantized_prefill", [False, True])
def test_quantized_engine_tracks_the_dense_model(kind, quantized_prefill):
    """Tiny random model: prompt log-probs stay close to the dense model's, batching does not change greedy
    tokens, the weights are really quantized (and the dense ones dropped with quantized_prefill), KV intact."""
    dense = Engine.from_model(random_model(TINY, seed=5), None, max_total_tokens=2048)
    quant = Engine.from_model(random_model(TINY, seed=5), None, max_total_tokens=2048, check_invariants=True,
                              quantization=kind, quantized_prefill=quantized_prefill)
    layer = quant.model.layers[0].mlp.gate_up_proj
    assert layer.quant is not None and layer.quant.kind == kind
    assert (layer.weight is None) == (quantized_prefill or layer.quant.backend == "native")
    assert quant.model.embed_tokens.quant.kind == "int8"
    prompts = [[(7 * i + j) % 250 for j in range(n)] for i, n in enumerate((5, 30, 70))]
    sp = {"temperature": 0, "max_new_tokens": 1}
    for p in prompts:
        want = dense.generate(input_ids=p, sampling_params=sp, return_logprob=True, logprob_start_len=0)
        got = quant.generate(input_ids=p, sampling_params=sp, return_logprob=True, logprob_start_len=0)
        lp_want = torch.tensor([x[0] for x in want["meta_info"]["input_token_logprobs"][1:]])
        lp_got = torch.tensor([x[0] for x in got["meta_info"]["input_token_logprobs"][1:]])
        assert (lp_got - lp_want).abs().mean() < (0.02 if kind == "int8" else 0.25)  # random weights: no 4-bit grid
    greedy = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    together = quant.generate(input_ids=prompts, sampling_params=greedy)
    alone = [quant.generate(input_ids=p, sampling_params=greedy) for p in prompts]
    if layer.weight is None:  # one kernel for every batch size (with dense prefill, decode batches may switch)
        assert [r["output_ids"] for r in together] == [r["output_ids"] for r in alone]
    quant.check_invariants()


def test_quantized_smollm2_keeps_the_file_precision(smol_files, smol_tokenizer):
    """The embedded GGUF is Q4_1 (layers) + Q8_0 (embedding): int4 layers + int8 head should cost nothing
    measurable. Mean negative log-likelihood of a README passage, float32 dense vs bf16 + int4."""
    from radixlm.runtime.model.loader import load_model

    text = open(__file__.replace("tests/test_quantization.py", "README.md")).read()[:3000]
    ids = smol_tokenizer(text)["input_ids"][:400]

    def nll(dtype, **cfg):
        model = load_model(smol_files, dtype, progress=False)
        engine = Engine.from_model(model, smol_tokenizer, max_total_tokens=2048, **cfg)
        res = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 1},
                              return_logprob=True, logprob_start_len=0)
        return -torch.tensor([x[0] for x in res["meta_info"]["input_token_logprobs"][1:]]).mean().item()

    base = nll(torch.float32)
    quant = nll(torch.bfloat16, quantization="int4", quantized_prefill=True)
    print(f"NLL float32 {base:.4f}, bf16 + int4 {quant:.4f}")
    assert abs(quant - base) < 0.01 * base


def test_cli_flags_for_quantization_and_true_defaults():
    """The generated CLI: --quantization takes the kinds, and bools that default to True get --no-* forms."""
    import argparse

    from radixlm.runtime.cli import add_engine_flags, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    cfg = engine_config_from_args(parser.parse_args(["--quantization", "int4", "--quantized-prefill",
                                                     "--no-jump-forward"]))
    assert (cfg.load.quantization, cfg.load.quantized_prefill, cfg.decoding.jump_forward) == ("int4", True, False)
    assert engine_config_from_args(parser.parse_args([])).decoding.jump_forward is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--quantization", "int3"])


def test_server_serves_int4_weights(shared_server):
    """The whole server over HTTP on the int4 weights --quantization auto keeps from the embedded Q4_1 file:
    a chat completion and a JSON-constrained one."""
    import json

    import httpx

    srv = shared_server
    info = httpx.get(f"{srv.url}/server_info", timeout=5).json()
    assert info["weights"] == "int4" and info["engine"]["quantization"] == "auto"
    # invariance per dimension: the defaults' kernels hold batch, cache, chunking and speculation; tensor
    # parallelism never (it sums partial products in another order): reported, with its reason
    assert info["invariant"] is True and info["invariance"] == {"batch": True, "cache": True, "chunking": True,
                                                                "speculation": True, "tp": False}
    assert info["invariance_gaps"] == [] and info["tp_invariance_gap"].startswith("tensor parallelism")
    body = {"model": "default", "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 8, "temperature": 0}
    res = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
    assert res.status_code == 200 and res.json()["usage"]["completion_tokens"] > 0
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"]}
    body |= {"max_tokens": 32, "response_format": {"type": "json_schema",
                                                   "json_schema": {"name": "c", "schema": schema}}}
    res = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
    assert res.status_code == 200
    assert set(json.loads(res.json()["choices"][0]["message"]["content"])) == {"colour"}
    assert srv.wait_idle()["running"] == 0


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
def test_q8_0_blocks_reach_the_int8_kernels_exactly():
    """Q8_0 bytes (as gguf writes them) -> QuantBlocks -> the int8 kernels' layout: the same weights as gguf's
    own dequantization, bit for bit, and int8_codes recovers the same codes from them."""
    import gguf

    from radixlm.runtime.model.gguf_blocks import QuantBlocks
    from radixlm.runtime.model.quantization import int8_codes

    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(0)).numpy() * 0.05
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    want = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(48, 128).copy())
    blocks = QuantBlocks.from_gguf(raw, "Q8_0", [48, 128])
    assert blocks.bits == 8 and torch.equal(blocks.dequantize(), want)
    quant = QuantWeight.from_int8_codes(blocks.q, blocks.d, torch.float32, cpu_ext.resolve("auto"))
    assert torch.equal(quant.dequantize(), want)
    q, d = int8_codes(want)
    assert torch.equal(q, blocks.q) and torch.equal(d, blocks.d)


def test_auto_quantization_follows_the_file(smol_files):
    from radixlm.runtime.model.loader import resolve_quantization

    cpu = torch.device("cpu")
    assert resolve_quantization("auto", smol_files, cpu)[0] == "int4"  # the embedded file's layers are Q4_1
    assert resolve_quantization("auto", None, cpu)[0] == "none"  # a model built in memory
    assert resolve_quantization("int8", smol_files, cpu)[0] == "int8"
    engine = Engine.from_model(random_model(TINY, seed=0), None, max_total_tokens=1024)
    quant = engine.model.layers[0].mlp.gate_up_proj.quant  # not quantized: dense, in the dense kernel's tiles
    assert quant is None if not cpu_ext.available() else quant.kind == "dense"


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
def test_gguf_q4_1_layers_and_q8_0_table_load_as_their_own_blocks(smol_files):
    """A Q4_1 file's layers go straight to the int4 kernels' layout, and its Q8_0 embedding table (the tied LM
    head) to the int8 kernels' (per group of 32, as Q8_0): dequantized, exactly the file's weights (Q/K rows
    un-permuted like the dense path); with torch's kernels they are dequantized first."""
    from radixlm.runtime.model.loader import load_model

    reference = load_model(smol_files, torch.float32, progress=False)  # its own: engines tile the shared one
    model = load_model(smol_files, torch.bfloat16, progress=False, quant_blocks=True)
    assert model.layers[0].self_attn.qkv_proj.blocks
    quantize_model(model, "int4", keep_dense=False, isa=cpu_ext.resolve("auto"))
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        got = model.layers[2].get_submodule(name)
        assert got.weight is None and got.blocks is None
        assert torch.equal(got.quant.dequantize(), reference.layers[2].get_submodule(name).weight)
    table = model.embed_tokens
    assert table.weight is None and table.quant.kind == "int8" and table.quant.backend == "native"
    assert torch.equal(table.quant.dequantize(), reference.embed_tokens.weight)
    ids = torch.tensor([0, 17, 49151, 2])
    assert torch.equal(table.quant.rows(ids), reference.embed_tokens.weight[ids].bfloat16())
    dense = load_model(smol_files, torch.float32, progress=False, quant_blocks=True)
    quantize_model(dense, "none", keep_dense=True)
    assert torch.equal(dense.layers[2].mlp.down_proj.weight, reference.layers[2].mlp.down_proj.weight)
