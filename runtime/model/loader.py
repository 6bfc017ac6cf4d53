"""Find and load a model: the embedded default, a GGUF file or a Hugging Face folder (one reader module per
format: gguf_file.py, hf_folder.py), or random weights for tests; plus the dtype, device and thread count a
process runs it with."""

from __future__ import annotations

import logging

import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels.cpu_info import core_budget
from radixlm.runtime.config import EngineConfig, ModelConfig
from radixlm.runtime.model.gguf_blocks import EIGHT_BIT, FOUR_BIT, WIDTHS
from radixlm.runtime.model.gguf_file import GGUFModel
from radixlm.runtime.model.hf_folder import HFModel
from radixlm.runtime.model.layers import TPInfo
from radixlm.runtime.model.llama import LlamaForCausalLM
from radixlm.runtime.model.quantization import quantize_model
from radixlm.runtime.model.sources import resolve_model
from radixlm.runtime.model.weight_arena import move_to_arena
from radixlm.runtime.model.weight_cache import WeightCache
from radixlm.runtime.progress import Progress

# bfloat16 on every CPU: it halves the bytes a decode step reads against float32; with AVX512-BF16 the
# kernels multiply bf16 in hardware, elsewhere they widen it to float32 in registers (bench_quant.py compares
# the weight forms and dtypes: benchmarks/results/quant/)
DEFAULT_DTYPE = torch.bfloat16
log = logging.getLogger("radixlm.model")


def open_model(model: str | None) -> GGUFModel | HFModel:
    source = resolve_model(model)
    return GGUFModel(source.path) if source.kind == "gguf" else HFModel(source.path)


def load_model(files: GGUFModel | HFModel, dtype: torch.dtype, tp: TPInfo | None = None,
               progress: bool = True, quant_blocks: bool = False) -> LlamaForCausalLM:
    """``quant_blocks``: a GGUF file's quantized weights load as int4 / int5 / int6 / int8 blocks (gguf_blocks.py;
    quantize_model then keeps them as they are, or requantizes them to the width asked for), not as dense float
    weights."""
    model = _empty_model(files.config, dtype, tp)
    total = files.num_tensors()
    weights = files.weights(dtype, quant_blocks) if isinstance(files, GGUFModel) else files.weights(dtype)
    with Progress("Loading weights", total=total, unit="tensor", enabled=progress) as bar:
        loaded = model.load_weights(bar.wrap(weights))
    if len(loaded) < model.expected_weights():
        raise ValueError(f"model: checkpoint has {len(loaded)} of {model.expected_weights()} expected tensors")
    return model.eval()


def _empty_model(cfg: ModelConfig, dtype: torch.dtype, tp: TPInfo | None) -> LlamaForCausalLM:
    """The model's modules with ``dtype`` weights for the checkpoint to fill (the layers make them with torch.empty,
    norms and embeddings with ones and zeros; the RoPE tables ask for float32 themselves). Built in ``dtype``
    directly, not on the meta device: meta tensors import torch's meta kernels and sympy, which took longer than
    the rest of a small model's load."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return LlamaForCausalLM(cfg, tp)
    finally:
        torch.set_default_dtype(default)


def random_model(cfg: ModelConfig, dtype: torch.dtype = torch.float32, seed: int = 0,
                 device: str = "cpu") -> LlamaForCausalLM:
    """A model with small random weights (the same for a seed on any device: drawn on the CPU), for fast unit
    tests and for benchmarks of shapes no file has (benchmarks/gpu_bench.py)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        else:
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.08)
    return model.eval()


