"""Waiting for servers to answer /health with 200: the DP launcher's replicas, the frontend's RuntimeEndpoint, the
tests' and the benchmarks' servers. Imports no torch."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx


def wait_healthy(urls: str | list[str], timeout: float, dead: Callable[[], str | None] = lambda: None,
                 poll: float = 0.1, path: str = "/health") -> float:
    """Seconds until ``path`` (/health; a peer without one: /v1/models) of every base url in ``urls`` answers
    200. RuntimeError with ``dead()``'s reason as soon as it gives one (a process that exited), or naming the
    servers still silent at ``timeout``."""
    start, pending = time.monotonic(), {urls} if isinstance(urls, str) else set(urls)
    while pending:
        reason = dead()
        if reason is not None:
            raise RuntimeError(reason)
        for url in list(pending):
            try:
                if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                    pending.discard(url)
            except httpx.HTTPError:
                pass
        if not pending:
            break
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"not healthy after {timeout:.0f} s: {', '.join(sorted(pending))}")
        time.sleep(poll)
    return time.monotonic() - start
