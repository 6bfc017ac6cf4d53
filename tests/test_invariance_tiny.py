"""Batch- and cache-invariance on a tiny random Llama the CPU kernels take (head dim 64): whatever the batch
around it (arrival step, neighbours, chunk size, page size, mixed chunks, speculation), whatever the cache
held before, each request's logits at every position it sampled are bitwise those of the request run alone
on a cold engine, and so are its tokens (greedy and seeded sampling with penalties)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import radixlm.runtime.execute.executor as executor_mod
import radixlm.runtime.execute.verify as verify_mod
from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import random_model

from .conftest import TINY

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
HEAD64 = dataclasses.replace(TINY, num_heads=2, num_kv_heads=1, head_dim=64, hidden_size=128,
                             max_position_embeddings=1024)
WEIGHTS = [(torch.bfloat16, "none"), (torch.float32, "none"), (torch.float32, "int4"), (torch.bfloat16, "int4")]
PREFIX = [(7 * j + 3) % 250 for j in range(90)]
# prompts: a shared prefix plus a tail (some repeat themselves, so ngram speculation drafts), or no prefix
TAILS = [[(5 * j + s) % 250 for j in range(n)] for s, n in ((1, 3), (2, 17), (3, 40), (4, 1), (5, 64))]
PROMPTS = ([PREFIX + t for t in TAILS] + [PREFIX[:45] + TAILS[2] * 2, TAILS[1] * 4, [9, 8, 7, 6, 5, 4] * 12,
                                           PREFIX[::-1][:33]])
PARAMS = [{"temperature": 0, "max_new_tokens": 12, "ignore_eos": True},
          {"temperature": 0.9, "top_p": 0.9, "seed": 7, "max_new_tokens": 12, "ignore_eos": True,
           "frequency_penalty": 0.5, "repetition_penalty": 1.2},
          {"temperature": 0.8, "top_k": 20, "min_p": 0.02, "seed": 11, "max_new_tokens": 12, "ignore_eos": True}]


@functools.cache
def engine(weights: int, page_size: int = 1, chunk: int = 1024, radix: bool = True, mixed: bool = False,
           spec: bool = False, max_prefill: int = 4096, steps: int = 1) -> Engine:
    """steps: decode_steps. Logits are captured where the executor samples; steps run back to back take their
    argmax or draw inside one call (tests/test_step_groups.py), so only their tokens are compared."""
    dtype, quantization = WEIGHTS[weights]
    extra = {"speculative_algorithm": "ngram", "speculative_num_draft_tokens": 3, "speculative_adaptive": False} \
        if spec else {}
    e = Engine.from_model(random_model(HEAD64, dtype=dtype, seed=0), None, quantization=quantization,
                          max_total_tokens=4096, page_size=page_size, chunked_prefill_size=chunk,
                          disable_radix_cache=not radix, enable_mixed_chunk=mixed, max_prefill_tokens=max_prefill,
                          check_invariants=True, decode_steps=steps, decode_group_ms=0, **extra)
    assert e.runner.invariance_gaps == [], e.runner.invariance_gaps
    return e


@contextlib.contextmanager
def captured_logits():
    """{(rid, position): logits [V]} of every row the executor samples (a step's or a speculative verify's)."""
    seen: dict[tuple, torch.Tensor] = {}
    real, real_greedy = executor_mod.sample, verify_mod._verify_greedy

    def observe(logits, reqs, cpu_isa=None):
        for row, req in enumerate(reqs):
            seen[(req.rid, len(req.output_ids))] = logits[row].clone()
        return real(logits, reqs, cpu_isa)

    def observe_greedy(rows, reqs, drafts):  # a greedy verify picks every position in one call
        out = real_greedy(rows, reqs, drafts)
        for req, r, got in zip(reqs, rows, out, strict=True):
            for j in range(len(got.tokens)):
                seen[(req.rid, len(req.output_ids) + j)] = r[j].clone()
        return out

    executor_mod.sample = verify_mod.sample = observe
    verify_mod._verify_greedy = observe_greedy
    try:
        yield seen
    finally:
        executor_mod.sample = verify_mod.sample = real
        verify_mod._verify_greedy = real_greedy


@functools.cache
def alone(weights: int, prompt: int, params: int) -> tuple[list[int], list[torch.Tensor]]:
    """The request alone on a cold engine without a radix cache: its tokens and the logits of each."""
    e = engine(weights, radix=False)
    with captured_logits() as seen:
        out = e.generate(input_ids=PROMPTS[prompt], sampling_params=PARAMS[params])
    rid = out["meta_info"]["id"]
    return out["output_ids"], [seen[(rid, pos)] for pos in range(len(out["output_ids"]))]


def run_mixed(e: Engine, arrivals: list[tuple[int, int, int]]) -> tuple[list, dict]:
    """arrivals: (steps to run before submitting, prompt, params) -> the requests and the logits seen."""
    reqs = []
    with captured_logits() as seen:
        for wait, prompt, params in arrivals:
            for _ in range(wait):
                e.core.step()
            reqs += e.submit(e.build(input_ids=PROMPTS[prompt], sampling_params=PARAMS[params]))
        while any(r.finished is None for r in reqs):
            e.core.step()
    return reqs, seen


arrival = st.tuples(st.integers(0, 3), st.integers(0, len(PROMPTS) - 1), st.integers(0, len(PARAMS) - 1))


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weights=st.integers(0, len(WEIGHTS) - 1), page_size=st.sampled_from([1, 4, 16]),
       chunk=st.sampled_from([8, 32, 1024]), radix=st.booleans(), mixed=st.booleans(), spec=st.booleans(),
       max_prefill=st.sampled_from([64, 4096]), warm=st.lists(st.integers(0, len(PROMPTS) - 1), max_size=3),
       arrivals=st.lists(arrival, min_size=1, max_size=6), steps=st.sampled_from([1, 4]))
def test_each_request_sees_the_logits_it_sees_alone(weights, page_size, chunk, radix, mixed, spec, max_prefill,
                                                    warm, arrivals, steps):
    e = engine(weights, page_size, max(chunk, page_size), radix, mixed, spec, max_prefill, steps)
    e.flush_cache()
    if warm:  # the cache holds these prompts (and their outputs) before the batch comes
        e.generate(input_ids=[PROMPTS[p] for p in warm], sampling_params=PARAMS[0])
    reqs, seen = run_mixed(e, arrivals)
    for req, (_, prompt, params) in zip(reqs, arrivals, strict=True):
        tokens, want = alone(weights, prompt, params)
        assert req.output_ids == tokens
        for pos in range(len(tokens)):
            if steps == 1 or (req.rid, pos) in seen:  # a token of a group of steps has its logits inside the call
                assert torch.equal(seen[(req.rid, pos)], want[pos]), (prompt, pos)
    e.check_invariants()


@pytest.mark.parametrize("weights", range(len(WEIGHTS)))
def test_extend_and_decode_give_the_same_logits_for_a_position(weights):
    """Prompt + its first k outputs sent as a new prompt (all extend) gives the logits decode gave for
    position k, cold and from the cache."""
    tokens, want = alone(weights, 2, 0)
    e = engine(weights, radix=False)
    for k in (1, 5, 11):
        with captured_logits() as seen:
            out = e.generate(input_ids=PROMPTS[2] + tokens[:k], sampling_params={**PARAMS[0], "max_new_tokens": 1})
        assert torch.equal(seen[(out["meta_info"]["id"], 0)], want[k])


def test_output_logprobs_are_the_same_with_speculation():
    """Greedy tokens and output logprobs (with top logprobs) from verify passes equal plain decoding's."""
    prompts = [PROMPTS[5], PROMPTS[6], PROMPTS[1]]
    kw = {"sampling_params": PARAMS[0], "return_logprob": True, "top_logprobs_num": 3}
    plain = engine(0, radix=False).generate(input_ids=prompts, **kw)
    spec = engine(0, spec=True)
    spec.flush_cache()
    fast = spec.generate(input_ids=prompts, **kw)
    assert sum(r["meta_info"].get("spec_accept_rate", 0) for r in fast) > 0  # verify passes did accept
    for a, b in zip(plain, fast, strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]
        assert a["meta_info"]["output_top_logprobs"] == b["meta_info"]["output_top_logprobs"]


