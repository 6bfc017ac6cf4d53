"""The model's architecture and how its weights load."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.config.options import DTYPES, QUANT_KINDS, check_choices, opt


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Llama-family decoder, read from GGUF metadata or a Hugging Face config.json."""

    architecture: str  # one of SUPPORTED_ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # sliding-window attention (Gemma 3): layers attend to their last `sliding_window` positions, except every
    # `sliding_window_pattern`-th layer (global, at rope_theta); the local layers rotate at rope_local_theta
    sliding_window: int | None = None
    sliding_window_pattern: int = 1
    rope_local_theta: float | None = None

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s attention window (None: it sees every earlier position)."""
        if self.sliding_window is None or (layer + 1) % self.sliding_window_pattern == 0:
            return None
        return self.sliding_window


@dataclass(frozen=True)
class LoadConfig:
    """Which weights, in which form."""

    model: str | None = opt(None, "GGUF file or Hugging Face folder; omitted: the embedded SmolLM2-135M-Instruct")
    dtype: str = opt("auto", "weight and activation dtype", choices=DTYPES)
    quantization: str = opt("auto", "weight-only quantization on the CPU: int8 (groups of 32, like GGUF's "
                             "Q8_0), int4 (groups of 32, like Q4_1; the embedding / LM head stays int8) or "
                             "mixed (each GGUF matrix at its own width: int4 for 4 bits or fewer, int5 for 5, "
                             "int6 for Q6_K, int8 for 8, as Q4_K_M files mix them); auto: what the file holds "
                             "(int4, int8 or mixed; float GGUF layers and Hugging Face folders stay dense; dense "
                             "on CUDA)",
                             choices=("auto", *QUANT_KINDS))
    quantized_prefill: bool = opt(False, "with --quantization on torch's kernels: drop the dense weights and run "
                                   "prefill through the quantized kernels too (less memory, slower prefill). "
                                   "radixlm's kernels always do: they beat the dense matmul at every batch")
    context_length: int | None = opt(None, "longest prompt + output; default: the model's")
    weight_cache: bool = opt(True, "keep a GGUF model's prepared weights (quantized and repacked for radixlm's CPU "
                              "kernels) on disk, keyed by the file's content, radixlm's code and these settings, "
                              "so later starts read them instead of preparing them ($RADIXLM_WEIGHT_CACHE_DIR, "
                              "else ~/.cache/radixlm/weights; the 4 most recently used are kept)")

    def __post_init__(self) -> None:
        check_choices(self)
