"""Frozen configuration dataclasses, one per concern. Each field's ``metadata["help"]`` feeds the generated CLI.

``EngineConfig`` is composed of the concerns the engine needs (weights, KV cache, scheduling, decoding,
speculation, execution, parallelism); ``EngineConfig.from_flat`` builds it from flat keyword arguments (the
``Engine(**config)`` and CLI form), every field name being unique across the concerns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flashinfer")
SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random")
ROUTER_POLICIES = ("cache_aware", "round_robin", "shortest_queue")
QUANT_KINDS = ("none", "int8", "int4", "mixed")
# kernels/cpu_ext.PATHS
CPU_KERNELS = ("auto", "torch", "portable", "avx2", "avx2_vnni", "avx512", "avx512_bf16", "neon")
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Gemma3ForCausalLM")


def _opt(default, help_text: str, **extra):
    return field(default=default, metadata={"help": help_text, **extra})


def _check_choices(cfg: Any) -> None:
    """Every field declared with ``choices`` holds one of them."""
    for f in dataclasses.fields(cfg):
        choices = f.metadata.get("choices")
        value = getattr(cfg, f.name)
        if choices is not None and value not in choices and not (value is None and f.default is None):
            raise ValueError(f"{f.name} must be one of {choices}, got {value!r}")


def _check_positive(cfg: Any, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")


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

    model: str | None = _opt(None, "GGUF file or Hugging Face folder; omitted: the embedded SmolLM2-135M-Instruct")
    dtype: str = _opt("auto", "weight and activation dtype", choices=DTYPES)
    quantization: str = _opt("auto", "weight-only quantization on the CPU: int8 (groups of 32, like GGUF's "
                             "Q8_0), int4 (groups of 32, like Q4_1; the embedding / LM head stays int8) or "
                             "mixed (each GGUF matrix at its own width: int4 for 4 bits or fewer, int5 for 5, "
                             "int6 for Q6_K, int8 for 8, as Q4_K_M files mix them); auto: what the file holds "
                             "(int4, int8 or mixed; float GGUF layers and Hugging Face folders stay dense; dense "
                             "on CUDA)",
                             choices=("auto", *QUANT_KINDS))
    quantized_prefill: bool = _opt(False, "with --quantization on torch's kernels: drop the dense weights and run "
                                   "prefill through the quantized kernels too (less memory, slower prefill). "
                                   "radixlm's kernels always do: they beat the dense matmul at every batch")
    context_length: int | None = _opt(None, "longest prompt + output; default: the model's")
    weight_cache: bool = _opt(True, "keep a GGUF model's prepared weights (quantized and repacked for radixlm's CPU "
                              "kernels) on disk, keyed by the file's content, radixlm's code and these settings, "
                              "so later starts read them instead of preparing them ($RADIXLM_WEIGHT_CACHE_DIR, "
                              "else ~/.cache/radixlm/weights; the 4 most recently used are kept)")

    def __post_init__(self) -> None:
        _check_choices(self)


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV pool and the radix tree over it."""

    max_total_tokens: int | None = _opt(None, "KV pool size in tokens; default: --context-length where given (as "
                                        "llama.cpp's -c), else from --kv-cache-memory-gb")
    kv_cache_memory_gb: float = _opt(1.0, "memory for the KV pool when neither --max-total-tokens nor "
                                     "--context-length is given")
    page_size: int = _opt(1, "tokens per KV page")
    disable_radix_cache: bool = _opt(False, "plain per-request KV, no prefix sharing")
    eviction_policy: str = _opt("lru", "radix cache eviction", choices=("lru", "lfu"))
    kv_disk_path: str | None = _opt(None, "a folder for the radix cache's disk tier: the KV of cached prefixes is "
                                    "written there (as it enters the tree) and loaded back for a request whose "
                                    "prefix the RAM pool no longer holds, also after a restart; replicas of one "
                                    "machine may share it (default: no disk tier)")
    kv_disk_gb: float = _opt(8.0, "most disk the tier uses; least recently used pages go first")
    kv_disk_block: int = _opt(64, "tokens per disk page (a multiple of --page-size)")

    def __post_init__(self) -> None:
        _check_positive(self, "page_size", "kv_disk_block")
        _check_choices(self)
        if self.max_total_tokens is not None and self.max_total_tokens < 2 * self.page_size:
            raise ValueError(f"max_total_tokens must be >= 2 pages, got {self.max_total_tokens}")
        if self.kv_disk_block % self.page_size:
            raise ValueError(f"kv_disk_block must be a multiple of page_size ({self.page_size}), "
                             f"got {self.kv_disk_block}")
        if self.kv_disk_gb <= 0:
            raise ValueError(f"kv_disk_gb must be > 0, got {self.kv_disk_gb}")
        if self.kv_disk_path is not None and self.disable_radix_cache:
            raise ValueError("kv_disk_path needs the radix cache (drop --disable-radix-cache)")


