"""The scheduler's answer to the dashboard: the top of its radix tree and the requests it holds."""

from __future__ import annotations

import dataclasses
import time

from radixlm.radix_cache.snapshot import NodeView, namespace_name, tree_view
from radixlm.runtime.core import EngineCore
from radixlm.runtime.messages import CacheViewReq, CacheViewResp, InFlight
from radixlm.runtime.request import Req

MAX_LISTED = 100  # requests listed per answer (the count of all of them is sent too)


def cache_view(core: EngineCore, q: CacheViewReq) -> CacheViewResp:
    """``q.top == 0``: the requests only (no walk over the tree)."""
    tree = core.cache.tree
    nodes, namespaces = [], {}
    if tree is not None and q.top > 0:
        try:
            nodes, namespaces = tree_view(tree, q.top, q.depth, q.namespace, q.preview_tokens)
        except ValueError as e:
            return CacheViewResp(q.query, error=str(e))
        if core.cache.disk is not None:
            nodes = with_tiers(core, nodes)
    if q.top > 0 and q.namespace is not None and q.namespace not in namespaces:
        return CacheViewResp(q.query, error=f"namespace {q.namespace!r} holds nothing in the cache "
                                            f"(known: {sorted(namespaces)})")
    reqs = in_flight(core)
    return CacheViewResp(q.query, nodes=nodes, namespaces=namespaces, total_requests=len(reqs),
                         requests=[_listing(r, state, q.preview_tokens) for r, state in reqs[:MAX_LISTED]])


def with_tiers(core: EngineCore, views: list[NodeView]) -> list[NodeView]:
    """Each node's tier: whether the disk tier also holds its blocks (one walk to find the nodes)."""
    wanted = {v.id for v in views}
    nodes = {n.id: n for n in core.cache.tree.walk() if n.id in wanted}
    out = []
    for v in views:
        node, parts = nodes[v.id], []
        while node.parent is not None:
            parts.append(node.key)
            node = node.parent
        path = [t for key in reversed(parts) for t in key]
        out.append(dataclasses.replace(v, tier=core.cache.disk.tier_of(nodes[v.id].namespace, path, v.tokens)))
    return out


def in_flight(core: EngineCore) -> list[tuple[Req, str]]:
    """Every request the scheduler holds, oldest first, with its state."""
    s = core.scheduler
    reqs = [(r, "grammar") for r in s.grammar_queue] + [(r, "waiting") for r in s.waiting]
    reqs += [(s.chunked, "prefill")] if s.chunked else []
    reqs += [(r, "running") for r in s.running]
    return sorted(reqs, key=lambda x: x[0].arrival)


def _listing(r: Req, state: str, preview_tokens: int) -> InFlight:
    return InFlight(rid=r.rid, state=state, prompt_tokens=len(r.origin_input_ids), cached_tokens=r.cached_tokens,
                    generated=len(r.output_ids), priority=r.priority, age_s=round(time.monotonic() - r.arrival, 3),
                    grammar=r.constraint.kind if r.constraint is not None else None,
                    preview_ids=r.origin_input_ids[:preview_tokens], namespace=namespace_name(r.namespace))
