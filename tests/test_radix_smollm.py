"""Prefix reuse with the embedded SmolLM2: cached tokens are reported, outputs equal cold runs."""

from __future__ import annotations

import random

import pytest

from radixlm.runtime.engine import Engine

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0, "max_new_tokens": 24}


@pytest.fixture(scope="module")
def engine(smol_model_fp32, smol_tokenizer):
    return Engine.from_model(smol_model_fp32, smol_tokenizer, check_invariants=True)


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = "river stone light market garden window letter music winter harbor engine paper".split()
    return " ".join(rng.choice(vocab) for _ in range(n))


@pytest.mark.parametrize("page_size", [1, 16])
def test_shared_500_token_prefix_is_reused_exactly(smol_model_fp32, smol_tokenizer, page_size):
    engine = Engine.from_model(smol_model_fp32, smol_tokenizer, check_invariants=True, page_size=page_size)
    prefix = smol_tokenizer(words(520, 1), add_special_tokens=False)["input_ids"][:500]
    q1, q2 = (smol_tokenizer(" Question: " + words(12, s), add_special_tokens=False)["input_ids"] for s in (2, 3))
    engine.generate(input_ids=prefix + q1, sampling_params=GREEDY)
    warm = engine.generate(input_ids=prefix + q2, sampling_params=GREEDY)
    assert warm["meta_info"]["cached_tokens"] >= 500 - 500 % page_size
    engine.flush_cache()
    cold = engine.generate(input_ids=prefix + q2, sampling_params=GREEDY)
    assert cold["meta_info"]["cached_tokens"] == 0
    assert warm["output_ids"] == cold["output_ids"]
    engine.check_invariants()


def test_second_chat_turn_reuses_first_turn_prompt_and_answer(engine):
    turn1 = [{"role": "user", "content": "Name three colors of the rainbow."}]
    first = engine.chat(turn1, GREEDY)
    turn2 = turn1 + [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "And two more?"}]
    second = engine.chat(turn2, GREEDY)
    prompt1 = first["meta_info"]["prompt_tokens"]
    # the first turn's prompt and (most of) its answer come from the cache
    assert second["meta_info"]["cached_tokens"] >= prompt1 + len(first["output_ids"]) - 2
    engine.check_invariants()


def test_stop_strings_are_trimmed(engine):
    p = "Count with me: one, two, three, four, five, six,"
    free = engine.generate(p, {"temperature": 0, "max_new_tokens": 20})
    text = free["text"]
    stop = text.strip().split(",")[1].strip() if "," in text else text.split()[1]
    out = engine.generate(p, {"temperature": 0, "max_new_tokens": 20, "stop": [stop]})
    assert stop not in out["text"] and text.startswith(out["text"])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    chunks = list(engine.generate(p, {"temperature": 0, "max_new_tokens": 20, "stop": stop}, stream=True))
    assert "".join(c["text"] for c in chunks) == out["text"]


def test_tiny_pool_retracts_and_gives_the_same_tokens(smol_model_fp32, smol_tokenizer):
    prompts = [smol_tokenizer(words(30 + i % 7, i), add_special_tokens=False)["input_ids"] for i in range(32)]
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    big = Engine.from_model(smol_model_fp32, smol_tokenizer, check_invariants=True)
    ref = [r["output_ids"] for r in big.generate(input_ids=prompts, sampling_params=sp)]
    tiny = Engine.from_model(smol_model_fp32, smol_tokenizer, check_invariants=True, max_total_tokens=700)
    out = tiny.generate(input_ids=prompts, sampling_params=sp)
    assert tiny.scheduler.stats["retractions"] > 0
    assert [r["output_ids"] for r in out] == ref
    tiny.check_invariants()
    assert tiny.cache.tree.protected_size == 0
