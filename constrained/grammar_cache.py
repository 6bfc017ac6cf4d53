"""Compile grammars off the scheduler thread, once per spec."""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from radixlm.constrained.base import Grammar, GrammarBackend
from radixlm.constrained.spec import ConstraintSpec


class GrammarCache:
    """spec -> Future[Grammar]. A failed compile is cached too (the same bad spec fails fast).

    One worker thread: compiles are rare next to decode steps, and on a 2-core machine a second busy
    thread would slow the forward pass far more than a queued compile costs.
    """

    def __init__(self, backend: GrammarBackend, capacity: int = 512) -> None:
        self.backend = backend
        self.capacity = capacity
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixlm-grammar")
        self._futures: OrderedDict[ConstraintSpec, Future] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, spec: ConstraintSpec) -> Future:
        fut = self._futures.get(spec)
        if fut is not None:
            self.hits += 1
            self._futures.move_to_end(spec)
            return fut
        self.misses += 1
        fut = self._pool.submit(self.backend.compile, spec)
        self._futures[spec] = fut
        while len(self._futures) > self.capacity:
            self._futures.popitem(last=False)
        return fut

    def compile_now(self, spec: ConstraintSpec) -> Grammar:
        return self.get(spec).result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def make_backend(name: str, tokenizer, vocab_size: int, stop_ids: list[int]) -> GrammarBackend:
    if name == "xgrammar":
        from radixlm.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, stop_ids)
    if name == "outlines":
        from radixlm.constrained.outlines_backend import OutlinesBackend

        return OutlinesBackend(tokenizer, vocab_size, stop_ids)
    raise ValueError(f"grammar_backend: unknown backend {name!r} (xgrammar or outlines)")
