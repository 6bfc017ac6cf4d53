"""The FlashInfer attention backend (NVIDIA GPUs, optional extra ``radixlm[gpu]``).

Plan once per batch (page table as CSR: indptr, page indices, last-page lengths), run per layer. The pool
must be token-major (k_buffer[layer] [S, Hkv, D]), which viewed as [S / P, P, Hkv, D] is FlashInfer's NHD
paged layout. K/V of new tokens are written by our store kernel before the run.
Not exercised on this project's CPU machines: benchmarks/results/gpu/ holds what was measured on a GPU.
"""

from __future__ import annotations

import torch

from radixlm.kernels.store_kv import store_kv_triton
from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.kv.pool import KVPool, ReqToTokenPool

WORKSPACE_BYTES = 256 * 2**20


def page_table(table: torch.Tensor, rows: list[int], seq_lens: list[int], page: int, device):
    """-> (indptr [B+1], page indices [sum pages], last_page_len [B]) as int32 on ``device``."""
    counts = [-(-n // page) for n in seq_lens]
    pos = [torch.arange(0, c * page, page, device=table.device) for c in counts]
    indices = torch.cat([table[r, p] // page for r, p in zip(rows, pos, strict=True)]).to(device, torch.int32)
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=device)
    last = torch.tensor([n - (c - 1) * page for n, c in zip(seq_lens, counts, strict=True)], dtype=torch.int32,
                        device=device)
    return indptr, indices, last


class FlashInferAttentionBackend:
    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool, page_size: int, num_q_heads: int) -> None:
        import flashinfer

        if pool.head_major:
            raise ValueError("the FlashInfer backend needs the token-major KV pool layout")
        self.pool, self.req_to_token, self.page = pool, req_to_token, page_size
        self.num_q_heads = num_q_heads
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=pool.device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)

    def prepare(self, batch: ForwardBatch) -> None:
        pool, dev = self.pool, self.pool.device
        num_kv, dim = pool.k_buffer[0].shape[1], pool.k_buffer[0].shape[2]
        indptr, indices, last = page_table(self.req_to_token.table, batch.req_rows.tolist(), batch.seq_lens,
                                           self.page, dev)
        dtype = pool.dtype
        if batch.mode == "decode":
            self.decode.plan(indptr, indices, last, self.num_q_heads, num_kv, dim, self.page,
                             q_data_type=dtype, kv_data_type=dtype)
        else:
            qo = torch.tensor([0, *torch.tensor(batch.extend_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
            self.prefill.plan(qo, indptr, indices, last, self.num_q_heads, num_kv, dim, self.page, causal=True,
                              q_data_type=dtype, kv_data_type=dtype)
        batch.attn_meta = batch.mode

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                batch: ForwardBatch) -> torch.Tensor:
        kb, vb = self.pool.k_buffer[layer], self.pool.v_buffer[layer]
        store_kv_triton(kb, vb, batch.out_cache_loc, k, v, head_major=False)
        paged = (kb.view(-1, self.page, *kb.shape[1:]), vb.view(-1, self.page, *vb.shape[1:]))
        wrapper = self.decode if batch.mode == "decode" else self.prefill
        return wrapper.run(q, paged).view(q.shape[0], -1)
