"""A radix tree over token ids whose values are KV slot indices, shared across requests.

Pure Python: values are lists of ints, so the tree can be tested without torch. The runtime converts slices
of values into index tensors when it builds a batch.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Hashable, Iterator, Sequence
from typing import NamedTuple

from radixlm.radix_cache.eviction import make_policy
from radixlm.radix_cache.node import NodeFactory, TreeNode
from radixlm.radix_cache.paging import align_down, child_key, common_prefix_len


class MatchResult(NamedTuple):
    slots: list[int]  # KV slots of the matched prefix, one per token
    last_node: TreeNode  # deepest node of the match; the match ends exactly at its end


class SizeInfo(NamedTuple):
    evictable: int  # tokens in unlocked nodes
    protected: int  # tokens in locked nodes
    total: int


class RadixCache:
    """Longest-prefix cache of KV slots.

    Invariants (checked by ``check_integrity``):
      * every node but the root has a non-empty, page-aligned key with one slot per token;
      * ``evictable + protected`` equals the sum of key lengths over all nodes;
      * a locked node has only locked ancestors; no slot appears twice in the tree.
    """

    def __init__(self, page_size: int = 1, eviction_policy: str = "lru") -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.policy = make_policy(eviction_policy)
        self.evicted_tokens = 0  # since start, across flushes
        self.reset()

    def reset(self) -> None:
        self._nodes = NodeFactory()
        self.root = self._nodes.new()
        self.root.lock_ref = 1  # the root is never evicted
        self._clock = 0
        self._now = 0.0  # wall-clock time of the last tick
        self.evictable_size = 0
        self.protected_size = 0

    # ---------------------------------------------------------------- queries
    def _tick(self) -> int:
        self._clock += 1
        self._now = time.time()
        return self._clock

    def match_prefix(self, key: Sequence[int], namespace: Hashable = None) -> MatchResult:
        """Longest cached page-aligned prefix of ``key``; splits a node so the match ends on a boundary."""
        key = key[: align_down(len(key), self.page_size)]
        node, slots, now = self.root, [], self._tick()
        while key:
            child = node.children.get(child_key(namespace, key, self.page_size))
            if child is None:
                break
            n = common_prefix_len(child.key, key, self.page_size)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access, child.touched = now, self._now
            child.hit_count += 1
            slots.extend(child.value)
            node, key = child, key[n:]
        return MatchResult(slots, node)

    def peek_prefix_len(self, key: Sequence[int], namespace: Hashable = None) -> int:
        """Length of the cached prefix of ``key`` without touching the tree (for scheduling policies)."""
        node, matched = self.root, 0
        while len(key) - matched >= self.page_size:
            child = node.children.get(child_key(namespace, key[matched:], self.page_size))
            if child is None:
                break
            n = common_prefix_len(child.key, key[matched:], self.page_size)
            matched += n
            if n < len(child.key):
                break
            node = child
        return matched

    def insert(self, key: Sequence[int], slots: Sequence[int], namespace: Hashable = None) -> int:
        """Cache ``slots`` for ``key`` (both cut to whole pages).

        Returns how many leading tokens were already cached: the caller owns ``slots[:returned]`` as
        duplicates and must free them (unless they are the very slots the tree holds).
        """
        if len(key) != len(slots):
            raise ValueError(f"insert: key has {len(key)} tokens but {len(slots)} slots")
        n_aligned = align_down(len(key), self.page_size)
        key, slots = list(key[:n_aligned]), list(slots[:n_aligned])
        node, done, now = self.root, 0, self._tick()
        while done < len(key):
            child = node.children.get(child_key(namespace, key[done:], self.page_size))
            if child is None:
                break
            n = common_prefix_len(child.key, key[done:], self.page_size)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access, child.touched = now, self._now
            done += n
            node = child
        if done < len(key):
            self._add_leaf(node, key[done:], slots[done:], namespace, now)
        return done

    # ---------------------------------------------------------------- locking
    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (reference counted)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"unlock of unlocked node {node}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node = node.parent

    # ---------------------------------------------------------------- eviction
    def evict(self, num_tokens: int) -> list[int]:
        """Free at least ``num_tokens`` slots from unlocked leaves (fewer if not enough are evictable)."""
        heap = [(self.policy.priority(n), n.id, n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while len(freed) < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            freed.extend(node.value)
            self.evicted_tokens += len(node.value)
            parent = node.parent
            del parent.children[child_key(node.namespace, node.key, self.page_size)]
            self.evictable_size -= len(node.key)
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (self.policy.priority(parent), parent.id, parent))
        return freed

    # ---------------------------------------------------------------- sizes and checks
    def sizes(self) -> SizeInfo:
        return SizeInfo(self.evictable_size, self.protected_size, self.evictable_size + self.protected_size)

    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def check_integrity(self) -> None:
        """Raise AssertionError with the first broken invariant."""
        evictable = protected = 0
        seen: set[int] = set()
        for node in self._walk():
            if node is self.root:
                continue
            assert node.key and len(node.key) == len(node.value), f"{node}: key/value mismatch"
            assert len(node.key) % self.page_size == 0, f"{node}: key not page-aligned"
            assert node.lock_ref >= 0, f"{node}: negative lock_ref"
            if node.lock_ref > 0:
                assert node.parent is self.root or node.parent.lock_ref > 0, f"{node}: locked under unlocked"
                protected += len(node.key)
            else:
                evictable += len(node.key)
            dup = seen.intersection(node.value)
            assert not dup, f"{node}: slots {sorted(dup)[:5]} appear twice"
            seen.update(node.value)
            ck = child_key(node.namespace, node.key, self.page_size)
            assert node.parent.children.get(ck) is node, f"{node}: parent does not index it"
        assert evictable == self.evictable_size, f"evictable {self.evictable_size} != recount {evictable}"
        assert protected == self.protected_size, f"protected {self.protected_size} != recount {protected}"

    def pretty_print(self) -> str:
        lines = [f"RadixCache(page_size={self.page_size}, evictable={self.evictable_size}, "
                 f"protected={self.protected_size})"]

        def visit(node: TreeNode, depth: int) -> None:
            for child in sorted(node.children.values(), key=lambda c: c.id):
                head = " ".join(map(str, child.key[:8])) + (" ..." if len(child.key) > 8 else "")
                ns = f" ns={child.namespace!r}" if child.namespace is not None else ""
                lines.append(f"{'  ' * depth}- [{len(child.key)}] {head} (lock={child.lock_ref}{ns})")
                visit(child, depth + 1)

        visit(self.root, 0)
        return "\n".join(lines)

    # ---------------------------------------------------------------- internals
    def walk(self) -> Iterator[TreeNode]:
        """Every node, the root first, each parent before its children."""
        return self._walk()

    def _walk(self) -> Iterator[TreeNode]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _leaves(self) -> Iterator[TreeNode]:
        return (n for n in self._walk() if n.is_leaf and n is not self.root)

    def _add_leaf(self, parent: TreeNode, key: list[int], slots: list[int], ns: Hashable, now: int) -> None:
        leaf = self._nodes.new(ns)
        leaf.key, leaf.value, leaf.parent, leaf.last_access, leaf.touched = key, slots, parent, now, self._now
        parent.children[child_key(ns, key, self.page_size)] = leaf
        self.evictable_size += len(key)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after ``n`` tokens; returns the new upper node (which inherits the lock count)."""
        upper = self._nodes.new(child.namespace)
        upper.key, upper.value = child.key[:n], child.value[:n]
        upper.parent, upper.lock_ref = child.parent, child.lock_ref
        upper.last_access, upper.touched, upper.hit_count = child.last_access, child.touched, child.hit_count
        child.parent.children[child_key(child.namespace, upper.key, self.page_size)] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[child_key(child.namespace, child.key, self.page_size)] = child
        return upper
