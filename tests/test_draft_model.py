"""Speculation with a separate draft model (--speculative-draft-model): the output is bitwise the target's
alone (greedy, seeded, logprobs, grammar), in a continuous batch with chunked prefill and the radix cache; a
draft whose vocabulary is not the target's is refused at start. On a tiny invariant Llama, and on the real
Qwen2.5-Coder-0.5B drafting for itself."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import random_model

from .conftest import TINY, catalog_file

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
HEAD64 = dataclasses.replace(TINY, num_heads=2, num_kv_heads=1, head_dim=64, hidden_size=128,
                             max_position_embeddings=1024)
PREFIX = [(7 * j + 3) % 250 for j in range(150)]
PROMPTS = [PREFIX + [(5 * j + s) % 250 for j in range(n)] for s, n in ((1, 3), (2, 40), (3, 90))] + [[9, 8, 7] * 20]
PARAMS = [{"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
          {"temperature": 0.9, "top_p": 0.9, "seed": 7, "max_new_tokens": 24, "ignore_eos": True,
           "frequency_penalty": 0.4}]


@functools.cache
def target():
    return random_model(HEAD64, dtype=torch.bfloat16, seed=0)


def engine(draft=None, **extra) -> Engine:
    spec = {"speculative_algorithm": "draft", "speculative_adaptive": False} if draft is not None else {}
    return Engine.from_model(target(), None, draft=draft, max_total_tokens=4096, check_invariants=True,
                             **spec, **extra)


def outputs(e: Engine, params: dict) -> list[tuple]:
    outs = e.generate(input_ids=PROMPTS, sampling_params=params, return_logprob=True, top_logprobs_num=2)
    return [(o["output_ids"], o["meta_info"]["output_token_logprobs"], o["meta_info"]["output_top_logprobs"])
            for o in outs]


@pytest.fixture(scope="module")
def alone():
    e = engine()
    yield {i: outputs(e, p) for i, p in enumerate(PARAMS)}
    e.shutdown()


@pytest.mark.parametrize("i", range(len(PARAMS)))
@pytest.mark.parametrize("draft_seed, layers", [(0, 2), (5, 1)])
def test_output_is_the_targets_alone(alone, i, draft_seed, layers):
    """A draft with the target's weights (it is always right) and a poor one: the same tokens and logprobs,
    batched, with 64-token chunks."""
    draft = random_model(dataclasses.replace(HEAD64, num_layers=layers), dtype=torch.bfloat16, seed=draft_seed)
    e = engine(draft, chunked_prefill_size=64)
    assert outputs(e, PARAMS[i]) == alone[i]
    st = e.scheduler.speculation.stats
    assert st["spec_verify_steps"] > 0
    if draft_seed == 0 and i == 0:
        assert st["spec_accepted_tokens"] == st["spec_draft_tokens"]  # greedy: the target's own argmax
    e.shutdown()


def test_the_draft_shares_cached_prefixes(alone):
    """A prefix another request computed is in the draft's pool too: the draft catches up only what is new."""
    e = engine(random_model(dataclasses.replace(HEAD64, num_layers=1), dtype=torch.bfloat16, seed=0))
    proposer = e.core.executor.draft_model
    e.generate(input_ids=PROMPTS[0], sampling_params=PARAMS[0])
    before = proposer.caught_up_tokens
    out = e.generate(input_ids=PROMPTS[1], sampling_params=PARAMS[0], return_logprob=True, top_logprobs_num=2)
    assert out["meta_info"]["cached_tokens"] >= 150
    assert proposer.caught_up_tokens - before < len(PROMPTS[1]) - 100  # not the shared 150 again
    assert out["output_ids"] == alone[0][1][0]
    e.shutdown()


def test_a_draft_of_another_vocabulary_is_refused():
    other = random_model(dataclasses.replace(HEAD64, vocab_size=300), dtype=torch.bfloat16, seed=0)
    with pytest.raises(ValueError, match="speculative_draft_model"):
        engine(other)


@pytest.fixture(scope="module")
def qwen():
    return catalog_file("qwen2.5-coder-0.5b")


