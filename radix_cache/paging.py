"""Page-aligned key helpers. With page size P, keys are compared and stored in whole pages of P tokens."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def align_down(n: int, page_size: int) -> int:
    return n - n % page_size


def child_key(namespace: Hashable, key: Sequence[int], page_size: int) -> tuple:
    """Key of a child in its parent's ``children`` dict: the namespace and the first page of tokens."""
    if page_size == 1:
        return (namespace, key[0])
    return (namespace, tuple(key[:page_size]))


def common_prefix_len(a: Sequence[int], b: Sequence[int], page_size: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, rounded down to whole pages."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return align_down(i, page_size)
