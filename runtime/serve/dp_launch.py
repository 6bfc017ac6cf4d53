"""``radixlm serve --dp-size N``: N full servers (replicas) on private ports behind the router on the public one."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing

from radixlm.kernels.cpu_info import core_budget
from radixlm.runtime.config import EngineConfig, RouterConfig, ServerConfig
from radixlm.runtime.serve.health import wait_healthy
from radixlm.runtime.serve.http_front import http_server, serve_until_signal
from radixlm.runtime.serve.launch import free_port, launch_server
from radixlm.runtime.serve.process_utils import die_with_parent, exit_now
from radixlm.runtime.serve.router import create_router_app

log = logging.getLogger("radixlm.dp")


def launch_dp(engine_cfg: EngineConfig, server_cfg: ServerConfig, router_cfg: RouterConfig) -> int:
    logging.basicConfig(level=server_cfg.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parallel = engine_cfg.parallel
    threads = engine_cfg.execution.num_threads or max(1, core_budget() // (parallel.dp_size * parallel.tp_size))
    engine_cfg = engine_cfg.replace(num_threads=threads, dp_size=1)
    mp = multiprocessing.get_context("spawn")
    replicas, urls = [], []
    for i in range(parallel.dp_size):
        port = free_port()
        cfg = dataclasses.replace(server_cfg, port=port, host="127.0.0.1")
        p = mp.Process(target=_run_replica, args=(engine_cfg, cfg),
                       name=f"radixlm-replica-{i}")
        p.start()
        replicas.append(p)
        urls.append(f"http://127.0.0.1:{port}")
    try:
        _wait_healthy(urls, replicas, server_cfg.startup_timeout_s)
        app = create_router_app(urls, router_cfg, shared_disk=engine_cfg.cache.kv_disk_path is not None)
        log.info("radixlm router: http://%s:%d -> %s (%s)", server_cfg.host, server_cfg.port, ", ".join(urls),
                 router_cfg.router_policy)
        server = http_server(app, server_cfg.host, server_cfg.port, server_cfg.log_level)
        return 0 if asyncio.run(serve_until_signal(server)) else 1
    except RuntimeError as e:
        log.error("startup failed: %s", e)
        return 1
    finally:
        for p in replicas:
            if p.is_alive():
                p.terminate()
        for p in replicas:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()


def _run_replica(engine_cfg: EngineConfig, server_cfg: ServerConfig) -> None:
    die_with_parent()
    exit_now(launch_server(engine_cfg, server_cfg))


def _wait_healthy(urls: list[str], procs: list, timeout: float) -> None:
    def dead() -> str | None:
        gone = [p for p in procs if not p.is_alive()]
        return f"{gone[0].name} exited with code {gone[0].exitcode} during startup" if gone else None

    wait_healthy(urls, timeout, dead, poll=0.5)
