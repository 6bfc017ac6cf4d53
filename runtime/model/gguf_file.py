"""GGUF files: metadata -> ModelConfig, tensors -> HF-named float weights (dequantized by the `gguf` package) or
the quantized ones as int4 / int5 / int8 blocks (gguf_blocks.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import torch

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.model.gguf_blocks import WIDTHS, QuantBlocks
from radixlm.runtime.model.gguf_header import GGUFHeader
from radixlm.runtime.model.sources import ModelSource
from radixlm.runtime.model.tokenizer_files import light_tokenizer, load_tokenizer

# GGUF architecture -> HF architecture, and whether llama.cpp permuted Q/K rows for its rotary layout.
_ARCHES = {"llama": ("LlamaForCausalLM", True), "mistral": ("MistralForCausalLM", True),
           "qwen2": ("Qwen2ForCausalLM", False), "gemma3": ("Gemma3ForCausalLM", False)}
# Gemma 3: a global layer every 6, local layers' RoPE base 10,000 (llama.cpp's constants: GGUF holds neither)
GEMMA3_PATTERN, GEMMA3_LOCAL_THETA = 6, 10000.0
_DEQUANTIZABLE = {"F32", "F16", "BF16", *WIDTHS}
LAYER_WEIGHT = re.compile(r"blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight")  # the linear layers
BLOCK_WEIGHT = re.compile(LAYER_WEIGHT.pattern + r"|token_embd\.weight|output\.weight")  # ... and the head
# Gemma 3's four norms a layer (their GGUF weights hold 1 + w, as llama.cpp's converter writes them) and q / k norms
_GEMMA3_NAMES = [
    (r"blk\.(\d+)\.ffn_norm\.weight", "model.layers.{0}.pre_feedforward_layernorm.weight"),
    (r"blk\.(\d+)\.post_attention_norm\.weight", "model.layers.{0}.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.post_ffw_norm\.weight", "model.layers.{0}.post_feedforward_layernorm.weight"),
    (r"blk\.(\d+)\.attn_(q|k)_norm\.weight", "model.layers.{0}.self_attn.{1}_norm.weight"),
]
_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", "model.layers.{0}.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", "model.layers.{0}.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_(q|k|v)\.(weight|bias)", "model.layers.{0}.self_attn.{1}_proj.{2}"),
    (r"blk\.(\d+)\.attn_output\.weight", "model.layers.{0}.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.ffn_(gate|up|down)\.weight", "model.layers.{0}.mlp.{1}_proj.weight"),
]


class GGUFModel:
    """An open GGUF file: its config, its tensors (dequantized lazily) and its tokenizer."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.header = GGUFHeader(path)
            self.meta = {k: v for k, v in self.header.meta.items()
                         if not k.startswith("tokenizer.ggml.") or k.endswith("_token_id")}
            self.config = self._config()
        except (ValueError, KeyError, IndexError, OSError, EOFError) as e:
            raise ValueError(f"model: corrupt or truncated GGUF file {path}: {e}") from e

    def _config(self) -> ModelConfig:
        arch = self.meta.get("general.architecture")
        if arch not in _ARCHES:
            raise ValueError(f"model: unsupported architecture {arch!r} (supported GGUF: {sorted(_ARCHES)})")
        m, a = self.meta, arch
        heads = int(m[f"{a}.attention.head_count"])
        hidden = int(m[f"{a}.embedding_length"])
        names = {t.name for t in self.header.tensors}
        vocab = m.get(f"{a}.vocab_size") or self.header.array_lengths["tokenizer.ggml.tokens"]
        scaling = None
        if m.get(f"{a}.rope.scaling.type") == "linear":
            scaling = {"rope_type": "linear", "factor": float(m[f"{a}.rope.scaling.factor"])}
        eos = m.get("tokenizer.ggml.eos_token_id")
        return ModelConfig(
            architecture=_ARCHES[a][0], vocab_size=int(vocab), hidden_size=hidden,
            intermediate_size=int(m[f"{a}.feed_forward_length"]), num_layers=int(m[f"{a}.block_count"]),
            num_heads=heads, num_kv_heads=int(m.get(f"{a}.attention.head_count_kv", heads)),
            head_dim=int(m.get(f"{a}.attention.key_length", hidden // heads)),
            rms_norm_eps=float(m[f"{a}.attention.layer_norm_rms_epsilon"]),
            rope_theta=float(m.get(f"{a}.rope.freq_base", 10000.0)), rope_scaling=scaling,
            max_position_embeddings=int(m.get(f"{a}.context_length", 4096)),
            tie_word_embeddings="output.weight" not in names, qkv_bias="blk.0.attn_q.bias" in names,
            bos_token_id=m.get("tokenizer.ggml.bos_token_id"), eos_token_ids=(int(eos),) if eos is not None else (),
            **_window(m, a),
        )

    def num_tensors(self) -> int:
        return len(self.header.tensors)

    def layer_types(self) -> frozenset[str]:
        """The GGUF types of the decoder layers' linear weights (attention and MLP projections)."""
        return frozenset(t.tensor_type.name for t in self.header.tensors if LAYER_WEIGHT.fullmatch(t.name))

    def weights(self, dtype: torch.dtype,
                quant_blocks: bool = False) -> Iterator[tuple[str, torch.Tensor | QuantBlocks]]:
        """Yield (HF name, tensor) pairs, dequantized, or with ``quant_blocks`` the quantized linear weights and
        embedding table as int4 / int5 / int8 codes and scales (QuantBlocks: exact for Q4_0 / Q4_1 / Q5_0 / Q5_1 /
        Q8_0, Q4_K / Q5_K up to float16 scales, no round trip through ``dtype``); Q/K rows are un-permuted back
        to HF's rotary layout."""
        import gguf

        cfg, permuted = self.config, _ARCHES[self.meta["general.architecture"]][1]
        for t in self.header.tensors:
            qtype, raw = t.tensor_type.name, self.header.data(t)
            if qtype not in _DEQUANTIZABLE:
                raise ValueError(f"model: tensor {t.name} has unsupported quantization {qtype}")
            name = _hf_name(t.name, self.meta["general.architecture"])
            shape = [int(d) for d in reversed(t.shape)]
            if quant_blocks and qtype in WIDTHS and BLOCK_WEIGHT.fullmatch(t.name):
                w = QuantBlocks.from_gguf(raw, qtype, shape)
            else:
                data = np.asarray(gguf.quants.dequantize(raw, t.tensor_type), dtype=np.float32)
                if not data.flags.writeable:  # F32 tensors come back as views of the read-only memory map
                    data = data.copy()
                w = torch.from_numpy(data.reshape(shape)).to(dtype)
            if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
                w = _unpermute(w, cfg.num_heads)
            elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
                w = _unpermute(w, cfg.num_kv_heads)
            yield name, w

    def load_tokenizer(self):
        return load_tokenizer(ModelSource("gguf", self.path))

    def light_tokenizer(self):
        return light_tokenizer(ModelSource("gguf", self.path))


def _window(m: dict, arch: str) -> dict:
    """The sliding-window fields of ModelConfig for a GGUF architecture that has them."""
    if arch != "gemma3" or f"{arch}.attention.sliding_window" not in m:
        return {}
    return {"sliding_window": int(m[f"{arch}.attention.sliding_window"]), "sliding_window_pattern": GEMMA3_PATTERN,
            "rope_local_theta": GEMMA3_LOCAL_THETA}


def _hf_name(name: str, arch: str = "llama") -> str:
    for pattern, target in (_GEMMA3_NAMES if arch == "gemma3" else []) + _NAMES:
        m = re.fullmatch(pattern, name)
        if m:
            return target.format(*m.groups())
    raise ValueError(f"model: unknown GGUF tensor {name!r}")


def _unpermute(w: torch.Tensor | QuantBlocks, n_head: int) -> torch.Tensor | QuantBlocks:
    """Undo llama.cpp's Q/K row permutation (interleaved rotary pairs -> HF's rotate-half halves)."""
    rows = w.shape[0]
    order = torch.arange(rows).reshape(n_head, rows // n_head // 2, 2).transpose(1, 2).reshape(-1)
    return w.take_rows(order) if isinstance(w, QuantBlocks) else w[order]
