"""The fused CPU decoder layers (one C++ op a layer, runtime/model/fused.py): used for quantized models on
radixlm's kernels, close to the same model on torch's ops, and a request's results are the same bits alone,
in a batch, from the radix cache or recomputed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine
from radixlm.runtime.model import fused as fused_module
from radixlm.runtime.model.fused import PHASES, FusedLayers
from radixlm.runtime.model.loader import random_model

from .conftest import TINY, int8_tail

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
HEAD64 = dataclasses.replace(TINY, num_heads=4, num_kv_heads=2, head_dim=64, hidden_size=128)
# 3 KV heads (as SmolLM2): a batch of one decodes 3 attention tasks, so 2 threads share the third stage by stage
THREE_KV = dataclasses.replace(TINY, num_heads=6, num_kv_heads=3, head_dim=64, hidden_size=192)
QKV_BIAS = dataclasses.replace(THREE_KV, qkv_bias=True)  # Qwen2's: added by the RoPE kernel, on every thread
HEAD128 = dataclasses.replace(TINY, num_heads=4, num_kv_heads=2, head_dim=128, hidden_size=256)  # Llama-3-8B's D
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


def engine(quantization: str = "int4", cfg=HEAD64, dtype=torch.float32, **extra) -> Engine:
    return Engine.from_model(random_model(cfg, dtype=dtype, seed=0), None, quantization=quantization,
                             max_total_tokens=4096, check_invariants=True, **extra)


def run(e: Engine, prompts, start: int = 0) -> list[dict]:
    """Greedy results with prompt logprobs from position ``start`` (the cache serves only what precedes it)."""
    out = e.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True, logprob_start_len=start)
    return out if isinstance(out, list) else [out]


def scores(result: dict) -> list:
    meta = result["meta_info"]
    return [meta["input_token_logprobs"], meta["output_token_logprobs"], result["output_ids"]]


@pytest.mark.parametrize(("quantization", "cfg"), [("int4", HEAD64), ("int8", HEAD64), ("int4", QKV_BIAS),
                                                    ("int8", HEAD128)],
                         ids=["int4", "int8", "int4-qkv-bias", "int8-head128"])
def test_quantized_models_run_fused_like_the_layer_by_layer_model(quantization, cfg):
    """The fused layers against the same model run layer by layer in Python on the same kernels (float32:
    only the rotary embedding's rounding differs, which can move an int8 activation code by one), prompt
    logprobs and greedy tokens. Such a move at one position carries into every later one through the KV
    cache: on this random model it shifted later logprobs by up to 0.03 (mean 0.006) for 2 of 8 prompts tried,
    and by under 1e-6 for the others; a wrong weight or layout shifts them by whole units."""
    fused, eager = engine(quantization, cfg), engine(quantization, cfg)
    eager.runner.fused = None
    assert fused.runner.fused is not None and engine(quantization, cfg, cpu_kernels="torch",
                                                                     deterministic=False).runner.fused is None
    prompts = [[(7 * j) % 250 for j in range(40)], [3, 4, 5]]
    for got, want in zip(run(fused, prompts), run(eager, prompts), strict=True):
        lp_got = torch.tensor([x[0] for x in got["meta_info"]["input_token_logprobs"][1:]])
        lp_want = torch.tensor([x[0] for x in want["meta_info"]["input_token_logprobs"][1:]])
        assert (lp_got - lp_want).abs().mean() < 2e-2 and (lp_got - lp_want).abs().max() < 0.1
        assert got["output_ids"] == want["output_ids"]
    fused.check_invariants()


def test_bfloat16_dense_models_run_fused_on_the_dense_kernel():
    """A dense bfloat16 model runs its matmuls on radixlm's dense kernel, fused; float32 too by default
    (deterministic), and keeps torch's matmul with --no-deterministic; a model the kernels cannot take is
    not fused."""
    dense = Engine.from_model(random_model(HEAD64, dtype=torch.bfloat16, seed=0), None, quantization="none",
                              max_total_tokens=2048)
    assert dense.runner.fused is not None and dense.runner.fused.kinds == {"dense"}
    assert dense.model.layers[0].mlp.down_proj.quant.kind == "dense"
    out = dense.generate(input_ids=[3, 4, 5, 6], sampling_params=GREEDY)
    assert len(out["output_ids"]) == GREEDY["max_new_tokens"]
    assert engine("none").model.layers[0].mlp.down_proj.quant.kind == "dense"  # float32, deterministic
    fast = engine("none", deterministic=False)
    assert fast.runner.fused is None and fast.model.layers[0].mlp.down_proj.quant is None
    assert Engine.from_model(random_model(TINY, seed=0), None, quantization="int4").runner.fused is None  # head dim 16


@pytest.mark.parametrize(("quantization", "dtype"), [("int4", torch.float32), ("int8", torch.float32),
                                                   ("int4", torch.bfloat16)])
def test_the_lm_head_in_the_call_gives_the_models_own_logits(quantization, dtype, monkeypatch):
    """With the LM head in the fused call (its float32 logits from the same op), every logprob and token is bit
    for bit what the model's own head gives on the final norm the call returns without it."""
    inside = engine(quantization, cfg=THREE_KV, dtype=dtype)
    assert inside.runner.fused.head_fused
    monkeypatch.setattr(fused_module, "_head_weights", lambda model: [])
    outside = engine(quantization, cfg=THREE_KV, dtype=dtype)
    assert not outside.runner.fused.head_fused
    prompts = [[(7 * j + 3) % 250 for j in range(40)], [5, 6, 7]]
    got, want = run(inside, prompts), run(outside, prompts)
    for g, w in zip(got, want, strict=True):
        assert scores(g) == scores(w) and g["output_ids"] == w["output_ids"]


def test_a_quantized_heads_logits_are_its_float32_sums():
    """Under bfloat16 activations a quantized LM head's logits are not rounded to bfloat16 (a logit near 20 would
    move by up to 1/16; bench_fidelity measured that rounding at a quarter of the 0.5B file's KL divergence from
    the float model): they are the kernel's sums on the rows widened to float32."""
    head = engine("int4", cfg=THREE_KV, dtype=torch.bfloat16).model.lm_head
    h = (torch.randn(3, THREE_KV.hidden_size, generator=torch.Generator().manual_seed(0)) * 8).bfloat16()
    got = head.logits(h)
    assert torch.equal(got, head.quant.matmul(h.float())[:, : head.vocab_size])
    assert not torch.equal(got, got.bfloat16().float())


@pytest.mark.parametrize("cfg", [HEAD64, THREE_KV, QKV_BIAS, HEAD128], ids=["2kv", "3kv", "3kv-bias", "head128"])
def test_a_request_is_the_same_alone_batched_cached_or_chunked(cfg):
    """Bit-identical prompt logprobs (of the last tokens) and output logprobs: alone, in a batch of mixed
    requests, after its prefix was cached by another request, and with chunked prefill of 7 tokens. With 3
    KV heads on 2 threads the request alone runs one attention task per layer on both threads, stage by
    stage, and in the batch of five its tasks run whole."""
    prefix = [(5 * j + 1) % 250 for j in range(50)]
    target, start = prefix + [3, 1, 4, 1, 5], len(prefix) + 1
    others = [[(11 * j) % 250 for j in range(n)] for n in (9, 33, 70)] + [prefix + [9, 9]]
    alone = scores(run(engine(cfg=cfg), [target], start)[0])
    batched = run(engine(cfg=cfg), [others[0], target, *others[1:]], start)
    assert scores(batched[1]) == alone
    cached = engine(cfg=cfg)
    run(cached, [prefix + [2]])  # puts the prefix in the radix tree
    hit = run(cached, [target], start)[0]
    assert hit["meta_info"]["cached_tokens"] >= len(prefix) and scores(hit) == alone
    assert scores(run(engine(cfg=cfg, chunked_prefill_size=7), [target], start)[0]) == alone


def test_the_layers_object_refuses_what_does_not_fit():
    """The C++ object takes the weights once and checks them then; a call with a bad layer count or shape is
    an error that names it, and the engine still answers afterwards."""
    e = engine()
    fused = e.runner.fused
    weights = [w for layer in e.model.layers for w in fused._layer_weights(layer)]
    pools = e.runner.pool
    rotary = e.model.rotary
    norm = e.model.norm.weight

    def make(weights, norm, heads=HEAD64.num_heads, cos=rotary.cos, head=()):
        return torch.classes.radixlm_cpu.FusedLayers(weights, norm, pools.k_buffer, pools.v_buffer, 1e-5, heads, cos,
                                                     rotary.sin, list(head))
    with pytest.raises(RuntimeError, match="tensors per layer"):
        make(weights[:-1], norm)
    with pytest.raises(RuntimeError, match="all quantized .* or all dense"):  # a dense o among int4 matrices
        o = e.model.layers[0].self_attn.o_proj.quant
        dense_o = torch.zeros(o.out_features // 16, o.in_features, 16, dtype=pools.k_buffer[0].dtype)
        make(weights[:8] + [dense_o] + weights[9:], norm)
    with pytest.raises(RuntimeError, match="shapes disagree"):
        make(weights, norm, heads=HEAD64.num_heads * 2)
    with pytest.raises(RuntimeError, match="final norm"):
        make(weights, norm[:-1])
    with pytest.raises(RuntimeError, match="rotary tables"):
        make(weights, norm, cos=rotary.cos[:, :-1])
    q = e.model.lm_head.quant
    with pytest.raises(RuntimeError, match="head: expected"):
        make(weights, norm, head=[q.data, q.scales])
    with pytest.raises(RuntimeError, match="head: the LM head takes"):  # the head of a model half as wide
        half = [q.data[:, : q.data.shape[1] // 2].contiguous(), q.scales[:, : q.scales.shape[1] // 2].contiguous()]
        make(weights, norm, head=[*half, torch.empty(0)])
    x = torch.zeros(1, HEAD64.hidden_size, dtype=pools.k_buffer[0].dtype)
    one, table = torch.ones(1, dtype=torch.long), e.runner.req_to_token.table
    pos, loc, req, ext = one - 1, one - 1, one - 1, torch.empty(0, dtype=torch.long)
    logit = torch.zeros(1, dtype=torch.long)

    def call(x=x, pos=pos, req=req, seq=one, layers=1, logit=logit):
        return fused.layers.run(x.clone(), pos, loc, table, req, seq, ext, layers, logit, fused.isa)
    with pytest.raises(RuntimeError, match="num_layers must be"):
        call(layers=HEAD64.num_layers + 1)
    with pytest.raises(RuntimeError, match="x must be"):
        call(x=x[:, :64])
    with pytest.raises(RuntimeError, match="outside the rotary tables"):
        call(pos=torch.tensor([rotary.cos.shape[0]]))
    for bad_row, bad_len in ((table.shape[0], 1), (0, 0), (0, table.shape[1] + 1)):
        with pytest.raises(RuntimeError, match="outside the table"):
            call(req=torch.tensor([bad_row]), seq=torch.tensor([bad_len]))
    for bad in ([1], [0, 0]):  # past the batch's rows; a row twice
        with pytest.raises(RuntimeError, match="logit_rows must increase"):
            call(logit=torch.tensor(bad))
    assert len(run(e, [[1, 2, 3]])[0]["output_ids"]) == GREEDY["max_new_tokens"]
    e.check_invariants()


def with_tails(e: Engine) -> Engine:
    """e (int4) with its stacked matrices' last parts in another width, as a Q4_K_M file's qkv has its v in Q6_K:
    qkv as int4 q, k and an int8 v tail, gate_up as int4 gate and an int8 up tail; the fused layers rebuilt."""
    cfg = e.model.cfg
    for layer in e.model.layers:
        for lin, rows in ((layer.self_attn.qkv_proj, cfg.num_kv_heads * cfg.head_dim),
                          (layer.mlp.gate_up_proj, cfg.intermediate_size)):
            lin.quant = int8_tail(lin.quant, rows)
    if e.runner.fused is not None:
        e.runner.fused = FusedLayers(e.model, e.runner.pool.k_buffer, e.runner.pool.v_buffer, e.runner.fused.isa)
    return e


def test_a_matrix_with_a_tail_in_another_width_runs_fused():
    """Fused, the tails' tiles write after their heads' columns and split by bytes over the threads: close to the
    same weights run layer by layer (QuantWeight.matmul), the same bits on one thread or two, and the same bits
    alone, batched or from the cache."""
    fused, eager = with_tails(engine(cfg=THREE_KV)), with_tails(engine(cfg=THREE_KV))
    eager.runner.fused = None
    assert fused.runner.fused.kinds == {"int4", "int8"}
    prefix = [(5 * j + 1) % 250 for j in range(50)]
    target, start = prefix + [3, 1, 4, 1, 5], len(prefix) + 1
    got, want = run(fused, [target])[0], run(eager, [target])[0]
    lp_got, lp_want = (torch.tensor([x[0] for x in r["meta_info"]["input_token_logprobs"][1:]]) for r in (got, want))
    assert (lp_got - lp_want).abs().mean() < 2e-2 and got["output_ids"] == want["output_ids"]
    alone = scores(run(fused, [target], start)[0])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert scores(run(with_tails(engine(cfg=THREE_KV)), [target], start)[0]) == alone
    finally:
        torch.set_num_threads(threads)
    others = [[(11 * j) % 250 for j in range(n)] for n in (9, 33)]
    assert scores(run(with_tails(engine(cfg=THREE_KV)), [others[0], target, others[1]], start)[1]) == alone
    hit = run(fused, [target], start)[0]  # its prefix is in the tree since the first run
    assert hit["meta_info"]["cached_tokens"] >= len(prefix) and scores(hit) == alone
    fused.check_invariants()


def test_the_phase_profile_times_every_phase_and_changes_no_token():
    """Profiling sums each thread's work and wait per phase of every layer over the calls since it began, and
    the tokens are those of an engine that never profiled."""
    plain, profiled = engine(), engine()
    fused = profiled.runner.fused
    fused.profile_phases(True)
    assert scores(run(profiled, [[5, 6, 7, 8]])[0]) == scores(run(plain, [[5, 6, 7, 8]])[0])
    prof = fused.phase_profile()
    assert prof.shape == (torch.get_num_threads(), 2, len(PHASES)) and prof.dtype == torch.float64
    assert bool((prof >= 0).all()) and bool((prof[:, 0, PHASES.index("qkv")] > 0).all())
    assert prof[0, 0, PHASES.index("LM head")] > 0  # the head's, after the layers, on the calling thread
    fused.profile_phases(False)
    run(profiled, [[9, 10]])
    assert torch.equal(fused.phase_profile(), torch.zeros_like(prof))  # off: zeroed and not summed
