"""Shared fixtures: the embedded SmolLM2 (loaded once per session), a tiny random Llama, HF references."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from radixlm.kernels.cpu_info import usable_cores

# pytest-xdist's workers share the machine: each takes its share of the cores through OMP_NUM_THREADS, which
# torch, the engines and the servers these tests start all read, so that two workers on two cores do not run
# four threads. Set before torch is imported.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cores() // _WORKERS))

import torch  # noqa: E402

from radixlm.runtime.config import ModelConfig  # noqa: E402
from radixlm.runtime.serve.health import wait_healthy  # noqa: E402
from radixlm.runtime.serve.launch import free_port  # noqa: E402
from radixlm.runtime.serve.process_utils import die_with_parent  # noqa: E402

TINY = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=128,
                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5,
                   rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=True,
                   eos_token_ids=(255,))


def int8_tail(q, rows: int):
    """A native int4 QuantWeight re-made with its last ``rows`` rows as an int8 tail (as a Q4_K_M qkv keeps its
    Q6_K v)."""
    from radixlm.runtime.model.quantization import QuantWeight

    w = q.dequantize()
    head, tail = (QuantWeight.quantize(part, kind, q.act_dtype, q.isa)
                  for part, kind in ((w[:-rows], "int4"), (w[-rows:], "int8")))
    return head.with_tail(tail)


@pytest.fixture(scope="session")
def tiny_model():
    from radixlm.runtime.model.loader import random_model

    return random_model(TINY, seed=0)


@pytest.fixture(scope="session")
def smol_files():
    from radixlm.runtime.model.loader import open_model

    return open_model(None)


@pytest.fixture(scope="session")
def smol_tokenizer(smol_files):
    return smol_files.load_tokenizer()


@pytest.fixture(scope="session")
def smol_model_fp32(smol_files):
    from radixlm.runtime.model.loader import load_model

    return load_model(smol_files, torch.float32, progress=False)


@pytest.fixture(scope="session")
def hf_model(smol_files):
    return transformers_model(smol_files.path)


def transformers_model(path: str):
    """transformers' own GGUF loader on ``path``, float32: the reference independent of ours. Most of its time
    is repeated work: it parses the file twice (config, then weights) and rebuilds gguf's tensor-name map once
    per module of the model. Both are pure, so they are memoized for this one load; what it computes is
    unchanged."""
    import functools
    from unittest import mock

    import gguf
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(path)
    with mock.patch.object(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader)), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=4)(gguf.get_tensor_name_map)):
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def transformers_reference(path: str):
    """(transformers' tokenizer, its float32 model) of the GGUF file at ``path``."""
    from transformers import AutoTokenizer

    folder, name = os.path.split(path)
    return AutoTokenizer.from_pretrained(folder, gguf_file=name), transformers_model(path)


def transformers_greedy(model, ids: list[int], n: int) -> list[int]:
    """The ``n`` tokens transformers' ``model`` continues ``ids`` with, greedily."""
    import torch

    return model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()


def catalog_file(name: str) -> str:
    """The installed file of catalog model ``name``; the test is skipped, saying how to install it, where it is
    not installed."""
    from radixlm.runtime.model.catalog import installed_path

    path = installed_path(name)
    if path is None:
        pytest.skip(f"{name} is not installed (radixlm models install {name})")
    return path


# The longest modules, longest first. pytest-xdist hands each worker whole files in collection order, so these
# start first and no worker is left running a long module alone at the end (the order is a hint: a stale
# list costs time, never a test).
LONGEST_FIRST = ("test_real_models.py", "test_gemma3.py", "test_engine_smollm.py", "test_compiled_decode.py",
                 "test_invariance.py", "test_reliability.py", "test_data_parallel.py", "test_neon_kernels.py", "test_speculative.py", "test_constrained.py",
                 "test_tensor_parallel.py", "test_agents.py", "test_dashboard.py", "test_lifecycle.py")


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: a worker a core (each then runs one torch thread), but no more than one per 9 GiB of
    available memory, since each worker holds its own SmolLM2 copies and servers."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    try:
        with open("/proc/meminfo") as f:
            available_kib = next((int(line.split()[1]) for line in f if line.startswith("MemAvailable")), 0)
    except OSError:
        available_kib = 9 << 20
    return max(1, min(usable_cores(), available_kib // (9 << 20)))


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def _free_memory_after_each_module():
    """An engine's KV pool and weights go when the cycle collector next runs (its scheduler holds the core's
    bound methods), and glibc keeps freed heap pages: collect and trim after each module, so that a worker does
    not carry every module's peak into the next (without it two workers peaked at 21.7 GB on a 23 GiB machine)."""
    yield
    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)


# ---------------------------------------------------------------- a real server on 127.0.0.1

def exits_within(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` is gone (or a zombie, i.e. exited) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    return True
        except OSError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


class ServerProcess:
    def __init__(self, *flags: str, timeout: float = 240, command: str = "serve", port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixlm.runtime", command, "--port", str(self.port), *flags]
        # its own process group (stop() may kill the group), ended by Linux if this test process dies first
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=os.path.dirname(__file__), start_new_session=True, preexec_fn=die_with_parent)
        def dead() -> str | None:
            if self.proc.poll() is None:
                return None
            return f"server exited with {self.proc.returncode}: {self.proc.stdout.read()[-3000:]}"

        try:
            wait_healthy(self.url, timeout, dead)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/server_info", timeout=5).json()["stats"]

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines():
            if line.startswith(f"radixlm:{name}{{") or line.startswith(f"radixlm:{name} "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def wait_idle(self, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.stats()
            if s and s["running"] == 0 and s["queued"] == 0:
                time.sleep(0.3)
                s = self.stats()
                if s["running"] == 0 and s["queued"] == 0:
                    return s
            time.sleep(0.1)
        raise AssertionError(f"server not idle after {timeout} s: {self.stats()}")


@pytest.fixture(scope="session")
def server_process():
    """The ServerProcess class: ``server_process(*flags)`` starts `radixlm serve` and waits for /health."""
    return ServerProcess


@pytest.fixture(scope="session")
def shared_server():
    """One long-lived `radixlm serve --check-invariants` for the modules whose tests leave the server as they
    found it (agents, dashboard, lang, constrained serving, lifecycle, quantization, reliability): it serves
    all their workloads one after another, as a real server would, and must still exit cleanly."""
    srv = ServerProcess("--check-invariants", "--max-queued-requests", "400")
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="session")
def smol_model_default(smol_files):
    """The embedded model as plain ``Engine()`` runs it: bfloat16 with the file's int4 layers (quantized by the
    first engine built on it, with ``quantization="int4"``), shared by the slow tests."""
    from radixlm.runtime.model.loader import load_model

    return load_model(smol_files, torch.bfloat16, progress=False, quant_blocks=True)
