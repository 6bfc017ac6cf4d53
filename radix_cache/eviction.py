"""Eviction policies: each maps a node to a sort key; the smallest key is evicted first."""

from __future__ import annotations

from typing import Protocol

from radixlm.radix_cache.node import TreeNode


class EvictionPolicy(Protocol):
    def priority(self, node: TreeNode) -> tuple: ...


class LRUPolicy:
    """Least recently used first."""

    def priority(self, node: TreeNode) -> tuple:
        return (node.last_access, node.id)


class LFUPolicy:
    """Least frequently hit first; ties broken by least recent use."""

    def priority(self, node: TreeNode) -> tuple:
        return (node.hit_count, node.last_access, node.id)


POLICIES: dict[str, type] = {"lru": LRUPolicy, "lfu": LFUPolicy}


def make_policy(name: str) -> EvictionPolicy:
    if name not in POLICIES:
        raise ValueError(f"eviction_policy must be one of {sorted(POLICIES)}, got {name!r}")
    return POLICIES[name]()
