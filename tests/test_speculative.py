"""Speculative decoding: greedy outputs identical to plain decoding, the sampling distribution unchanged,
KV accounting intact after rejections, retractions and grammar cuts."""

from __future__ import annotations

import json

import pytest
import torch

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.decode.speculative.proposers import NgramProposer, spec_state
from radixlm.runtime.engine import Engine
from radixlm.runtime.messages import LogprobOptions, SamplingParams
from radixlm.runtime.model.loader import random_model
from radixlm.runtime.request import Req

DOC = ("Invoice 2291. Customer: Maria Lopez, 14 Harbour Road, Lisbon. Items: 3 lamps at 40 EUR, 2 chairs at "
       "85 EUR. Total: 290 EUR. Due: 2026-12-15. Contact: maria.lopez@example.com.")
SCHEMA = {"type": "object", "properties": {"customer": {"type": "string"}, "city": {"type": "string"},
                                           "total": {"type": "string"}, "due": {"type": "string"}},
          "required": ["customer", "city", "total", "due"]}
PROMPTS = [
    f"Copy the document exactly.\nDocument: {DOC}\nCopy: ",
    "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\n"
    "# the same functions, renamed\ndef rect_area(w, h):\n",
    "Tell me about the moon.",
    f"Extract the fields as JSON.\nDocument: {DOC}\nJSON: ",
]


def test_ngram_proposes_the_latest_continuation():
    req = Req("r", [5, 6, 7, 8, 1, 5, 6, 7, 9, 5, 6], SamplingParams(), LogprobOptions(), ())
    prop = NgramProposer(1, 3)
    assert prop.propose([req], [3]) == [[7, 9, 5]]  # "5 6" last followed by 7 9 (position 7), not 7 8
    req.output_ids += [7, 9]
    assert prop.propose([req], [2]) == [[5, 6]]  # the index grows with the output
    assert prop.propose([req], [0]) == [[]]
    assert spec_state(req).indexed == len(req.fill_ids)
    with pytest.raises(ValueError, match="1 <= min <= max"):
        NgramProposer(3, 2)


@pytest.fixture(scope="module")
def plain(smol_model_fp32, smol_tokenizer):
    return Engine.from_model(smol_model_fp32, smol_tokenizer, check_invariants=True, max_total_tokens=8192)


def run(engine: Engine, max_new: int = 48) -> list[dict]:
    sps = [{"temperature": 0, "max_new_tokens": max_new}] * 3 + [
        {"temperature": 0, "max_new_tokens": max_new, "json_schema": json.dumps(SCHEMA)}]
    return engine.generate(PROMPTS, sps)


@pytest.mark.slow
@pytest.mark.parametrize("alg, extra", [("ngram", {}), ("draft", {"speculative_draft_layers": 12}), ("suffix", {}),
                                        ("ngram", {"max_total_tokens": 320, "schedule_conservativeness": 0.1})])
def test_greedy_speculation_gives_the_plain_tokens(plain, smol_model_fp32, smol_tokenizer, alg, extra):
    expected = run(plain)
    cfg = {"check_invariants": True, "max_total_tokens": 8192, "speculative_algorithm": alg,
           "speculative_adaptive": False, **extra}  # every step verifies: nothing left uncompared
    engine = Engine.from_model(smol_model_fp32, smol_tokenizer, **cfg)
    got = run(engine)
    for e, g in zip(expected, got, strict=True):
        assert g["output_ids"] == e["output_ids"]
    st = engine.scheduler.speculation.stats
    assert st["spec_verify_steps"] > 0 and st["spec_draft_tokens"] > 0
    if alg in ("ngram", "suffix"):  # copying and code repeat the prompt: most drafts are right
        assert st["spec_accepted_tokens"] / st["spec_draft_tokens"] > 0.5
        assert got[0]["meta_info"]["spec_accept_length"] > 2
    if "max_total_tokens" in extra and extra["max_total_tokens"] < 1000:
        assert engine.scheduler.stats["retractions"] > 0  # KV pressure: speculation dropped, then retraction
    json.loads(got[3]["text"])  # the constrained output is still valid JSON
    assert engine.cache.check([]) is None
    engine.cache.tree.check_integrity()
    assert engine.cache.tree.protected_size == 0


@pytest.mark.slow
def test_requests_may_name_another_method(plain, smol_model_fp32, smol_tokenizer):
    """On a suffix-decoding server without a draft model, the copying request names 'ngram', the code one
    'draft' (the self-draft drafts for it), the third takes the default (it ends at once), the JSON one opts
    out: each answer is the plain one; the first two verified drafts, the last never did."""
    expected = run(plain)
    engine = Engine.from_model(smol_model_fp32, smol_tokenizer, check_invariants=True, max_total_tokens=8192,
                               speculative_algorithm="suffix", speculative_adaptive=False,
                               speculative_draft_layers=12)
    sps = [{"temperature": 0, "max_new_tokens": 48, "speculative": c} for c in ("ngram", "draft", True)] + [
        {"temperature": 0, "max_new_tokens": 48, "json_schema": json.dumps(SCHEMA), "speculative": False}]
    got = engine.generate(PROMPTS, sps)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    verified = ["spec_verify_ct" in g["meta_info"] for g in got]
    assert verified[:2] == [True, True] and not verified[3]
    assert engine.cache.check([]) is None


