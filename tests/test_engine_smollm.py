"""The embedded SmolLM2 through the Engine gives exactly transformers' greedy tokens (float32)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import DynamicCache

from radixlm.runtime.engine import Engine

pytestmark = pytest.mark.slow
LENGTHS = [5, 17, 60, 150, 300, 600, 1000, 1500]
NEW_TOKENS = 32
EOS = 2  # SmolLM2's <|im_end|>
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based inks and a wooden press adapted from wine making. Within decades, "
        "printing shops spread across Europe, books became cheaper, literacy rose, and new ideas in science, "
        "religion and politics travelled faster than ever before. ")


@pytest.fixture(scope="module")
def prompts(smol_tokenizer):
    ids = smol_tokenizer(TEXT * 40, add_special_tokens=False)["input_ids"]
    return [ids[i * 7: i * 7 + n] for i, n in enumerate(LENGTHS)]  # different starts and lengths


def hf_greedy(hf_model, prompts: list[list[int]]) -> list[tuple[list[int], torch.Tensor]]:
    """transformers' greedy tokens (cut after EOS) and prompt logprobs for each prompt. Each prompt's forward
    pass runs alone (no padding: it gives the prompt's logprobs and its cache); the greedy steps then run for
    all prompts at once, their caches left-padded to one length and the padding masked out (tokens equal to
    one prompt at a time, as generate() gives them)."""
    caches, logprobs, first = [], [], []
    for ids in prompts:
        x = torch.tensor([ids])
        out = hf_model(x, use_cache=True)
        logp = torch.log_softmax(out.logits[0].float(), dim=-1)
        logprobs.append(logp[:-1].gather(1, x[0, 1:].unsqueeze(1)).squeeze(1))
        first.append(int(out.logits[0, -1].argmax()))
        caches.append([layer[:2] for layer in out.past_key_values])  # (keys, values) [1, heads, len, dim]
    width = max(map(len, prompts))
    cache = DynamicCache()
    for i in range(len(caches[0])):
        keys, values = (torch.cat([F.pad(c[i][j], (0, 0, width - c[i][j].shape[2], 0)) for c in caches])
                        for j in (0, 1))
        cache.update(keys, values, i)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts])
    positions = torch.tensor([[len(ids)] for ids in prompts])
    steps = [torch.tensor(first)]
    for _ in range(NEW_TOKENS - 1):
        mask = torch.cat((mask, torch.ones(len(prompts), 1, dtype=mask.dtype)), dim=1)
        out = hf_model(steps[-1][:, None], attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True)
        steps.append(out.logits[:, -1].argmax(-1))
        positions = positions + 1
    tokens = torch.stack(steps, dim=1).tolist()
    return [(gen[:gen.index(EOS) + 1] if EOS in gen else gen, lp) for gen, lp in zip(tokens, logprobs, strict=True)]


@pytest.fixture(scope="module")
def reference(hf_model, prompts):
    """HF greedy tokens (cut after EOS) and prompt logprobs."""
    with torch.no_grad():
        return hf_greedy(hf_model, prompts)


def run_engine(model, tokenizer, prompts, **cfg):
    engine = Engine.from_model(model, tokenizer, check_invariants=True, **cfg)
    res = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS},
                          return_logprob=True, logprob_start_len=0)
    engine.check_invariants()
    return engine, res


# the defaults, and chunks, pages and no radix cache at once (test_invariance checks each of them alone
# against a run without it, token for token and logprob for logprob, in bfloat16 and int4)
@pytest.mark.parametrize("cfg", [{}, {"page_size": 16, "chunked_prefill_size": 64, "disable_radix_cache": True}],
                         ids=["default", "page16-chunk64-noradix"])
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


def test_hf_folder_saved_from_gguf_gives_same_tokens(tmp_path_factory, hf_model, smol_tokenizer, prompts, reference):
    folder = tmp_path_factory.mktemp("smol-hf")
    config = hf_model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}  # tied
    names = sorted(state)
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):  # two shards
        save_file({k: state[k] for k in part}, str(folder / f"model-0000{i + 1}-of-00002.safetensors"))
    smol_tokenizer.save_pretrained(folder)
    engine = Engine(str(folder), dtype="float32")
    assert engine.model.cfg.architecture == "LlamaForCausalLM"
    res = engine.generate(input_ids=prompts[:4], sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS})
    assert [r["output_ids"] for r in res] == [g for g, _ in reference[:4]]
