"""Prometheus metrics of the API process, on a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = r = CollectorRegistry()
        labels = ["model_name"]

        def counter(name, doc):
            return Counter(f"radixlm:{name}", doc, labels, registry=r).labels(model_name)

        def gauge(name, doc):
            return Gauge(f"radixlm:{name}", doc, labels, registry=r).labels(model_name)

        def hist(name, doc):
            return Histogram(f"radixlm:{name}", doc, labels, buckets=LATENCY_BUCKETS, registry=r).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "prompt tokens processed")
        self.generation_tokens = counter("generation_tokens", "tokens generated")
        self.cached_tokens = counter("cached_tokens", "prompt tokens served from the radix cache")
        self.cached_tokens_ram = counter("cached_tokens_ram", "prompt tokens served from the radix cache in RAM")
        self.cached_tokens_disk = counter("cached_tokens_disk", "prompt tokens loaded back from its disk tier")
        self.disk_on = gauge("kv_disk_on", "the disk tier is on (0: off, or none configured)")
        self.disk_used = gauge("kv_disk_used_bytes", "bytes of KV pages on disk")
        self.disk_written = gauge("kv_disk_written_bytes", "bytes written to the disk tier since start")
        self.disk_read = gauge("kv_disk_read_bytes", "bytes read back from the disk tier since start")
        self.disk_load_s = gauge("kv_disk_load_seconds", "seconds spent loading pages back since start")
        self.disk_corrupt = gauge("kv_disk_corrupt_pages", "pages dropped on read for failing their checks")
        self.requests = counter("num_requests", "requests finished")
        self.aborted = counter("num_aborted_requests", "requests aborted")
        self.running = gauge("num_running_reqs", "requests running in the scheduler")
        self.queued = gauge("num_queue_reqs", "requests waiting in the scheduler")
        self.token_usage = gauge("token_usage", "fraction of the KV pool in use (locked or owned)")
        self.cache_hit_rate = gauge("cache_hit_rate", "cached prompt tokens / prompt tokens")
        self.spec_accept_rate = gauge("spec_accept_rate", "speculative decoding: accepted / drafted tokens")
        self.spec_accept_length = gauge("spec_accept_length", "speculative decoding: tokens per verify pass")
        self.spec_speedup = gauge("spec_speedup", "speculative decoding: verify steps' tokens/s over plain decoding's")
        self.spec_off_steps = gauge("spec_off_steps", "speculative decoding: decode steps left plain (it did not pay)")
        self.spec_method_accept_rate = Gauge("radixlm:spec_method_accept_rate", "speculative decoding: accepted / "
                                             "drafted tokens of the requests of each method", [*labels, "method"],
                                             registry=r)
        self.model_name = model_name
        self.ttft = hist("time_to_first_token_seconds", "time to first token")
        self.itl = hist("inter_token_latency_seconds", "time between streamed tokens")
        self.e2e = hist("e2e_request_latency_seconds", "request latency end to end")
        self.queue_time = hist("queue_time_seconds", "time from arrival to the first scheduled step")

    def render(self) -> bytes:
        return generate_latest(self.registry)
