"""Huge-page blocks (runtime/host_memory.py): the KV pool's CPU buffers live in one, 2 MB aligned and zero,
and a refused mapping leaves them ordinary tensors that work the same."""

from __future__ import annotations

import torch

from radixlm.runtime import host_memory
from radixlm.runtime.host_memory import HUGE_PAGE, huge_page_tensors
from radixlm.runtime.kv.pool import KVPool

from .conftest import TINY


def test_tensors_start_on_huge_page_boundaries_and_read_zeros():
    shapes = [(3, 100, 16), (7,), (2, 5)]
    out, _ = huge_page_tensors(shapes, torch.bfloat16)
    assert [tuple(t.shape) for t in out] == shapes
    for t in out:
        assert t.dtype == torch.bfloat16 and t.is_contiguous() and t.data_ptr() % HUGE_PAGE == 0
        assert bool((t == 0).all())
    out[0].fill_(1.0)  # the tensors do not overlap
    assert bool((out[1] == 0).all()) and bool((out[2] == 0).all())


def test_the_kv_pool_lives_in_a_huge_page_block_and_stores():
    pool = KVPool(TINY, 64, torch.bfloat16, TINY.num_kv_heads)
    assert len(pool.k_buffer) == len(pool.v_buffer) == TINY.num_layers
    for t in pool.k_buffer + pool.v_buffer:
        assert t.shape == (TINY.num_kv_heads, 64, TINY.head_dim) and t.data_ptr() % HUGE_PAGE == 0
    k = torch.randn(2, TINY.num_kv_heads, TINY.head_dim, dtype=torch.bfloat16)
    pool.store(1, torch.tensor([3, 9]), k, -k)
    assert torch.equal(pool.k_buffer[1][:, [3, 9]], k.transpose(0, 1))
    assert torch.equal(pool.v_buffer[1][:, [3, 9]], -k.transpose(0, 1))
    assert bool((pool.k_buffer[0] == 0).all())  # the other layer untouched


def test_a_refused_mapping_gives_ordinary_zero_buffers(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(host_memory.mmap, "mmap", refuse)
    pool = KVPool(TINY, 64, torch.float32, TINY.num_kv_heads)
    assert all(bool((t == 0).all()) and t.shape == (TINY.num_kv_heads, 64, TINY.head_dim)
               for t in pool.k_buffer + pool.v_buffer)
