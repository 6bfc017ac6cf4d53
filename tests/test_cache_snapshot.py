"""radix_cache.snapshot: the dashboard's bounded, read-only view of the tree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.radix_cache import RadixCache
from radixlm.radix_cache.snapshot import namespace_sizes, top_nodes


def filled(prompts: list[list[int]], page_size: int = 1, namespaces=None) -> RadixCache:
    tree, slot = RadixCache(page_size), 0
    for i, p in enumerate(prompts):
        ns = namespaces[i % len(namespaces)] if namespaces else None
        present = tree.insert(p, list(range(slot, slot + len(p))), ns)
        slot += len(p)
        assert present >= 0
    return tree


def state(tree: RadixCache) -> list[tuple]:
    return sorted((n.id, tuple(n.key), n.last_access, n.hit_count, n.lock_ref) for n in tree.walk())


@settings(max_examples=60, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=30),
       top=st.integers(1, 20), depth=st.integers(1, 6), page_size=st.sampled_from([1, 2]))
def test_top_nodes_is_a_connected_bounded_read_only_view(prompts, top, depth, page_size):
    tree = filled(prompts, page_size)
    before = state(tree)
    nodes = top_nodes(tree, top, depth)
    assert state(tree) == before  # looking never splits, touches or counts
    assert len(nodes) <= top and all(1 <= n.depth <= depth for n in nodes)
    ids = {n.id for n in nodes}
    assert all(n.parent == -1 or n.parent in ids for n in nodes)  # every chosen node's parent is chosen
    by_id = {n.id: n for n in tree.walk()}
    for v in nodes:  # subtree sizes recount
        stack, total = [by_id[v.id]], 0
        while stack:
            node = stack.pop()
            total += len(node.key)
            stack.extend(node.children.values())
        assert v.subtree_tokens == total and v.tokens == len(by_id[v.id].key)
    roots = [n for n in tree.root.children.values()]
    if roots:  # the biggest branch comes first
        assert nodes[0].subtree_tokens == max(v.subtree_tokens for v in top_nodes(tree, 500, 64) if v.depth == 1)


def test_namespaces_and_previews():
    tree = filled([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]], namespaces=[None, "tenant-a"])
    assert namespace_sizes(tree) == {"default": 4 + 1, "tenant-a": 4}  # [1, 2] is shared in default
    only_a = top_nodes(tree, 10, 8, namespace="tenant-a", preview_tokens=2)
    assert [n.namespace for n in only_a] == ["tenant-a"] and only_a[0].preview_ids == (1, 2)
    assert all(n.preview_ids == () for n in top_nodes(tree, 10, 8, preview_tokens=0))
    shared = top_nodes(tree, 1, 1)[0]
    assert shared.namespace == "default" and shared.children == 2 and shared.tokens == 2


@pytest.mark.parametrize("kwargs, name", [({"top": 0}, "top"), ({"top": 501}, "top"), ({"depth": 0}, "depth"),
                                          ({"preview_tokens": -1}, "preview_tokens"), ({"top": True}, "top")])
def test_bad_arguments_name_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        top_nodes(RadixCache(), **kwargs)


def test_evictions_are_counted_across_flushes():
    tree = filled([[1, 2, 3], [4, 5]])
    assert len(tree.evict(5)) == 5 and tree.evicted_tokens == 5
    tree.reset()
    assert tree.evicted_tokens == 5
