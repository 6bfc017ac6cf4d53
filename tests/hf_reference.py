"""transformers' reference for the embedded SmolLM2 (float32), as a script the suite runs in the background.

``python hf_reference.py OUT`` loads the GGUF file with transformers' own loader (independent of ours) and
writes to folder OUT:
- ``reference.pt``: the prompts and, for each, transformers' greedy tokens (cut after EOS) and prompt logprobs;
- ``hf-folder/``: the model as a transformers folder (config.json, two safetensors shards, the tokenizer).
One thread: the results are bitwise those of two threads (checked on the AVX2 machine), and the job runs at
idle priority in the cores the tests leave free.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from unittest import mock

import torch

LENGTHS = [5, 17, 60, 150, 300, 600, 1000, 1500]
NEW_TOKENS = 32
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based inks and a wooden press adapted from wine making. Within decades, "
        "printing shops spread across Europe, books became cheaper, literacy rose, and new ideas in science, "
        "religion and politics travelled faster than ever before. ")
EOS = 2


def prompt_ids(tokenizer) -> list[list[int]]:
    ids = tokenizer(TEXT * 40, add_special_tokens=False)["input_ids"]
    return [ids[i * 7: i * 7 + n] for i, n in enumerate(LENGTHS)]  # different starts and lengths


def load_hf(path: str):
    """transformers' GGUF loader. Most of its time is repeated work: it parses the file twice (config, then
    weights) and rebuilds gguf's tensor-name map once per module of the model. Both are pure, so they are
    memoized for this one load; what it computes is unchanged."""
    import gguf
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(path)
    with mock.patch.object(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader)), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=4)(gguf.get_tensor_name_map)):
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def hf_greedy(hf_model, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens (cut after EOS) and prompt logprobs for one prompt: the prompt's forward pass gives both
    its logprobs and the cache the greedy steps continue from (what generate() does, without a second pass
    over the prompt)."""
    x = torch.tensor([ids])
    out = hf_model(x, use_cache=True)
    logp = torch.log_softmax(out.logits[0].float(), dim=-1)
    prompt_lp = logp[:-1].gather(1, x[0, 1:].unsqueeze(1)).squeeze(1)
    gen, cache, nxt = [], out.past_key_values, int(out.logits[0, -1].argmax())
    while True:
        gen.append(nxt)
        if nxt == EOS or len(gen) == NEW_TOKENS:
            return gen, prompt_lp
        out = hf_model(torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
        cache, nxt = out.past_key_values, int(out.logits[0, -1].argmax())


def save_folder(hf_model, tokenizer, folder: str) -> None:
    """The model as a transformers folder: config.json, the weights in two safetensors shards (the tied LM
    head left out), the tokenizer."""
    from safetensors.torch import save_file

    os.makedirs(folder)
    config = hf_model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    names = sorted(state)
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        save_file({k: state[k] for k in part}, os.path.join(folder, f"model-0000{i + 1}-of-00002.safetensors"))
    tokenizer.save_pretrained(folder)


def main(out: str) -> None:
    from radixlm.runtime.model.loader import open_model

    torch.set_num_threads(1)
    files = open_model(None)
    tokenizer = files.load_tokenizer()
    hf_model = load_hf(files.path)
    prompts = prompt_ids(tokenizer)
    with torch.no_grad():
        reference = [hf_greedy(hf_model, ids) for ids in prompts]
    torch.save({"prompts": prompts, "reference": reference}, os.path.join(out, "reference.pt"))
    save_folder(hf_model, tokenizer, os.path.join(out, "hf-folder"))


if __name__ == "__main__":
    main(sys.argv[1])
