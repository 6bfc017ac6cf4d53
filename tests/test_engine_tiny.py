"""The whole engine path on a tiny random-weight Llama: fast unit tests of sampling, stopping and errors."""

from __future__ import annotations

import asyncio
import gc
import random
import weakref

import pytest
import torch

from radixlm.runtime.engine import Engine


@pytest.fixture
def engine(tiny_model):
    e = Engine.from_model(tiny_model, None, check_invariants=True, max_total_tokens=4096)
    yield e
    e.check_invariants()


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(250) for _ in range(n)]


def test_batched_equals_one_at_a_time(engine):
    prompts = [prompt(n, n) for n in (3, 40, 7, 120)]
    greedy = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    together = engine.generate(input_ids=prompts, sampling_params=greedy)
    alone = [engine.generate(input_ids=p, sampling_params=greedy) for p in prompts]
    assert [r["output_ids"] for r in together] == [r["output_ids"] for r in alone]
    assert all(len(r["output_ids"]) == 12 for r in together)
    assert alone[1]["meta_info"]["cached_tokens"] >= 39  # the batched run cached it


def test_seeded_sampling_reproduces_and_top_k1_is_greedy(engine):
    p = prompt(20)
    sp = {"temperature": 1.0, "max_new_tokens": 16, "seed": 7, "ignore_eos": True}
    a = engine.generate(input_ids=p, sampling_params=sp)["output_ids"]
    b = engine.generate(input_ids=[p, prompt(5)], sampling_params=[sp, {"temperature": 1.0}])[0]["output_ids"]
    assert a == b
    c = engine.generate(input_ids=p, sampling_params={**sp, "seed": 8})["output_ids"]
    assert a != c
    greedy = engine.generate(input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": 16,
                                                           "ignore_eos": True})["output_ids"]
    topk1 = engine.generate(input_ids=p, sampling_params={"temperature": 1.0, "top_k": 1, "max_new_tokens": 16,
                                                          "ignore_eos": True})["output_ids"]
    assert topk1 == greedy


def test_n_samples_and_filters(engine):
    out = engine.generate(input_ids=prompt(10), sampling_params={"temperature": 1.0, "n": 4, "max_new_tokens": 8,
                                                                 "ignore_eos": True, "seed": 1})
    assert len(out) == 4 and len({tuple(o["output_ids"]) for o in out}) > 1
    out = engine.generate(input_ids=prompt(10), sampling_params={
        "temperature": 0.7, "top_p": 0.5, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.3,
        "frequency_penalty": 0.5, "presence_penalty": 0.5, "max_new_tokens": 8, "ignore_eos": True})
    assert len(out["output_ids"]) == 8


def test_min_tokens_stop_ids_and_logprobs(engine):
    p = prompt(12)
    free = engine.generate(input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": 10, "ignore_eos": True})
    stop_tok = free["output_ids"][3]
    out = engine.generate(input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": 10,
                                                        "stop_token_ids": [stop_tok]})
    assert out["output_ids"][-1] == stop_tok and len(out["output_ids"]) <= 4
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_tok}
    out = engine.generate(input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": 10, "min_new_tokens": 10,
                                                        "stop_token_ids": [stop_tok]})
    assert len(out["output_ids"]) == 10 and stop_tok not in out["output_ids"]
    out = engine.generate(input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": 3, "ignore_eos": True},
                          return_logprob=True, logprob_start_len=4, top_logprobs_num=3)
    meta = out["meta_info"]
    assert len(meta["input_token_logprobs"]) == len(p) - 4
    assert len(meta["output_token_logprobs"]) == 3 and all(lp <= 0 for lp, _ in meta["output_token_logprobs"])
    top = meta["output_top_logprobs"][0]
    assert len(top) == 3 and top[0][0] == out["output_ids"][0]  # greedy picks the top-1


def test_max_new_tokens_zero_caches_the_prompt(engine):
    p = prompt(64, 3)
    out = engine.generate(input_ids=p, sampling_params={"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"
    again = engine.generate(input_ids=p + [1, 2], sampling_params={"max_new_tokens": 1})
    assert again["meta_info"]["cached_tokens"] == 64


@pytest.mark.parametrize("params, field", [
    ({"max_new_tokens": -1}, "max_new_tokens"), ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -3}, "top_k"), ({"min_p": 2}, "min_p"),
    ({"temperature": "hot"}, "temperature"), ({"n": 0}, "n"), ({"bogus": 1}, "bogus"),
    ({"temperature": float("nan")}, "temperature"), ({"stop": [""]}, "stop"),
    ({"logit_bias": {99999: 1.0}}, "logit_bias"), ({"stop_token_ids": [99999]}, "stop_token_ids"),
])
def test_bad_sampling_params_name_the_field(engine, params, field):
    with pytest.raises(ValueError, match=field):
        engine.generate(input_ids=prompt(5), sampling_params=params)
    assert engine.generate(input_ids=prompt(5), sampling_params={"max_new_tokens": 2})["output_ids"]


def test_bad_prompts(engine):
    with pytest.raises(ValueError, match="input_ids"):
        engine.generate(input_ids=[])
    with pytest.raises(ValueError, match="prompt"):
        engine.generate(input_ids=prompt(600))  # context is 512
    with pytest.raises(ValueError, match="input_ids"):
        engine.generate(input_ids=[1, 2, 99999])
    with pytest.raises(ValueError, match="prompt"):
        engine.generate(prompt="text needs a tokenizer")
    with pytest.raises(ValueError, match="unknown option"):
        Engine.from_model(engine.model, None, max_totl_tokens=5)
    assert not engine.scheduler.has_work()


