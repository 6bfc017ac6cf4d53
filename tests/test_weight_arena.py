"""The CPU kernels' weights in one block in read order (runtime/model/weight_arena.py): every native weight
moves there, in the order a decode step reads it, the block starts on a huge page boundary, and no
result changes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.fused import PROJECTIONS, FusedLayers, _linears
from radixlm.runtime.model.loader import random_model
from radixlm.runtime.model.quantization import quantize_model
from radixlm.runtime.model.weight_arena import HUGE_PAGE, move_to_arena, read_order, weight_tensors

from .conftest import TINY, int8_tail

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
HEAD64 = dataclasses.replace(TINY, num_heads=4, num_kv_heads=2, head_dim=64, hidden_size=128)


@pytest.mark.parametrize("kind", ["int4", "int8", "none", "int4-tails"])
def test_weights_move_in_read_order_and_multiply_the_same(kind):
    """int4-tails: each qkv's v rows an int8 tail, which moves right after its weight."""
    model = random_model(HEAD64, seed=0)
    quantize_model(model, kind.removesuffix("-tails"), keep_dense=False, isa=cpu_ext.resolve("auto"))
    if kind.endswith("tails"):
        for layer in model.layers:
            layer.self_attn.qkv_proj.quant = int8_tail(layer.self_attn.qkv_proj.quant, 2 * 64)
    mods = read_order(model)
    expected = [_linears(layer)[p] for layer in model.layers for p in PROJECTIONS] + [model.lm_head]
    assert [id(m) for m in mods] == [id(m) for m in expected]
    xs = [torch.randn(3, m.quant.in_features) for m in mods]
    before = [m.quant.matmul(x) for m, x in zip(mods, xs, strict=True)]
    ids = torch.tensor([0, 7, 255])
    rows_before = model.lm_head.quant.rows(ids)

    arena = move_to_arena(model)

    assert arena is not None and arena.buffer.data_ptr() % HUGE_PAGE == 0
    moved = [t for m in mods for t in weight_tensors(m.quant)]
    assert arena.tensors == len(moved) and all(arena.holds(t) for t in moved)
    starts = [t.data_ptr() for t in moved]
    assert starts == sorted(starts) and all(s % 64 == 0 for s in starts)
    for m, x, y in zip(mods, xs, before, strict=True):
        assert torch.equal(m.quant.matmul(x), y)
    assert torch.equal(model.lm_head.quant.rows(ids), rows_before)  # the tied embedding's lookup


def test_a_model_without_native_weights_has_no_arena():
    model = random_model(HEAD64, seed=0)
    quantize_model(model, "int4", keep_dense=False, isa=None)  # torch's int4 kernels
    assert read_order(model) == [] and move_to_arena(model) is None


def test_a_refused_mapping_leaves_the_weights_in_place(monkeypatch):
    from radixlm.runtime.model import weight_arena

    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    model = random_model(HEAD64, seed=0)
    quantize_model(model, "int4", keep_dense=False, isa=cpu_ext.resolve("auto"))
    before = [id(m.quant.data) for m in read_order(model)]
    monkeypatch.setattr(weight_arena.mmap, "mmap", refuse)
    assert move_to_arena(model) is None
    assert [id(m.quant.data) for m in read_order(model)] == before


def test_the_engine_runs_from_the_arena():
    """The runner moves the weights before it builds the fused layers, which then read the arena's copies;
    greedy tokens and logprobs are the same bits as from copies outside it."""
    moved = Engine.from_model(random_model(HEAD64, seed=0), None, quantization="int4", max_total_tokens=2048)
    arena, runner = moved.runner.weight_arena, moved.runner
    assert arena is not None and runner.fused is not None
    assert all(arena.holds(t) for m in read_order(moved.model) for t in weight_tensors(m.quant))
    outside = Engine.from_model(random_model(HEAD64, seed=0), None, quantization="int4", max_total_tokens=2048)
    for m in read_order(outside.model):
        q = m.quant
        m.quant = dataclasses.replace(q, data=q.data.clone(), scales=q.scales.clone(),
                                      mins=None if q.mins is None else q.mins.clone())
        assert not arena.holds(m.quant.data) and not outside.runner.weight_arena.holds(m.quant.data)
    r = outside.runner
    r.fused = FusedLayers(outside.model, r.pool.k_buffer, r.pool.v_buffer, r.fused.isa)
    prompts, params = [[3, 4, 5, 6], [9, 8]], {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    got, want = (e.generate(input_ids=prompts, sampling_params=params, return_logprob=True, logprob_start_len=0)
                 for e in (moved, outside))
    for a, b in zip(got, want, strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]
        assert a["meta_info"]["input_token_logprobs"] == b["meta_info"]["input_token_logprobs"]


def test_freed_heap_goes_back_to_the_system():
    """glibc keeps freed heap pages resident; release_freed_heap returns them (the weights' old copies)."""
    import os

    from radixlm.runtime.model.weight_arena import release_freed_heap
    from radixlm.runtime.serve.scheduler_process import rss_mb

    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc here")

    kept, freed = [], []
    for i in range(3000):  # 64 KB blocks: under glibc's mmap threshold, so they come from the heap
        (kept if i % 2 else freed).append(bytearray(64 << 10))
    before = rss_mb()
    freed.clear()  # holes between the kept blocks: free() cannot shrink the heap's top past them
    if not release_freed_heap():
        pytest.skip("no glibc malloc_trim here")
    assert rss_mb() < before - 50
    assert len(kept) == 1500
