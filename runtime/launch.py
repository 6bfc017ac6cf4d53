"""Start the scheduler and detokenizer processes, wait for their handshake, serve HTTP, clean up."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import time

import uvicorn
import zmq

from radixlm.runtime.config import EngineConfig, ServerConfig
from radixlm.runtime.detokenizer_proc import run_detokenizer
from radixlm.runtime.ipc import IpcPaths, pull, push
from radixlm.runtime.messages import Ready, Shutdown, decoder, encode
from radixlm.runtime.metrics import Metrics
from radixlm.runtime.openai_serving import Serving
from radixlm.runtime.scheduler_proc import run_scheduler
from radixlm.runtime.server import create_app
from radixlm.runtime.tokenizer_manager import TokenizerManager
from radixlm.runtime.weights import open_model

log = logging.getLogger("radixlm")
CHILD_CHECK_S = 0.2


class StartupError(RuntimeError):
    pass


def launch_server(engine_cfg: EngineConfig, server_cfg: ServerConfig) -> int:
    """Run the server until SIGINT/SIGTERM or a child's death; returns the process exit code."""
    logging.basicConfig(level=server_cfg.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    paths = IpcPaths.create()
    ctx = zmq.Context()
    procs: list[multiprocessing.Process] = []
    try:
        ready = pull(ctx, paths.ready)
        procs = _spawn(engine_cfg, server_cfg, paths)
        files = open_model(engine_cfg.model)
        tokenizer = files.load_tokenizer()
        if server_cfg.chat_template:
            with open(server_cfg.chat_template) as f:
                tokenizer.chat_template = f.read()
        info = _wait_ready(ready, procs, server_cfg.startup_timeout_s)
        name = server_cfg.served_model_name or os.path.basename(files.path if hasattr(files, "path") else files.folder)
        return asyncio.run(_serve(engine_cfg, server_cfg, paths, procs, tokenizer, info, name))
    except (StartupError, ValueError, OSError) as e:
        log.error("startup failed: %s", e)
        return 1
    finally:
        _stop(ctx, paths, procs)


def _spawn(engine_cfg: EngineConfig, server_cfg: ServerConfig, paths: IpcPaths) -> list[multiprocessing.Process]:
    mp = multiprocessing.get_context("spawn")
    me, level = os.getpid(), server_cfg.log_level
    procs = [
        mp.Process(target=run_scheduler, args=(dataclasses.asdict(engine_cfg), paths, me, level),
                   name="radixlm-scheduler"),
        mp.Process(target=run_detokenizer, args=(engine_cfg.model, paths, me, level), name="radixlm-detokenizer"),
    ]
    for p in procs:
        p.start()
    return procs


def _wait_ready(sock: zmq.Socket, procs: list[multiprocessing.Process], timeout: float) -> dict:
    dec, info, pending = decoder(Ready), {}, {"scheduler", "detokenizer"}
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise StartupError(f"{', '.join(sorted(pending))} not ready after {timeout:.0f} s")
        if sock.poll(200):
            msg = dec.decode(sock.recv())
            if msg.error:
                raise StartupError(f"{msg.process} process: {msg.error}")
            pending.discard(msg.process)
            info.update(msg.info)
            continue
        for p in procs:
            if not p.is_alive():
                raise StartupError(f"{p.name} exited with code {p.exitcode} during startup")
    return info


async def _serve(engine_cfg, server_cfg, paths, procs, tokenizer, info: dict, name: str) -> int:
    metrics = Metrics(name)
    tm = TokenizerManager(tokenizer, paths, metrics)
    serving = Serving(tm, server_cfg, info["max_context"], name)
    server_info = {"model_path": engine_cfg.model or "default (SmolLM2-135M-Instruct)", **info,
                   "engine": dataclasses.asdict(engine_cfg),
                   "server": {k: v for k, v in dataclasses.asdict(server_cfg).items() if k != "api_key"}}
    app = create_app(serving, server_info)
    server = uvicorn.Server(uvicorn.Config(app, host=server_cfg.host, port=server_cfg.port,
                                           log_level=server_cfg.log_level, access_log=False,
                                           timeout_graceful_shutdown=5))
    # our own SIGINT/SIGTERM handling: uvicorn's re-raises the signal after shutdown, which would kill this
    # process before it stops its children and removes the socket folder
    server.capture_signals = contextlib.nullcontext
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    tm.start()
    exit_code = 0

    async def watch_children() -> None:
        nonlocal exit_code
        while not server.should_exit:
            await asyncio.sleep(CHILD_CHECK_S)
            dead = [p for p in procs if not p.is_alive()]
            if dead:
                msg = f"{dead[0].name} process died (exit code {dead[0].exitcode}); the server is shutting down"
                log.error(msg)
                tm.fail_all(msg)
                exit_code = 1
                await asyncio.sleep(1.0)  # let in-flight requests receive their 503
                server.should_exit = True

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        log.info("radixlm ready: http://%s:%d (model %s)", server_cfg.host, server_cfg.port, name)

    watcher, hello = asyncio.create_task(watch_children()), asyncio.create_task(announce())
    await server.serve()
    watcher.cancel()
    hello.cancel()
    return exit_code if server.started else 1


def _stop(ctx: zmq.Context, paths: IpcPaths, procs: list[multiprocessing.Process]) -> None:
    try:
        for addr in (paths.to_scheduler, paths.to_detokenizer):
            sock = push(ctx, addr)
            sock.send(encode(Shutdown()), zmq.NOBLOCK)
            sock.close()
    except zmq.ZMQError:
        pass
    for p in procs:
        p.join(timeout=3)
        if p.is_alive():
            p.terminate()
            p.join(timeout=2)
        if p.is_alive():
            p.kill()
    ctx.destroy(linger=0)
    shutil.rmtree(paths.folder, ignore_errors=True)
