"""The API process's HTTP side: the tokenizer it serves with, the FastAPI app under uvicorn, and the
Supervisor that watches the children. launch.py imports it after spawning them, so these imports and the
tokenizer's load overlap the model's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import time

import uvicorn

from radixlm.kernels.cpu_info import cpu_description
from radixlm.runtime.api.app import create_app
from radixlm.runtime.api.chat.reasoning import reasoning_syntax
from radixlm.runtime.api.metrics import Metrics
from radixlm.runtime.api.scheduler_client import SchedulerClient
from radixlm.runtime.api.serving import Serving
from radixlm.runtime.api.tenancy import Tenancy
from radixlm.runtime.config import ServerConfig
from radixlm.runtime.model.sources import ModelSource
from radixlm.runtime.model.tokenizer_files import load_tokenizer

log = logging.getLogger("radixlm")
CHILD_CHECK_S = 0.2


def api_tokenizer(source: ModelSource, server_cfg: ServerConfig):
    """The model's tokenizer with --chat-template applied; a --reasoning-parser that does not fit it is a
    ValueError (the startup fails)."""
    tokenizer = load_tokenizer(source)
    if server_cfg.chat_template:
        with open(server_cfg.chat_template) as f:
            tokenizer.chat_template = f.read()
    reasoning_syntax(server_cfg.reasoning_parser, tokenizer.chat_template)
    return tokenizer


async def serve_api(engine_cfg, server_cfg, paths, procs, tokenizer, info: dict, name: str, tenancy: Tenancy) -> int:
    """Serve the API until a signal or a child's death -> the exit code."""
    metrics = Metrics(name)
    client = SchedulerClient(tokenizer, paths, metrics)
    serving = Serving(client, server_cfg, info["max_context"], name, tenancy)
    server_info = {"model_path": engine_cfg.load.model or "default (SmolLM2-135M-Instruct)", **info, "api_pid": os.getpid(),
                   "cpu": cpu_description(),
                   "engine": engine_cfg.flat(),
                   "server": {k: v for k, v in dataclasses.asdict(server_cfg).items() if k != "api_key"},
                   "tenants": len(set(tenancy.keys.values())), "cache_sharing": tenancy.sharing}
    server = http_server(create_app(serving, server_info), server_cfg.host, server_cfg.port, server_cfg.log_level)
    client.start()
    watch = Supervisor(server, client, procs, engine_cfg.scheduler.watchdog_timeout_s, server_cfg.drain_timeout_s)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, watch.drain)

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        log.info("radixlm ready: http://%s:%d (model %s)", server_cfg.host, server_cfg.port, name)

    watcher, hello = asyncio.create_task(watch.run()), asyncio.create_task(announce())
    await server.serve()
    watcher.cancel()
    hello.cancel()
    return watch.exit_code if server.started else 1


class Supervisor:
    """Outside the scheduler's loop, in the API process: a dead child, or a scheduler whose heartbeat (its
    stats, sent every STATS_INTERVAL_S while its loop turns) stopped for ``hang_s`` (a forward or compile step
    that never returns), fails every request with 503, marks the server unhealthy and exits non-zero. SIGTERM
    drains: new requests get 503, running ones get ``drain_s`` to finish, then the server exits 0."""

    def __init__(self, server: uvicorn.Server, client: SchedulerClient, procs, hang_s: float, drain_s: float) -> None:
        self.server, self.client, self.procs, self.hang_s, self.drain_s = server, client, procs, hang_s, drain_s
        self.exit_code = 0
        self.drain_deadline: float | None = None

    def drain(self) -> None:
        if self.drain_deadline is None:
            log.info("draining: new requests get 503; %d running get up to %.0f s", len(self.client.states), self.drain_s)
            self.client.draining = True
            self.drain_deadline = time.monotonic() + self.drain_s
            if not self.client.states:  # nothing to wait for
                self.server.should_exit = True
        else:  # a second signal: stop now
            self.server.should_exit = True

    async def run(self) -> None:
        while not self.server.should_exit:
            await asyncio.sleep(CHILD_CHECK_S)
            problem = self._problem()
            if problem:
                log.error(problem)
                self.client.fail_all(problem)
                self.exit_code = 1
                await asyncio.sleep(0.5)  # let in-flight requests receive their 503
                self.server.should_exit = True
            elif self.drain_deadline is not None and (not self.client.states or time.monotonic() > self.drain_deadline):
                if self.client.states:
                    log.warning("drain timeout: %d requests still running get 503", len(self.client.states))
                    self.client.fail_all("the server shut down before this request finished (drain timeout)")
                    await asyncio.sleep(0.5)
                self.server.should_exit = True

    def _problem(self) -> str | None:
        dead = [p for p in self.procs if not p.is_alive()]
        if dead:
            return f"{dead[0].name} process died (exit code {dead[0].exitcode}); the server is shutting down"
        age = self.client.heartbeat_age()
        if age is not None and age > self.hang_s:
            return f"the scheduler has not answered for {age:.1f} s (a step hung; limit {self.hang_s} s); exiting"
        return None


def http_server(app, host: str, port: int, log_level: str) -> uvicorn.Server:
    """A uvicorn server that leaves SIGINT/SIGTERM to us: uvicorn's handler re-raises the signal after
    shutdown, which would kill this process before it stops its children (see ``stop_on_signals``)."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                           timeout_graceful_shutdown=5))
    server.capture_signals = contextlib.nullcontext
    return server


def stop_on_signals(server: uvicorn.Server) -> None:
    """Call inside the running event loop: SIGINT/SIGTERM ask the server to exit gracefully."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))


async def serve_until_signal(server: uvicorn.Server) -> bool:
    """Serve until SIGINT/SIGTERM; -> whether the server had started."""
    stop_on_signals(server)
    await server.serve()
    return bool(server.started)
