"""Decode attention on the CPU: one query token per request over its KV slots, with shared prefixes
computed once (cascade attention).

Requests whose slot rows start with the same run of slots (a system prompt from the radix cache) form a
group: the group's queries attend to that prefix in one matmul against a single gather of it, each request
attends to the rest of its own slots in a padded batch, and the two parts are merged by their log-sum-exp.
Without this, every request re-reads the shared prefix: at 128 requests over a 1,000-token prompt that was
most of the decode step.

Shapes: B requests, Hkv KV heads, G query heads per KV head, D head dim, Ls padded suffix length.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.kernels import cpu_decode_attention as native_kernel
from radixlm.runtime.kv.pool import KVPool

MIN_SHARED = 32  # shorter shared prefixes are not worth a separate pass
# Without shared prefixes and up to this many padded keys per head (B * Ls), one fused SDPA call beat the
# matmul / softmax / matmul chain of tiny bmm calls when measured on the CPU (bf16, 1-8 requests of 100-300
# keys); beyond it the chain wins.
SDPA_MAX_KEYS = 2400


@dataclass
class PrefixGroup:
    members: torch.Tensor  # [n] request indices in the batch
    slots: torch.Tensor  # [S] the shared prefix's KV slots


@dataclass
class DecodeMeta:
    idx: torch.Tensor  # [B * Ls] slots of each request's own part (suffix), padded
    suffix_len: int  # Ls
    mask: torch.Tensor | None  # [1, B, 1, Ls] True = attend; None when no request is padded
    groups: list[PrefixGroup]
    bias: torch.Tensor | None = None  # the mask as float32 0 / -inf (the fused kernel's form), with groups
    native: tuple[torch.Tensor, ...] | None = None  # native_args for the C++ kernel (it takes every batch)


def plan_decode(table: torch.Tensor, rows: torch.Tensor, seq_lens: list[int], isa: int | None = None) -> DecodeMeta:
    """``isa`` (a path of radixlm's C++ kernels): the kernel's step inputs too (DecodeMeta.native). It reads
    each request's whole slot row, shared prefix included, so no prefix groups are formed for it: a
    request's attention then never depends on the batch it is in."""
    lens = torch.tensor(seq_lens)
    longest = max(seq_lens)
    slots = table[rows, :longest]  # [B, Lmax]
    if isa is not None:  # each request's own slot row, unpadded for the kernel: idx is the rows themselves
        mask = None if min(seq_lens) == longest else (torch.arange(longest) < lens.unsqueeze(1))[None, :, None, :]
        return DecodeMeta(slots.reshape(-1), longest, mask, [], None, native_args(lens, None, None))
    groups = prefix_groups(slots, lens)
    start = torch.zeros_like(lens)
    for group in groups:
        start[group.members] = group.slots.numel()
    suffix_len = int((lens - start).max())
    pos = start.unsqueeze(1) + torch.arange(suffix_len).unsqueeze(0)  # [B, Ls]
    mask = pos < lens.unsqueeze(1)
    idx = slots.gather(1, pos.clamp(max=slots.shape[1] - 1))
    mask = None if bool(mask.all()) else mask[None, :, None, :]
    bias = additive_bias(mask) if groups and mask is not None else None
    return DecodeMeta(idx.reshape(-1), suffix_len, mask, groups, bias)


def prefix_groups(slots: torch.Tensor, lens: torch.Tensor) -> list[PrefixGroup]:
    """Requests whose slot rows [B, Lmax] start with the same run of at least MIN_SHARED slots."""
    by_first: dict[int, list[int]] = defaultdict(list)
    for i, first in enumerate(slots[:, 0].tolist()):
        by_first[first].append(i)
    groups = []
    for members in by_first.values():
        if len(members) < 2:
            continue
        m = torch.tensor(members)
        sub = slots[m]
        limit = int(lens[m].min()) - 1  # the newest token is always the request's own
        differs = (sub[:, :limit] != sub[:1, :limit]).any(dim=0).nonzero()
        shared = int(differs[0]) if len(differs) else limit
        if shared >= MIN_SHARED:
            groups.append(PrefixGroup(m, sub[0, :shared].clone()))
    return groups


def _partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    """q [..., G, D], k/v [..., L, D] -> (unnormalized out [..., G, D] f32, max [..., G, 1], sum [..., G, 1])."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - m)
    return torch.matmul(p.to(v.dtype), v).float(), m, p.sum(dim=-1, keepdim=True)


def additive_bias(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask (True = attend) as the float32 0 / -inf bias the fused flash kernel takes."""
    return torch.zeros(mask.shape, dtype=torch.float32).masked_fill(~mask, float("-inf"))


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None):
    """q [N, H, Lq, D], k/v [N, H, L, D] -> (out [N, H, Lq, D] float32, lse [N, H, Lq] float32): torch's fused
    CPU attention kernel, which also returns the log-sum-exp that merging two partial attentions needs."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)
    return out.float(), lse


def _attend_with_groups(qg, k, v, pool: KVPool, layer: int, meta: DecodeMeta) -> torch.Tensor:
    """Cascade: every request over its own suffix, each group's queries over their shared prefix at once,
    merged by log-sum-exp. qg [Hkv, B, G, D], k/v [Hkv, B, Ls, D] -> [Hkv, B, G, D] float32."""
    out, lse = _flash(qg, k, v, meta.bias)
    for group in meta.groups:
        kp, vp = pool.gather(layer, group.slots, workspace=1)  # [Hkv, S, D], read once for the group
        merge_prefix(out, lse, qg, kp, vp, group.members)
    return out


def merge_prefix(out: torch.Tensor, lse: torch.Tensor, qg: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor,
                 members: torch.Tensor) -> None:
    """Fold one group's shared prefix kp, vp [Hkv, S, D] into the attention its ``members`` [n] already have
    over their own suffixes (out [Hkv, B, G, D] float32, updated in place; lse [Hkv, B, G])."""
    hkv, _, g, d = qg.shape
    n = members.shape[0]
    qm = qg[:, members].reshape(1, hkv, n * g, d)  # all the group's queries at once
    o2, l2 = _flash(qm, kp.unsqueeze(0), vp.unsqueeze(0), None)
    o2, l2 = o2.view(hkv, n, g, d), l2.view(hkv, n, g)
    l1 = lse[:, members]
    top = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - top).unsqueeze(-1), torch.exp(l2 - top).unsqueeze(-1)
    out[:, members] = (out[:, members] * w1 + o2 * w2) / (w1 + w2)


def traced_decode_attention(q: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, idx: torch.Tensor,
                            mask: torch.Tensor, members: torch.Tensor | None,
                            prefix: torch.Tensor | None) -> torch.Tensor:
    """decode_attention for torch.compile: the same math with no branch on sizes (one graph serves every
    batch), at most one shared-prefix group, and fresh gathers instead of the pool's workspaces.
    q [B, Hq, D]; kb, vb one layer's [Hkv, S, D]; idx [B * Ls]; mask [1, B, 1, Ls]: bool without a group,
    its additive_bias with one; members [n] and prefix [P] slots of the group, or None -> [B, Hq * D]."""
    b, hq, d = q.shape
    hkv, ls = kb.shape[0], mask.shape[-1]
    qg = q.view(b, hkv, hq // hkv, d).transpose(0, 1)  # [Hkv, B, G, D]
    k, v = kb.index_select(1, idx).view(hkv, b, ls, d), vb.index_select(1, idx).view(hkv, b, ls, d)
    if members is None:
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
    else:
        out, lse = _flash(qg, k, v, mask)
        merge_prefix(out, lse, qg, kb.index_select(1, prefix), vb.index_select(1, prefix), members)
    return out.to(q.dtype).permute(1, 0, 2, 3).reshape(b, hq * d)


def native_fits(pool: KVPool, num_q_heads: int, head_dim: int) -> bool:
    """Whether radixlm's C++ decode attention (kernels/cpu_decode_attention.cpp) takes this pool: a
    head-major float32 / bfloat16 CPU pool, head dim 64 or 128, at most 16 query heads a KV head."""
    kb = pool.k_buffer[0] if pool.k_buffer else None
    return (kb is not None and kb.device.type == "cpu" and pool.head_major and head_dim in (64, 128)
            and kb.dtype in (torch.float32, torch.bfloat16) and num_q_heads % kb.shape[0] == 0
            and num_q_heads // kb.shape[0] <= 16)


def native_args(counts: torch.Tensor, members: torch.Tensor | None,
                prefix: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's inputs to the C++ kernel after idx, built once a step (not per layer): (counts [B] valid
    slots of each padded idx row, prefix [P] the group's shared slots or empty, member [B] bool: in it)."""
    member = torch.zeros(counts.shape[0], dtype=torch.bool)
    if members is None:
        return counts, torch.zeros(0, dtype=torch.int64), member
    member[members] = True
    return counts, prefix, member


