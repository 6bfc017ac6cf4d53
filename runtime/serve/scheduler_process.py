"""The scheduler process: one loop of receive -> step -> send, with the forward pass on its main thread."""

from __future__ import annotations

import logging
import os
import threading
import time

import msgspec
import torch
import zmq

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.core import EngineCore
from radixlm.runtime.ipc import IpcPaths, pull, push
from radixlm.runtime.kv.disk_tier import DiskTier
from radixlm.runtime.messages import (
    AbortReq,
    CacheViewReq,
    DiskTierStats,
    FlushCacheReq,
    FlushCacheResp,
    GenerateReq,
    Ready,
    ReqError,
    SchedulerStats,
    Shutdown,
    TokenBatch,
    TokenUpdate,
    ToScheduler,
    decoder,
    encode,
    merge_progress,
)
from radixlm.runtime.model.invariance import TP_GAP, invariance_report
from radixlm.runtime.scheduler import StepOutput
from radixlm.runtime.serve.cache_view import cache_view
from radixlm.runtime.serve.process_utils import die_with_parent, parent_alive

log = logging.getLogger("radixlm.scheduler")
STATS_INTERVAL_S = 0.25
TEST_HANG_ENV = "RADIXLM_TEST_HANG_AFTER_STEPS"
# the deferred loads wait for this long a pause, so that they do not hold up a client's first request, which
# often comes the moment /health answers
WARM_UP_IDLE_S = 1.0


