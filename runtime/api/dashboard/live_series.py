"""The dashboard's time series: one sample a second of the scheduler's stats and the API's latencies.

Everything is bounded: ``HISTORY`` samples (about five minutes) and ``MAX_LATENCIES`` recent latencies.
Rates are differences between consecutive samples of cumulative counters, so a missed second only widens
one interval.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import asdict, dataclass

from radixlm.runtime.messages import SchedulerStats

HISTORY = 300  # samples kept (one a second)
LATENCY_WINDOW_S = 30.0  # percentiles are over requests that finished in this window
MAX_LATENCIES = 4096


@dataclass(frozen=True)
class Sample:
    t: float  # time.time()
    hit_rate: float | None  # cached / prompt tokens admitted in this interval (None: none admitted)
    kv_used: int  # slots held by requests (their own and locked tree slots)
    kv_locked: int
    kv_evictable: int
    kv_free: int
    running: int
    queued: int
    prefill_tps: float  # prompt tokens computed (not cached) per second
    decode_tps: float  # tokens generated per second
    ttft_p50: float | None
    ttft_p90: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    evicted: int  # tokens evicted in this interval
    retractions: int  # ... and requests retracted
    spec_accept_rate: float | None = None  # speculative decoding: accepted / drafted since start (None: off)
    spec_speedup: float | None = None  # ... its tokens/s over plain decoding's, lately
    ram_hit_tps: float | None = None  # prompt tokens served from the radix cache in RAM, per second
    disk_hit_tps: float | None = None  # ... loaded back from its disk tier (None: no disk tier)
    disk_write_mbs: float | None = None  # the disk tier's MB written per second
    disk_read_mbs: float | None = None  # ... and read back
    disk_load_ms: float | None = None  # mean milliseconds per load-back in this interval (None: none)


class RecentLatencies:
    """TTFT and TPOT of recently finished requests, for percentiles (bounded deques)."""

    def __init__(self) -> None:
        self.ttft: deque[tuple[float, float]] = deque(maxlen=MAX_LATENCIES)
        self.tpot: deque[tuple[float, float]] = deque(maxlen=MAX_LATENCIES)

    def finished(self, ttft: float | None, tpot: float | None) -> None:
        now = time.monotonic()
        if ttft is not None:
            self.ttft.append((now, ttft))
        if tpot is not None:
            self.tpot.append((now, tpot))

    def percentiles(self, which: str) -> tuple[float | None, float | None]:
        cut = time.monotonic() - LATENCY_WINDOW_S
        xs = sorted(v for t, v in getattr(self, which) if t >= cut)
        if not xs:
            return None, None
        return round(xs[len(xs) // 2], 4), round(xs[min(len(xs) - 1, int(len(xs) * 0.9))], 4)


def tier_rates(s: SchedulerStats, s0: SchedulerStats, dt: float) -> dict[str, float | None]:
    """Hits per tier, the disk tier's bytes per second and its mean load-back time, between two stats."""
    d, d0 = s.disk, s0.disk
    disk = d.cached_tokens - d0.cached_tokens if d is not None and d0 is not None else 0
    out: dict[str, float | None] = {"ram_hit_tps": round(max(s.cached_tokens - s0.cached_tokens - disk, 0) / dt, 1)}
    if d is None or d0 is None:
        return out
    loads = d.loads - d0.loads
    return {**out, "disk_hit_tps": round(max(disk, 0) / dt, 1),
            "disk_write_mbs": round(max(d.bytes_written - d0.bytes_written, 0) / dt / 1e6, 3),
            "disk_read_mbs": round(max(d.bytes_read - d0.bytes_read, 0) / dt / 1e6, 3),
            "disk_load_ms": round((d.load_s - d0.load_s) / loads * 1000, 2) if loads > 0 else None}


class LiveSeries:
    """Samples once a second from ``stats()`` (the last SchedulerStats), ``generated()`` (tokens generated
    since start) and the latencies."""

    def __init__(self, stats, generated, latencies: RecentLatencies) -> None:
        self._stats, self._generated, self.latencies = stats, generated, latencies
        self.samples: deque[Sample] = deque(maxlen=HISTORY)
        self._last: tuple[float, SchedulerStats, float] | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(1.0)

    def sample(self) -> Sample | None:
        s, now, gen = self._stats(), time.time(), float(self._generated())
        if s is None:
            return None
        last, self._last = self._last, (now, s, gen)
        if last is None:
            return None
        t0, s0, gen0 = last
        dt = max(now - t0, 1e-6)
        prompt, cached = s.prompt_tokens - s0.prompt_tokens, s.cached_tokens - s0.cached_tokens
        ttft, tpot = self.latencies.percentiles("ttft"), self.latencies.percentiles("tpot")
        sample = Sample(t=round(now, 3), hit_rate=round(cached / prompt, 4) if prompt > 0 else None,
                        kv_used=s.kv_used, kv_locked=s.kv_locked, kv_evictable=s.kv_evictable,
                        kv_free=max(s.kv_total - s.kv_used - s.kv_evictable, 0), running=s.running,
                        queued=s.queued, prefill_tps=round(max(prompt - cached, 0) / dt, 1),
                        decode_tps=round(max(gen - gen0, 0) / dt, 1), ttft_p50=ttft[0], ttft_p90=ttft[1],
                        tpot_p50=tpot[0], tpot_p90=tpot[1], evicted=max(s.evicted_tokens - s0.evicted_tokens, 0),
                        retractions=max(s.retractions - s0.retractions, 0),
                        spec_accept_rate=round(s.spec_accept_rate, 3) if s.spec_accept_length else None,
                        spec_speedup=round(s.spec_speedup, 3) if s.spec_speedup else None,
                        **tier_rates(s, s0, dt))
        self.samples.append(sample)
        return sample

    def recent(self, last: int = HISTORY) -> list[dict]:
        return [asdict(x) for x in list(self.samples)[-last:]]
