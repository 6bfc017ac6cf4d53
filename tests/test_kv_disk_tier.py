"""The radix cache's disk tier in the engine, on a tiny random Llama the CPU kernels take (bitwise invariant):
answers over a prefix from disk are bitwise those from RAM and from a recompute; a restart hits what the
disk holds; tenants and models never hit each other's pages; a corrupt page, a failing disk and an unusable
path each get a log line or a clear error and nothing else breaks (every engine checks its KV accounting
after each step)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import random_model

from .conftest import TINY

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
HEAD64 = dataclasses.replace(TINY, num_heads=2, num_kv_heads=1, head_dim=64, hidden_size=128,
                             max_position_embeddings=1024)
CONTEXT = [(11 * j + 5) % 250 for j in range(300)]  # an agent's shared context: 4 whole blocks of 64 and a tail
TURN = [(3 * j + 1) % 250 for j in range(20)]
PARAMS = [{"temperature": 0, "max_new_tokens": 10, "ignore_eos": True},
          {"temperature": 0.9, "top_p": 0.9, "seed": 5, "max_new_tokens": 10, "ignore_eos": True,
           "frequency_penalty": 0.3}]


@functools.cache
def model(seed: int = 0):
    return random_model(HEAD64, dtype=torch.bfloat16, seed=seed)


def engine(path=None, seed: int = 0, **extra) -> Engine:
    opts = {"kv_disk_path": str(path)} if path is not None else {}
    e = Engine.from_model(model(seed), None, **{"quantization": "int4", "max_total_tokens": 2048,
                                                "check_invariants": True, **opts, **extra})
    assert e.runner.invariance_gaps == []
    return e


def ask(e: Engine, ids: list[int], params: dict, namespace: str | None = None) -> dict:
    msgs = e.build(input_ids=ids, sampling_params=params, return_logprob=True)
    for m in msgs:
        m.namespace = namespace
    (req,) = e.submit(msgs)
    while req.finished is None:
        e.core.step()
    return e.result(req)


def answer(r: dict) -> tuple:
    return r["output_ids"], r["meta_info"]["output_token_logprobs"]


def flush_to_disk(e: Engine) -> None:
    e.core.cache.disk.writer.flush()


@pytest.fixture(scope="module")
def cold():
    """Each prompt's answer on an engine without a radix cache: the recompute."""
    e = engine(disable_radix_cache=True)
    yield {(i, tail): answer(ask(e, CONTEXT + TURN[:tail], p)) for i, p in enumerate(PARAMS) for tail in (0, 20)}
    e.shutdown()


@pytest.mark.parametrize("i", range(len(PARAMS)))
def test_ram_disk_and_recompute_answer_bitwise_alike(tmp_path, cold, i):
    e = engine(tmp_path)
    first = ask(e, CONTEXT, PARAMS[i])
    assert answer(first) == cold[(i, 0)]
    ram = ask(e, CONTEXT + TURN, PARAMS[i])
    assert ram["meta_info"]["cached_tokens"] >= 299 and ram["meta_info"]["cached_tokens_disk"] == 0
    flush_to_disk(e)
    e.flush_cache()
    disk = ask(e, CONTEXT + TURN, PARAMS[i])
    assert disk["meta_info"]["cached_tokens_disk"] >= 256  # the 4 whole blocks of the context at least
    assert answer(ram) == answer(disk) == cold[(i, 20)]
    e.shutdown()


def test_restart_hits_disk_within_its_namespace_only(tmp_path, cold):
    e = engine(tmp_path)
    ask(e, CONTEXT, PARAMS[0], namespace="tenant-a")
    e.shutdown()  # writes what is queued
    e = engine(tmp_path)  # a restart: an empty tree over the same folder
    other = ask(e, CONTEXT + TURN, PARAMS[0], namespace="tenant-b")
    assert other["meta_info"]["cached_tokens"] == 0
    default = ask(e, CONTEXT + TURN[:5], PARAMS[0])
    assert default["meta_info"]["cached_tokens"] == 0
    own = ask(e, CONTEXT + TURN, PARAMS[0], namespace="tenant-a")
    assert own["meta_info"]["cached_tokens_disk"] >= 256 and answer(own) == cold[(0, 20)]
    e.shutdown()


def test_another_model_never_loads_foreign_pages(tmp_path):
    e = engine(tmp_path)
    ask(e, CONTEXT, PARAMS[0])
    e.shutdown()
    e = engine(tmp_path, seed=1)
    r = ask(e, CONTEXT + TURN, PARAMS[0])
    assert r["meta_info"]["cached_tokens"] == 0 and e.core.cache.disk.store.stats.corrupt_dropped == 0
    e.shutdown()


def test_corrupt_page_is_recomputed(tmp_path, cold, caplog):
    e = engine(tmp_path)
    ask(e, CONTEXT, PARAMS[0])
    e.shutdown()
    pages = sorted((os.path.getmtime(p), p) for p in (str(tmp_path / n) for n in os.listdir(tmp_path)))
    victim = pages[1][1]  # some block of the context
    with open(victim, "r+b") as f:
        f.seek(-50, os.SEEK_END)
        f.write(b"\xff" * 8)
    e = engine(tmp_path)
    with caplog.at_level(logging.WARNING, logger="radixlm.kv_disk"):
        r = ask(e, CONTEXT + TURN, PARAMS[0])
    assert answer(r) == cold[(0, 20)]
    assert e.core.cache.disk.store.stats.corrupt_dropped == 1 and "dropped page" in caplog.text
    assert r["meta_info"]["cached_tokens_disk"] < 256
    flush_to_disk(e)  # the recomputed block was written again, whole
    with open(victim, "rb") as f:
        f.seek(-50, os.SEEK_END)
        assert f.read(8) != b"\xff" * 8
    e.shutdown()


