"""radixlm.runtime: model loading and execution, KV memory, scheduling, and the offline Engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.runtime.engine import Engine

__all__ = ["Engine"]


def __getattr__(name: str):
    if name == "Engine":  # lazy, so `import radixlm.runtime.config` does not pull in torch and transformers
        from radixlm.runtime.engine import Engine

        return Engine
    raise AttributeError(name)
