"""A tensor-parallel rank other than 0: load this rank's shard, then replay rank 0's batch plans."""

from __future__ import annotations

import logging
import os
import sys

import zmq

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.ipc import IpcPaths, push
from radixlm.runtime.messages import Ready, encode
from radixlm.runtime.model.distributed import follow, init_tp_group
from radixlm.runtime.model.loader import load_for
from radixlm.runtime.model.runner import ModelRunner
from radixlm.runtime.serve.process_utils import die_with_parent, tp_process_name

log = logging.getLogger("radixlm.tp")


def run_tp_worker(cfg: EngineConfig, rank: int, tp_addr: str, paths: IpcPaths | None, log_level: str) -> None:
    """Entry point of a follower rank (spawned). ``paths`` is None on a node other than 0 (no handshake)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    die_with_parent()
    ctx = zmq.Context()
    ready = push(ctx, paths.ready) if paths is not None else None
    name = tp_process_name(rank)
    try:
        group = init_tp_group(tp_addr, rank, cfg.parallel.tp_size)
        _, model, dtype, cfg = load_for(cfg, rank, progress=False)
        runner = ModelRunner(model, cfg, dtype)
    except Exception as e:  # startup failure: report it, like the scheduler does
        if ready is not None:
            ready.send(encode(Ready(name, error=f"{type(e).__name__}: {e}")))
        log.error("%s failed to start: %s", name, e)
        sys.exit(1)
    if ready is not None:
        ready.send(encode(Ready(name, info={"tp_rank_pids": {rank: os.getpid()}})))
    try:
        steps = follow(runner, group)
    except KeyboardInterrupt:
        return
    except Exception as e:  # a peer died: the collective fails; exiting non-zero takes the server down
        log.error("%s: the tensor-parallel group failed (%s); exiting", name, e)
        sys.exit(1)
    log.info("%s: rank 0 stopped after %d steps", name, steps)
