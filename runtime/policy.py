"""Pure scheduling policy: queue order and prefill admission, testable without a model.

Nothing here touches KV memory or tensors: inputs are plain views of the queue and numbers.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from radixlm.radix_cache import RadixCache

CLIP_MAX_NEW_TOKENS = 4096  # reservation cap for one request's future decode tokens
IN_BATCH_DEDUP_MIN = 32  # a shared uncached prefix this long makes later requests wait for the first one


@dataclass(frozen=True)
class QueueItem:
    """What the policy sees of one waiting request."""

    rid: str
    tokens: Sequence[int]
    prefix_len: int  # tokens already cached in the radix tree
    max_new_tokens: int
    priority: int = 0  # lower runs first
    arrival: float = 0.0
    namespace: Hashable = None


def order_queue(items: list[QueueItem], policy: str, now: float, max_wait_s: float = float("inf"),
                lpm_max_queue: int = 128, rng: random.Random | None = None,
                in_flight: Sequence[QueueItem] = ()) -> list[QueueItem]:
    """Return the waiting requests to consider this round, in admission order.

    Requests that waited longer than ``max_wait_s`` come first in arrival order (the aging bound), then the
    rest by priority and the policy. Cache-aware policies fall back to fcfs for long queues, and leave out
    requests whose long uncached prefix is being computed by an earlier one (``in_flight`` includes the
    chunked request): they wait a round and then hit the cache.
    """
    aged = sorted((i for i in items if now - i.arrival > max_wait_s), key=lambda i: i.arrival)
    rest = [i for i in items if now - i.arrival <= max_wait_s]
    if policy in ("lpm", "dfs-weight") and len(rest) > lpm_max_queue:
        policy = "fcfs"
    if policy == "lpm":
        rest.sort(key=lambda i: (i.priority, -i.prefix_len, i.arrival))
    elif policy == "dfs-weight":
        rest = dfs_weight_order(rest)
    if policy in ("lpm", "dfs-weight"):  # aged requests too: waiting one more round for a cache hit is cheap
        return dedup_shared_prefixes(aged + rest, in_flight=in_flight)[0]
    if policy == "fcfs":
        rest.sort(key=lambda i: (i.priority, i.arrival))
    elif policy == "lof":
        rest.sort(key=lambda i: (i.priority, -i.max_new_tokens, i.arrival))
    elif policy == "random":
        (rng or random.Random(0)).shuffle(rest)
        rest.sort(key=lambda i: i.priority)
    else:
        raise ValueError(f"schedule_policy: unknown policy {policy!r}")
    return aged + rest


def dfs_weight_order(items: list[QueueItem]) -> list[QueueItem]:
    """Depth-first over a radix tree of the waiting prompts, heavier subtrees (more requests) first.

    Requests sharing a prefix come out next to each other, biggest groups first, so a group is admitted
    together and its prefix is computed once. Priority levels are kept apart (lower first).
    """
    out: list[QueueItem] = []
    for prio in sorted({i.priority for i in items}):
        out += _dfs_one_level(sorted((i for i in items if i.priority == prio), key=lambda i: i.arrival))
    return out


def _dfs_one_level(level: list[QueueItem]) -> list[QueueItem]:
    tree = RadixCache()
    for item in level:
        tree.insert(item.tokens, [0] * len(item.tokens), item.namespace)
    ends: dict[int, list[QueueItem]] = {}
    for item in level:  # match_prefix splits nodes, so every item ends exactly at a node
        ends.setdefault(tree.match_prefix(item.tokens, item.namespace).last_node.id, []).append(item)
    weight: dict[int, int] = {}

    def count(node) -> int:
        weight[node.id] = len(ends.get(node.id, [])) + sum(count(c) for c in node.children.values())
        return weight[node.id]

    out: list[QueueItem] = []

    def visit(node) -> None:
        out.extend(ends.get(node.id, []))
        for child in sorted(node.children.values(), key=lambda c: (-weight[c.id], c.id)):
            visit(child)

    count(tree.root)
    visit(tree.root)
    return out


def dedup_shared_prefixes(items: list[QueueItem], threshold: int = IN_BATCH_DEDUP_MIN,
                          in_flight: Sequence[QueueItem] = ()) -> tuple[list[QueueItem], list[QueueItem]]:
    """Split requests into (go now, wait a round): a request that an earlier one (or the chunked request in
    flight) would give at least ``threshold`` more cached tokens than the cache gives it now waits a round,
    then hits that request's cache instead of computing the same tokens again. Measured against what is
    cached, not against zero: a chunked request's first chunk is already in the cache, and the requests
    sharing its prefix must still wait for the rest."""
    sim = RadixCache()
    for item in in_flight:
        sim.insert(item.tokens, [0] * len(item.tokens), item.namespace)
    first, later = [], []
    for item in items:
        if sim.peek_prefix_len(item.tokens, item.namespace) - item.prefix_len >= threshold:
            later.append(item)
            continue
        if len(item.tokens) - item.prefix_len >= threshold:  # only then can it give another that much
            sim.insert(item.tokens, [0] * len(item.tokens), item.namespace)
        first.append(item)
    return first, later


@dataclass
class PrefillBudget:
    """Token budgets for one prefill batch (after SGLang's PrefillAdder)."""

    rem_total: int  # KV tokens free or evictable, minus what running requests are expected to decode
    rem_input: int  # max_prefill_tokens left in this batch
    rem_chunk: int  # chunked_prefill_size left in this batch
    rem_reqs: int  # request slots left (max_running_requests - running)
    page_size: int = 1

    def admit(self, extend_len: int, max_new_tokens: int, batch_empty: bool) -> int:
        """How many of ``extend_len`` new tokens to compute now: all, a page-aligned chunk, or 0 (stop)."""
        if self.rem_reqs <= 0 or extend_len <= 0:
            return 0
        reserve = min(max_new_tokens, CLIP_MAX_NEW_TOKENS)
        if extend_len + reserve > self.rem_total:
            # it fits without reservation and nothing else runs: admit (the decode may retract later)
            if not (batch_empty and extend_len <= self.rem_total):
                return 0
            reserve = 0
        limit = min(self.rem_chunk, self.rem_input)
        if extend_len <= limit:
            n = extend_len
        else:
            n = limit - limit % self.page_size
            if n <= 0:
                return 0
        self.rem_total -= n + (reserve if n == extend_len else 0)
        self.rem_input -= n
        self.rem_chunk -= n
        self.rem_reqs -= 1
        return n
