"""The cache never changes an answer, with the embedded SmolLM2 in the default dtype (bfloat16), its int4
layers as the file holds them and dense (--quantization none): 12 chat prompts sharing a ~300-token
system prompt and 4 that share nothing. Greedy tokens and their logprobs (with the top 2) are bitwise
those of each request sent alone to a cold engine without a radix cache, without chunked prefill, with
pages of one token and no speculation; whether it ran with the cache on, in a staggered batch of 16, with
chunks of 64 tokens, pages of 16, ngram speculation, or as the second turn of a conversation."""

from __future__ import annotations

import random

import pytest

from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
LOGPROBS = {"return_logprob": True, "top_logprobs_num": 2}
WHOLE = 2048  # a chunk larger than any prompt here: no chunked prefill
TOPICS = "harbor market library bakery river station garden museum workshop theater".split()
FACTS = ["The {t} opens at {h} in the morning and closes at {k} in the evening.",
         "Visitors to the {t} are asked to sign the book by the door, which has {n} pages left.",
         "Last year the {t} counted {n} guests, most of them on rainy weekends.",
         "The keeper of the {t} is called {name}, and {name} has worked there for {h} years.",
         "A small map of the {t} hangs on the north wall, drawn in {n} colors."]
NAMES = "Ada Bruno Chiara Dmitri Elena Farid Greta Hugo Ines Jonas".split()


def document(seed: int, sentences: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(FACTS).format(t=rng.choice(TOPICS), h=rng.randint(2, 11), k=rng.randint(5, 11),
                                             n=rng.randint(3, 900), name=rng.choice(NAMES))
                    for _ in range(sentences))


def conversations() -> list[list[dict[str, str]]]:
    """12 questions about one long document (the shared prefix), 4 unrelated short chats."""
    system = {"role": "system", "content": "Answer from this town guide.\n" + document(0, 14)}
    shared = [[system, {"role": "user", "content": q.format(t=t)}]
              for q in ("When does the {t} open?", "Who keeps the {t}? Copy the sentence.") for t in TOPICS[:6]]
    alone = [[{"role": "user", "content": f"Write a line about a {t}. " + document(s, 1 + s % 3)}]
             for s, t in enumerate(TOPICS[:4], start=1)]
    return shared + alone


def make(quantization: str, **config) -> Engine:
    e = Engine(quantization=quantization, check_invariants=True, max_total_tokens=40_000,
               max_running_requests=16, **config)
    assert e.runner.invariance_gaps == [], e.runner.invariance_gaps
    return e


def answers(results: list[dict]) -> list[tuple]:
    return [(r["output_ids"], r["meta_info"]["output_token_logprobs"], r["meta_info"]["output_top_logprobs"])
            for r in results]


def batched(e: Engine, prompts: list[list[int]], order: list[int]) -> list[tuple]:
    """The prompts in batches of 16 (in ``order``), the second 8 of each arriving two steps after the first."""
    reqs = {}
    for start in range(0, len(order), 16):
        group = order[start:start + 16]
        for half in (group[:8], group[8:]):
            for i, req in zip(half, e.submit(e.build(input_ids=[prompts[i] for i in half],
                                                     sampling_params=GREEDY, **LOGPROBS)), strict=True):
                reqs[i] = req
            for _ in range(2):
                e.core.step()
        while any(r.finished is None for r in reqs.values()):
            e.core.step()
    e.check_invariants()
    return answers([e.result(reqs[i]) for i in range(len(prompts))])


@pytest.fixture(scope="module", params=["auto", "none"], ids=["int4", "dense-bf16"])
def setup(request):
    """(quantization, prompts, the reference engine, each prompt's answer alone on it)."""
    ref = make(request.param, disable_radix_cache=True, chunked_prefill_size=WHOLE)
    prompts = [ref.apply_chat_template(c) for c in conversations()]
    assert len(prompts) == 16 and min(len(p) for p in prompts[:12]) > 290  # chunks of 64 and pages of 16, several each
    alone = [answers([ref.generate(input_ids=p, sampling_params=GREEDY, **LOGPROBS)])[0] for p in prompts]
    yield request.param, prompts, ref, alone
    ref.shutdown()


def test_cache_on_alone_and_in_batches_of_16(setup):
    quantization, prompts, _, want = setup
    e = make(quantization, chunked_prefill_size=WHOLE)
    warm = [answers([e.generate(input_ids=p, sampling_params=GREEDY, **LOGPROBS)])[0] for p in prompts]
    assert warm == want  # radix cache on vs off, each request alone
    e.flush_cache()
    order = random.Random(1).sample(range(16), 16)  # shared-prefix and unrelated prompts mixed
    assert batched(e, prompts, order) == want  # alone vs in a batch of 16
    e.shutdown()


@pytest.mark.parametrize("config", [{"chunked_prefill_size": 64}, {"page_size": 16},
                                    {"speculative_algorithm": "ngram", "speculative_adaptive": False}],
                         ids=["chunk64", "page16", "ngram"])
def test_chunks_pages_and_speculation(setup, config):
    quantization, prompts, _, want = setup
    e = make(quantization, **{"chunked_prefill_size": WHOLE, **config})
    got = batched(e, prompts, list(range(16)))
    if "speculative_algorithm" in config:
        assert e.scheduler.speculation.stats["spec_accepted_tokens"] > 0, "no draft was accepted: nothing was compared"
    assert got == want
    e.shutdown()


def test_second_chat_turn_equals_the_conversation_sent_cold(setup):
    quantization, prompts, ref, _ = setup
    e = make(quantization)
    turns = conversations()[:2]
    for first in turns:
        answer = e.chat(first, GREEDY)
        second = [*first, {"role": "assistant", "content": answer["text"]},
                  {"role": "user", "content": "Say that again in other words."}]
        warm = e.chat(second, GREEDY, **LOGPROBS)
        assert warm["meta_info"]["cached_tokens"] >= answer["meta_info"]["prompt_tokens"]
        assert answers([warm]) == answers([ref.chat(second, GREEDY, **LOGPROBS)])
    e.shutdown()
