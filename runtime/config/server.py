"""The HTTP server's and the data-parallel router's settings."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.config.options import ROUTER_POLICIES, check_choices, check_positive, opt


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server and its processes."""

    host: str = opt("127.0.0.1", "address to bind (127.0.0.1 unless told otherwise)")
    port: int = opt(30000, "HTTP port")
    served_model_name: str | None = opt(None, "model name in the API; default: the model file's name")
    chat_template: str | None = opt(None, "a Jinja chat template file that replaces the model's")
    reasoning_parser: str = opt("none", "split <think>...</think> into reasoning_content (the chat template "
                                 "must write the markers)", choices=("none", "deepseek-r1", "qwen3"))
    api_key: str | None = opt(None, "require 'Authorization: Bearer KEY' on every route but /health and the "
                               "static pages (one tenant)")
    api_keys_file: str | None = opt(None, "a file of 'KEY TENANT' lines: each key authenticates as its tenant, "
                                     "and each tenant's prompts live in a radix namespace of their own")
    cache_sharing: str | None = opt(None, "who shares cached prefixes: 'global' (everyone), 'tenant' (each "
                                     "tenant apart), 'salt' (only requests with the same cache_salt); "
                                     "default: tenant with --api-keys-file, else global; a cache_salt always "
                                     "splits its tenant's namespace", choices=("global", "tenant", "salt"))
    log_level: str = opt("info", "logging level", choices=("debug", "info", "warning", "error"))
    max_request_bytes: int = opt(8 * 2**20, "largest request body accepted")
    max_n: int = opt(64, "largest n (samples per prompt)")
    max_stop: int = opt(64, "most stop strings per request")
    max_top_logprobs: int = opt(20, "largest top_logprobs")
    max_messages: int = opt(1024, "most chat messages per request")
    request_timeout_s: float = opt(600.0, "a request still unfinished after this long is aborted (504)")
    startup_timeout_s: float = opt(600.0, "how long to wait for the model to load")
    drain_timeout_s: float = opt(30.0, "on SIGTERM, how long running requests get to finish (new ones get 503)")
    dashboard_previews: str = opt("on", "the dashboard's text previews of cached prefixes and prompts (a few "
                                   "tokens each); off: no prompt token leaves the scheduler for it",
                                   choices=("on", "off"))
    stream_interval: int = opt(1, "send a running request's new tokens on every N-th decode step (its first "
                                "token and its end go at once): fewer wake-ups of the helper processes on the "
                                "cores the forward pass uses, in coarser chunks")

    responses_db: str = opt("~/.cache/radixlm/responses.sqlite3", "the SQLite file of stored Responses "
                             "(store: true, the API's default; previous_response_id continues one); several "
                             "servers may share it; 'off': nothing is stored and store: true is a 400")
    responses_ttl_hours: float = opt(720.0, "a stored response is deleted this long after it was made")
    responses_max: int = opt(100_000, "most stored responses; beyond it the oldest are deleted")

    def __post_init__(self) -> None:
        check_positive(self, "stream_interval", "responses_max")
        check_choices(self)
        if self.responses_ttl_hours <= 0:
            raise ValueError(f"responses_ttl_hours must be > 0, got {self.responses_ttl_hours}")


@dataclass(frozen=True)
class RouterConfig:
    """The data-parallel router: which replica gets each request."""

    router_policy: str = opt("cache_aware", "how requests are spread over replicas", choices=ROUTER_POLICIES)
    cache_threshold: float = opt(0.5, "cache_aware: below this matched fraction, go to the least-loaded replica")
    balance_abs_threshold: int = opt(8, "cache_aware: imbalanced when max - min in-flight exceeds this ...")
    balance_rel_threshold: float = opt(1.5, "... and max in-flight exceeds this times the min")
    max_tree_chars: int = opt(2**22, "cache_aware: characters remembered per replica (LRU beyond)")
    health_check_interval_s: float = opt(1.0, "how often the router probes each replica's /health")

    def __post_init__(self) -> None:
        check_choices(self)
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.max_tree_chars < 1 or self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("max_tree_chars must be >= 1, balance_abs_threshold >= 0, balance_rel_threshold >= 1")
