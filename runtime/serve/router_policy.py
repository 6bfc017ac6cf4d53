"""Which data-parallel replica gets a request: pure policy, no I/O (the HTTP router calls it).

``cache_aware`` keeps, per replica, an approximate radix tree over the text of the requests the router sent
it (characters, not tokens: the router has no tokenizer). It never asks the replicas what they cache; it
forgets by LRU beyond ``max_tree_chars`` per replica, as the replica's own cache would. Where the replicas
share a disk tier (--kv-disk-path), one more tree stands for it: a prefix no replica holds in RAM but the
disk does goes to the least loaded replica, which loads it back ("disk") rather than computing it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from radixlm.radix_cache import RadixCache
from radixlm.runtime.config import RouterConfig


@dataclass
class Replica:
    url: str
    up: bool = True
    in_flight: int = 0  # requests the router sent and has not seen finish
    routed: int = 0
    tree: RadixCache = field(default_factory=RadixCache)
    next_value: int = 0  # tree values are unique placeholders: the tree's invariants hold as for KV slots


@dataclass(frozen=True)
class Decision:
    url: str
    reason: str  # "cache" | "disk" | "balance" | "low_match" | "round_robin" | "shortest_queue"
    match: float  # matched fraction of the request text on the chosen replica (cache_aware only)


class RoutingPolicy:
    def __init__(self, cfg: RouterConfig, urls: list[str], shared_disk: bool = False) -> None:
        if not urls:
            raise ValueError("router: at least one worker URL is needed")
        self.cfg = cfg
        self.replicas = {u: Replica(u) for u in urls}
        self.disk = Replica("disk") if shared_disk else None  # what the shared disk tier holds (its text)
        self._rr = itertools.count()

    def up(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.up]

    def pick(self, text: str, exclude: frozenset[str] = frozenset()) -> Decision:
        """Choose a replica for ``text`` and count it in flight; raises LookupError when none is up."""
        live = [r for r in self.up() if r.url not in exclude]
        if not live:
            raise LookupError("no replica is available")
        policy = self.cfg.router_policy
        if policy == "round_robin":
            d = Decision(live[next(self._rr) % len(live)].url, "round_robin", 0.0)
        elif policy == "shortest_queue":
            d = Decision(min(live, key=lambda r: r.in_flight).url, "shortest_queue", 0.0)
        else:
            d = self._cache_aware(text, live)
        chosen = self.replicas[d.url]
        chosen.in_flight += 1
        chosen.routed += 1
        if policy == "cache_aware":
            self._remember(chosen, text)
            if self.disk is not None:  # every replica writes its prefixes through to the shared disk
                self._remember(self.disk, text, self.cfg.max_tree_chars * len(self.replicas))
        return d

    def _cache_aware(self, text: str, live: list[Replica]) -> Decision:
        # least loaded; among equals, the one remembering the least text (spreads new prefixes over replicas)
        least = min(live, key=lambda r: (r.in_flight, r.tree.total_size()))
        most = max(r.in_flight for r in live)
        if most - least.in_flight > self.cfg.balance_abs_threshold and \
                most > least.in_flight * self.cfg.balance_rel_threshold:
            return Decision(least.url, "balance", 0.0)
        key = _key(text)
        best, best_len = least, -1
        for r in live:  # ties go to the less loaded replica
            n = r.tree.peek_prefix_len(key)
            if n > best_len or n == best_len and r.in_flight < best.in_flight:
                best, best_len = r, n
        ratio = best_len / max(len(key), 1)
        if ratio >= self.cfg.cache_threshold:
            return Decision(best.url, "cache", ratio)
        on_disk = self.disk.tree.peek_prefix_len(key) / max(len(key), 1) if self.disk is not None else 0.0
        if on_disk >= self.cfg.cache_threshold:
            return Decision(least.url, "disk", on_disk)
        return Decision(least.url, "low_match", ratio)

    def _remember(self, replica: Replica, text: str, budget: int | None = None) -> None:
        key = _key(text)
        replica.tree.insert(key, range(replica.next_value, replica.next_value + len(key)))
        replica.next_value += len(key)
        over = replica.tree.total_size() - (budget or self.cfg.max_tree_chars)
        if over > 0:
            replica.tree.evict(over)

    def finished(self, url: str) -> None:
        r = self.replicas.get(url)
        if r is not None and r.in_flight > 0:
            r.in_flight -= 1

    def mark(self, url: str, up: bool) -> None:
        """A replica going down loses its tree: whatever it cached is gone or unknown when it returns."""
        r = self.replicas[url]
        if r.up and not up:
            r.tree.reset()  # (the disk's tree stays: what the disk holds outlives a replica)
            r.in_flight = 0
        r.up = up

    def info(self) -> list[dict]:
        return [{"url": r.url, "up": r.up, "in_flight": r.in_flight, "routed": r.routed,
                 "tree_chars": r.tree.total_size()} for r in self.replicas.values()]


def _key(text: str) -> list[int]:
    return [ord(c) for c in text]
