"""Hugging Face folders: config.json + *.safetensors (sharded too) + tokenizer files."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator

import torch

from radixlm.runtime.config import SUPPORTED_ARCHITECTURES, ModelConfig
from radixlm.runtime.model.sources import ModelSource
from radixlm.runtime.model.tokenizer_files import load_tokenizer


class HFModel:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        try:
            with open(os.path.join(folder, "config.json")) as f:
                self.raw = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"model: cannot read {folder}/config.json: {e}") from e
        self.files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
        if not self.files:
            raise ValueError(f"model: no *.safetensors files in {folder}")
        self.config = config_from_hf(self.raw)

    def num_tensors(self) -> int:
        from safetensors import safe_open

        total = 0
        for path in self.files:
            with safe_open(path, "pt") as f:
                total += len(list(f.keys()))
        return total

    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import safe_open

        for path in self.files:
            try:
                with safe_open(path, "pt") as f:
                    for name in f.keys():
                        yield name, f.get_tensor(name).to(dtype)
            except Exception as e:
                if isinstance(e, ValueError) and str(e).startswith("model:"):
                    raise
                raise ValueError(f"model: corrupt safetensors file {path}: {e}") from e

    def load_tokenizer(self):
        return load_tokenizer(ModelSource("hf", self.folder))

    def light_tokenizer(self) -> None:
        return None  # a folder's tokenizer loads through transformers (no cache of radixlm's own)


def config_from_hf(raw: dict) -> ModelConfig:
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"model: unsupported architecture {arch!r} (supported: {list(SUPPORTED_ARCHITECTURES)})")
    heads = raw["num_attention_heads"]
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    rope = raw.get("rope_scaling") or None
    rope_params = raw.get("rope_parameters") or {}
    if rope is None and rope_params.get("rope_type", "default") != "default":
        rope = rope_params
    return ModelConfig(
        architecture=arch, vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"], num_layers=raw["num_hidden_layers"], num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=raw.get("rope_theta") or rope_params.get("rope_theta", 10000.0), rope_scaling=rope,
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        qkv_bias=arch == "Qwen2ForCausalLM" or raw.get("attention_bias", False),
        bos_token_id=raw.get("bos_token_id"), eos_token_ids=eos_ids,
    )
