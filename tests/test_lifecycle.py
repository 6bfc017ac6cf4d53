"""Limits that hold for every body, a watchdog outside the loop, SIGTERM drain and flush under load, over HTTP."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

import httpx
import pytest

from radixlm.runtime.serve.scheduler_process import TEST_HANG_ENV

pytestmark = pytest.mark.slow
BODY = {"model": "default", "prompt": "Count to ten:", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server


def raw_request(port: int, head: bytes, chunks) -> bytes:
    """Send a request by hand (chunked bodies, odd headers) and return the start of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        try:
            for chunk in chunks:
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the body ended
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                more = s.recv(65536)
                if not more:
                    break
                data += more
        except ConnectionResetError:
            pass
        return data


def still_serves(srv) -> None:
    assert httpx.get(f"{srv.url}/health").status_code == 200
    assert httpx.post(f"{srv.url}/v1/completions", json=BODY, timeout=60).status_code == 200


def test_a_chunked_20_mb_body_gets_413(server):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    piece = b'{"prompt": "' + b"a" * (1 << 20)
    chunks = (b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(20))
    answer = raw_request(server.port, head, chunks)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    still_serves(server)


def test_deep_json_and_too_many_headers(server):
    deep = b"[" * 2000 + b"]" * 2000
    r = httpx.post(f"{server.url}/v1/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "deeper" in r.json()["error"]["message"]
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n"
    assert raw_request(server.port, head, []).startswith(b"HTTP/1.1 431")
    still_serves(server)


def test_flush_cache_under_load_keeps_running_requests(server):
    long = {**BODY, "prompt": "Once upon a time " * 20, "max_tokens": 80, "ignore_eos": True}

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            runs = [asyncio.create_task(c.post("/v1/completions", json={**long, "seed": i})) for i in range(4)]
            await asyncio.sleep(1.0)
            flush = await c.post("/flush_cache")
            return flush, await asyncio.gather(*runs)

    flush, results = asyncio.run(main())
    assert flush.status_code == 200 and "flushed" in flush.text, flush.text
    assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 80 for r in results)
    assert server.wait_idle()["leak"] is None
    assert httpx.post(f"{server.url}/flush_cache").text.startswith("Cache flushed: flushed")  # idle: all of it


def test_a_hung_step_gives_503_and_a_nonzero_exit(server_process, monkeypatch):
    monkeypatch.setenv(TEST_HANG_ENV, "3")
    srv = server_process("--watchdog-timeout-s", "2")
    t = time.monotonic()
    r = httpx.post(f"{srv.url}/v1/completions", json={**BODY, "max_tokens": 50}, timeout=30)
    waited = time.monotonic() - t
    assert r.status_code == 503 and "hung" in r.json()["error"]["message"], r.text
    assert waited < 2 + 2, waited  # the watchdog's bound, plus its poll and the answer
    try:
        assert httpx.get(f"{srv.url}/health", timeout=2).status_code == 503
    except httpx.TransportError:
        pass  # already gone
    assert srv.proc.wait(timeout=15) != 0


def test_sigterm_drains(server_process):
    srv = server_process()
    result: dict = {}

    def run():
        body = {**BODY, "max_tokens": 600, "ignore_eos": True}
        result["r"] = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(1.0)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    late = httpx.post(f"{srv.url}/v1/completions", json=BODY, timeout=10)
    assert late.status_code == 503 and "draining" in late.json()["error"]["message"]
    worker.join()
    assert result["r"].status_code == 200 and result["r"].json()["usage"]["completion_tokens"] == 600
    assert srv.proc.wait(timeout=20) == 0
    assert "did not stop" not in srv.proc.stdout.read()  # the children took the shutdown request themselves