def resolve_dtype(name: str) -> torch.dtype:
    return {"auto": DEFAULT_DTYPE, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for, but torch sees no CUDA device")
    return torch.device("cuda" if name == "cuda" or name == "auto" and torch.cuda.is_available() else "cpu")


def thread_budget(cfg: EngineConfig) -> int:
    """torch threads for this process: the core budget shared among the TP ranks on this machine."""
    return cfg.execution.num_threads or max(1, core_budget() // cfg.parallel.tp_size)


def resolve_quantization(choice: str, files: GGUFModel | HFModel | None, device: torch.device) -> tuple[str, str]:
    """--quantization auto -> (the kind, why): what the file's linear layers hold, on the CPU."""
    if choice != "auto":
        return choice, "asked for"
    if device.type != "cpu":
        return "none", "quantized kernels run on the CPU only"
    if not isinstance(files, GGUFModel):
        return "none", "the weights are not a quantized GGUF file"
    types = files.layer_types()
    held = f"the GGUF file's layers are {'/'.join(sorted(types))}"
    if types and types <= FOUR_BIT:
        return "int4", held
    if types and types <= EIGHT_BIT:
        return "int8", held
    if types and types <= WIDTHS.keys():
        return "mixed", held + (" (each at its width: int2 for Q2_K, int3 for Q3_K, int4 for the other 4-bit types "
                                "(IQ4_*, IQ2_* and IQ1_* as codes into their values) and IQ3_S, int5 for 5 bits, int6 "
                                "for Q6_K and IQ3_XXS, int8 for 8)")
    return "none", f"the GGUF file's layers are {'/'.join(sorted(types)) or 'dense'}"


def load_for(cfg: EngineConfig, rank: int = 0, progress: bool = True):
    """Set this process's threads and load rank ``rank``'s shard -> (files, model on its device, dtype, the
    config with --quantization auto resolved). A GGUF model on radixlm's CPU kernels comes back prepared
    (prepare_weights): from the weight cache where an entry has its key, else prepared here and written there."""
    torch.set_num_threads(thread_budget(cfg))
    files = open_model(cfg.load.model)
    dtype = resolve_dtype(cfg.load.dtype)
    device = resolve_device(cfg.execution.device)
    kind, why = resolve_quantization(cfg.load.quantization, files, device)
    log.info("weights: %s (%s); dtype %s", kind, why, str(dtype).removeprefix("torch."))
    cfg = cfg.replace(quantization=kind)
    cache, isa = _weight_cache(cfg, files, dtype, device)
    if cache is not None and cache.exists():
        model = _empty_model(files.config, dtype, TPInfo(rank, 1))
        model.weight_arena = cache.load(model)
        if model.weight_arena is not None:
            model.prepared = True
            log.info("weights: read prepared from the weight cache (%s)", cache.folder)
            return files, model, dtype, cfg
    model = load_model(files, dtype, TPInfo(rank, cfg.parallel.tp_size), progress=progress,
                       quant_blocks=kind in ("int4", "int8", "mixed")).to(device)
    if isinstance(files, GGUFModel):
        files.header.drop_pages()  # the weights are copied out: the file's pages leave this process's memory
    if cache is not None:
        prepare_weights(model, cfg, isa)
        if model.weight_arena is not None and cache.save(model, model.weight_arena):
            log.info("weights: prepared and written to the weight cache (%s)", cache.folder)
    return files, model, dtype, cfg


def prepare_weights(model: LlamaForCausalLM, cfg: EngineConfig, isa: int | None) -> None:
    """Quantize ``model`` (quantize_model) and, on the CPU, move its kernels' weights into one block
    (move_to_arena): once, so a model already prepared (or restored from the weight cache) is left as it is."""
    if model.prepared:
        return
    quantize_model(model, cfg.load.quantization, keep_dense=not cfg.load.quantized_prefill, isa=isa,
                   deterministic=cfg.execution.deterministic)
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    model.weight_arena = move_to_arena(model) if on_cpu else None
    model.prepared = True


def _weight_cache(cfg: EngineConfig, files: GGUFModel | HFModel, dtype: torch.dtype,
                  device: torch.device) -> tuple[WeightCache | None, int | None]:
    """The weight cache entry for this load (None where there is none: off, not a GGUF file, not radixlm's CPU
    kernels, tensor parallel, a file that cannot be read or a cache folder that cannot be written) and the
    kernel path."""
    if device.type != "cpu":
        return None, None
    isa = cpu_ext.resolve(cfg.execution.cpu_kernels)
    if not cfg.load.weight_cache or not isinstance(files, GGUFModel) or isa is None or cfg.parallel.tp_size > 1:
        return None, isa
    settings = {"dtype": str(dtype), "quantization": cfg.load.quantization, "isa": isa,
                "quantized_prefill": cfg.load.quantized_prefill, "deterministic": cfg.execution.deterministic}
    try:
        return WeightCache.entry(files.path, settings), isa
    except OSError as e:
        log.warning("weight cache: off for this start (%s)", e)
        return None, isa