SMALL = ModelConfig(architecture="LlamaForCausalLM", vocab_size=8, hidden_size=32, intermediate_size=64,
                    num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=128,
                    tie_word_embeddings=False)


def token_counts(engine: Engine, sp: dict, n: int, positions: range) -> torch.Tensor:
    """counts[p, v]: how often token v was sampled at output position p, over n seeded samples."""
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    res = engine.generate(input_ids=[prompt] * n, sampling_params=[{**sp, "seed": s} for s in range(n)])
    counts = torch.zeros(len(positions), SMALL.vocab_size)
    for r in res:
        for i, p in enumerate(positions):
            counts[i, r["output_ids"][p]] += 1
    return counts


@pytest.mark.parametrize("sp", [{"temperature": 0.7},
                                {"temperature": 1.0, "top_p": 0.9, "frequency_penalty": 0.8, "top_k": 6}])
def test_sampling_distribution_is_unchanged(sp):
    """Two-sample chi-square test per output position: with and without ngram speculation, 3,000 samples
    each, vocabulary 8 (df = 7). We fail above 24.3, the 0.1% critical value: a correct implementation fails
    by chance once in a thousand runs per position; seeds are fixed, so this run is reproducible.
    The verifier samples each position as plain decoding does (the same draws of the request's generator)
    and keeps a draft only where it equals the sample, so a seeded request gives the very same tokens
    (tests/test_invariance_tiny.py); this checks the unseeded distribution. Power, checked by breaking the
    verifier on purpose: accepting every draft fails this test."""
    model = random_model(SMALL, seed=3)  # a spread distribution: 3 to 33% per token (10% of drafts accepted)
    sp = {**sp, "max_new_tokens": 4, "ignore_eos": True}
    plain = Engine.from_model(model, max_running_requests=256, max_total_tokens=8192)
    spec = Engine.from_model(model, max_running_requests=256, max_total_tokens=8192, check_invariants=True,
                             speculative_algorithm="ngram", speculative_ngram_min=1, speculative_ngram_max=2,
                             speculative_num_draft_tokens=3, speculative_min_accept_rate=0.0,
                             speculative_adaptive=False)
    a, b = token_counts(plain, sp, 3000, range(1, 4)), token_counts(spec, sp, 3000, range(1, 4))
    st = spec.scheduler.speculation.stats
    assert st["spec_draft_tokens"] > 3000 and 0 < st["spec_accepted_tokens"] < st["spec_draft_tokens"]
    for pos in range(3):
        total = a[pos] + b[pos]
        seen = total > 0
        expected = total[seen] / 2
        chi2 = (((a[pos][seen] - expected) ** 2 + (b[pos][seen] - expected) ** 2) / expected).sum().item()
        assert chi2 < 24.3, f"position {pos + 1}: chi2 {chi2:.1f}; {a[pos].tolist()} vs {b[pos].tolist()}"
    assert spec.cache.check([]) is None


def test_config_errors():
    with pytest.raises(ValueError, match="speculative_algorithm"):
        Engine.from_model(random_model(SMALL), speculative_algorithm="medusa")
    with pytest.raises(ValueError, match="speculative_draft_model: model: path '/x' does not exist"):
        Engine.from_model(random_model(SMALL), speculative_algorithm="draft", speculative_draft_model="/x")


@pytest.mark.slow
def test_server_reports_acceptance(server_process):
    import httpx

    srv = server_process("--speculative-algorithm", "ngram", "--max-total-tokens", "4096")
    try:
        r = httpx.post(f"{srv.url}/generate", timeout=120, json={"text": PROMPTS[0], "sampling_params": {
            "temperature": 0, "max_new_tokens": 40}}).json()
        meta = r["meta_info"]
        assert meta["spec_verify_ct"] > 0 and meta["spec_accept_length"] > 1.5, meta
        r = httpx.post(f"{srv.url}/generate", timeout=120, json={"text": PROMPTS[1], "sampling_params": {
            "temperature": 0, "max_new_tokens": 40, "speculative": "suffix"}}).json()
        assert r["meta_info"]["spec_verify_ct"] > 0
        srv.wait_idle()
        assert srv.metric("spec_accept_rate") > 0.3 and srv.metric("spec_accept_length") > 1.5
        text = httpx.get(f"{srv.url}/metrics", timeout=5).text  # each method's acceptance apart
        rates = {m: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("radixlm:spec_method_accept_rate{") for m in ("ngram", "suffix")
                 if f'method="{m}"' in line}
        assert set(rates) == {"ngram", "suffix"} and rates["ngram"] > 0.3, rates
    finally:
        srv.stop()
