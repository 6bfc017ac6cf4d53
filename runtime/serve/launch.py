"""Start the scheduler process (and tensor-parallel followers), wait for their handshake, serve HTTP, clean up.

The children are spawned first, before this process imports the HTTP side (http_front.py: FastAPI, uvicorn,
the API) and loads the tokenizer: the model's load starts while those happen, on the other core."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import socket
import time

import zmq

from radixlm.runtime.api.tenancy import Tenancy
from radixlm.runtime.config import EngineConfig, ServerConfig
from radixlm.runtime.ipc import IpcPaths, pull, push
from radixlm.runtime.messages import Ready, Shutdown, decoder, encode
from radixlm.runtime.model.sources import resolve_model
from radixlm.runtime.serve.process_utils import tp_process_name
from radixlm.runtime.serve.spawn_targets import scheduler_main, tp_worker_main

log = logging.getLogger("radixlm")
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
        source = resolve_model(engine_cfg.load.model)
        ready = pull(ctx, paths.ready)
        procs = _spawn(engine_cfg, server_cfg, paths)  # first: the model loads while the HTTP side starts
        from radixlm.runtime.serve import http_front  # (after the spawn, on purpose: see the docstring)

        tokenizer = http_front.api_tokenizer(source, server_cfg)
        info = _wait_ready(ready, procs, server_cfg.startup_timeout_s, _handshakes(engine_cfg))
        grace = STOP_GRACE_S
        name = server_cfg.served_model_name or os.path.basename(source.path)
        return asyncio.run(http_front.serve_api(engine_cfg, server_cfg, paths, procs, tokenizer, info, name, tenancy))
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
