"""Frozen configuration dataclasses, one per concern, a module per group of them. Each field's
``metadata["help"]`` feeds the generated CLI.

``EngineConfig`` is composed of the concerns the engine needs (weights, KV cache, scheduling, decoding,
speculation, execution, parallelism); ``EngineConfig.from_flat`` builds it from flat keyword arguments (the
``Engine(**config)`` and CLI form), every field name being unique across the concerns.
"""

from radixlm.runtime.config.cache import CacheConfig, SchedulerConfig
from radixlm.runtime.config.decoding import DecodingConfig, SpeculativeConfig
from radixlm.runtime.config.engine import EngineConfig
from radixlm.runtime.config.execution import ExecutionConfig, ParallelConfig
from radixlm.runtime.config.model import LoadConfig, ModelConfig
from radixlm.runtime.config.options import (
    ATTENTION_BACKENDS,
    CPU_KERNELS,
    DTYPES,
    QUANT_KINDS,
    ROUTER_POLICIES,
    SCHEDULE_POLICIES,
    SPECULATIVE_METHODS,
    SUPPORTED_ARCHITECTURES,
)
from radixlm.runtime.config.server import RouterConfig, ServerConfig

__all__ = ["ATTENTION_BACKENDS", "CPU_KERNELS", "DTYPES", "QUANT_KINDS", "ROUTER_POLICIES", "SCHEDULE_POLICIES",
           "SPECULATIVE_METHODS", "SUPPORTED_ARCHITECTURES", "CacheConfig", "DecodingConfig", "EngineConfig",
           "ExecutionConfig", "LoadConfig", "ModelConfig", "ParallelConfig", "RouterConfig", "SchedulerConfig",
           "ServerConfig", "SpeculativeConfig"]
