"""Decode attention with shared prefixes (cascade) equals plain per-request attention."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.kv.pool import KVPool
from radixlm.runtime.model.attention.cpu_decode import decode_attention, plan_decode

CFG = ModelConfig("LlamaForCausalLM", vocab_size=8, hidden_size=32, intermediate_size=8, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=8)


def reference(q, pool, rows, lens):
    out = []
    for i, n in enumerate(lens):
        k = pool.k_buffer[0][:, rows[i, :n]]  # [Hkv, n, D]
        v = pool.v_buffer[0][:, rows[i, :n]]
        qi = q[i].view(2, 2, 8)  # [Hkv, G, D]
        p = torch.softmax(qi @ k.transpose(-1, -2) / 8**0.5, dim=-1)
        out.append((p @ v).reshape(-1))
    return torch.stack(out)


def test_cascade_matches_reference():
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(CFG, 512, torch.float32, 2)
    _fill(pool, gen)
    shared = torch.arange(1, 61)  # a 60-slot prefix shared by requests 0, 1, 3
    lens = [75, 64, 20, 90, 61]
    table = torch.zeros(5, 128, dtype=torch.int64)
    own = iter(range(100, 512))
    for i, n in enumerate(lens):
        prefix = shared if i in (0, 1, 3) else torch.tensor([], dtype=torch.int64)
        rest = torch.tensor([next(own) for _ in range(n - len(prefix))], dtype=torch.int64)
        table[i, :n] = torch.cat([prefix, rest])
    table[4, :40] = shared[:40]  # shares only 40 with the others: still one group, cut at 40
    rows = torch.arange(5)
    meta = plan_decode(table, rows, lens)
    assert len(meta.groups) == 1 and len(meta.groups[0].slots) == 40
    q = torch.randn(5, 4, 8, generator=gen)
    got = decode_attention(q, pool, 0, meta)
    assert torch.allclose(got, reference(q, pool, table, lens), atol=1e-5)
    assert meta.suffix_len < max(lens)  # the shared prefix is not gathered per request


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens", [[33], [5, 70, 12], [900, 700, 1000]])  # one request / SDPA path / chain path
def test_paths_without_shared_prefixes_match_reference(dtype, lens):
    gen = torch.Generator().manual_seed(1)
    pool = KVPool(CFG, 4096, dtype, 2)
    _fill(pool, gen)
    table = torch.zeros(len(lens), 1024, dtype=torch.int64)
    slots = torch.randperm(4000, generator=gen) + 1
    start = 0
    for i, n in enumerate(lens):
        table[i, :n] = slots[start:start + n]
        start += n
    meta = plan_decode(table, torch.arange(len(lens)), lens)
    assert not meta.groups and (meta.mask is None) == (len(set(lens)) == 1)
    q = torch.randn(len(lens), 4, 8, generator=gen).to(dtype)
    got = decode_attention(q, pool, 0, meta).float()
    want = reference(q.float(), _as_float(pool), table, lens)
    assert torch.allclose(got, want, atol=1e-5 if dtype == torch.float32 else 3e-2)


def _as_float(pool: KVPool) -> KVPool:
    out = KVPool(CFG, pool.num_slots, torch.float32, 2)
    for src, dst in zip(pool.k_buffer + pool.v_buffer, out.k_buffer + out.v_buffer, strict=True):
        dst.copy_(src.float())
    return out


def _fill(pool: KVPool, gen: torch.Generator) -> None:
    for buf in pool.k_buffer + pool.v_buffer:
        buf.copy_(torch.randn(buf.shape, generator=gen))
