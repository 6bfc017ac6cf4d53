"""Gemma 3's decoder layer, beside the Llama one (llama.py builds it for Gemma3ForCausalLM):
- q and k are RMS-normed per head (over D) before RoPE;
- four norms a layer: before and after attention, before and after the MLP, each output normed before its
  residual add;
- the MLP is GeGLU: gelu_tanh(gate) * up;
- local layers attend to a sliding window (ModelConfig.window) with their own RoPE base; every sixth is global;
- the embedding is scaled by sqrt(H) (in the model's dtype, as transformers does), in llama.py.
The GGUF file's norm weights already hold Gemma's 1 + w, so plain RMSNorm applies them.

Shapes: T tokens, H hidden size, Hq / Hkv query / KV heads, D head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.model.layers import ColumnParallelLinear, RMSNorm, RowParallelLinear, TPInfo, split_range
from radixlm.runtime.model.rotary import RopeAt
from radixlm.runtime.model.self_attention import Attend, Attention


class Gemma3Attention(Attention):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPInfo) -> None:
        super().__init__(cfg, layer_id, tp)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: RopeAt, attend: Attend) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 Hkv) D]
        d = self.head_dim
        q, k, v = qkv.split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        q = self.q_norm(q.reshape(-1, d)).view(-1, self.num_heads, d)
        k = self.k_norm(k.reshape(-1, d)).view(-1, self.num_kv_heads, d)
        q, k = rope(q, k)
        return self.o_proj(attend(q, k, v.reshape(-1, self.num_kv_heads, d), self.layer_id))


class GeGLU(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPInfo) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear.even(cfg.hidden_size, [cfg.intermediate_size] * 2, False, tp)
        self.down_proj = RowParallelLinear(split_range(cfg.intermediate_size, tp.rank, tp.size), cfg.hidden_size, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPInfo) -> None:
        super().__init__()
        self.self_attn = Gemma3Attention(cfg, layer_id, tp)
        self.mlp = GeGLU(cfg, tp)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = RMSNorm(h, eps), RMSNorm(h, eps)

    def forward(self, x, residual, rope: RopeAt, attend: Attend):
        """(x, residual) -> (this layer's output, the residual stream before it is added): the same contract as
        the Llama layer, so the caller's final norm adds the last output."""
        if residual is not None:
            x = x + residual
        residual = x
        x = self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, attend))
        residual = residual + x
        x = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(residual)))
        return x, residual
