"""Build the model and tokenizer from a GGUF file or HF folder, or with random weights for tests."""

from __future__ import annotations

import torch
from tqdm import tqdm

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.gguf_loader import GGUFModel
from radixlm.runtime.hf_loader import HFModel
from radixlm.runtime.layers import TPInfo
from radixlm.runtime.model_files import resolve_model
from radixlm.runtime.model_llama import LlamaForCausalLM


def open_model(model: str | None) -> GGUFModel | HFModel:
    source = resolve_model(model)
    return GGUFModel(source.path) if source.kind == "gguf" else HFModel(source.path)


def load_model(files: GGUFModel | HFModel, dtype: torch.dtype, tp: TPInfo | None = None,
               progress: bool = True) -> LlamaForCausalLM:
    cfg = files.config
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(cfg, tp)
    model = skeleton.to_empty(device="cpu").to(dtype)
    total = files.num_tensors()
    bar = tqdm(files.weights(dtype), total=total, desc="Loading weights", unit="tensor", disable=not progress)
    loaded = model.load_weights(bar)
    if len(loaded) < model.expected_weights():
        raise ValueError(f"model: checkpoint has {len(loaded)} of {model.expected_weights()} expected tensors")
    return model.eval()


def random_model(cfg: ModelConfig, dtype: torch.dtype = torch.float32, seed: int = 0) -> LlamaForCausalLM:
    """A model with small random weights, for fast unit tests."""
    gen = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(dtype)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        else:
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.08)
    return model.eval()