@dataclass(frozen=True)
class SchedulerConfig:
    """Admission, batching and the order of the waiting queue."""

    chunked_prefill_size: int = _opt(1024, "largest prefill chunk of one request, in tokens")
    max_prefill_tokens: int = _opt(4096, "largest prefill batch, in tokens")
    max_running_requests: int = _opt(64, "most requests decoding at once")
    decode_steps: int = _opt(4, "requests decode up to this many tokens back to back while nothing else waits and "
                             "none needs the scheduler between tokens (a grammar): the "
                             "scheduler's work is paid once for them, and they stream in groups")
    decode_group_ms: float = _opt(50.0, "a group of back-to-back decode steps takes only the steps that fit in about "
                                  "this many milliseconds of the recent decode step time, so that streams stay smooth "
                                  "with large models and batches (0: no limit)")
    enable_mixed_chunk: bool = _opt(False, "running requests decode their next token inside a prefill batch "
                                    "instead of waiting for it (slower on the CPU)")
    max_queued_requests: int | None = _opt(None, "reject new requests beyond this many waiting")
    schedule_policy: str = _opt("lpm", "order of the waiting queue", choices=SCHEDULE_POLICIES)
    schedule_conservativeness: float = _opt(1.0, "above 1 reserves more KV for running requests")
    lpm_max_queue: int = _opt(128, "cache-aware policies fall back to fcfs beyond this queue length")
    max_wait_s: float = _opt(30.0, "aging bound: a request waiting longer goes first, whatever the policy")
    priority_preemption_threshold: int = _opt(10, "a waiting request preempts running ones this much worse")
    check_invariants: bool = _opt(False, "check KV accounting after every step (debug)")
    watchdog_timeout_s: float = _opt(300.0, "a forward step slower than this is reported and its requests fail")

    def __post_init__(self) -> None:
        _check_positive(self, "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "decode_steps")
        if not self.decode_group_ms >= 0:
            raise ValueError(f"decode_group_ms: must be >= 0, got {self.decode_group_ms}")
        _check_choices(self)


@dataclass(frozen=True)
class DecodingConfig:
    """Sampling defaults and grammar-constrained decoding."""

    random_seed: int = _opt(0, "seed of the engine's RNG (requests without a seed draw from it)")
    grammar_backend: str = _opt("xgrammar", "grammar backend for constrained decoding",
                                choices=("xgrammar", "outlines"))
    grammar_timeout_s: float = _opt(60.0, "a grammar that takes longer to compile fails its request")
    jump_forward: bool = _opt(True, "append grammar-forced text in one step instead of token by token")

    def __post_init__(self) -> None:
        _check_choices(self)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: suffix decoding, n-gram prompt lookup or self-speculation, adaptive."""

    speculative_algorithm: str | None = _opt(None, "speculative decoding: 'suffix' (drafts from what followed the "
                                             "same tokens in the request and in its namespace's recent outputs), "
                                             "'ngram' (prompt lookup) or 'draft' (self-speculation: the model's "
                                             "first layers + LM head)", choices=("suffix", "ngram", "draft"))
    speculative_num_draft_tokens: int = _opt(3, "speculative decoding: the most tokens proposed per step (each "
                                             "request's draft length follows its acceptance up to this; 3 keeps a "
                                             "request's verify at 4 positions, the CPU matmuls' decode tile)")
    speculative_ngram_min: int = _opt(2, "ngram and suffix speculation: shortest n-gram matched")
    speculative_ngram_max: int = _opt(4, "ngram and suffix speculation: longest n-gram matched")
    speculative_suffix_min_share: float = _opt(0.5, "suffix speculation: a drafted token's least share of the "
                                               "counts after its context")
    speculative_suffix_memory_tokens: int = _opt(65536, "suffix speculation: recent output tokens kept per "
                                                 "namespace (0: the request's own tokens only)")
    speculative_adaptive: bool = _opt(True, "measure tokens a second with and without speculation at each batch "
                                      "size and speculate only where it pays")
    speculative_draft_model: str | None = _opt(None, "draft speculation with a separate draft model (a GGUF file, "
                                               "folder or catalog name sharing the model's tokenizer, e.g. "
                                               "Qwen2.5-Coder-0.5B for the 1.5B); implies --speculative-algorithm "
                                               "draft; unset: the model's own first layers draft")
    speculative_draft_layers: int = _opt(8, "draft speculation: layers of the model the self-draft runs")
    speculative_min_accept_rate: float = _opt(0.3, "a request whose recent acceptance is below this stops "
                                              "speculating for a while")

    def __post_init__(self) -> None:
        _check_choices(self)
        if self.speculative_num_draft_tokens < 1 or self.speculative_draft_layers < 1:
            raise ValueError("speculative_num_draft_tokens and speculative_draft_layers must be >= 1")
        if not 0 < self.speculative_suffix_min_share <= 1 or self.speculative_suffix_memory_tokens < 0:
            raise ValueError("speculative_suffix_min_share must be in (0, 1] and speculative_suffix_memory_tokens "
                             ">= 0")
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ValueError(f"speculative ngram sizes must satisfy 1 <= min <= max, got "
                             f"{self.speculative_ngram_min}, {self.speculative_ngram_max}")
        if self.speculative_draft_model is not None:
            if self.speculative_algorithm not in (None, "draft"):
                raise ValueError(f"speculative_draft_model: needs --speculative-algorithm draft, got "
                                 f"{self.speculative_algorithm!r}")
            object.__setattr__(self, "speculative_algorithm", "draft")  # (frozen: the one implied value)


@dataclass(frozen=True)
class ExecutionConfig:
    """Where and how the forward pass runs: device, attention backend, kernels, graphs, threads."""

    device: str = _opt("auto", "where the model runs: cuda if available, else cpu", choices=("auto", "cpu", "cuda"))
    attention_backend: str = _opt("auto", "auto: flashinfer if importable on CUDA, else triton on CUDA, else torch",
                                  choices=ATTENTION_BACKENDS)
    disable_cuda_graph: bool = _opt(False, "run decode batches eagerly instead of replaying captured CUDA graphs")
    cuda_graph_max_bs: int = _opt(256, "largest decode batch captured in a CUDA graph (larger ones run eagerly)")
    cpu_kernels: str = _opt("auto", "radixlm's C++ CPU kernels (int4/int8 matmuls, attention, norms, the grammar "
                            "bitmask; built on first use, then cached): auto runs the fastest path this CPU has "
                            "(avx512_bf16, avx512, avx2_vnni, avx2 or portable; neon on ARM), a path's name "
                            "forces it, torch: torch's ops only", choices=CPU_KERNELS)
    enable_torch_compile: bool = _opt(False, "CPU: run decode batches through one torch.compile'd graph "
                                      "(compiled at startup, cached on disk)")
    torch_compile_max_bs: int = _opt(16, "largest decode batch the compiled CPU step runs (larger ones run eagerly)")
    num_threads: int | None = _opt(None, "torch intra-op threads; default: OMP_NUM_THREADS if set, else the CPUs "
                                   "this process may run on (its affinity mask), shared among the TP ranks")
    deterministic: bool = _opt(True, "batch- and cache-invariant decoding: a request's tokens and logprobs do not "
                               "depend on what it is batched with, the radix cache, chunking, page size or "
                               "speculation (radixlm's kernels for every matmul, norm and attention). "
                               "--no-deterministic allows --cpu-kernels torch and --enable-torch-compile, which "
                               "are not invariant")

    def __post_init__(self) -> None:
        _check_positive(self, "torch_compile_max_bs")
        _check_choices(self)
        if self.deterministic and self.cpu_kernels == "torch":
            raise ValueError("cpu_kernels 'torch': torch's matmuls and attention are not batch-invariant; add "
                             "--no-deterministic (deterministic=False) to use them")
        if self.deterministic and self.enable_torch_compile:
            raise ValueError("enable_torch_compile: the compiled decode step is not batch-invariant (its kernels "
                             "are not the eager extend's); add --no-deterministic (deterministic=False) to use it")


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor-parallel ranks, where they meet, and data-parallel replicas."""

    tp_size: int = _opt(1, "tensor-parallel ranks (one scheduler process each; gloo on the CPU, NCCL on GPUs)")
    dp_size: int = _opt(1, "data-parallel replicas, each with its own radix cache, behind a cache-aware router")
    dist_init_addr: str | None = _opt(None, "host:port where TP ranks meet; default: a free port on 127.0.0.1")
    nnodes: int = _opt(1, "machines the TP group spans")
    node_rank: int = _opt(0, "this machine's index among --nnodes (0 serves HTTP)")

    def __post_init__(self) -> None:
        _check_positive(self, "tp_size", "dp_size", "nnodes")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("nnodes > 1 needs --dist-init-addr host:port (reachable from every node)")


@dataclass(frozen=True)
class EngineConfig:
    """Everything one engine (model runner + KV cache + scheduler) needs, by concern."""

    load: LoadConfig = field(default_factory=LoadConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if self.execution.enable_torch_compile and (self.parallel.tp_size > 1 or self.execution.device == "cuda"):
            raise ValueError("enable_torch_compile compiles the CPU decode step of one process (tp_size 1); on "
                             "CUDA decode batches replay CUDA graphs instead")
        if self.speculative.speculative_draft_model is not None and self.parallel.tp_size > 1:
            raise ValueError("speculative_draft_model is not supported with tp_size > 1 yet")
        if self.cache.kv_disk_path is not None and self.parallel.tp_size > 1:
            raise ValueError("kv_disk_path is not supported with tp_size > 1 yet (each rank holds a share of the KV)")
        page, sched = self.cache.page_size, self.scheduler
        for name in ("chunked_prefill_size", "max_prefill_tokens"):  # a prefill chunk is whole pages
            if getattr(sched, name) < page:
                raise ValueError(f"{name} must be >= page_size ({page}), got {getattr(sched, name)}")

    @classmethod
    def concerns(cls) -> dict[str, type]:
        return {f.name: f.default_factory for f in dataclasses.fields(cls)}

    @classmethod
    def from_flat(cls, **options: Any) -> EngineConfig:
        """``EngineConfig.from_flat(page_size=16, quantization="int4")``: each option goes to its concern."""
        parts: dict[str, dict[str, Any]] = {name: {} for name in cls.concerns()}
        owner = {f.name: name for name, kind in cls.concerns().items() for f in dataclasses.fields(kind)}
        for key, value in options.items():
            if key not in owner:
                raise ValueError(f"Engine: unknown option {key!r}")
            parts[owner[key]][key] = value
        return cls(**{name: kind(**parts[name]) for name, kind in cls.concerns().items()})

    def flat(self) -> dict[str, Any]:
        """The inverse of from_flat: every option by name."""
        return {k: v for name in self.concerns() for k, v in dataclasses.asdict(getattr(self, name)).items()}

    def replace(self, **options: Any) -> EngineConfig:
        return EngineConfig.from_flat(**{**self.flat(), **options})


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server and its processes."""

    host: str = _opt("127.0.0.1", "address to bind (127.0.0.1 unless told otherwise)")
    port: int = _opt(30000, "HTTP port")
    served_model_name: str | None = _opt(None, "model name in the API; default: the model file's name")
    chat_template: str | None = _opt(None, "a Jinja chat template file that replaces the model's")
    reasoning_parser: str = _opt("none", "split <think>...</think> into reasoning_content (the chat template "
                                 "must write the markers)", choices=("none", "deepseek-r1", "qwen3"))
    api_key: str | None = _opt(None, "require 'Authorization: Bearer KEY' on every route but /health and the "
                               "static pages (one tenant)")
    api_keys_file: str | None = _opt(None, "a file of 'KEY TENANT' lines: each key authenticates as its tenant, "
                                     "and each tenant's prompts live in a radix namespace of their own")
    cache_sharing: str | None = _opt(None, "who shares cached prefixes: 'global' (everyone), 'tenant' (each "
                                     "tenant apart), 'salt' (only requests with the same cache_salt); "
                                     "default: tenant with --api-keys-file, else global; a cache_salt always "
                                     "splits its tenant's namespace", choices=("global", "tenant", "salt"))
    log_level: str = _opt("info", "logging level", choices=("debug", "info", "warning", "error"))
    max_request_bytes: int = _opt(8 * 2**20, "largest request body accepted")
    max_n: int = _opt(64, "largest n (samples per prompt)")
    max_stop: int = _opt(64, "most stop strings per request")
    max_top_logprobs: int = _opt(20, "largest top_logprobs")
    max_messages: int = _opt(1024, "most chat messages per request")
    request_timeout_s: float = _opt(600.0, "a request still unfinished after this long is aborted (504)")
    startup_timeout_s: float = _opt(600.0, "how long to wait for the model to load")
    drain_timeout_s: float = _opt(30.0, "on SIGTERM, how long running requests get to finish (new ones get 503)")
    dashboard_previews: str = _opt("on", "the dashboard's text previews of cached prefixes and prompts (a few "
                                   "tokens each); off: no prompt token leaves the scheduler for it",
                                   choices=("on", "off"))
    stream_interval: int = _opt(1, "send a running request's new tokens on every N-th decode step (its first "
                                "token and its end go at once): fewer wake-ups of the helper processes on the "
                                "cores the forward pass uses, in coarser chunks")

    responses_db: str = _opt("~/.cache/radixlm/responses.sqlite3", "the SQLite file of stored Responses "
                             "(store: true, the API's default; previous_response_id continues one); several "
                             "servers may share it; 'off': nothing is stored and store: true is a 400")
    responses_ttl_hours: float = _opt(720.0, "a stored response is deleted this long after it was made")
    responses_max: int = _opt(100_000, "most stored responses; beyond it the oldest are deleted")

    def __post_init__(self) -> None:
        _check_positive(self, "stream_interval", "responses_max")
        _check_choices(self)
        if self.responses_ttl_hours <= 0:
            raise ValueError(f"responses_ttl_hours must be > 0, got {self.responses_ttl_hours}")


@dataclass(frozen=True)
class RouterConfig:
    """The data-parallel router: which replica gets each request."""

    router_policy: str = _opt("cache_aware", "how requests are spread over replicas", choices=ROUTER_POLICIES)
    cache_threshold: float = _opt(0.5, "cache_aware: below this matched fraction, go to the least-loaded replica")
    balance_abs_threshold: int = _opt(8, "cache_aware: imbalanced when max - min in-flight exceeds this ...")
    balance_rel_threshold: float = _opt(1.5, "... and max in-flight exceeds this times the min")
    max_tree_chars: int = _opt(2**22, "cache_aware: characters remembered per replica (LRU beyond)")
    health_check_interval_s: float = _opt(1.0, "how often the router probes each replica's /health")

    def __post_init__(self) -> None:
        _check_choices(self)
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.max_tree_chars < 1 or self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("max_tree_chars must be >= 1, balance_abs_threshold >= 0, balance_rel_threshold >= 1")
