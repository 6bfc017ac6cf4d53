"""Decode steps run back to back (decode_steps): the very tokens, texts and finish reasons of one step at a time,
greedy and sampled, stops inside a group of steps, KV given back exactly, and the requests that must go one step
at a time."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine
from radixlm.runtime.execute.sampler import asked_logprobs, asking_rows
from radixlm.runtime.messages import LogprobOptions, SamplingParams
from radixlm.runtime.model.loader import random_model
from radixlm.runtime.request import Req
from radixlm.runtime.scheduler.step_groups import StepClock, steps_for

from .conftest import TINY

needs_kernels = pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
THREE_KV = dataclasses.replace(TINY, num_heads=6, num_kv_heads=3, head_dim=64, hidden_size=192)

PROMPTS = ["The capital of France is", "List three colors:", "def add(a, b):\n", "Once upon a time"]


def req(output: int = 0, logprobs: bool = False, **params) -> Req:
    r = Req("r", [5, 6, 7], SamplingParams(**{"temperature": 0, "max_new_tokens": 10, **params}),
            LogprobOptions(return_logprob=logprobs), (2,))
    r.output_ids += [9] * output
    return r


def test_which_requests_go_back_to_back():
    assert steps_for([req()], 4, 100) == 4
    assert steps_for([req(), req(max_new_tokens=3)], 4, 100) == 3  # the fewest tokens any may still take
    assert steps_for([req(output=8)], 4, 100) == 2
    assert steps_for([req()], 4, 5) == 2  # the context: 3 prompt tokens, room for 2
    assert steps_for([req()], 1, 100) == 1 and steps_for([], 4, 100) == 1
    assert steps_for([req(top_k=1, temperature=0.8)], 4, 100) == 4  # top_k 1 is greedy too
    for grouped in (req(temperature=0.7, top_p=0.9, seed=1), req(repetition_penalty=1.1), req(presence_penalty=0.5),
                    req(logit_bias={3: 1.0})):  # the call draws, penalizes and biases between its steps
        assert steps_for([req(), grouped], 4, 100) == 4
    assert steps_for([req(), req(logprobs=True)], 4, 100) == 4  # each step's logits kept for them
    assert steps_for([req(), req(min_new_tokens=2)], 4, 100) == 2  # EOS blocked for 2 more tokens: a group ends there
    assert steps_for([req(output=2, min_new_tokens=2)], 4, 100) == 4  # past min_new_tokens, EOS is not blocked


@pytest.mark.parametrize("path", [None, *(cpu_ext.PATHS.index(p) for p in cpu_ext.supported())])
def test_only_the_rows_that_asked_get_logprobs(path):
    """A batch where some requests ask for logprobs: theirs are those of their rows alone (the C++ op's or torch's),
    the others get 0.0 and no top ones, whatever order the rows come in."""
    reqs = [req(logprobs=True), req(), req(logprobs=True)]
    reqs[2].logprob = LogprobOptions(return_logprob=True, top_logprobs_num=3)
    raw, tokens = torch.randn(3, 500, generator=torch.Generator().manual_seed(0)) * 3, [4, 5, 6]
    asked = asking_rows(reqs)
    out = asked_logprobs(raw[asked], asked, tokens, reqs, path)
    alone = [asked_logprobs(raw[i:i + 1].clone(), [0], tokens[i:i + 1], [reqs[i]], path) for i in (0, 2)]
    assert out.tokens == tokens and out.logprobs[1] == 0.0 and out.top_logprobs[1] == []
    assert [out.logprobs[0], out.logprobs[2]] == [a.logprobs[0] for a in alone]
    assert out.top_logprobs[0] == [] and out.top_logprobs[2] == alone[1].top_logprobs[0]
    want = torch.log_softmax(raw, dim=-1)
    assert abs(out.logprobs[2] - want[2, 6].item()) < 1e-5
    assert [i for i, _ in out.top_logprobs[2]] == want[2].topk(3).indices.tolist()


def test_decode_steps_must_be_positive(tiny_model):
    with pytest.raises(ValueError, match="decode_steps"):
        Engine.from_model(tiny_model, decode_steps=0)
    with pytest.raises(ValueError, match="decode_group_ms"):
        Engine.from_model(tiny_model, decode_group_ms=-1.0)


def test_a_group_takes_the_steps_that_fit_its_time_budget():
    clock = StepClock(0.050)
    assert clock.fit(4) == 1  # nothing timed yet
    clock.observe(0.040, 4)  # 10 ms a step: 5 fit
    assert clock.fit(4) == 4 and clock.fit(8) == 5
    for _ in range(20):
        clock.observe(0.030, 1)
    assert clock.fit(4) == 1  # a step alone is over half the budget
    assert StepClock(0.0).fit(4) == 4  # no limit


def test_a_small_budget_keeps_steps_single_and_the_tokens_the_same(tiny_model):
    params = [{"temperature": 0.8, "seed": 3, "max_new_tokens": 12, "ignore_eos": True},
              {"temperature": 0, "max_new_tokens": 9, "ignore_eos": True}]
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    outputs = []
    for budget_ms in (1e-6, 0.0):
        engine = Engine.from_model(tiny_model, decode_group_ms=budget_ms)
        outputs.append([o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)])
        grouped = engine.scheduler.stats["grouped_decode_steps"]
        assert (grouped == 0) if budget_ms else (grouped > 0)
    assert outputs[0] == outputs[1]


@pytest.fixture(scope="module")
def one_step(smol_model_fp32, smol_tokenizer):
    return Engine.from_model(smol_model_fp32, smol_tokenizer, decode_steps=1, check_invariants=True)


def params_for(one_step: Engine) -> list[dict]:
    """Requests that end at every offset inside a group of 4 steps: by length, by a stop string, by a stop token
    (each taken from the one-step output, so that it matches mid-way), after min_new_tokens, and stop tokens
    that min_new_tokens blocks at first (the one-step output's tokens 1 and 2, greedy and sampled; and the token
    that comes first once they are no longer blocked); sampled ones
    with each filter, seeded, whose draws go in the groups too; and ones with penalties and logit bias, which the
    groups apply between their steps."""
    base = {"temperature": 0, "max_new_tokens": 23}
    first = one_step.generate(PROMPTS, base)
    stop_text = first[1]["text"][10:14]
    blocked = {**base, "min_new_tokens": 7, "stop_token_ids": first[0]["output_ids"][1:3]}
    unblocked = one_step.generate(PROMPTS[0], blocked)["output_ids"][7]  # the first token past min_new_tokens
    return [{**base, "max_new_tokens": 13},
            {**base, "stop": [stop_text]},
            {**base, "stop_token_ids": [first[2]["output_ids"][6]]},
            {**base, "min_new_tokens": 3, "max_new_tokens": 18},
            {**blocked, "stop_token_ids": [*blocked["stop_token_ids"], unblocked]},  # stops right at min_new_tokens
            {"temperature": 0.9, "seed": 6, "min_new_tokens": 5, "max_new_tokens": 14,
             "stop_token_ids": first[1]["output_ids"][1:3]},
            {"temperature": 0.8, "seed": 7, "max_new_tokens": 6},
            {"temperature": 0.7, "top_p": 0.9, "seed": 3, "max_new_tokens": 11},
            {"temperature": 1.0, "top_k": 40, "min_p": 0.05, "seed": 4, "max_new_tokens": 17},
            {**base, "repetition_penalty": 1.3, "logit_bias": {first[3]["output_ids"][2]: -100.0}},
            {"temperature": 0.9, "seed": 5, "frequency_penalty": 0.8, "presence_penalty": 0.4, "max_new_tokens": 15}]


@pytest.mark.parametrize("extra", [{}, {"max_total_tokens": 256, "page_size": 16}])
def test_back_to_back_steps_give_the_one_step_outputs(one_step, smol_model_fp32, smol_tokenizer, extra):
    params = params_for(one_step)
    prompts = (PROMPTS * 3)[:len(params)]
    expected = one_step.generate(prompts, params)
    grouped = Engine.from_model(smol_model_fp32, smol_tokenizer, decode_steps=4, decode_group_ms=0,
                                check_invariants=True, **extra)
    for _ in range(2):  # the second time over the prefixes the first left in the radix cache
        got = grouped.generate(prompts, params)
        for e, g in zip(expected, got, strict=True):
            assert g["output_ids"] == e["output_ids"] and g["text"] == e["text"]
            assert g["meta_info"]["finish_reason"] == e["meta_info"]["finish_reason"]
        alone = grouped.generate(PROMPTS[0], params[0])  # one request, all its steps in groups
        assert alone["output_ids"] == expected[0]["output_ids"]
    assert grouped.scheduler.stats["grouped_decode_steps"] > 0
    assert grouped.cache.check([]) is None
    grouped.cache.tree.check_integrity()
    assert grouped.cache.tree.protected_size == 0


def test_back_to_back_steps_give_the_one_step_logprobs(one_step, smol_model_fp32, smol_tokenizer):
    """A request asking for logprobs decodes in groups too: each step's logits are kept for them, and every token
    up to a stop gets the logprob and the top ones that a single step gives it, bit for bit."""
    params = params_for(one_step)
    prompts = (PROMPTS * 3)[:len(params)]
    asked = {"return_logprob": True, "top_logprobs_num": 3}
    expected = one_step.generate(prompts, params, **asked)
    grouped = Engine.from_model(smol_model_fp32, smol_tokenizer, decode_steps=4, decode_group_ms=0)
    got = grouped.generate(prompts, params, **asked)
    for e, g in zip(expected, got, strict=True):
        assert g["output_ids"] == e["output_ids"]
        assert len(g["meta_info"]["output_token_logprobs"]) == len(g["output_ids"])
        for key in ("output_token_logprobs", "output_top_logprobs"):
            assert g["meta_info"][key] == e["meta_info"][key]
    assert grouped.scheduler.stats["grouped_decode_steps"] > 0


@needs_kernels
def test_argmax_rows_is_torchs_argmax():
    logits = torch.randn(6, 1000)
    logits[1, 40] = logits[1, 700] = float("nan")  # the first NaN
    logits[2] = 0.0
    logits[2, 333] = logits[2, 900] = float("inf")  # the first of equal maxima
    logits[3, 999] = 50.0  # the last column
    logits[4] = float("-inf")
    logits[5, 8] = 50.0  # in the first run of 8
    assert torch.equal(torch.ops.radixlm_cpu.argmax_rows(logits, 1000), logits.argmax(-1))
    assert torch.equal(torch.ops.radixlm_cpu.argmax_rows(logits, 997), logits[:, :997].argmax(-1))  # a tail
    with pytest.raises(RuntimeError, match="cols"):
        torch.ops.radixlm_cpu.argmax_rows(logits, 1001)


def mixed_logprobs(engine: Engine, prompts: list[list[int]], params: list[dict]) -> list[dict]:
    """The prompts in one batch, every other one asking for logprobs (the first with its top 2): a group keeps
    the logits of the rows that ask alone."""
    msgs = [engine.build(input_ids=p, sampling_params=q, return_logprob=i % 2 == 0, top_logprobs_num=2 * (i == 0))[0]
            for i, (p, q) in enumerate(zip(prompts, params, strict=True))]
    reqs = engine.submit(msgs)
    while any(r.finished is None for r in reqs):
        engine.core.step()
    return [engine.result(r) for r in reqs]


@needs_kernels
@pytest.mark.parametrize(("quantization", "dtype", "in_call"), [("int4", torch.float32, True),
                                                                ("int8", torch.float32, True),
                                                                ("none", torch.bfloat16, False)])
def test_the_fused_call_runs_the_steps_as_single_steps(quantization, dtype, in_call):
    """The fused layers run a group of steps in one C++ call (the embedding, the layers, the LM head and the
    argmax or draw, step after step): the same tokens as one step at a time, every request ending where it should,
    and the same logprobs, where every request asks and where some do (a group keeps only their rows' logits). A
    dense model's head is outside the call, so its groups run a forward at a time from Python."""
    model = random_model(THREE_KV, dtype=dtype, seed=0)

    def build(steps: int) -> Engine:
        return Engine.from_model(model, None, quantization=quantization, max_total_tokens=4096, check_invariants=True,
                                 decode_steps=steps, decode_group_ms=0)

    one, grouped = build(1), build(4)
    calls = []
    in_one_call = grouped.core.executor.fused_steps
    grouped.core.executor.fused_steps = lambda *args: calls.append(in_one_call(*args)) or calls[-1]
    prompts = [[(7 * j + 3) % 250 for j in range(n)] for n in (5, 40, 17)]
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in (9, 14, 4)]
    params[2] = {**params[2], "temperature": 0.9, "top_p": 0.95, "seed": 5, "max_new_tokens": 10}
    params[0] = {**params[0], "repetition_penalty": 1.5, "frequency_penalty": 0.5, "logit_bias": {11: 3.0}}
    expected = one.generate(input_ids=prompts, sampling_params=params)
    stop = expected[1]["output_ids"][6]  # ends request 1 inside its second group
    params[1] = {**params[1], "stop_token_ids": [stop]}
    expected = one.generate(input_ids=prompts, sampling_params=params)
    got = grouped.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    asked = {"return_logprob": True, "top_logprobs_num": 2}  # each step's logits kept for them, in either form
    expected = one.generate(input_ids=prompts, sampling_params=params, **asked)
    got = grouped.generate(input_ids=prompts, sampling_params=params, **asked)
    for e, g in zip(expected, got, strict=True):
        assert g["output_ids"] == e["output_ids"]
        assert g["meta_info"]["output_token_logprobs"] == e["meta_info"]["output_token_logprobs"]
        assert g["meta_info"]["output_top_logprobs"] == e["meta_info"]["output_top_logprobs"]
    one_mixed, got = (mixed_logprobs(e, prompts, params) for e in (one, grouped))  # only rows 0 and 2 ask
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    keys = ("output_token_logprobs", "output_top_logprobs")
    assert [[g["meta_info"].get(k) for k in keys] for g in got] == [[e["meta_info"].get(k) for k in keys]
                                                                   for e in one_mixed]
    assert [len(g["meta_info"].get("output_token_logprobs", [])) for g in got] == [9, 0, 10]
    assert calls and all((c is not None) == in_call for c in calls)
    grouped.check_invariants()
    assert grouped.cache.tree.protected_size == 0