def test_a_prefill_chunk_smaller_than_a_page_is_refused():
    """A chunk is whole pages: one smaller than a page could never be scheduled (the request would wait forever)."""
    for name in ("chunked_prefill_size", "max_prefill_tokens"):
        with pytest.raises(ValueError, match=f"{name} must be >= page_size \\(16\\)"):
            Engine.from_model(random_model(HEAD64, seed=0), None, page_size=16, **{name: 8})


@pytest.mark.parametrize("weights", range(len(WEIGHTS)))
def test_every_kernel_path_gives_the_same_logits(weights):
    """The whole model gives the same bits on every ISA path this CPU runs (portable, AVX2, AVX512), but
    AVX512-BF16, whose bfloat16 attention multiplies in hardware."""
    dtype, quantization = WEIGHTS[weights]
    paths = [p for p in cpu_ext.supported() if p != "avx512_bf16"]
    if len(paths) < 2:
        pytest.skip(f"this CPU runs one path only ({paths})")
    logits = []
    for path in paths:
        e = Engine.from_model(random_model(HEAD64, dtype=dtype, seed=0), None, quantization=quantization,
                              max_total_tokens=4096, cpu_kernels=path, decode_steps=1)
        with captured_logits() as seen:
            out = e.generate(input_ids=PROMPTS[:4], sampling_params=PARAMS[0])
        logits.append([seen[(r["meta_info"]["id"], pos)] for r in out for pos in range(len(r["output_ids"]))])
    assert all(torch.equal(a, b) for other in logits[1:] for a, b in zip(logits[0], other, strict=True))
