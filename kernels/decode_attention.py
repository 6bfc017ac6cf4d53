"""Decode attention over the paged KV pool: one query token per request over all of its slots,
grouped-query heads, split-K so that long contexts spread over many programs.

Stage 1: program (request, query head, split) computes a partial softmax over its share of the keys:
the normalized output and its log-sum-exp. Stage 2 merges the splits by their log-sum-exp.

Shapes: B requests, Hq / Hkv heads, D head dim, S pool slots, NS splits.
"""

from __future__ import annotations

import functools

import torch


def decode_attention_torch(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, table: torch.Tensor,
                           req_rows: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float,
                           head_major: bool = True) -> torch.Tensor:
    """q [B, Hq, D] -> out [B, Hq, D] in q's dtype (computed in float32)."""
    ones = torch.ones_like(seq_lens)
    from radixlm.kernels.extend_attention import extend_attention_torch

    return extend_attention_torch(q, k_buf, v_buf, table, req_rows, seq_lens, ones, sm_scale, head_major)


def decode_attention_triton(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, table: torch.Tensor,
                            req_rows: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float,
                            head_major: bool = True, num_splits: int = 8, block_n: int = 64) -> torch.Tensor:
    """The same in two launches. ``num_splits`` is fixed (not data-dependent), so the launch can be captured
    in a CUDA graph; each request's keys are cut into that many equal chunks."""
    b, hq, d = q.shape
    hkv = k_buf.shape[0] if head_major else k_buf.shape[1]
    s_dim, h_dim = (1, 0) if head_major else (0, 1)
    mid_o = torch.empty(b, hq, num_splits, d, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(b, hq, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    stage1, stage2 = _kernels()
    stage1[(b, hq, num_splits)](q, k_buf, v_buf, table, req_rows, seq_lens, mid_o, mid_lse, sm_scale,
                                q.stride(0), q.stride(1), k_buf.stride(s_dim), k_buf.stride(h_dim), table.stride(0),
                                GROUP=hq // hkv, D=d, NUM_SPLITS=num_splits, BLOCK_N=block_n)
    stage2[(b, hq)](mid_o, mid_lse, out, out.stride(0), out.stride(1), D=d, NUM_SPLITS=num_splits)
    return out


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def decode_stage1(q_ptr, k_buf, v_buf, table, rows_ptr, seq_ptr, mid_o, mid_lse, sm_scale,
                      stride_qb, stride_qh, stride_bs, stride_bh, stride_tr,
                      GROUP: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
        b, h, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        seq = tl.load(seq_ptr + b).to(tl.int32)
        row = tl.load(rows_ptr + b)
        chunk = tl.cdiv(seq, NUM_SPLITS)
        lo = split * chunk
        hi = tl.minimum(lo + chunk, seq)
        offs_d = tl.arange(0, D)
        q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_d).to(tl.float32)
        kvh = h // GROUP
        m_i = float("-inf")
        l_i = 0.0
        acc = tl.zeros([D], tl.float32)
        for n0 in range(lo, hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            valid = offs_n < hi
            slots = tl.load(table + row * stride_tr + offs_n, mask=valid, other=0)
            kv_off = slots * stride_bs + kvh * stride_bh
            k = tl.load(k_buf + kv_off[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], 1) * sm_scale
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m_i - m_new)
            v = tl.load(v_buf + kv_off[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * v, 0)
            l_i = l_i * alpha + tl.sum(p, 0)
            m_i = m_new
        base = (b * tl.num_programs(1) + h) * NUM_SPLITS + split
        if hi > lo:
            tl.store(mid_o + base * D + offs_d, acc / l_i)
            tl.store(mid_lse + base, m_i + tl.log(l_i))
        else:  # an empty split (short context): weight 0 in the merge
            tl.store(mid_o + base * D + offs_d, tl.zeros([D], tl.float32))
            tl.store(mid_lse + base, float("-inf"))

    @triton.jit
    def decode_stage2(mid_o, mid_lse, o_ptr, stride_ob, stride_oh, D: tl.constexpr, NUM_SPLITS: tl.constexpr):
        b, h = tl.program_id(0), tl.program_id(1)
        base = (b * tl.num_programs(1) + h) * NUM_SPLITS
        offs_s = tl.arange(0, NUM_SPLITS)
        offs_d = tl.arange(0, D)
        lse = tl.load(mid_lse + base + offs_s)
        w = tl.exp(lse - tl.max(lse, 0))
        o = tl.load(mid_o + (base + offs_s)[:, None] * D + offs_d[None, :])
        out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
        tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty))

    return decode_stage1, decode_stage2
