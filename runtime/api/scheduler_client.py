"""In the API process: the scheduler's client (requests out, token updates in), per-request state, detokenizing
the scheduler's updates, metrics."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from radixlm.runtime.api.dashboard.live_series import LiveSeries, RecentLatencies
from radixlm.runtime.api.detokenizer import Detokenizer
from radixlm.runtime.api.metrics import Metrics
from radixlm.runtime.ipc import IpcPaths, pull, push
from radixlm.runtime.messages import (
    AbortReq,
    CacheViewReq,
    CacheViewResp,
    FlushCacheReq,
    FlushCacheResp,
    GenerateReq,
    ReqError,
    SchedulerStats,
    TextUpdate,
    ToApi,
    TokenBatch,
    TokenUpdate,
    decoder,
    encode,
)

log = logging.getLogger("radixlm.api")
DISCONNECT_POLL_S = 0.25
VIEW_TIMEOUT_S = 5.0


class RequestFailed(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class ReqState:
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    created: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    finished: bool = False


class SchedulerClient:
    """The API process's side of the scheduler: sends typed requests and aborts over ZeroMQ, receives each
    step's token updates, detokenizes them per request (detokenizer.py) and hands them to the request's
    waiter; it also keeps the metrics and the dashboard's series, and notices a scheduler that stopped."""

    def __init__(self, tokenizer, paths: IpcPaths, metrics: Metrics) -> None:
        self.tokenizer = tokenizer
        self.ctx = zmq.asyncio.Context()
        self.to_sched = push(self.ctx, paths.to_scheduler)
        # A plain socket drained by the event loop's reader callback: every message that has come is handled in
        # one wake-up, without zmq.asyncio's future per message (this runs for every streamed token).
        self.recv = pull(zmq.Context.shadow(self.ctx), paths.to_api)
        self._decoder = decoder(ToApi)
        self.detokenizer = Detokenizer(tokenizer)
        self.metrics = metrics
        self.states: dict[str, ReqState] = {}
        self.stats: SchedulerStats | None = None
        self.dead: str | None = None  # why the server cannot serve any more
        self.draining = False  # SIGTERM: finish what runs, take nothing new
        self._heartbeat: float | None = None  # when the scheduler's last stats arrived
        self._flush_waiters: list[asyncio.Future] = []
        self._views: dict[int, asyncio.Future] = {}  # query -> the scheduler's CacheViewResp
        self._ids = itertools.count()
        self.latencies = RecentLatencies()
        self.generated_tokens = 0  # since start
        self.series = LiveSeries(lambda: self.stats, lambda: self.generated_tokens, self.latencies)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.recv.getsockopt(zmq.FD), self._drain)
        loop.call_soon(self._drain)  # what came before the reader was added
        self.series.start()

    def new_rid(self) -> str:
        return f"{uuid.uuid4().hex[:12]}{next(self._ids)}"

    # ------------------------------------------------------------ requests
    def submit(self, req: GenerateReq) -> None:
        if self.dead:
            raise RequestFailed(503, self.dead)
        if self.draining:
            raise RequestFailed(503, "the server is shutting down (draining)")
        if req.rid in self.states:
            raise RequestFailed(400, f"rid {req.rid!r} is already in use")
        self.states[req.rid] = ReqState()
        self.to_sched.send(encode(req))

    async def updates(self, rid: str, is_disconnected=None) -> AsyncIterator[TextUpdate]:
        """Yield ``rid``'s updates until it finishes. Leaving early, or the client going away
        (``is_disconnected`` is polled while waiting), aborts it so the scheduler frees its KV."""
        state = self.states[rid]
        try:
            while True:
                try:  # asyncio.timeout, not wait_for: no task per token (this runs for every streamed token)
                    async with asyncio.timeout(DISCONNECT_POLL_S if is_disconnected else None):
                        item = await state.queue.get()
                except TimeoutError:
                    if await is_disconnected():
                        return
                    continue
                if isinstance(item, ReqError):
                    raise RequestFailed(item.status, item.message)
                yield item
                if item.finished:
                    return
        finally:
            if not state.finished:
                self.abort(rid)
            self.states.pop(rid, None)

    def abort(self, rid: str) -> None:
        if rid in self.states:
            self.states[rid].finished = True
        self.to_sched.send(encode(AbortReq(rid)))

    async def flush_cache(self) -> FlushCacheResp:
        fut = asyncio.get_running_loop().create_future()
        self._flush_waiters.append(fut)
        self.to_sched.send(encode(FlushCacheReq()))
        return await asyncio.wait_for(fut, timeout=30)

    async def cache_view(self, top: int, depth: int, namespace: str | None, preview_tokens: int) -> CacheViewResp:
        """The scheduler's view of its radix tree and requests (RequestFailed 503 if it does not answer)."""
        if self.dead:
            raise RequestFailed(503, self.dead)
        query = next(self._ids)
        fut = self._views[query] = asyncio.get_running_loop().create_future()
        self.to_sched.send(encode(CacheViewReq(query, top, depth, namespace, preview_tokens)))
        try:
            return await asyncio.wait_for(fut, timeout=VIEW_TIMEOUT_S)
        except TimeoutError as e:
            raise RequestFailed(503, f"the scheduler did not answer within {VIEW_TIMEOUT_S} s (busy in a step)") from e
        finally:
            self._views.pop(query, None)

    def fail_all(self, message: str) -> None:
        self.dead = message
        for state in self.states.values():
            state.queue.put_nowait(ReqError("", message, 503))

    # ------------------------------------------------------------ receive loop
    def _drain(self) -> None:
        """The reader callback. zmq's FD is edge-triggered: read until ZMQ_EVENTS has no POLLIN, or no further
        wake-up comes for what is already queued."""
        while self.recv.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            raw = self.recv.recv(zmq.NOBLOCK)
            try:
                self._on_message(self._decoder.decode(raw))
            except Exception:  # one bad message must not stop the stream of every other request
                log.exception("could not handle a message from the scheduler")

    def _on_message(self, msg) -> None:
        if isinstance(msg, TokenBatch):
            for u in msg.updates:
                self._on_tokens(u)
        elif isinstance(msg, ReqError):
            state = self.states.get(msg.rid)
            if state:
                state.queue.put_nowait(msg)
        elif isinstance(msg, SchedulerStats):
            self._on_stats(msg)
        elif isinstance(msg, FlushCacheResp):
            for fut in self._flush_waiters:
                if not fut.done():
                    fut.set_result(msg)
            self._flush_waiters.clear()
        elif isinstance(msg, CacheViewResp):
            fut = self._views.get(msg.query)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    def _on_tokens(self, u: TokenUpdate) -> None:
        """One request's new tokens: detokenized here, then its update. A request whose text cannot be
        decoded fails alone (its stream ends with the error and the scheduler is told to abort it)."""
        try:
            text = self.detokenizer.text_update(u)
        except Exception as e:  # noqa: BLE001 - one request's failure, reported to it
            log.exception("could not detokenize request %s", u.rid)
            state = self.states.get(u.rid)
            if state is not None and not state.finished:
                state.queue.put_nowait(ReqError(u.rid, f"detokenizing failed: {type(e).__name__}: {e}", 500))
            return
        self._on_update(text)

    def _on_update(self, u: TextUpdate) -> None:
        state = self.states.get(u.rid)
        now, m = time.monotonic(), self.metrics
        if state is not None:
            if u.new_ids:
                if state.last_token is None:
                    state.first_token = now
                    m.ttft.observe(now - state.created)
                else:
                    m.itl.observe(now - state.last_token)
                state.last_token = now
            if u.finished:
                state.finished = True
                m.e2e.observe(now - state.created)
                self._record_latency(state, u, now)
            state.queue.put_nowait(u)
        m.generation_tokens.inc(len(u.new_ids))
        self.generated_tokens += len(u.new_ids)
        if u.queue_time is not None:
            m.queue_time.observe(u.queue_time)
        if u.finished:
            m.requests.inc()
            m.prompt_tokens.inc(u.prompt_tokens)
            m.cached_tokens.inc(u.cached_tokens)
            m.cached_tokens_ram.inc(u.cached_tokens - u.disk_cached_tokens)
            m.cached_tokens_disk.inc(u.disk_cached_tokens)
            if (u.finish_reason or {}).get("type") == "abort":
                m.aborted.inc()

    def _record_latency(self, state: ReqState, u: TextUpdate, now: float) -> None:
        if state.first_token is None:
            return
        tpot = (now - state.first_token) / (u.completion_tokens - 1) if u.completion_tokens > 1 else None
        self.latencies.finished(state.first_token - state.created, tpot)

    def heartbeat_age(self) -> float | None:
        """Seconds since the scheduler's loop last reported (None before its first report)."""
        return None if self._heartbeat is None else time.monotonic() - self._heartbeat

    def _on_stats(self, s: SchedulerStats) -> None:
        self.stats, self._heartbeat = s, time.monotonic()
        m = self.metrics
        m.running.set(s.running)
        m.queued.set(s.queued)
        m.token_usage.set(s.kv_used / max(s.kv_total, 1))
        m.cache_hit_rate.set(s.cache_hit_rate)
        m.spec_accept_rate.set(s.spec_accept_rate)
        m.spec_accept_length.set(s.spec_accept_length)
        m.spec_speedup.set(s.spec_speedup)
        m.spec_off_steps.set(s.spec_off_steps)
        for method, rate in s.spec_accept_by_method.items():
            m.spec_method_accept_rate.labels(m.model_name, method).set(rate)
        if s.disk is not None:
            d = s.disk
            for gauge, value in ((m.disk_on, d.on), (m.disk_used, d.used_bytes), (m.disk_written, d.bytes_written),
                                 (m.disk_read, d.bytes_read), (m.disk_load_s, d.load_s),
                                 (m.disk_corrupt, d.corrupt_dropped)):
                gauge.set(value)
        if s.leak:
            log.error("scheduler reports: %s", s.leak)
