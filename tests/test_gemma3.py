"""Gemma 3 270M (the catalog's GGUF, Q4_K_M): its own layer (q/k norms, four norms a layer, GeGLU, a scaled
embedding) and five sliding-window layers of every six. With float weights its greedy tokens are transformers',
on a prompt longer than the window and after a radix-cache hit past it; served over the OpenAI API with its chat
template (the file carries none: chat_templates.py), <end_of_turn> ends the turn. The file is the base model, so
its chat answers are a base model's: the test checks they are transformers' own. Skipped, saying why, where the
file is not installed (``radixlm models install gemma-3-270m``; .ci/run installs it)."""

from __future__ import annotations

import dataclasses
import os

import httpx
import pytest
import torch
import torch.nn.functional as F

from .conftest import TINY, catalog_file, transformers_greedy, transformers_reference

NAME = "gemma-3-270m"
TEXT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "data", "fidelity_text.txt")


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    """The model over the whole sequence at once, each layer's window applied as a mask -> logits [T, V]."""
    def attend(q, k, v, layer):  # q [T, Hq, D], k / v [T, Hkv, D]
        t, groups, window = q.shape[0], q.shape[1] // k.shape[1], model.cfg.window(layer)
        pos = torch.arange(t)
        mask = (pos[None, :] <= pos[:, None]) & ((pos[:, None] - pos[None, :] < window) if window else True)
        k, v = (x.repeat_interleave(groups, 1).transpose(0, 1) for x in (k, v))
        return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1).reshape(t, -1)

    with torch.inference_mode():
        return model.compute(torch.tensor(ids), torch.arange(len(ids)), attend)


def test_a_tiny_gemma_with_a_window_of_8_decodes_as_the_whole_sequence_does():
    """Random weights, a window of 8 on every other layer: chunked prefill (chunks of 8), decode, and a second
    request that hits the first one's cache past the window all give the tokens of the whole-sequence reference."""
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model.loader import random_model

    cfg = dataclasses.replace(TINY, architecture="Gemma3ForCausalLM", sliding_window=8, sliding_window_pattern=2,
                              rope_local_theta=10000.0)
    model = random_model(cfg, seed=3)
    assert cfg.window(0) == 8 and cfg.window(1) is None
    engine = Engine.from_model(model, None, max_total_tokens=512, chunked_prefill_size=8)
    first = [(7 * j + 3) % 256 for j in range(30)]
    for prompt in (first, first[:20] + [5, 9, 11]):
        want, ids = [], list(prompt)
        for _ in range(6):
            want.append(int(reference_logits(model, ids)[-1].argmax()))
            ids.append(want[-1])
        out = engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 6,
                                                                 "ignore_eos": True})
        assert out["output_ids"] == want
    assert out["meta_info"]["cached_tokens"] == 20
    engine.shutdown()
    with pytest.raises(ValueError, match="sliding-window"):
        Engine.from_model(model, None, max_total_tokens=512, enable_torch_compile=True, deterministic=False)


@pytest.fixture(scope="module")
def gemma_path():
    return catalog_file(NAME)


@pytest.fixture(scope="module")
def reference(gemma_path):
    return transformers_reference(gemma_path)


@pytest.mark.slow
def test_float_weights_give_transformers_greedy_tokens_past_the_window(gemma_path, reference):
    from radixlm.runtime.engine import Engine

    tok, model = reference
    engine = Engine(gemma_path, dtype="float32", quantization="none", max_total_tokens=4096,
                    chunked_prefill_size=256)
    assert engine.model.cfg.sliding_window == 512 and engine.model.cfg.window(5) is None
    with open(TEXT) as f:
        ids = tok(f.read())["input_ids"]
    short = tok("The capital of France is")["input_ids"]
    # 700 tokens (the window is 512), then 650 of them again with another ending: a cache hit past the window
    for prompt, cached in ((short, 0), (ids[:700], 1), (ids[:650] + ids[2000:2060], 650)):  # 1: the shared <bos>
        out = engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 12,
                                                                 "ignore_eos": True})
        assert out["output_ids"] == transformers_greedy(model, prompt, 12)
        assert out["meta_info"]["cached_tokens"] == cached
    text = engine.generate(prompt="The capital of France is", sampling_params={"temperature": 0,
                                                                               "max_new_tokens": 8})
    assert text["output_ids"] == transformers_greedy(model, short, 8)[:len(text["output_ids"])]  # the prompt got its <bos>
    engine.shutdown()


@pytest.mark.slow
def test_the_default_path_tracks_the_float_model(gemma_path, reference):
    """The file's Q4_K / Q5_0 / Q6_K / Q8_0 matrices at their widths, bfloat16: the next-token choice of the float
    model at almost every position of 400 tokens of text."""
    from radixlm.runtime.engine import Engine

    tok, model = reference
    with open(TEXT) as f:
        ids = tok(f.read())["input_ids"][:400]
    with torch.inference_mode():
        want = model(torch.tensor([ids])).logits[0, :-1].argmax(-1)
    engine = Engine(gemma_path, max_total_tokens=2048)
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1}, return_logprob=True,
                          logprob_start_len=0, top_logprobs_num=1)
    got = torch.tensor([row[0][0] for row in out["meta_info"]["input_top_logprobs"][1:]])
    assert (got == want).float().mean() > 0.9
    engine.shutdown()


@pytest.mark.slow
def test_served_with_its_chat_template(server_process, gemma_path, reference):
    tok, model = reference
    srv = server_process("--model", NAME, "--dtype", "float32", "--quantization", "none",
                         "--max-total-tokens", "2048")
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"model": "default", "messages": ask, "temperature": 0,
                                                           "max_tokens": 24}, timeout=120).json()
    ids = [2, 105, 2364, 107, *tok("What is the capital of France?", add_special_tokens=False)["input_ids"],
           106, 107, 105, 4368, 107]  # <bos><start_of_turn>user\n ... <end_of_turn>\n<start_of_turn>model\n
    assert r["usage"]["prompt_tokens"] == len(ids)
    want = transformers_greedy(model, ids, 24)
    end = want.index(106) if 106 in want else len(want)  # <end_of_turn> stops the turn
    assert r["choices"][0]["message"]["content"] == tok.decode(want[:end])
    assert r["choices"][0]["finish_reason"] == ("stop" if end < 24 else "length")
    assert srv.stop() == 0
