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
    """Length of the longest common prefix of ``a`` and ``b``, rounded down to whole pages.

    Compares slices (C speed) with a binary search instead of a Python loop over tokens: prompts are
    thousands of tokens long and the scheduler asks this for every waiting request on every step.
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return align_down(n, page_size)
    lo, hi = 0, n - 1  # invariant: a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return align_down(lo, page_size)
