"""The attention module of a Llama-family decoder layer (Llama's and Gemma 3's): qkv, RoPE, the backend's
attention over the paged KV pool, o_proj.

Shapes: T tokens in the flattened batch, H hidden size, Hq/Hkv local query/KV heads, D head dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.model.layers import ColumnParallelLinear, HeadShard, RowParallelLinear, TPInfo
from radixlm.runtime.model.rotary import RopeAt

# attend(q [T, Hq, D], k [T, Hkv, D], v, layer) -> [T, Hq D]: stores k, v in the KV pool, then attends
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPInfo) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = d = cfg.head_dim
        heads = HeadShard.of(cfg.num_heads, cfg.num_kv_heads, tp)
        self.num_heads, self.num_kv_heads = heads.q_count, heads.kv_count
        q_part, kv_part = (heads.q_start * d, heads.q_count * d), (heads.kv_start * d, heads.kv_count * d)
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, [q_part, kv_part, kv_part], cfg.qkv_bias)
        self.o_proj = RowParallelLinear(q_part, cfg.hidden_size, tp)

    def forward(self, x: torch.Tensor, rope: RopeAt, attend: Attend) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 Hkv) D]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = rope(q, k)
        out = attend(q, k, v, self.layer_id)  # [T, Hq D]
        return self.o_proj(out)
