"""One engine's configuration, composed of its concerns; built from the flat options of Engine(**config)
and the CLI."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.config.cache import CacheConfig, SchedulerConfig
from radixlm.runtime.config.decoding import DecodingConfig, SpeculativeConfig
from radixlm.runtime.config.execution import ExecutionConfig, ParallelConfig
from radixlm.runtime.config.model import LoadConfig


@dataclass(frozen=True)
class EngineConfig:
    """Everything one engine (model runner + KV cache + scheduler) needs, by concern."""

    load: LoadConfig = field(default_factory=LoadConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if self.execution.enable_torch_compile and (self.parallel.tp_size > 1 or self.execution.device == "cuda"):
            raise ValueError("enable_torch_compile compiles the CPU decode step of one process (tp_size 1); on "
                             "CUDA decode batches replay CUDA graphs instead")
        if self.speculative.speculative_draft_model is not None and self.parallel.tp_size > 1:
            raise ValueError("speculative_draft_model is not supported with tp_size > 1 yet")
        if self.cache.kv_disk_path is not None and self.parallel.tp_size > 1:
            raise ValueError("kv_disk_path is not supported with tp_size > 1 yet (each rank holds a share of the KV)")
        page, sched = self.cache.page_size, self.scheduler
        for name in ("chunked_prefill_size", "max_prefill_tokens"):  # a prefill chunk is whole pages
            if getattr(sched, name) < page:
                raise ValueError(f"{name} must be >= page_size ({page}), got {getattr(sched, name)}")

    @classmethod
    def concerns(cls) -> dict[str, type]:
        return {f.name: f.default_factory for f in dataclasses.fields(cls)}

    @classmethod
    def from_flat(cls, **options: Any) -> EngineConfig:
        """``EngineConfig.from_flat(page_size=16, quantization="int4")``: each option goes to its concern."""
        parts: dict[str, dict[str, Any]] = {name: {} for name in cls.concerns()}
        owner = {f.name: name for name, kind in cls.concerns().items() for f in dataclasses.fields(kind)}
        for key, value in options.items():
            if key not in owner:
                raise ValueError(f"Engine: unknown option {key!r}")
            parts[owner[key]][key] = value
        return cls(**{name: kind(**parts[name]) for name, kind in cls.concerns().items()})

    def flat(self) -> dict[str, Any]:
        """The inverse of from_flat: every option by name."""
        return {k: v for name in self.concerns() for k, v in dataclasses.asdict(getattr(self, name)).items()}

    def replace(self, **options: Any) -> EngineConfig:
        return EngineConfig.from_flat(**{**self.flat(), **options})