def test_abort_and_async_streaming(engine):
    async def main():
        sp = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
        stream = await engine.async_generate(input_ids=prompt(9), sampling_params=sp, stream=True)
        plain = asyncio.create_task(engine.async_generate(input_ids=prompt(30), sampling_params=sp))
        ids = []
        async for chunk in stream:
            ids += chunk["output_ids"]
        done = await plain
        return ids, done

    ids, done = asyncio.run(main())
    assert len(ids) == 20 and len(done["output_ids"]) == 20
    engine.submit(engine.build(input_ids=prompt(8), sampling_params={"max_new_tokens": 50}, rid="victim"))
    engine.core.step()
    engine.abort("victim")
    outs = engine.core.step()
    assert any(o.req.rid == "victim" and o.req.finished.type == "abort" for o in outs)
    assert not engine.scheduler.has_work()


def test_watchdog_fails_slow_steps_without_hanging(tiny_model):
    e = Engine.from_model(tiny_model, None, check_invariants=True, watchdog_timeout_s=0.0)
    out = e.generate(input_ids=[prompt(6), prompt(9, 1)], sampling_params={"max_new_tokens": 20, "ignore_eos": True})
    for o in out:
        assert o["meta_info"]["finish_reason"]["type"] == "abort"
        assert "watchdog" in o["meta_info"]["finish_reason"]["message"]
    assert not e.scheduler.has_work()
    e.check_invariants()


def test_request_table_leak_is_named(engine):
    engine.generate(input_ids=prompt(5), sampling_params={"max_new_tokens": 2})
    row = engine.runner.req_to_token.alloc()  # a row nobody owns
    with pytest.raises(RuntimeError, match="request-table leak"):
        engine.check_invariants()
    engine.runner.req_to_token.free(row)


@pytest.mark.parametrize("mixed", [True, False])
def test_mixed_chunk_decodes_inside_prefill_batches(tiny_model, mixed):
    """A long prompt prefilled in 16-token chunks while short ones decode: with mixed chunks the short ones
    decode inside those prefill batches; greedy tokens equal one-at-a-time runs either way, KV intact."""
    e = Engine.from_model(tiny_model, None, check_invariants=True, max_total_tokens=4096, chunked_prefill_size=16,
                          enable_mixed_chunk=mixed)
    prompts = [prompt(4, 1), prompt(150, 2), prompt(9, 3)]
    greedy = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    together = e.generate(input_ids=prompts, sampling_params=greedy)
    riders = e.scheduler.stats["mixed_decode_steps"]
    alone = [e.generate(input_ids=p, sampling_params=greedy) for p in prompts]
    assert [r["output_ids"] for r in together] == [r["output_ids"] for r in alone]
    assert (riders > 0) == mixed
    e.check_invariants()


def test_argmax_rows_is_torchs_argmax():
    """The sampler's greedy pick (numpy's argmax for float32 on the CPU) gives torch's argmax exactly: random
    rows, ties (the first index), NaN (counts as the maximum, the first one), all -inf, and other dtypes."""
    import torch

    from radixlm.runtime.execute.sampler import argmax_rows

    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 49152, generator=g)
    x[1, 7] = x[1, 9000] = x[1].max() + 1  # a tie
    x[2, 300], x[2, 40] = float("nan"), float("nan")
    x[3] = float("-inf")
    x[4, 5] = x[4, 6] = float("inf")
    x[5] = 0.0
    for rows in (x, x[:1], x[::2]):
        got = argmax_rows(rows)
        assert got.dtype == torch.int64 and torch.equal(got, rows.argmax(dim=-1))
    assert torch.equal(argmax_rows(x.bfloat16()), x.bfloat16().argmax(dim=-1))


def test_shutdown_frees_the_kv_pool_at_once_and_refuses_new_work(tiny_model):
    """The engine, its core and its scheduler hold one another, so only shutdown() can free the pool before the
    cycle collector runs: its tensors are gone while the engine object still lives, and new requests are refused."""
    e = Engine.from_model(tiny_model, None, max_total_tokens=4096)
    e.generate(input_ids=[1, 2, 3], sampling_params={"temperature": 0, "max_new_tokens": 2})
    pool = weakref.ref(e.runner.pool.k_buffer[0])
    gc.disable()  # what frees the pool must be shutdown() itself
    try:
        e.shutdown()
        assert pool() is None
    finally:
        gc.enable()
    with pytest.raises(RuntimeError, match="shut down"):
        e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    e.shutdown()  # twice is harmless


def test_the_kv_pool_follows_the_context_asked_for(tiny_model):
    """--max-total-tokens sets the pool; else --context-length does, as llama.cpp's -c (one whole context);
    else the memory budget over the model's bytes per token."""
    from radixlm.runtime.kv.pool import KVPool

    sized = {}
    for flat in ({"max_total_tokens": 300}, {"context_length": 200}, {"kv_cache_memory_gb": 0.001}):
        e = Engine.from_model(tiny_model, None, **flat)
        sized[next(iter(flat))] = (e.cache.alloc.capacity, e.runner.kv_sized_by, e.runner.max_context)
        e.shutdown()
    per_token = KVPool.bytes_per_token(tiny_model.cfg, torch.float32, tiny_model.cfg.num_kv_heads)
    assert sized["max_total_tokens"][:2] == (300, "max_total_tokens")
    assert sized["context_length"] == (200, "context_length", 200)
    assert sized["kv_cache_memory_gb"][:2] == (int(0.001 * 2**30 // per_token), "kv_cache_memory_gb")
