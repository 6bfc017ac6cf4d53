"""What every concern's dataclass shares: the choices fields take, the field helper whose help text feeds
the generated CLI, and the checks."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flashinfer")
SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random")
ROUTER_POLICIES = ("cache_aware", "round_robin", "shortest_queue")
QUANT_KINDS = ("none", "int8", "int4", "mixed")
SPECULATIVE_METHODS = ("suffix", "ngram", "draft")
# kernels/cpu_ext.PATHS
CPU_KERNELS = ("auto", "torch", "portable", "avx2", "avx2_vnni", "avx512", "avx512_bf16", "neon")
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Gemma3ForCausalLM")


def opt(default, help_text: str, **extra):
    return field(default=default, metadata={"help": help_text, **extra})


def check_choices(cfg: Any) -> None:
    """Every field declared with ``choices`` holds one of them."""
    for f in dataclasses.fields(cfg):
        choices = f.metadata.get("choices")
        value = getattr(cfg, f.name)
        if choices is not None and value not in choices and not (value is None and f.default is None):
            raise ValueError(f"{f.name} must be one of {choices}, got {value!r}")


def check_positive(cfg: Any, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
