"""Shared fixtures: the embedded SmolLM2 (loaded once per session), a tiny random Llama, HF references."""

from __future__ import annotations

import os

import pytest
import torch

from radixlm.runtime.config import ModelConfig

TINY = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=128,
                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5,
                   rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=True,
                   eos_token_ids=(255,))


@pytest.fixture(scope="session")
def tiny_model():
    from radixlm.runtime.weights import random_model

    return random_model(TINY, seed=0)


@pytest.fixture(scope="session")
def smol_files():
    from radixlm.runtime.weights import open_model

    return open_model(None)


@pytest.fixture(scope="session")
def smol_tokenizer(smol_files):
    return smol_files.load_tokenizer()


@pytest.fixture(scope="session")
def smol_model_fp32(smol_files):
    from radixlm.runtime.weights import load_model

    return load_model(smol_files, torch.float32, progress=False)


@pytest.fixture(scope="session")
def hf_model(smol_files):
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(smol_files.path)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
