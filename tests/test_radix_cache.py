"""Radix cache: unit tests and property tests against a naive model (a map from cached prefixes to slots)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.radix_cache import RadixCache


def test_match_insert_split_and_duplicates():
    tree = RadixCache()
    assert tree.insert([1, 2, 3, 4], [10, 11, 12, 13]) == 0
    assert tree.insert([1, 2, 5], [20, 21, 22]) == 2  # caller frees 20, 21
    m = tree.match_prefix([1, 2, 3, 9])
    assert m.slots == [10, 11, 12]
    assert m.last_node.key == [3]  # the [3, 4] node was split at the match end
    assert tree.match_prefix([7]).slots == []
    tree.check_integrity()
    assert tree.total_size() == 5


def test_lock_protects_from_eviction_and_parent_becomes_evictable():
    tree = RadixCache()
    tree.insert([1, 2, 3], [1, 2, 3])
    tree.insert([1, 2, 4, 5], [1, 2, 6, 7])
    node = tree.match_prefix([1, 2, 3]).last_node
    tree.lock(node)
    assert tree.sizes() == (2, 3, 5)
    assert sorted(tree.evict(100)) == [6, 7]
    tree.unlock(node)
    assert sorted(tree.evict(100)) == [1, 2, 3]  # [3] then its parent [1, 2]
    assert tree.total_size() == 0
    tree.check_integrity()


def test_lru_and_lfu_order():
    lru = RadixCache(eviction_policy="lru")
    lru.insert([1], [1])
    lru.insert([2], [2])
    lru.match_prefix([1])
    assert lru.evict(1) == [2]
    lfu = RadixCache(eviction_policy="lfu")
    lfu.insert([1], [1])
    lfu.insert([2], [2])
    lfu.match_prefix([1])
    lfu.match_prefix([1])
    lfu.match_prefix([2])
    assert lfu.evict(1) == [2]


def test_paged_keys_are_aligned_and_namespaces_do_not_share():
    tree = RadixCache(page_size=4)
    assert tree.insert(list(range(10)), list(range(100, 110))) == 0
    assert tree.total_size() == 8  # the partial last page is not cached
    assert tree.match_prefix(list(range(7))).slots == [100, 101, 102, 103]
    assert tree.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).slots == [100, 101, 102, 103]
    assert tree.match_prefix(list(range(8)), namespace="lora-a").slots == []
    assert tree.insert(list(range(8)), list(range(200, 208)), namespace="lora-a") == 0
    assert tree.match_prefix(list(range(8)), namespace="lora-a").slots == list(range(200, 208))
    tree.check_integrity()
    text = tree.pretty_print()
    assert "ns='lora-a'" in text and "[4]" in text


def test_bad_arguments():
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(page_size=0)
    with pytest.raises(ValueError, match="eviction_policy"):
        RadixCache(eviction_policy="fifo-ish")
    with pytest.raises(ValueError, match="slots"):
        RadixCache().insert([1, 2], [1])
    tree = RadixCache()
    tree.insert([1], [1])
    with pytest.raises(RuntimeError, match="unlock"):
        tree.unlock(tree.match_prefix([1]).last_node)


class NaiveCache:
    """The specification: a map (namespace, prefix of whole pages) -> the slots of its last page."""

    def __init__(self, page_size: int) -> None:
        self.page = page_size
        self.map: dict[tuple, tuple[int, ...]] = {}

    def match_len(self, ns, key) -> int:
        n = 0
        while n + self.page <= len(key) and (ns, tuple(key[: n + self.page])) in self.map:
            n += self.page
        return n

    def slots(self, ns, key, n) -> list[int]:
        return [s for i in range(0, n, self.page) for s in self.map[(ns, tuple(key[: i + self.page]))]]

    def insert(self, ns, key, slots) -> None:
        for i in range(0, len(key) - len(key) % self.page, self.page):
            self.map.setdefault((ns, tuple(key[: i + self.page])), tuple(slots[i : i + self.page]))

    def values(self) -> list[int]:
        return sorted(s for page in self.map.values() for s in page)

    def drop(self, freed: set[int]) -> None:
        self.map = {k: v for k, v in self.map.items() if not freed & set(v)}


keys = st.lists(st.integers(0, 3), min_size=0, max_size=14)
ops = st.lists(
    st.tuples(st.sampled_from(["insert", "match", "lock", "unlock", "evict"]), st.sampled_from([None, "x"]),
              keys, st.integers(0, 20)),
    max_size=60,
)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@settings(max_examples=150, deadline=None)
@given(ops=ops, policy=st.sampled_from(["lru", "lfu"]))
def test_random_interleavings_keep_invariants(page_size, ops, policy):
    tree, naive = RadixCache(page_size, policy), NaiveCache(page_size)
    next_slot, free, locks = 0, set(), []
    for op, ns, key, n in ops:
        key = key * (page_size // 4 + 1)  # long enough to fill pages of 16
        if op == "insert":
            slots = list(range(next_slot, next_slot + len(key)))
            next_slot += len(key)
            expected = naive.match_len(ns, key)
            assert tree.insert(key, slots, ns) == expected
            naive.insert(ns, key, slots)
            aligned = len(key) - len(key) % page_size
            free.update(slots[:expected] + slots[aligned:])  # duplicates and the unaligned tail
        elif op == "match":
            m = tree.match_prefix(key, ns)
            assert m.slots == naive.slots(ns, key, naive.match_len(ns, key))
            assert tree.peek_prefix_len(key, ns) == len(m.slots)
        elif op == "lock":
            m = tree.match_prefix(key, ns)
            tree.lock(m.last_node)
            locks.append((ns, key[: len(m.slots)], m.slots, m.last_node))
        elif op == "unlock" and locks:
            tree.unlock(locks.pop(n % len(locks))[3])
        elif op == "evict":
            evictable = tree.evictable_size
            freed = tree.evict(n)
            assert len(freed) >= min(n, evictable)
            locked = {s for _, _, slots, _ in locks for s in slots}
            assert not locked & set(freed), "evicted a locked slot"
            free.update(freed)
            naive.drop(set(freed))
        tree.check_integrity()
        in_tree = [s for n in tree._walk() if n is not tree.root for s in n.value]
        assert sorted(in_tree) == naive.values()
        assert not free & set(in_tree) and len(free) + len(in_tree) == next_slot  # nothing leaked
        for lns, lkey, lslots, _ in locks:  # locked prefixes stay cached
            assert naive.slots(lns, lkey, len(lkey)) == lslots
    for *_, node in locks:
        tree.unlock(node)
    assert tree.protected_size == 0
    assert sorted(tree.evict(10**9) + list(free)) == list(range(next_slot))
