"""The embedded SmolLM2 through the Engine gives exactly transformers' greedy tokens (float32)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from radixlm.runtime.engine import Engine

from .background import Job
from .hf_reference import NEW_TOKENS, prompt_ids

pytestmark = pytest.mark.slow


def transformers_reference(job: Job):
    """hf_reference.py into the job's folder, in the background from the session's start."""
    return job.run([sys.executable, os.path.join(os.path.dirname(__file__), "hf_reference.py"), job.tmp],
                   timeout=1200)


BACKGROUND_JOBS = {"transformers reference": transformers_reference}


@pytest.fixture(scope="module")
def prompts(smol_tokenizer):
    return prompt_ids(smol_tokenizer)


@pytest.fixture(scope="module")
def hf_outputs(background) -> str:
    """The folder hf_reference.py wrote: reference.pt and hf-folder/."""
    job = background("transformers reference")
    out = job.result()
    assert out.returncode == 0, out.stderr[-3000:]
    return job.tmp


@pytest.fixture(scope="module")
def reference(hf_outputs, prompts):
    """transformers' greedy tokens (cut after EOS) and prompt logprobs, one prompt at a time."""
    saved = torch.load(os.path.join(hf_outputs, "reference.pt"))
    assert saved["prompts"] == prompts
    return saved["reference"]


def run_engine(model, tokenizer, prompts, **cfg):
    engine = Engine.from_model(model, tokenizer, check_invariants=True, **cfg)
    res = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS},
                          return_logprob=True, logprob_start_len=0)
    engine.check_invariants()
    return engine, res


@pytest.mark.parametrize("cfg", [{}, {"chunked_prefill_size": 64}, {"page_size": 16},
                                 {"page_size": 16, "chunked_prefill_size": 64, "disable_radix_cache": True}],
                         ids=["default", "chunk64", "page16", "page16-chunk64-noradix"])
def test_greedy_matches_transformers(smol_model_fp32, smol_tokenizer, prompts, reference, cfg):
    engine, results = run_engine(smol_model_fp32, smol_tokenizer, prompts, **cfg)
    worst = 0.0
    for ids, res, (ref_gen, ref_lp) in zip(prompts, results, reference, strict=True):
        assert res["output_ids"] == ref_gen, f"prompt of {len(ids)} tokens diverged"
        ours = torch.tensor([lp for lp, _ in res["meta_info"]["input_token_logprobs"][1:]])
        assert res["meta_info"]["input_token_logprobs"][0][0] is None
        diff = (ours - ref_lp).abs().max().item()
        worst = max(worst, diff)
        assert diff < 1e-3, f"prompt logprobs differ by {diff}"
    print(f"max prompt logprob difference vs transformers ({cfg}): {worst:.2e}")
    if cfg.get("chunked_prefill_size") == 64:
        assert engine.scheduler.stats["prefill_steps"] > len(prompts)


def test_hf_folder_saved_from_gguf_gives_same_tokens(hf_outputs, prompts, reference):
    """transformers' model saved as a transformers folder (sharded safetensors) loads and gives its tokens."""
    folder = os.path.join(hf_outputs, "hf-folder")
    engine = Engine(folder, dtype="float32")
    assert engine.model.cfg.architecture == "LlamaForCausalLM"
    res = engine.generate(input_ids=prompts[:4], sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS})
    assert [r["output_ids"] for r in res] == [g for g, _ in reference[:4]]
