"""Kernels against their torch references: on the CPU under TRITON_INTERPRET=1, natively on CUDA (gpu)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from radixlm.kernels.token_bitmask import apply_token_bitmask_torch, unpack_bitmask

BITMASK_CHECK = textwrap.dedent("""
    import os
    import torch
    from radixlm.kernels.token_bitmask import apply_token_bitmask_torch, apply_token_bitmask_triton
    dev = os.environ.get("CHECK_DEVICE", "cpu")
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for vocab in (100, 1000, 2051):
            logits = torch.randn(4, vocab, generator=gen).to(dtype)
            bitmask = torch.randint(-2**31, 2**31 - 1, (4, (vocab + 31) // 32 - (vocab == 2051)), generator=gen,
                                    dtype=torch.int64).to(torch.int32)
            rows = torch.tensor([0, 2])
            want, got = logits.clone(), logits.clone().to(dev)
            apply_token_bitmask_torch(want, bitmask, rows)
            apply_token_bitmask_triton(got, bitmask.to(dev), rows.to(dev))
            assert torch.equal(want, got.cpu()), (dtype, vocab)
    print("ok")
""")


def test_torch_bitmask_reference_semantics():
    logits = torch.zeros(3, 40)
    bitmask = torch.zeros(3, 2, dtype=torch.int32)
    bitmask[0, 0] = 0b101  # row 0 allows tokens 0 and 2
    bitmask[1, 1] = 1  # row 1 allows token 32
    apply_token_bitmask_torch(logits, bitmask, torch.tensor([0, 1]))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0, 2]
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [32]
    assert torch.isfinite(logits[2]).all()  # rows without a grammar are untouched
    assert unpack_bitmask(torch.tensor([[-1]], dtype=torch.int32), 32).all()


def test_triton_bitmask_kernel_under_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-P", "-c", BITMASK_CHECK], env=env, capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(__file__))
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.gpu
def test_triton_bitmask_kernel_on_cuda():
    env = {**os.environ, "CHECK_DEVICE": "cuda"}
    out = subprocess.run([sys.executable, "-P", "-c", BITMASK_CHECK], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


KERNEL_CHECKS = ["store_kv", "rmsnorm", "rotary", "extend_attention", "decode_attention", "attention_invariance",
                 "engine"]


def start_check(names: list[str], device: str, **env: str) -> subprocess.Popen:
    """kernel_checks.py running ``names`` on ``device`` (read its output with communicate)."""
    return subprocess.Popen([sys.executable, "kernel_checks.py", ",".join(names), device], env={**os.environ, **env},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=os.path.dirname(__file__))


# the checks in two interpreter processes at once (the interpreter runs on one core), split about evenly by time
INTERPRETED_HALVES = (["attention_invariance", "store_kv", "rmsnorm", "rotary"],
                      ["engine", "decode_attention", "extend_attention"])


@pytest.fixture(scope="module")
def interpreted() -> tuple[str, str]:
    """(stdout, stderr) of every check under the interpreter, in two processes that each import torch and
    Triton once (each check in its own process spent more on those imports than on some checks)."""
    pytest.importorskip("triton")
    assert sorted(sum(INTERPRETED_HALVES, [])) == sorted(KERNEL_CHECKS)
    procs = [start_check(names, "cpu", TRITON_INTERPRET="1") for names in INTERPRETED_HALVES]
    outs = [p.communicate(timeout=900) for p in procs]
    return "".join(o for o, _ in outs), "".join(e for _, e in outs)


@pytest.mark.parametrize("name", KERNEL_CHECKS)
def test_triton_kernel_under_interpreter(interpreted, name):
    """Every kernel against its torch reference on the CPU (fp32/fp16/bf16, head dims 64/128, page sizes
    1 and 4, both pool layouts; the attention kernels over a pairwise cover of these, kernel_checks.py);
    "engine" runs the Triton backend end to end against the torch backend."""
    stdout, stderr = interpreted
    own = stderr.partition(f"--- {name}\n")[2]  # empty if the process died before this check
    assert f"ok {name}\n" in stdout, (own or stderr)[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("name", KERNEL_CHECKS)
def test_triton_kernel_on_cuda(name):
    proc = start_check([name], "cuda")
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0 and f"ok {name}" in stdout, stderr[-3000:]
