"""Tree nodes of the radix cache: a run of token ids and the KV slots that hold them."""

from __future__ import annotations

from collections.abc import Hashable
from itertools import count


class TreeNode:
    """One edge of the radix tree.

    Invariants:
      * ``len(key) == len(value)``; both are page-aligned when the tree's page size is > 1.
      * ``lock_ref > 0`` on a node implies ``lock_ref > 0`` on every ancestor (locks count up to the root).
      * children are keyed by ``(namespace, first page of the child's key)``.
    """

    __slots__ = ("id", "key", "value", "children", "parent", "lock_ref", "last_access", "touched", "hit_count",
                 "namespace")

    def __init__(self, node_id: int, namespace: Hashable = None) -> None:
        self.id = node_id
        self.key: list[int] = []
        self.value: list[int] = []  # KV slot index per token
        self.children: dict[tuple, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.lock_ref = 0
        self.last_access = 0  # the tree's logical clock at the last match or insert (eviction order)
        self.touched = 0.0  # ... and the wall-clock time then (time.time(), for operators)
        self.hit_count = 0
        self.namespace = namespace

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref})"


class NodeFactory:
    """Hands out node ids; one per tree so that ids are deterministic in tests."""

    def __init__(self) -> None:
        self._ids = count()

    def new(self, namespace: Hashable = None) -> TreeNode:
        return TreeNode(next(self._ids), namespace)