class SchedulerProcess:
    def __init__(self, core: EngineCore, paths: IpcPaths, ctx: zmq.Context, stream_interval: int = 1) -> None:
        self.core = core
        self.sched = core.scheduler
        self.recv = pull(ctx, paths.to_scheduler)
        self.to_api = push(ctx, paths.to_api)
        self.decode_msg = decoder(ToScheduler)
        self.last_stats = 0.0
        self.running = True
        self.held: dict[str, TokenUpdate] = {}  # rid -> tokens not sent yet (stream_interval > 1)
        self.interval = stream_interval
        self.warmed = False  # the core's deferred parts loaded (after WARM_UP_IDLE_S with nothing to do)
        self.active_at = time.monotonic()  # when the loop last had work or a message
        # test-only: after this many steps, the next step never returns (what the API's watchdog must see)
        hang = os.environ.get(TEST_HANG_ENV)
        self.steps_before_hang = int(hang) if hang else None

    def loop(self, parent_pid: int) -> None:
        while self.running and parent_alive(parent_pid):
            busy = self.sched.has_work()
            received = self.recv.poll(0 if busy else 50)
            if received:
                self._drain()
            if received or busy:
                self.active_at = time.monotonic()
            elif not self.warmed and time.monotonic() - self.active_at >= WARM_UP_IDLE_S:
                self._warm_up()
            if self.sched.has_work():
                self._maybe_hang()
                outputs = self.core.step()
                updates = [self._update(o) for o in outputs]
                for err in (u for u in updates if isinstance(u, ReqError)):
                    self.to_api.send(encode(err))
                tokens = self._due([u for u in updates if isinstance(u, TokenUpdate)])
                if tokens:
                    self.to_api.send(encode(TokenBatch(tokens)))
            self._maybe_send_stats()

    def _warm_up(self) -> None:
        """Once, with nothing to do: the core's deferred loads. A failure is logged and left to the first
        request that needs the part, which reports it as its own error."""
        self.warmed = True
        start = time.perf_counter()
        try:
            self.core.warm_up()
        except Exception:  # noqa: BLE001 - logged; the request path raises it again where it matters
            log.exception("warming up the tokenizer and the grammar backend failed")
            return
        log.info("idle: tokenizer and grammar backend loaded in %.2f s", time.perf_counter() - start)

    def _maybe_hang(self) -> None:
        if self.steps_before_hang is not None:
            self.steps_before_hang -= 1
            if self.steps_before_hang < 0:
                log.warning("%s is set: this step hangs (a test of the watchdog)", TEST_HANG_ENV)
                threading.Event().wait()

    def _due(self, updates: list[TokenUpdate]) -> list[TokenUpdate]:
        """The updates to send now: all of them at stream_interval 1; otherwise a request's first token, its
        end, and its tokens once stream_interval of them are held; the rest wait, merged per request."""
        if self.interval == 1:
            return updates
        due = []
        for u in updates:
            held = self.held.pop(u.rid, None)
            first = u.completion_tokens == len(u.new_ids)
            if held is not None:
                u = merge_progress(held, u)
            if first or u.finished or len(u.new_ids) >= self.interval:
                due.append(u)
            else:
                self.held[u.rid] = u
        return due

    def _drain(self) -> None:
        while True:
            try:
                raw = self.recv.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._handle(self.decode_msg.decode(raw))
            except msgspec.DecodeError as e:
                log.error("dropped a malformed message: %s", e)

    def _handle(self, msg) -> None:
        if isinstance(msg, GenerateReq):
            self._add(msg)
        elif isinstance(msg, AbortReq):
            self.held.pop(msg.rid, None)
            self.sched.abort(msg.rid)
        elif isinstance(msg, FlushCacheReq):
            flushed, kept = self.core.flush_cache()
            note = f"; {kept} tokens held by running requests stay" if kept else ""
            self.to_api.send(encode(FlushCacheResp(True, f"flushed {flushed} tokens{note}")))
        elif isinstance(msg, CacheViewReq):
            self.to_api.send(encode(cache_view(self.core, msg)))
        elif isinstance(msg, Shutdown):
            self.running = False

    def _add(self, msg: GenerateReq) -> None:
        try:
            self.core.submit(msg)
        except ValueError as e:
            status = 503 if "queue is full" in str(e) else 400
            self.to_api.send(encode(ReqError(msg.rid, str(e), status)))

    def _update(self, out: StepOutput) -> TokenUpdate | ReqError:
        r, n = out.req, len(out.new_tokens)
        if r.finished is not None and r.finished.status:  # failed before producing anything useful
            return ReqError(r.rid, r.finished.message or "request failed", r.finished.status)
        u = TokenUpdate(rid=r.rid, new_ids=out.new_tokens, finished=out.finished,
                        finish_reason=r.finished.to_dict() if r.finished else None,
                        prompt_tokens=len(r.origin_input_ids), completion_tokens=len(r.output_ids),
                        cached_tokens=r.cached_tokens, disk_cached_tokens=r.disk_cached_tokens, stop=r.params.stop, no_stop_trim=r.params.no_stop_trim,
                        skip_special_tokens=r.params.skip_special_tokens)
        if r.spec_state is not None:
            st = r.spec_state
            u.spec_verify_steps, u.spec_draft_tokens, u.spec_accepted_tokens = st.verify_steps, st.drafted, st.accepted
        if len(r.output_ids) == n and r.admit_time is not None:
            u.queue_time = r.admit_time - r.arrival
        if r.logprob.return_logprob:
            u.output_logprobs = [list(x) for x in r.output_token_logprobs[len(r.output_token_logprobs) - n:]]
            if r.output_top_logprobs:
                u.output_top_logprobs = r.output_top_logprobs[len(r.output_top_logprobs) - n:]
            if len(r.output_ids) == n or (out.finished and not r.output_ids):  # first update: prompt logprobs
                u.input_logprobs = [list(x) for x in r.input_token_logprobs]
                u.input_top_logprobs = r.input_top_logprobs
        return u

    def _maybe_send_stats(self) -> None:
        now = time.monotonic()
        if now - self.last_stats < STATS_INTERVAL_S:
            return
        self.last_stats = now
        cache, st = self.core.cache, self.sched.stats
        leak = None if self.sched.has_work() else cache.check([])
        tree = cache.tree.sizes() if cache.tree is not None else None
        self.to_api.send(encode(SchedulerStats(
            running=len(self.sched.live_requests()), queued=len(self.sched.waiting),
            kv_used=cache.alloc.capacity - cache.available(), kv_total=cache.alloc.capacity,
            cache_hit_rate=st["cached_tokens"] / max(st["prompt_tokens"], 1), retractions=st["retractions"],
            leak=leak, rss_mb=rss_mb(), kv_evictable=tree.evictable if tree else 0,
            kv_locked=tree.protected if tree else 0, prompt_tokens=st["prompt_tokens"],
            cached_tokens=st["cached_tokens"], evicted_tokens=cache.tree.evicted_tokens if tree else 0,
            disk=disk_stats(cache.disk, st["disk_cached_tokens"]), **spec_rates(self.sched))))


