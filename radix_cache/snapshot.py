"""A bounded view of the radix tree for operators: the nodes that hold the most tokens, and per-namespace sizes.

Pure Python and read-only (it never splits or touches a node, so looking does not change eviction order).
The cost is one walk over the tree; what it returns is bounded by ``top`` whatever the tree's size.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Hashable
from dataclasses import dataclass

from radixlm.radix_cache.node import TreeNode
from radixlm.radix_cache.tree import RadixCache

MAX_TOP = 500
MAX_DEPTH = 64
MAX_PREVIEW = 16
DEFAULT_NAMESPACE = "default"  # how the namespace None is named to operators


@dataclass(frozen=True)
class NodeView:
    """One node as an operator sees it. ``parent`` is -1 for a child of the root."""

    id: int
    parent: int
    depth: int  # 1 for a child of the root
    tokens: int  # tokens on this edge
    subtree_tokens: int  # tokens on this edge and everything below it
    hits: int  # prefix matches that went through this node
    idle_s: float  # seconds since the last match or insert that touched it
    lock_ref: int  # running requests that hold it (0: evictable)
    namespace: str
    children: int
    preview_ids: tuple[int, ...]  # the first tokens of the edge (empty when previews are off)
    tier: str = "ram"  # "ram", or "ram+disk" where the disk tier holds every whole block that ends on this edge


def namespace_name(ns: Hashable) -> str:
    return DEFAULT_NAMESPACE if ns is None else str(ns)


def check_view_args(top: int, depth: int, preview_tokens: int) -> None:
    """ValueError naming the first argument out of range."""
    for name, value, hi in (("top", top, MAX_TOP), ("depth", depth, MAX_DEPTH),
                            ("preview_tokens", preview_tokens, MAX_PREVIEW)):
        lo = 0 if name == "preview_tokens" else 1
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


def namespace_sizes(tree: RadixCache) -> dict[str, int]:
    """Tokens held per namespace (a namespace with nothing cached is absent)."""
    return tree_view(tree, 1, 1, preview_tokens=0)[1]


def top_nodes(tree: RadixCache, top: int = 50, depth: int = 8, namespace: str | None = None,
              preview_tokens: int = 8) -> list[NodeView]:
    return tree_view(tree, top, depth, namespace, preview_tokens)[0]


def tree_view(tree: RadixCache, top: int = 50, depth: int = 8, namespace: str | None = None,
              preview_tokens: int = 8) -> tuple[list[NodeView], dict[str, int]]:
    """The ``top`` nodes holding the most tokens (their own and below), no deeper than ``depth``.

    Ordered by (-subtree_tokens, depth, id): a parent's subtree is never smaller than a child's and it is
    shallower, so every chosen node's parent is chosen too, and the result draws as one tree.
    ``namespace`` keeps one namespace's nodes (by ``namespace_name``); None keeps all. Also returns the
    tokens held per namespace (from the same single walk over the tree).
    """
    check_view_args(top, depth, preview_tokens)
    subtree, depths, sizes = _walk_sizes(tree)
    candidates = (n for n in subtree if depths[n.id] <= depth
                  and (namespace is None or namespace_name(n.namespace) == namespace))
    chosen = heapq.nsmallest(top, candidates, key=lambda n: (-subtree[n], depths[n.id], n.id))
    now = time.time()
    return [NodeView(id=n.id, parent=-1 if n.parent is tree.root else n.parent.id, depth=depths[n.id],
                     tokens=len(n.key), subtree_tokens=subtree[n], hits=n.hit_count,
                     idle_s=round(max(now - n.touched, 0.0), 3), lock_ref=n.lock_ref,
                     namespace=namespace_name(n.namespace), children=len(n.children),
                     preview_ids=tuple(n.key[:preview_tokens])) for n in chosen], sizes


def _walk_sizes(tree: RadixCache) -> tuple[dict[TreeNode, int], dict[int, int], dict[str, int]]:
    """Tokens at and below every node but the root, each node's depth, and tokens per namespace
    (iterative: trees can be deep)."""
    order: list[TreeNode] = []
    depths = {tree.root.id: 0}
    sizes: dict[str, int] = {}
    for node in tree.walk():  # parents before children
        if node is not tree.root:
            depths[node.id] = depths[node.parent.id] + 1
            order.append(node)
            name = namespace_name(node.namespace)
            sizes[name] = sizes.get(name, 0) + len(node.key)
    subtree = {n: len(n.key) for n in order}
    for node in reversed(order):  # children before parents
        if node.parent is not tree.root:
            subtree[node.parent] += subtree[node]
    return subtree, depths, sizes
