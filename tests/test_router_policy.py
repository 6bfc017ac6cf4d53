"""The data-parallel routing policy, without any server: pure decisions over replica state."""

from __future__ import annotations

import pytest

from radixlm.runtime.config import RouterConfig
from radixlm.runtime.serve.router import routing_text
from radixlm.runtime.serve.router_policy import RoutingPolicy

URLS = ["http://a", "http://b"]
SYSTEMS = [f"System prompt number {g}: " + "lorem ipsum dolor sit amet " * 40 for g in range(4)]


def workload():
    """4 groups x 8 requests sharing a long system prompt, interleaved as clients would send them."""
    return [SYSTEMS[g] + f"question {i}?" for i in range(8) for g in range(4)]


def grouped():
    return [SYSTEMS[g] + f"question {i}?" for g in range(4) for i in range(8)]


def test_cache_aware_keeps_each_group_on_one_replica():
    policy = RoutingPolicy(RouterConfig(), URLS)
    chosen: dict[int, set[str]] = {g: set() for g in range(4)}
    for i, text in enumerate(workload()):
        d = policy.pick(text)
        chosen[i % 4].add(d.url)
        if i >= 4:
            assert d.reason == "cache" and d.match > 0.9
        policy.finished(d.url)
    assert all(len(urls) == 1 for urls in chosen.values()), chosen
    # the groups are spread: the first request of each group goes to the least-loaded replica
    assert {u for urls in chosen.values() for u in urls} == set(URLS)


def test_round_robin_spreads_every_group():
    policy = RoutingPolicy(RouterConfig(router_policy="round_robin"), URLS)
    chosen: dict[int, set[str]] = {g: set() for g in range(4)}
    for i, text in enumerate(grouped()):
        chosen[i // 8].add(policy.pick(text).url)
    assert all(len(urls) == 2 for urls in chosen.values())


def test_imbalance_overrides_the_cache():
    cfg = RouterConfig(balance_abs_threshold=2, balance_rel_threshold=1.5)
    policy = RoutingPolicy(cfg, URLS)
    first = policy.pick(SYSTEMS[0]).url  # in flight, never finished
    picks = [policy.pick(SYSTEMS[0] + str(i)) for i in range(6)]
    assert picks[0].url == first and picks[0].reason == "cache"
    assert any(p.reason == "balance" and p.url != first for p in picks)
    loads = sorted(r["in_flight"] for r in policy.info())
    assert loads[1] - loads[0] <= cfg.balance_abs_threshold + 1


def test_low_match_goes_to_the_least_loaded():
    policy = RoutingPolicy(RouterConfig(), URLS)
    a = policy.pick("x" * 100)
    b = policy.pick("completely different text")
    assert b.reason == "low_match" and b.url != a.url  # a is busier


def test_a_prefix_on_the_shared_disk_goes_to_the_least_loaded_replica():
    """A replica that went down lost its RAM, not the shared disk: its prefix is a "disk" hit anywhere."""
    cfg = RouterConfig(max_tree_chars=2000)
    policy = RoutingPolicy(cfg, URLS, shared_disk=True)
    first = policy.pick(SYSTEMS[0] + "q1")
    policy.mark(first.url, up=False)
    policy.mark(first.url, up=True)
    d = policy.pick(SYSTEMS[0] + "q2")
    assert d.reason == "disk" and d.match > 0.9
    plain = RoutingPolicy(cfg, URLS)
    plain.mark(plain.pick(SYSTEMS[0] + "q1").url, up=False)
    assert plain.pick(SYSTEMS[0] + "q2").reason == "low_match"


def test_shortest_queue():
    policy = RoutingPolicy(RouterConfig(router_policy="shortest_queue"), URLS)
    a = policy.pick("p").url
    assert policy.pick("p").url != a
    policy.finished(a)
    assert policy.pick("q").url == a


def test_down_replicas_are_skipped_and_forget_their_tree():
    policy = RoutingPolicy(RouterConfig(), URLS)
    url = policy.pick(SYSTEMS[0]).url
    policy.mark(url, False)
    assert policy.replicas[url].tree.total_size() == 0
    assert all(policy.pick(SYSTEMS[0]).url != url for _ in range(5))
    policy.mark([u for u in URLS if u != url][0], False)
    with pytest.raises(LookupError):
        policy.pick("anything")
    policy.mark(url, True)
    assert policy.pick("anything").url == url


def test_tree_is_bounded_by_lru():
    policy = RoutingPolicy(RouterConfig(max_tree_chars=1000, router_policy="cache_aware"), ["http://a"])
    for i in range(50):
        policy.pick(f"{i:04d}" + "y" * 200)
    r = policy.replicas["http://a"]
    assert r.tree.total_size() <= 1000
    r.tree.check_integrity()


def test_routing_text():
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    def text(path, body, auth=""):
        return routing_text(path, body, auth).split(":", 1)[1]

    assert text("/v1/chat/completions", chat) == "system:S\nuser:hi\n"
    assert text("/v1/completions", {"prompt": ["a", "b"]}) == "a"
    # a Responses request routes like the chat request it becomes
    assert text("/v1/responses", {"instructions": "S", "input": [{"role": "user", "content": "hi"}]}) == \
        text("/v1/responses", {"instructions": "S", "input": "hi"}) == "system:S\nuser:hi\n"
    assert text("/generate", {"text": "t"}) == "t"
    assert text("/generate", {"input_ids": [1, 2]}) == "[1, 2]"
    # tenants (API keys) and salts are kept apart in the router's trees too
    scopes = {routing_text("/generate", {"text": "t", **salt}, auth).split(":", 1)[0]
              for auth in ("", "Bearer a", "Bearer b") for salt in ({}, {"cache_salt": "s"})}
    assert len(scopes) == 6


def test_config_errors():
    with pytest.raises(ValueError, match="router_policy"):
        RouterConfig(router_policy="best")
    with pytest.raises(ValueError, match="cache_threshold"):
        RouterConfig(cache_threshold=2.0)
    with pytest.raises(ValueError, match="at least one worker"):
        RoutingPolicy(RouterConfig(), [])