def decode_attention(q: torch.Tensor, pool: KVPool, layer: int, meta: DecodeMeta, isa: int | None = None) -> torch.Tensor:
    """q [B, Hq, D] -> [B, Hq * D]. ``isa``: radixlm's C++ kernel on that path (see native_fits), for the
    batches plan_decode planned for it."""
    b, hq, d = q.shape
    if isa is not None and meta.native is not None:
        kb, vb = pool.k_buffer[layer], pool.v_buffer[layer]
        return native_kernel.decode_attention(q.contiguous(), kb, vb, meta.idx.view(b, -1), *meta.native, isa)
    k, v = pool.gather(layer, meta.idx)  # [Hkv, B * Ls, D]
    hkv = k.shape[0]
    qg = q.view(b, hkv, hq // hkv, d).transpose(0, 1)  # [Hkv, B, G, D]: query heads by their KV head
    k, v = k.view(hkv, b, meta.suffix_len, d), v.view(hkv, b, meta.suffix_len, d)
    if not meta.groups and b * meta.suffix_len <= SDPA_MAX_KEYS:  # a KV head's G query heads act as G positions
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=meta.mask)  # [Hkv, B, G, D]
        return out.permute(1, 0, 2, 3).reshape(b, hq * d)
    if meta.groups:
        out = _attend_with_groups(qg, k, v, pool, layer, meta)
    else:
        out, _, s = _partial(qg, k, v, meta.mask)
        out = out / s
    return out.to(q.dtype).permute(1, 0, 2, 3).reshape(b, hq * d)  # [Hkv, B, G, D] -> [B, Hq D]
