"""The KV fingerprint: what must match for K/V computed by one process to be reused by another.

The disk tier keys every page by it (radix_cache/disk/keys.py), so a restart with another model file, weight
form, dtype, kernel path or radixlm version never loads foreign KV: its keys are other keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import torch

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.model.runner import ModelRunner
from radixlm.runtime.model.weight_cache import cache_root, code_digest, file_digest

FORMAT = 1


def kv_fingerprint(runner: ModelRunner, cfg: EngineConfig, model_path: str | None) -> str:
    """32 hex digits over the model's content (its file's SHA-256, else its parameters'), the weight form and
    dtypes, the pool's layout, the kernel path and the code that computes K and V."""
    parts = {
        "format": FORMAT,
        "model": file_digest(model_path, cache_root()) if model_path and os.path.isfile(model_path)
        else _params_digest(runner.model),
        "quantization": cfg.load.quantization,
        "kv_dtype": str(runner.pool.dtype),
        "head_major": runner.pool.head_major,
        "device": runner.device.type,
        "cpu_isa": runner.cpu_isa,
        "attention": runner.backend_name,
        "fused": runner.fused is not None,
        "deterministic": cfg.execution.deterministic,
        "page_size": cfg.cache.page_size,
        "code": code_digest(),
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _params_digest(model: torch.nn.Module) -> str:
    """SHA-256 over a model's tensors (a model built in-process, without a file): its state dict and its
    layers' quantized weights, which live outside it."""
    tensors = dict(model.state_dict())
    for name, module in model.named_modules():
        quant = getattr(module, "quant", None)
        if dataclasses.is_dataclass(quant):
            for f in dataclasses.fields(quant):
                if isinstance(value := getattr(quant, f.name), torch.Tensor):
                    tensors[f"{name}.quant.{f.name}"] = value
    digest = hashlib.sha256()
    for name, t in sorted(tensors.items()):
        digest.update(name.encode() + str(t.dtype).encode() + str(tuple(t.shape)).encode())
        digest.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
