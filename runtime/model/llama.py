"""One Llama-family decoder: Llama, Mistral, Qwen2 (qkv bias), SmolLM (Llama with tied embeddings) and Gemma 3
(its own layer, gemma3.py: q/k norms, four norms a layer, GeGLU, sliding-window layers, a scaled embedding).

Shapes: T tokens in the flattened batch, H hidden size, Hq/Hkv local query/KV heads, D head dim.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import cpu_norm_act
from radixlm.runtime.config import ModelConfig
from radixlm.runtime.model.gemma3 import Gemma3DecoderLayer
from radixlm.runtime.model.layers import (
    ColumnParallelLinear,
    HeadShard,
    RMSNorm,
    RowParallelLinear,
    TPInfo,
    VocabParallelEmbedding,
    native_cpu_ok,
    split_range,
)
from radixlm.runtime.model.rotary import RopeAt, RotaryEmbedding
from radixlm.runtime.model.self_attention import Attend, Attention

# HF weight name fragment -> (our module fragment, shard index within a stacked weight)
_STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
            "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


class MLP(nn.Module):
    cpu_isa: int | None = None  # radixlm's C++ silu(gate) * up on the eager CPU path (set by ModelRunner)

    def __init__(self, cfg: ModelConfig, tp: TPInfo) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear.even(cfg.hidden_size, [cfg.intermediate_size] * 2, False, tp)
        self.down_proj = RowParallelLinear(split_range(cfg.intermediate_size, tp.rank, tp.size), cfg.hidden_size, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if native_cpu_ok(gate_up, self.cpu_isa) and gate_up.shape[-1] % 32 == 0:
            return self.down_proj(cpu_norm_act.silu_mul(gate_up, self.cpu_isa))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPInfo) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_id, tp)
        self.mlp = MLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, rope: RopeAt, attend: Attend):
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, rope, attend)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPInfo | None = None) -> None:
        super().__init__()
        tp = tp or TPInfo()
        if tp.size > cfg.num_heads:
            raise ValueError(f"tp_size {tp.size} exceeds the number of attention heads ({cfg.num_heads})")
        HeadShard.of(cfg.num_heads, cfg.num_kv_heads, tp)  # raises on a split that cannot keep groups local
        self.cfg, self.tp = cfg, tp
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.gemma = cfg.architecture == "Gemma3ForCausalLM"
        if self.gemma:
            self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        else:
            self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = self.embed_tokens if cfg.tie_word_embeddings else VocabParallelEmbedding(
            cfg.vocab_size, cfg.hidden_size, tp)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.rotary_local = None if cfg.rope_local_theta is None else RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_local_theta, None)
        # set once its weights are quantized and placed (loader.prepare_weights): the block the kernels read
        self.prepared, self.weight_arena = False, None

    @torch.inference_mode()
    def forward(self, batch) -> torch.Tensor:
        """batch.input_ids [T], batch.positions [T] -> logits [R, vocab] float32 for rows batch.logit_rows [R]."""
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
            return batch.attn_backend.forward(q, k, v, layer, batch)

        return self.compute(batch.input_ids, batch.positions, attend, batch.logit_rows, batch.num_layers)

    def compute(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend,
                logit_rows: torch.Tensor | None = None, num_layers: int | None = None) -> torch.Tensor:
        """input_ids, positions [T] -> logits [R, vocab] float32 for rows ``logit_rows`` [R] (None: all T).
        ``attend(q, k, v, layer)`` stores the new K/V and attends; the compiled CPU decode step traces this."""
        x, residual = self.embed_tokens(input_ids), None
        if self.gemma:  # the normalizer in the model's dtype, as transformers rounds it
            x = x * torch.tensor(self.cfg.hidden_size ** 0.5, dtype=x.dtype)
        rope = self.rotary.at(positions, x.dtype)
        local = self.rotary_local.at(positions, x.dtype) if self.rotary_local is not None else rope
        for i, layer in enumerate(self.layers[:num_layers]):  # a sliding-window layer rotates at its own base
            x, residual = layer(x, residual, rope if self.cfg.window(i) is None else local, attend)
        if logit_rows is not None:
            x, residual = x[logit_rows], residual[logit_rows]
        x, _ = self.norm(x, residual)
        return self.lm_head.logits(x)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into this rank's shards; returns the parameter names that were loaded."""
        params = dict(self.named_modules())
        loaded: set[str] = set()
        for name, w in weights:
            if "rotary_emb" in name:
                continue
            name = name.removeprefix("model.")
            module_name, _, kind = name.rpartition(".")
            shard = 0
            for hf, (ours, idx) in _STACKED.items():
                if f".{hf}" in module_name:
                    module_name, shard = module_name.replace(hf, ours), idx
                    break
            if module_name == "lm_head" and self.cfg.tie_word_embeddings:
                continue
            module = params.get(module_name)
            if module is None or not hasattr(module, "load") and not isinstance(module, RMSNorm):
                raise ValueError(f"model: unexpected weight {name!r}")
            if isinstance(module, RMSNorm):
                module.weight.data.copy_(w)
            else:
                module.load(shard, kind, w)
            loaded.add(f"{module_name}.{kind}#{shard}")
        return loaded

    def expected_weights(self) -> int:
        """How many HF tensors a complete checkpoint has (q, k, v, o, gate, up, down, 2 norms a layer; Gemma 3: 6)."""
        per_layer = 7 + (6 if self.gemma else 2) + (3 if self.cfg.qkv_bias else 0)
        return self.cfg.num_layers * per_layer + 2 + (0 if self.cfg.tie_word_embeddings else 1)
