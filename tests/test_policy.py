"""Scheduling policy as pure functions: no model, no tensors."""

from __future__ import annotations

from radixlm.runtime.policy import PrefillBudget, QueueItem, dedup_shared_prefixes, order_queue


def item(rid, tokens, prefix_len=0, arrival=0.0, priority=0, max_new=16):
    return QueueItem(rid, tokens, prefix_len, max_new, priority, arrival)


def interleaved_groups():
    """Requests of groups A and B arrive alternately; A's prefix is already cached."""
    a, b = [1] * 100, [2] * 100
    return [item(f"{g}{i}", (a if g == "A" else b) + [10 + i], 100 if g == "A" else 0, arrival=i * 2 + (g == "B"))
            for i in range(3) for g in "AB"]


def admitted_together(order, slots=3):
    return {rid[0] for rid in (i.rid for i in order[:slots])}


def test_lpm_and_dfs_weight_group_sharing_requests_where_fcfs_does_not():
    items = interleaved_groups()
    assert admitted_together(order_queue(items, "fcfs", now=10)) == {"A", "B"}
    assert admitted_together(order_queue(items, "lpm", now=10)) == {"A"}
    dfs = "".join(i.rid[0] for i in order_queue(items, "dfs-weight", now=10))
    assert dfs in ("AAAB", "BAAA")  # grouped; B's uncached prefix goes with one request, the rest wait a round


def test_dfs_weight_puts_the_heaviest_group_first():
    heavy = [item(f"h{i}", [5] * 40 + [i], arrival=i + 1) for i in range(4)]
    light = [item("l0", [6] * 40, arrival=0)]
    assert [i.rid for i in order_queue(light + heavy, "dfs-weight", now=10)][0].startswith("h")


def test_in_batch_dedup_defers_requests_sharing_an_uncached_prefix():
    shared = [7] * 64
    items = [item("x", shared + [1]), item("y", shared + [2]), item("z", [9] * 10)]
    now, later = dedup_shared_prefixes(items)
    assert [i.rid for i in now] == ["x", "z"] and [i.rid for i in later] == ["y"]
    chunked = item("c", shared + [3])  # a chunked request is computing the shared prefix right now
    now, later = dedup_shared_prefixes(items, in_flight=[chunked])
    assert [i.rid for i in now] == ["z"]
    assert [i.rid for i in order_queue(items, "lpm", now=0, in_flight=[chunked])] == ["z"]


def test_in_batch_dedup_counts_what_is_cached_already():
    shared = [7] * 1000
    chunked = item("c", shared + [3])  # its first 49 tokens are cached, the rest still being computed
    partial = item("p", shared + [4], prefix_len=49)
    assert dedup_shared_prefixes([partial], in_flight=[chunked]) == ([], [partial])
    cached = item("k", shared + [5], prefix_len=1000)  # the whole prefix is cached: nothing to wait for
    assert dedup_shared_prefixes([cached], in_flight=[chunked]) == ([cached], [])
    twins = [item("t0", [1] * 100 + [2] * 40, prefix_len=100), item("t1", [1] * 100 + [2] * 40, prefix_len=100)]
    assert [i.rid for i in dedup_shared_prefixes(twins)[0]] == ["t0"]  # the same uncached suffix: once


def test_aging_bound_and_priorities():
    old = item("old", [3] * 5, prefix_len=0, arrival=0.0)
    fresh = [item(f"f{i}", [1] * 50, prefix_len=50, arrival=100.0) for i in range(3)]
    assert order_queue(fresh + [old], "lpm", now=101, max_wait_s=1000)[0].rid != "old"
    assert order_queue(fresh + [old], "lpm", now=101, max_wait_s=30)[0].rid == "old"
    urgent = item("urgent", [4] * 5, priority=-5, arrival=50.0)
    for policy in ("fcfs", "lpm", "dfs-weight", "lof", "random"):
        assert order_queue(fresh + [urgent], policy, now=60)[0].rid == "urgent"


def test_lpm_falls_back_to_fcfs_on_long_queues():
    items = [item(f"r{i}", [i % 3] * 10, prefix_len=i, arrival=i) for i in range(10)]
    assert [i.rid for i in order_queue(items, "lpm", now=100, lpm_max_queue=5)] == [f"r{i}" for i in range(10)]


def test_budget_admits_whole_chunks_and_stops():
    b = PrefillBudget(rem_total=1000, rem_input=300, rem_chunk=300, rem_reqs=4, page_size=16)
    assert b.admit(100, 50, batch_empty=True) == 100
    assert b.admit(500, 50, batch_empty=False) == 192  # a page-aligned chunk of what is left
    assert b.admit(10, 50, batch_empty=False) == 0  # the chunk budget is spent
    tight = PrefillBudget(rem_total=120, rem_input=4096, rem_chunk=4096, rem_reqs=4)
    assert tight.admit(100, 50, batch_empty=False) == 0  # no room for its decode reservation
    assert tight.admit(100, 50, batch_empty=True) == 100  # alone it may start; decode retracts if needed
    assert PrefillBudget(10**6, 10**6, 10**6, rem_reqs=0).admit(5, 5, True) == 0
