"""Helpers shared by the benchmark scripts: prompts of a given token length and timing."""

from __future__ import annotations

import random
import time
from contextlib import contextmanager

VOCAB = ("river stone light market garden window letter music winter harbor engine paper silver forest "
         "morning signal bridge valley copper thunder lantern meadow orbit canvas").split()


def text_of_tokens(tokenizer, n_tokens: int, seed: int) -> list[int]:
    """Token ids of random English-like text, exactly ``n_tokens`` long."""
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tokenizer(" ".join(rng.choice(VOCAB) for _ in range(64)), add_special_tokens=False)["input_ids"]
    return ids[:n_tokens]


@contextmanager
def timer(results: dict, key: str):
    t = time.perf_counter()
    yield
    results[key] = time.perf_counter() - t


def cpu_description() -> str:
    """The CPU as every result names it: cores, model name, and its instruction sets (AVX512 or not)."""
    from radixlm.kernels.cpu_info import cpu_description as describe

    return describe()
