"""Tensor parallelism on gloo: head sharding, per-rank weight shards, and TP=2 == TP=1 through the server."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest
import torch

from radixlm.kernels.cpu_info import core_budget
from radixlm.runtime.model.layers import HeadShard, TPInfo, split_range

from .conftest import exits_within

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colors:\n1.",
           "In 1969, the first humans landed on", "Translate to French: good morning"]


def test_split_range_is_balanced_and_covers():
    for n, size in [(9, 2), (1536, 2), (7, 3), (4, 4)]:
        parts = [split_range(n, r, size) for r in range(size)]
        assert sum(c for _, c in parts) == n and parts[0][0] == 0
        assert all(a + c == b for (a, c), (b, _) in zip(parts, parts[1:], strict=False))
        assert max(c for _, c in parts) - min(c for _, c in parts) <= 1


def test_head_shards_keep_query_groups_with_their_kv_head():
    # SmolLM2-135M: 9 query heads in 3 groups of 3 -> ranks hold 2 + 1 KV heads
    assert HeadShard.of(9, 3, TPInfo(0, 2)) == HeadShard(0, 6, 0, 2)
    assert HeadShard.of(9, 3, TPInfo(1, 2)) == HeadShard(6, 3, 2, 1)
    assert HeadShard.max_kv_heads(9, 3, 2) == 2
    # fewer KV heads than ranks: each KV head replicated on 2 ranks that split its group
    shards = [HeadShard.of(8, 2, TPInfo(r, 4)) for r in range(4)]
    assert [(s.q_start, s.q_count, s.kv_start) for s in shards] == [(0, 2, 0), (2, 2, 0), (4, 2, 1), (6, 2, 1)]
    with pytest.raises(ValueError, match="cannot split"):
        HeadShard.of(6, 2, TPInfo(0, 4))


@pytest.mark.slow
def test_each_rank_holds_about_half_the_weights(smol_files):
    from radixlm.runtime.model.loader import load_model

    full = load_model(smol_files, torch.float32, progress=False)
    ranks = [load_model(smol_files, torch.float32, TPInfo(r, 2), progress=False) for r in range(2)]
    cfg = full.cfg
    d = cfg.head_dim
    for r, m in enumerate(ranks):
        attn, mlp = m.layers[0].self_attn, m.layers[0].mlp
        heads = HeadShard.of(cfg.num_heads, cfg.num_kv_heads, TPInfo(r, 2))
        assert attn.qkv_proj.weight.shape == ((heads.q_count + 2 * heads.kv_count) * d, cfg.hidden_size)
        assert attn.o_proj.weight.shape == (cfg.hidden_size, heads.q_count * d)
        assert mlp.gate_up_proj.weight.shape == (cfg.intermediate_size, cfg.hidden_size)  # 2 x half
        assert mlp.down_proj.weight.shape == (cfg.hidden_size, cfg.intermediate_size // 2)
        assert m.embed_tokens.weight.shape == (cfg.vocab_size // 2, cfg.hidden_size)
    # the shards are the full matrices' slices: rank 1's down_proj is the right half of the full one
    torch.testing.assert_close(ranks[1].layers[3].mlp.down_proj.weight,
                               full.layers[3].mlp.down_proj.weight[:, cfg.intermediate_size // 2:], rtol=0, atol=0)
    size = [sum(p.numel() for p in m.parameters()) for m in (full, *ranks)]
    assert sum(size[1:]) == pytest.approx(size[0], rel=0.01)  # nothing held twice (norms are tiny)
    assert all(0.4 < s / size[0] < 0.6 for s in size[1:]), size


def greedy(url: str, n: int = 32) -> list[list[int]]:
    """The prompts as one batched request (they prefill and decode together)."""
    r = httpx.post(f"{url}/generate", json={"text": PROMPTS, "sampling_params": {
        "temperature": 0, "max_new_tokens": n, "ignore_eos": True}}, timeout=120)
    assert r.status_code == 200, r.text
    return [x["output_ids"] for x in r.json()]


@pytest.mark.slow
def test_tp2_on_gloo_gives_tp1_greedy_tokens(server_process, smol_model_fp32, smol_tokenizer):
    """TP1's tokens from the in-process engine: a float32 server without TP gives the same (test_server)."""
    from radixlm.runtime.engine import Engine

    one = Engine.from_model(smol_model_fp32, smol_tokenizer, max_total_tokens=4096)
    assert one.config.load.quantization == "none"
    expected = [x["output_ids"] for x in one.generate(PROMPTS, {"temperature": 0, "max_new_tokens": 32,
                                                                "ignore_eos": True})]
    one.shutdown()
    two = server_process("--dtype", "float32", "--quantization", "none", "--max-total-tokens", "4096", "--tp-size", "2")
    try:
        info = httpx.get(f"{two.url}/server_info", timeout=5).json()
        assert info["engine"]["tp_size"] == 2 and info["threads"] == max(1, core_budget() // 2)
        assert greedy(two.url) == expected
        # the prefix cache works across ranks: a repeated prompt is served from the cache, same tokens
        r = httpx.post(f"{two.url}/generate", json={"text": PROMPTS[0], "sampling_params": {
            "temperature": 0, "max_new_tokens": 32, "ignore_eos": True}}, timeout=60).json()
        assert r["meta_info"]["cached_tokens"] > 0 and r["output_ids"] == expected[0]
        two.wait_idle()
    finally:
        assert two.stop() == 0


@pytest.mark.slow
def test_a_dead_rank_takes_the_server_down(server_process):
    srv = server_process("--tp-size", "2", "--max-total-tokens", "4096")
    info = httpx.get(f"{srv.url}/server_info", timeout=5).json()
    statuses: list[int] = []

    def long_request():
        try:
            statuses.append(httpx.post(f"{srv.url}/generate", json={"text": "Count to a thousand:", "sampling_params": {
                "max_new_tokens": 2000, "ignore_eos": True}}, timeout=60).status_code)
        except httpx.HTTPError:
            statuses.append(-1)

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(1.5)
    os.kill(info["tp_rank_pids"]["1"], signal.SIGKILL)
    t.join(timeout=30)
    assert not t.is_alive() and statuses and statuses[0] in (503, -1)
    deadline = time.monotonic() + 30
    while srv.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert srv.proc.poll() not in (None, 0)
    assert exits_within(info["scheduler_pid"], 1)