def test_failing_disk_turns_the_tier_off_and_serving_goes_on(tmp_path, cold, caplog):
    folder = tmp_path / "kv"
    e = engine(folder)
    ask(e, CONTEXT, PARAMS[0])
    flush_to_disk(e)
    shutil.rmtree(folder)  # the disk goes away under the server
    e.flush_cache()
    with caplog.at_level(logging.ERROR, logger="radixlm.kv_disk"):
        r = ask(e, CONTEXT + TURN, PARAMS[0])
        again = ask(e, CONTEXT + TURN[:7] + [1] * 64, PARAMS[0])  # writes fail: the tier turns off
        flush_to_disk(e)
    assert answer(r) == cold[(0, 20)] and len(again["output_ids"]) == 10
    assert not e.core.cache.disk.on and "KV disk tier off" in caplog.text
    assert ask(e, CONTEXT + TURN, PARAMS[0])["meta_info"]["cached_tokens"] >= 299  # RAM still serves
    e.shutdown()


def test_unusable_path_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match="kv_disk_path"):
        engine(tmp_path / "file")
    with pytest.raises(ValueError, match="kv_disk_path needs the radix cache"):
        engine(tmp_path, disable_radix_cache=True)


def test_working_set_larger_than_the_pool_comes_back_from_disk(tmp_path, cold):
    """Five 300-token contexts through a pool of 1024 tokens: the first is evicted from RAM, then loaded back."""
    e = engine(tmp_path, max_total_tokens=1024)
    contexts = [[(t + k) % 250 for t in CONTEXT] for k in range(5)]
    for c in contexts:
        ask(e, c, PARAMS[0])
    flush_to_disk(e)
    assert e.core.cache.tree.evicted_tokens > 0
    r = ask(e, CONTEXT + TURN, PARAMS[0])
    assert r["meta_info"]["cached_tokens_disk"] >= 256 and answer(r) == cold[(0, 20)]
    e.shutdown()


def test_replicas_sharing_a_folder_hit_each_others_pages(tmp_path, cold):
    """Two engines on one folder (as the DP replicas of one machine): each keeps its own index and finds the
    other's pages on a miss."""
    a, b = engine(tmp_path), engine(tmp_path)
    ask(a, CONTEXT, PARAMS[0])
    flush_to_disk(a)
    r = ask(b, CONTEXT + TURN, PARAMS[0])
    assert r["meta_info"]["cached_tokens_disk"] >= 256 and answer(r) == cold[(0, 20)]
    a.shutdown()
    b.shutdown()


def test_a_load_slower_than_recomputing_is_skipped(tmp_path, cold):
    e = engine(tmp_path)
    ask(e, CONTEXT, PARAMS[0])
    flush_to_disk(e)
    e.flush_cache()
    disk = e.core.cache.disk
    disk.load_s_per_token, disk.prefill_s_per_token = 1.0, 1e-6  # as if the disk were far slower than the CPU
    r = ask(e, CONTEXT + TURN, PARAMS[0])
    assert r["meta_info"]["cached_tokens"] == 0 and disk.counters.skipped_loads == 1
    assert answer(r) == cold[(0, 20)]
    e.shutdown()


def test_agents_beyond_the_pool_each_get_their_context_back(tmp_path, cold):
    """Four agents' contexts through a pool that holds two: on the next turn, sent all at once, each agent's
    context comes back from RAM or disk; none is computed again, though the loads must wait for room."""
    e = engine(tmp_path, max_total_tokens=768, chunked_prefill_size=128)
    e.core.cache.disk.pays = lambda tokens: True  # load or compute is timed (its own test); here it must not decide
    contexts = [[(t + k) % 250 for t in CONTEXT] for k in range(4)]
    e.generate(input_ids=contexts, sampling_params=PARAMS[0])
    flush_to_disk(e)
    outs = e.generate(input_ids=[c + TURN for c in contexts], sampling_params=PARAMS[0])
    assert all(o["meta_info"]["cached_tokens"] >= 256 for o in outs), [o["meta_info"] for o in outs]
    assert sum(o["meta_info"]["cached_tokens_disk"] for o in outs) >= 256
    e.shutdown()


def test_a_prefix_on_disk_waits_for_room_rather_than_being_computed(tmp_path):
    """Admission of a request whose prefix is on disk while running requests fill the pool: it waits for the
    room to load the prefix (computing it would need the same room and take longer), then loads it."""
    e = engine(tmp_path, max_total_tokens=1024)
    ask(e, CONTEXT, PARAMS[0])
    flush_to_disk(e)
    e.flush_cache()
    cache = e.core.cache

    def req(ids):
        (m,) = e.build(input_ids=ids, sampling_params=PARAMS[0])
        return e.core.make_req(m)

    big = req([(5 * j + 2) % 250 for j in range(900)])
    assert cache.admit(big) and cache.extend(big, 900) is not None
    small = req(CONTEXT + TURN)
    assert not cache.admit(small) and small.row is None and cache.tree.protected_size == 0
    cache.release(big, insert=False)
    assert cache.admit(small) and small.disk_prefix_len >= 256 and small.prefix_len == small.disk_prefix_len
    cache.release(small, insert=False)
    assert cache.check([]) is None
    e.shutdown()
