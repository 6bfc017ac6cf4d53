"""Suffix decoding: drafts with no model, from what followed the same tokens before (SuffixDecoding, arXiv
2411.04975, as a chain instead of a tree).

Two tables of next-token counts, each keyed by the n tokens before (n from min_n to max_n): one over a request's
own prompt and output, grown as it decodes, and one over the recent outputs of its namespace (a tenant's, a salt's:
never another's), where agents' repeated tool output and code come back. A draft extends the request's tokens one
token at a time: the longest n-gram either table knows gives the counts (both tables' summed), and the most
frequent next token is proposed while its share of the counts stays at least ``min_share``. The drafts are greedy
guesses; verification keeps the output exact (execute/verify.py).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Hashable, Sequence


class SuffixTable:
    """Counts of the token after each n-gram (min_n <= n <= max_n) of the sequences added. Adding a sequence
    costs O(len * (max_n - min_n + 1)); so does removing it."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.next: dict[tuple[int, ...], Counter] = {}

    def add(self, seq: Sequence[int], start: int = 0, sign: int = 1) -> None:
        """Count each token of seq[start:] after the n-grams that end right before it (sign -1: uncount)."""
        for end in range(max(start, 1), len(seq)):
            tok = seq[end]
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(seq[end - n:end])
                counts = self.next.setdefault(key, Counter())
                counts[tok] += sign
                if counts[tok] <= 0:
                    del counts[tok]
                    if not counts:
                        del self.next[key]

    def lookup(self, context: Sequence[int], n: int) -> Counter | None:
        return self.next.get(tuple(context[-n:])) if len(context) >= n else None


class NamespaceOutputs:
    """The recent outputs of each namespace, as a SuffixTable each, bounded to ``max_tokens`` a namespace (the
    oldest outputs are uncounted first) and to ``max_namespaces`` namespaces (the least recently used goes)."""

    def __init__(self, min_n: int, max_n: int, max_tokens: int, max_namespaces: int = 256) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.max_tokens, self.max_namespaces = max_tokens, max_namespaces
        self.tables: OrderedDict[Hashable, tuple[SuffixTable, deque, list[int]]] = OrderedDict()

    def add(self, namespace: Hashable, output: Sequence[int]) -> None:
        if len(output) < 2 or self.max_tokens <= 0:
            return
        if namespace not in self.tables:
            self.tables[namespace] = (SuffixTable(self.min_n, self.max_n), deque(), [0])
            while len(self.tables) > self.max_namespaces:
                self.tables.popitem(last=False)
        self.tables.move_to_end(namespace)
        table, docs, size = self.tables[namespace]
        doc = list(output[-self.max_tokens:])
        table.add(doc)
        docs.append(doc)
        size[0] += len(doc)
        while size[0] > self.max_tokens:
            old = docs.popleft()
            table.add(old, sign=-1)
            size[0] -= len(old)

    def table(self, namespace: Hashable) -> SuffixTable | None:
        entry = self.tables.get(namespace)
        return entry[0] if entry is not None else None


def propose(context: list[int], tables: list[SuffixTable], budget: int, min_share: float, max_n: int,
            min_n: int) -> list[int]:
    """Up to ``budget`` tokens continuing ``context``: each the most frequent next token after the longest n-gram
    of (context + draft so far) that any table knows, while its share of those counts is >= ``min_share``."""
    draft: list[int] = []
    seq = list(context[-max_n:])
    while len(draft) < budget:
        counts = None
        for n in range(max_n, min_n - 1, -1):
            found = [c for c in (t.lookup(seq, n) for t in tables) if c]
            if found:
                counts = found[0] if len(found) == 1 else sum(found, Counter())
                break
        if not counts:
            break
        tok, hits = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
        if hits < min_share * sum(counts.values()):
            break
        draft.append(tok)
        seq = seq[1:] + [tok] if len(seq) >= max_n else seq + [tok]
    return draft


class SuffixProposer:
    """Drafts for a batch from each request's own table (grown as it decodes) and its namespace's recent outputs
    (added when a request finishes)."""

    def __init__(self, min_n: int, max_n: int, min_share: float, memory_tokens: int) -> None:
        self.min_n, self.max_n, self.min_share = min_n, max_n, min_share
        self.outputs = NamespaceOutputs(min_n, max_n, memory_tokens)

    def propose(self, reqs: list, budgets: list[int], states: list) -> list[list[int]]:
        """states[i]: request i's SpecState (its own table lives there)."""
        drafts = []
        for req, k, st in zip(reqs, budgets, states, strict=True):
            if k <= 0:
                drafts.append([])
                continue
            seq = req.fill_ids
            if st.suffix is None:
                st.suffix = SuffixTable(self.min_n, self.max_n)
            st.suffix.add(seq, start=st.suffix_indexed)
            st.suffix_indexed = len(seq)
            shared = self.outputs.table(req.namespace)
            tables = [st.suffix] if shared is None else [st.suffix, shared]
            drafts.append(propose(seq, tables, k, self.min_share, self.max_n, self.min_n))
        return drafts

    def finished(self, req) -> None:
        """A finished request's output joins its namespace's recent outputs."""
        self.outputs.add(req.namespace, req.output_ids)