def disk_stats(disk: DiskTier | None, cached_tokens: int) -> DiskTierStats | None:
    if disk is None:
        return None
    s, c = disk.store.stats, disk.counters
    return DiskTierStats(on=disk.on, off_reason=s.off_reason, pages=disk.store.pages, used_bytes=disk.store.used_bytes,
                         capacity_bytes=disk.store.capacity, cached_tokens=cached_tokens,
                         bytes_written=s.bytes_written, bytes_read=s.bytes_read, loads=c.loads, load_s=c.load_s,
                         save_s=c.save_s, corrupt_dropped=s.corrupt_dropped, evicted_pages=s.evicted_pages,
                         skipped_writes=disk.writer.skipped, skipped_loads=c.skipped_loads)


def spec_rates(sched) -> dict[str, float]:
    """Speculative decoding since start: accepted / drafted, tokens produced per verify pass, steps left plain
    because it did not pay; and lately, its speed over plain decoding's."""
    if sched.speculation is None or not sched.speculation.stats["spec_verify_steps"]:
        return {}
    st, pays = sched.speculation.stats, sched.speculation.pays
    return {"spec_accept_rate": st["spec_accepted_tokens"] / max(st["spec_draft_tokens"], 1),
            "spec_accept_length": 1 + st["spec_accepted_tokens"] / st["spec_verify_steps"],
            "spec_speedup": (pays.speedup() or 0.0) if pays is not None else 0.0, "spec_off_steps": st["spec_off_steps"],
            "spec_accept_by_method": sched.speculation.accept_rates()}


def kernel_path(core: EngineCore) -> str:
    if core.runner.device.type != "cpu":
        return f"{core.runner.device.type}: {torch.cuda.get_device_name() if torch.cuda.is_available() else '?'}"
    from radixlm.kernels import cpu_ext

    return cpu_ext.describe(core.runner.cpu_isa)


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def run_scheduler(cfg: EngineConfig, paths: IpcPaths, parent_pid: int, log_level: str, tp_addr: str | None = None,
                  stream_interval: int = 1) -> None:
    """Entry point of the scheduler process (spawned); with tp_size > 1 it is rank 0 of the TP group."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    die_with_parent()
    ctx = zmq.Context()
    ready = push(ctx, paths.ready)
    try:
        group = None
        if cfg.parallel.tp_size > 1:
            from radixlm.runtime.model.distributed import init_tp_group

            group = init_tp_group(tp_addr, 0, cfg.parallel.tp_size)
        core = EngineCore(cfg, tp_group=group, progress=False)
        proc = SchedulerProcess(core, paths, ctx, stream_interval)
    except Exception as e:  # startup failure: report the real reason to the launcher
        ready.send(encode(Ready("scheduler", error=f"{type(e).__name__}: {e}")))
        time.sleep(0.2)
        return
    pool = core.runner.pool
    info = {"max_context": core.max_context, "kv_total": core.cache.alloc.capacity,
            "kv_pool": {"tokens": core.cache.alloc.capacity, "sized_by": core.runner.kv_sized_by,
                        "bytes": sum(t.numel() * t.element_size() for t in [*pool.k_buffer, *pool.v_buffer])},
            "dtype": str(core.dtype).removeprefix("torch."), "weights": core.config.load.quantization,
            "threads": torch.get_num_threads(),
            "scheduler_pid": os.getpid(), "invariant": not core.runner.invariance_gaps,
            "invariance": invariance_report(core.runner.invariance_gaps),
            "invariance_gaps": core.runner.invariance_gaps, "tp_invariance_gap": TP_GAP,
            "device": core.runner.device.type,
            "kernels": kernel_path(core)}
    ready.send(encode(Ready("scheduler", info=info)))
    try:
        proc.loop(parent_pid)
    except KeyboardInterrupt:
        pass
    core.close()  # a clean stop: lets the other TP ranks exit too
