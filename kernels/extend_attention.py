"""Extend (prefill) attention over the paged KV pool: each request's new tokens attend, causally, to its
cached prefix and to themselves, read from the pool through the request -> token-slot table.

One launch covers the whole batch (variable prefix and extend lengths, grouped-query heads). The new
tokens' K/V must already be in the pool (the backend stores them first). Page size does not matter: the
table maps every position to its slot.

Invariance: query tiles and key blocks are both aligned to absolute positions (a query at position p is
row p % BLOCK_M of its tile; keys come in blocks [j * BLOCK_N, (j + 1) * BLOCK_N) merged in order), so a
query's result is the same bits whether its sequence is extended whole, in chunks over a cached prefix,
or one token at a time, and whatever else is in the batch. Blocks a query cannot see add exactly zero.

Shapes: T new tokens in the batch, B requests, Hq / Hkv heads, D head dim, S pool slots.
"""

from __future__ import annotations

import functools

import torch


def extend_attention_torch(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, table: torch.Tensor,
                           req_rows: torch.Tensor, seq_lens: torch.Tensor, extend_lens: torch.Tensor,
                           sm_scale: float, head_major: bool = True) -> torch.Tensor:
    """q [T, Hq, D]; k_buf, v_buf [Hkv, S, D] (or [S, Hkv, D]); table [R, C]; req_rows, seq_lens,
    extend_lens [B] -> out [T, Hq, D] in q's dtype (computed in float32)."""
    out = torch.empty_like(q)
    groups = q.shape[1] // (k_buf.shape[0] if head_major else k_buf.shape[1])
    start = 0
    for row, seq, ext in zip(req_rows.tolist(), seq_lens.tolist(), extend_lens.tolist(), strict=True):
        slots = table[row, :seq]
        k = k_buf[:, slots] if head_major else k_buf[slots].transpose(0, 1)  # [Hkv, L, D]
        v = v_buf[:, slots] if head_major else v_buf[slots].transpose(0, 1)
        k, v = k.float().repeat_interleave(groups, 0), v.float().repeat_interleave(groups, 0)
        qi = q[start:start + ext].float().transpose(0, 1)  # [Hq, ext, D]
        scores = qi @ k.transpose(1, 2) * sm_scale  # [Hq, ext, L]
        prefix = seq - ext
        causal = torch.ones(ext, seq, dtype=torch.bool, device=q.device).tril(diagonal=prefix)
        scores.masked_fill_(~causal, float("-inf"))
        out[start:start + ext] = (scores.softmax(-1) @ v).transpose(0, 1).to(q.dtype)
        start += ext
    return out


def extend_attention_triton(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, table: torch.Tensor,
                            req_rows: torch.Tensor, seq_lens: torch.Tensor, extend_lens: torch.Tensor,
                            sm_scale: float, head_major: bool = True, max_extend: int | None = None,
                            block_m: int = 32, block_n: int = 32) -> torch.Tensor:
    """The same in one launch over (request, query head, block of new tokens). ``max_extend``: the longest
    extend length, if the caller knows it (saves a device -> host sync)."""
    import triton

    out = torch.empty_like(q)
    b, hq, d = len(req_rows), q.shape[1], q.shape[2]
    hkv = k_buf.shape[0] if head_major else k_buf.shape[1]
    s_dim, h_dim = (1, 0) if head_major else (0, 1)
    q_start = torch.zeros(b, dtype=torch.int64, device=q.device)
    q_start[1:] = torch.cumsum(extend_lens, 0)[:-1]
    max_extend = max_extend or int(extend_lens.max())
    grid = (b, hq, triton.cdiv(max_extend + block_m - 1, block_m))  # tiles aligned to positions: one more
    _kernel()[grid](q, k_buf, v_buf, out, table, req_rows, q_start, seq_lens, extend_lens, sm_scale,
                    q.stride(0), q.stride(1), k_buf.stride(s_dim), k_buf.stride(h_dim), out.stride(0), out.stride(1),
                    table.stride(0), GROUP=hq // hkv, D=d, BLOCK_M=block_m, BLOCK_N=block_n)
    return out


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def extend_kernel(q_ptr, k_buf, v_buf, o_ptr, table, rows_ptr, q_start_ptr, seq_ptr, ext_ptr, sm_scale,
                      stride_qt, stride_qh, stride_bs, stride_bh, stride_ot, stride_oh, stride_tr,
                      GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        b, h, mb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        seq = tl.load(seq_ptr + b).to(tl.int32)
        ext = tl.load(ext_ptr + b).to(tl.int32)
        prefix = seq - ext
        first = prefix - prefix % BLOCK_M + mb * BLOCK_M  # this tile's first absolute position
        if first < seq:
            q0 = tl.load(q_start_ptr + b)
            row = tl.load(rows_ptr + b)
            kvh = h // GROUP
            pos = first + tl.arange(0, BLOCK_M)  # [M] absolute positions; this request's queries: [prefix, seq)
            offs_m = pos - prefix  # index among the request's new tokens
            offs_d = tl.arange(0, D)
            m_valid = (pos >= prefix) & (pos < seq)
            q = tl.load(q_ptr + (q0 + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                        mask=m_valid[:, None], other=0.0).to(tl.float32)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D], tl.float32)
            end = tl.minimum(first + BLOCK_M, seq)  # the tile's last query sees keys < end
            for n0 in range(0, end, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                n_valid = offs_n < seq
                slots = tl.load(table + row * stride_tr + offs_n, mask=n_valid, other=0)
                kv_off = slots * stride_bs + kvh * stride_bh
                k = tl.load(k_buf + kv_off[None, :] + offs_d[:, None], mask=n_valid[None, :], other=0.0)
                s = tl.dot(q, k.to(tl.float32)) * sm_scale  # [M, N]
                visible = (pos[:, None] >= offs_n[None, :]) & n_valid[None, :]
                s = tl.where(visible, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p = tl.exp(s - m_new[:, None])
                alpha = tl.exp(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p, 1)
                v = tl.load(v_buf + kv_off[:, None] + offs_d[None, :], mask=n_valid[:, None], other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
                m_i = m_new
            out = acc / l_i[:, None]
            tl.store(o_ptr + (q0 + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
                     out.to(o_ptr.dtype.element_ty), mask=m_valid[:, None])

    return extend_kernel
