"""The KV pool with its radix tree, and the scheduler that admits requests into it."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.config.options import SCHEDULE_POLICIES, check_choices, check_positive, opt


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV pool and the radix tree over it."""

    max_total_tokens: int | None = opt(None, "KV pool size in tokens; default: --context-length where given (as "
                                        "llama.cpp's -c), else from --kv-cache-memory-gb")
    kv_cache_memory_gb: float = opt(1.0, "memory for the KV pool when neither --max-total-tokens nor "
                                     "--context-length is given")
    page_size: int = opt(1, "tokens per KV page")
    disable_radix_cache: bool = opt(False, "plain per-request KV, no prefix sharing")
    eviction_policy: str = opt("lru", "radix cache eviction", choices=("lru", "lfu"))
    kv_disk_path: str | None = opt(None, "a folder for the radix cache's disk tier: the KV of cached prefixes is "
                                    "written there (as it enters the tree) and loaded back for a request whose "
                                    "prefix the RAM pool no longer holds, also after a restart; replicas of one "
                                    "machine may share it (default: no disk tier)")
    kv_disk_gb: float = opt(8.0, "most disk the tier uses; least recently used pages go first")
    kv_disk_block: int = opt(64, "tokens per disk page (a multiple of --page-size)")

    def __post_init__(self) -> None:
        check_positive(self, "page_size", "kv_disk_block")
        check_choices(self)
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

    chunked_prefill_size: int = opt(1024, "largest prefill chunk of one request, in tokens")
    max_prefill_tokens: int = opt(4096, "largest prefill batch, in tokens")
    max_running_requests: int = opt(64, "most requests decoding at once")
    decode_steps: int = opt(4, "requests decode up to this many tokens back to back while nothing else waits and "
                             "none needs the scheduler between tokens (a grammar): the "
                             "scheduler's work is paid once for them, and they stream in groups")
    decode_group_ms: float = opt(50.0, "a group of back-to-back decode steps takes only the steps that fit in about "
                                  "this many milliseconds of the recent decode step time, so that streams stay smooth "
                                  "with large models and batches (0: no limit)")
    enable_mixed_chunk: bool = opt(False, "running requests decode their next token inside a prefill batch "
                                    "instead of waiting for it (slower on the CPU)")
    max_queued_requests: int | None = opt(None, "reject new requests beyond this many waiting")
    schedule_policy: str = opt("lpm", "order of the waiting queue", choices=SCHEDULE_POLICIES)
    schedule_conservativeness: float = opt(1.0, "above 1 reserves more KV for running requests")
    lpm_max_queue: int = opt(128, "cache-aware policies fall back to fcfs beyond this queue length")
    max_wait_s: float = opt(30.0, "aging bound: a request waiting longer goes first, whatever the policy")
    priority_preemption_threshold: int = opt(10, "a waiting request preempts running ones this much worse")
    check_invariants: bool = opt(False, "check KV accounting after every step (debug)")
    watchdog_timeout_s: float = opt(300.0, "a forward step slower than this is reported and its requests fail")

    def __post_init__(self) -> None:
        check_positive(self, "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "decode_steps")
        if not self.decode_group_ms >= 0:
            raise ValueError(f"decode_group_ms: must be >= 0, got {self.decode_group_ms}")
        check_choices(self)