def test_qwen_drafting_for_itself_is_exact(qwen):
    """The 0.5B with itself as the draft: greedy, seeded and JSON-schema answers with logprobs, token for token."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    asks = [("Write a Python function that reverses a list.", {}),
            ("Invent a person as JSON.", {"json_schema": json.dumps(schema)}),
            ("Name three colors.", {"temperature": 0.8, "seed": 3})]

    def run(e: Engine) -> list[tuple]:
        outs = [e.chat([{"role": "user", "content": q}], {"temperature": 0, "max_new_tokens": 40, **extra},
                       return_logprob=True) for q, extra in asks]
        return [(o["output_ids"], o["meta_info"]["output_token_logprobs"]) for o in outs]

    plain = Engine(qwen, max_total_tokens=2048)
    expected = run(plain)
    plain.shutdown()
    e = Engine(qwen, max_total_tokens=2048, speculative_draft_model=qwen, speculative_adaptive=False)
    assert e.config.speculative.speculative_algorithm == "draft"
    assert run(e) == expected
    st = e.scheduler.speculation.stats
    assert st["spec_accepted_tokens"] >= 0.9 * st["spec_draft_tokens"] > 0
    e.shutdown()


def test_qwen_refuses_gemmas_vocabulary(qwen):
    with pytest.raises(ValueError, match="speculative_draft_model"):
        Engine(qwen, max_total_tokens=1024, speculative_draft_model=catalog_file("gemma-3-270m"))


def test_a_request_may_choose_not_to_speculate(alone):
    e = engine(random_model(dataclasses.replace(HEAD64, num_layers=1), dtype=torch.bfloat16, seed=0))
    assert outputs(e, {**PARAMS[0], "speculative": False}) == alone[0]
    assert e.scheduler.speculation.stats["spec_draft_tokens"] == 0
    with pytest.raises(ValueError, match="sampling_params.speculative must be true, false or one of"):
        e.generate(input_ids=PROMPTS[0], sampling_params={"speculative": "no"})
    with pytest.raises(ValueError, match="sampling_params.speculative must be true, false or a method"):
        e.generate(input_ids=PROMPTS[0], sampling_params={"speculative": 3})
    e.shutdown()
    plain = engine()
    with pytest.raises(ValueError, match="sampling_params.speculative: 'suffix' needs a server started with"):
        plain.generate(input_ids=PROMPTS[0], sampling_params={"speculative": "suffix"})
    plain.shutdown()


@pytest.mark.parametrize("default", ["suffix", "draft"])
def test_each_request_speculates_with_its_own_method(alone, default):
    """One batch, each request with another method (the server's default, each named one, none), beside a
    draft model: every answer is the target's alone; the draft model ran only for the requests that use it."""
    draft = random_model(dataclasses.replace(HEAD64, num_layers=1), dtype=torch.bfloat16, seed=0)
    e = Engine.from_model(target(), None, draft=draft, max_total_tokens=4096, check_invariants=True,
                          speculative_algorithm=default, speculative_adaptive=False, chunked_prefill_size=64)
    choices = [True, "ngram", "suffix", False]  # PROMPTS[3] repeats itself: n-gram and suffix drafts find it
    params = [{**PARAMS[0], "speculative": c} for c in choices]
    outs = e.generate(input_ids=PROMPTS, sampling_params=params, return_logprob=True, top_logprobs_num=2)
    got = [(o["output_ids"], o["meta_info"]["output_token_logprobs"], o["meta_info"]["output_top_logprobs"])
           for o in outs]
    assert got == alone[0]
    assert e.scheduler.speculation.stats["spec_draft_tokens"] > 0
    drafted = e.core.executor.draft_model.caught_up_tokens  # only PROMPTS[0] (True) goes through it, as 'draft'
    assert (drafted > 0) == (default == "draft") and drafted <= len(PROMPTS[0])
    e.shutdown()


def test_a_draft_models_probes_spare_requests_it_has_not_run():
    """Where speculation measured slower, a probe with a draft model takes only requests that speculated
    before: a new one would first run its whole prompt through the draft, for a step that is only a probe."""
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.decode.speculative.policy import SpecPolicy
    from radixlm.runtime.decode.speculative.proposers import spec_state

    e = engine(random_model(dataclasses.replace(HEAD64, num_layers=1), dtype=torch.bfloat16, seed=0))
    old, new = (e.core.make_req(m) for m in e.build(input_ids=[PROMPTS[0], PROMPTS[1]], sampling_params=PARAMS[0]))
    spec_state(old).verify_steps = 3
    policy = SpecPolicy(SpeculativeConfig(speculative_algorithm="draft"), max_context=1024)
    policy.draft_model = True
    policy.pays.observe("verify", 2, 10, 1.0)
    policy.pays.observe("decode", 2, 100, 1.0)  # speculation far slower at this batch size
    plans = [policy.plan([old, new]) for _ in range(64)]
    probes = [p for p in plans if p is not None]
    assert probes and all(p[0] > 0 and p[1] == 0 for p in probes)
    policy.draft_model = False
    assert any(p is not None and p[1] > 0 for p in (policy.plan([old, new]) for _ in range(64)))
    e.shutdown()


def test_a_poor_draft_drafts_within_the_grammar(smol_model_default, smol_tokenizer):
    """A random-weight draft under a JSON schema (jump-forward off, so the schema's forced text is decoded token
    by token): every token it drafts is one the grammar allows (the executor's cut takes none away), some are
    accepted, the matcher is back where it was after each draft (else the target's mask would drift), and the
    answer is the target's alone, logprobs included."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "city": {"type": "string"}}, "required": ["name", "age", "city"]}
    params = {"temperature": 0, "max_new_tokens": 48, "json_schema": json.dumps(schema)}

    def run(e: Engine) -> tuple:
        out = e.generate("Invent a person as JSON:", params, return_logprob=True)
        return out["output_ids"], out["meta_info"]["output_token_logprobs"]

    common = {"quantization": "int4", "jump_forward": False, "check_invariants": True}
    plain = Engine.from_model(smol_model_default, smol_tokenizer, **common)
    want = run(plain)
    plain.shutdown()
    draft = random_model(dataclasses.replace(smol_model_default.cfg, num_layers=1), dtype=torch.bfloat16, seed=1)
    e = Engine.from_model(smol_model_default, smol_tokenizer, draft=draft, speculative_algorithm="draft",
                          speculative_adaptive=False, speculative_min_accept_rate=0.0, **common)
    proposer, proposed = e.core.executor.draft_model, []
    propose = proposer.propose

    def recording(reqs, ks, locs):
        out = propose(reqs, ks, locs)
        proposed.extend(len(d) for d in out)
        return out

    proposer.propose = recording
    assert run(e) == want
    st = e.scheduler.speculation.stats
    assert sum(proposed) == st["spec_draft_tokens"] > 0  # nothing the grammar forbids was drafted
    assert st["spec_accepted_tokens"] > 0  # (5 of 23 here: a draft cut at its first forbidden token had 0)
    e.shutdown()
