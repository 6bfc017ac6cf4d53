"""Start the scheduler process (and tensor-parallel followers), wait for their handshake, serve HTTP, clean up."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import time

import uvicorn
import zmq

from radixlm.kernels.cpu_info import cpu_description
from radixlm.runtime.api.app import create_app
from radixlm.runtime.api.metrics import Metrics
from radixlm.runtime.api.reasoning import reasoning_syntax
from radixlm.runtime.api.serving import Serving
from radixlm.runtime.api.tenancy import Tenancy
from radixlm.runtime.api.tokenizer_manager import TokenizerManager
from radixlm.runtime.config import EngineConfig, ServerConfig
from radixlm.runtime.ipc import IpcPaths, pull, push
from radixlm.runtime.messages import Ready, Shutdown, decoder, encode
from radixlm.runtime.model.sources import resolve_model
from radixlm.runtime.model.tokenizer_files import load_tokenizer
from radixlm.runtime.serve.process_utils import scheduler_main, tp_process_name, tp_worker_main

log = logging.getLogger("radixlm")
CHILD_CHECK_S = 0.2
STOP_GRACE_S = 3.0  # how long a child that started gets to finish after Shutdown
SHUTDOWN_LINGER_MS = 200  # how long a Shutdown message may wait for its connection (a local socket)


class StartupError(RuntimeError):
    pass


def launch_server(engine_cfg: EngineConfig, server_cfg: ServerConfig) -> int:
    """Run the server until SIGINT/SIGTERM or a child's death; returns the process exit code."""
    logging.basicConfig(level=server_cfg.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if engine_cfg.parallel.node_rank > 0:
        return run_tp_node(engine_cfg, server_cfg.log_level)
    paths = IpcPaths.create()
    ctx = zmq.Context()
    procs: list[multiprocessing.Process] = []
    grace = 0.0  # until every child is ready: a failed startup stops them at once, they have nothing to finish
    try:
        tenancy = Tenancy.from_config(server_cfg.api_key, server_cfg.api_keys_file, server_cfg.cache_sharing)
        ready = pull(ctx, paths.ready)
        procs = _spawn(engine_cfg, server_cfg, paths)  # first: the model loads while the tokenizer does
        source = resolve_model(engine_cfg.load.model)
        tokenizer = load_tokenizer(source)
        if server_cfg.chat_template:
            with open(server_cfg.chat_template) as f:
                tokenizer.chat_template = f.read()
        reasoning_syntax(server_cfg.reasoning_parser, tokenizer.chat_template)  # a bad one fails the startup
        info = _wait_ready(ready, procs, server_cfg.startup_timeout_s, _handshakes(engine_cfg))
        grace = STOP_GRACE_S
        name = server_cfg.served_model_name or os.path.basename(source.path)
        return asyncio.run(_serve(engine_cfg, server_cfg, paths, procs, tokenizer, info, name, tenancy))
    except (StartupError, ValueError, OSError) as e:
        log.error("startup failed: %s", e)
        return 1
    finally:
        _stop(ctx, paths, procs, grace)


def _spawn(engine_cfg: EngineConfig, server_cfg: ServerConfig, paths: IpcPaths) -> list[multiprocessing.Process]:
    mp = multiprocessing.get_context("spawn")
    me, level = os.getpid(), server_cfg.log_level
    tp_addr = engine_cfg.parallel.dist_init_addr or f"127.0.0.1:{free_port()}"
    procs = [
        mp.Process(target=scheduler_main, args=(engine_cfg, paths, me, level, tp_addr, server_cfg.stream_interval),
                   name="radixlm-scheduler"),
    ]
    procs += [mp.Process(target=tp_worker_main, args=(engine_cfg, rank, tp_addr, paths, level),
                         name=f"radixlm-{tp_process_name(rank)}") for rank in _local_ranks(engine_cfg)[1:]]
    for p in procs:
        p.start()
    return procs


def _local_ranks(engine_cfg: EngineConfig) -> list[int]:
    """The TP ranks this machine runs: an equal share of tp_size per node, node 0 holding rank 0."""
    parallel = engine_cfg.parallel
    if parallel.tp_size % parallel.nnodes:
        raise ValueError(f"tp_size {parallel.tp_size} must be a multiple of nnodes {parallel.nnodes}")
    per = parallel.tp_size // parallel.nnodes
    return list(range(parallel.node_rank * per, (parallel.node_rank + 1) * per))


def _handshakes(engine_cfg: EngineConfig) -> set[str]:
    return {"scheduler", *(tp_process_name(r) for r in _local_ranks(engine_cfg)[1:])}


def run_tp_node(engine_cfg: EngineConfig, log_level: str) -> int:
    """A node other than 0 of a multi-node TP group: run its ranks until they exit (rank 0 serves HTTP)."""
    mp = multiprocessing.get_context("spawn")
    addr = engine_cfg.parallel.dist_init_addr
    procs = [mp.Process(target=tp_worker_main, args=(engine_cfg, rank, addr, None, log_level),
                        name=f"radixlm-{tp_process_name(rank)}") for rank in _local_ranks(engine_cfg)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return max(p.exitcode or 0 for p in procs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(sock: zmq.Socket, procs: list[multiprocessing.Process], timeout: float, pending: set[str]) -> dict:
    dec, info = decoder(Ready), {}
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise StartupError(f"{', '.join(sorted(pending))} not ready after {timeout:.0f} s")
        if sock.poll(200):
            msg = dec.decode(sock.recv())
            if msg.error:
                raise StartupError(f"{msg.process} process: {msg.error}")
            pending.discard(msg.process)
            for key, value in msg.info.items():  # dict values (per-rank pids) merge across processes
                info[key] = {**info[key], **value} if isinstance(value, dict) and key in info else value
            continue
        for p in procs:
            if not p.is_alive():
                raise StartupError(f"{p.name} exited with code {p.exitcode} during startup")
    return info


async def _serve(engine_cfg, server_cfg, paths, procs, tokenizer, info: dict, name: str, tenancy: Tenancy) -> int:
    metrics = Metrics(name)
    tm = TokenizerManager(tokenizer, paths, metrics)
    serving = Serving(tm, server_cfg, info["max_context"], name, tenancy)
    server_info = {"model_path": engine_cfg.load.model or "default (SmolLM2-135M-Instruct)", **info, "api_pid": os.getpid(),
                   "cpu": cpu_description(),
                   "engine": engine_cfg.flat(),
                   "server": {k: v for k, v in dataclasses.asdict(server_cfg).items() if k != "api_key"},
                   "tenants": len(set(tenancy.keys.values())), "cache_sharing": tenancy.sharing}
    server = http_server(create_app(serving, server_info), server_cfg.host, server_cfg.port, server_cfg.log_level)
    tm.start()
    watch = Supervisor(server, tm, procs, engine_cfg.scheduler.watchdog_timeout_s, server_cfg.drain_timeout_s)
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

    def __init__(self, server: uvicorn.Server, tm: TokenizerManager, procs, hang_s: float, drain_s: float) -> None:
        self.server, self.tm, self.procs, self.hang_s, self.drain_s = server, tm, procs, hang_s, drain_s
        self.exit_code = 0
        self.drain_deadline: float | None = None

    def drain(self) -> None:
        if self.drain_deadline is None:
            log.info("draining: new requests get 503; %d running get up to %.0f s", len(self.tm.states), self.drain_s)
            self.tm.draining = True
            self.drain_deadline = time.monotonic() + self.drain_s
            if not self.tm.states:  # nothing to wait for
                self.server.should_exit = True
        else:  # a second signal: stop now
            self.server.should_exit = True

    async def run(self) -> None:
        while not self.server.should_exit:
            await asyncio.sleep(CHILD_CHECK_S)
            problem = self._problem()
            if problem:
                log.error(problem)
                self.tm.fail_all(problem)
                self.exit_code = 1
                await asyncio.sleep(0.5)  # let in-flight requests receive their 503
                self.server.should_exit = True
            elif self.drain_deadline is not None and (not self.tm.states or time.monotonic() > self.drain_deadline):
                if self.tm.states:
                    log.warning("drain timeout: %d requests still running get 503", len(self.tm.states))
                    self.tm.fail_all("the server shut down before this request finished (drain timeout)")
                    await asyncio.sleep(0.5)
                self.server.should_exit = True

    def _problem(self) -> str | None:
        dead = [p for p in self.procs if not p.is_alive()]
        if dead:
            return f"{dead[0].name} process died (exit code {dead[0].exitcode}); the server is shutting down"
        age = self.tm.heartbeat_age()
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


def _stop(ctx: zmq.Context, paths: IpcPaths, procs: list[multiprocessing.Process], grace: float) -> None:
    """Ask the scheduler to shut down (the TP followers stop with it), wait up to ``grace`` seconds for each
    child, then terminate (then kill) it."""
    sock = push(ctx, paths.to_scheduler)
    # the message is queued on a connection still being made: linger lets it out after close (push's
    # default, no linger, dropped it, and every stop waited out the grace for each child)
    sock.setsockopt(zmq.LINGER, SHUTDOWN_LINGER_MS if grace > 0 else 0)
    try:
        sock.send(encode(Shutdown()), zmq.NOBLOCK)
    except zmq.ZMQError:
        pass
    sock.close()
    for p in procs:
        p.join(timeout=grace)
        if p.is_alive():
            if grace > 0:
                log.warning("%s did not stop within %.0f s of the shutdown request; terminating it", p.name, grace)
            p.terminate()
            p.join(timeout=2)
        if p.is_alive():
            p.kill()
    ctx.destroy(linger=0)
    shutil.rmtree(paths.folder, ignore_errors=True)
