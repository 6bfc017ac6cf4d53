"""The dashboard and the playground: the JSON API over HTTP, then both pages in headless Chromium (Debian's
``chromium``, driven by Playwright; skipped with the reason when either is missing; .ci/run installs them)."""

from __future__ import annotations

import json
import os
import shutil
import threading

import httpx
import jsonschema
import pytest

pytestmark = pytest.mark.slow
SHARED = "You are a careful museum guide. Answer in one sentence, politely and briefly. " * 4
ARTIFACTS = os.environ.get("RADIXLM_TEST_ARTIFACTS", os.path.join(os.path.dirname(__file__), "artifacts"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(shared_server):
    """The session's shared server, idle and its cache flushed: the tree tests look for this module's prefix."""
    shared_server.wait_idle()
    assert httpx.post(f"{shared_server.url}/flush_cache", timeout=30).status_code == 200
    return shared_server


def complete(url: str, prompt: str, max_tokens: int = 4, **headers) -> dict:
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def shared_prefix_requests(url: str, n: int = 4) -> None:
    for i in range(n):
        complete(url, f"{SHARED}Question {i}: which room holds the oldest painting?")


# ---------------------------------------------------------------- the JSON API


def test_tree_shows_the_shared_prefix(server):
    shared_prefix_requests(server.url)
    tree = httpx.get(f"{server.url}/cache/tree", params={"top": 10, "depth": 4}).json()
    assert 0 < len(tree["nodes"]) <= 10 and all(n["depth"] <= 4 for n in tree["nodes"])
    ids = {n["id"] for n in tree["nodes"]}
    assert all(n["parent"] == -1 or n["parent"] in ids for n in tree["nodes"])  # one connected tree
    shared = [n for n in tree["nodes"] if n["children"] >= 2 and n["hits"] > 0]
    assert shared and shared[0]["tokens"] >= 40 and shared[0]["preview"].startswith("You are a careful")
    assert tree["namespaces"]["default"] >= shared[0]["subtree_tokens"]
    server.wait_idle()  # the scheduler's stats come every 0.25 s: wait for one sent after the requests
    stats = httpx.get(f"{server.url}/cache/stats").json()
    assert stats["now"]["cached_tokens"] > 0 and stats["now"]["kv_evictable"] > 0
    assert stats["server"]["kernels"] and stats["server"]["model_path"]
    assert len(stats["series"]) <= 300
    assert httpx.get(f"{server.url}/requests").json() == {"total": 0, "requests": []}


@pytest.mark.parametrize("query, param", [
    ({"top": -1}, "top"), ({"top": 10**9}, "top"), ({"top": "many"}, "top"), ({"depth": 0}, "depth"),
    ({"depth": 65}, "depth"), ({"namespace": "no-such-tenant"}, "namespace")])
def test_bad_tree_parameters_get_400_naming_them(server, query, param):
    r = httpx.get(f"{server.url}/cache/tree", params=query)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert httpx.get(f"{server.url}/cache/stats", params={"last": 0}).json()["error"]["param"] == "last"
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_requests_in_flight_are_listed(server):
    seen: list[dict] = []
    t = threading.Thread(target=complete, args=(server.url, f"{SHARED}Tell a long story.", 96))
    t.start()
    while t.is_alive() and not seen:
        seen = httpx.get(f"{server.url}/requests").json()["requests"]
    t.join()
    assert seen and seen[0]["state"] in ("waiting", "prefill", "running") and seen[0]["prompt_tokens"] > 40
    assert seen[0]["preview"].startswith("You are")
    server.wait_idle()
    assert httpx.get(f"{server.url}/requests").json()["total"] == 0


def test_previews_off_and_the_api_key(server_process):
    srv = server_process("--dashboard-previews", "off", "--api-key", "sekret")
    try:
        auth = {"Authorization": "Bearer sekret"}
        complete(srv.url, f"{SHARED}Hello.", **auth)
        assert httpx.get(f"{srv.url}/cache/tree").status_code == 401
        assert httpx.get(f"{srv.url}/dashboard").status_code == 200  # the page: no data, asks for the key
        nodes = httpx.get(f"{srv.url}/cache/tree", headers=auth).json()["nodes"]
        assert nodes and all(n["preview"] is None for n in nodes)
    finally:
        assert srv.stop() == 0
    log = srv.proc.stdout.read()
    assert "radixlm ready" in log and "museum guide" not in log  # prompts never reach the logs


# ---------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; .ci/run does it)")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        yield b
        b.close()


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    return page, errors


def test_dashboard_in_chromium(server, browser):
    page, errors = open_page(browser, f"{server.url}/dashboard")
    page.wait_for_selector("#status.ok", timeout=15_000)
    before = float(page.get_attribute("#chart-hit_rate", "data-t") or 0)  # (a long-lived server's series is full)
    long = threading.Thread(target=complete, args=(server.url, f"{SHARED}Describe every room.", 400))
    long.start()
    page.wait_for_function("document.getElementById('inflight-total').textContent !== '0'", timeout=30_000)
    long.join()
    shared_prefix_requests(server.url, 3)
    page.wait_for_function(
        "[...document.querySelectorAll('#icicle .node')].some(n => n.dataset.shared === '1' && +n.dataset.hits > 0)",
        timeout=15_000)
    page.wait_for_function("+document.getElementById('chart-hit_rate').dataset.max > 0", timeout=15_000)
    assert float(page.get_attribute("#chart-hit_rate", "data-t")) > before  # the charts kept up
    page.wait_for_function("document.getElementById('inflight-total').textContent === '0' && "
                           "document.querySelectorAll('#inflight tbody tr').length === 0", timeout=30_000)
    assert "avx" in page.inner_text("#info").lower() or "cuda" in page.inner_text("#info").lower()
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, "dashboard.png"), full_page=True)
    assert not errors
    page.close()


def test_playground_streams_and_validates_json(server, browser):
    page, errors = open_page(browser, f"{server.url}/playground")
    page.fill("#temperature", "0")
    page.fill("#input", "Name one planet.")
    page.click("#send")
    page.wait_for_selector(".msg.assistant[data-done='1']", timeout=60_000)
    first = page.locator(".msg.assistant").nth(0)
    assert int(first.get_attribute("data-chunks")) > 1  # arrived as a stream
    assert first.locator(".text").inner_text().strip()
    assert int(first.locator(".usage").get_attribute("data-prompt")) > 0
    page.check("#json_mode")
    page.fill("#schema", json.dumps(SCHEMA))
    page.fill("#input", "Describe a person as JSON.")
    page.click("#send")
    page.wait_for_function("document.querySelectorAll(\".msg.assistant[data-done='1']\").length === 2", timeout=60_000)
    second = page.locator(".msg.assistant").nth(1)
    jsonschema.validate(json.loads(second.locator(".text").inner_text()), SCHEMA)
    assert second.locator(".validation").get_attribute("data-valid") == "1"
    assert int(second.locator(".usage").get_attribute("data-cached")) > 0  # the system prompt and first turn
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, "playground.png"))
    assert not errors
    page.close()


def test_dashboard_reconnects_after_a_restart_with_an_api_key(server_process, browser):
    first = server_process()
    page, errors = open_page(browser, f"{first.url}/dashboard")
    page.wait_for_selector("#status.ok", timeout=15_000)
    port = first.port
    assert first.stop() == 0
    page.wait_for_selector("#status.down", timeout=15_000)
    second = server_process("--api-key", "sekret", port=port)
    try:
        page.wait_for_selector("#keybox:not([hidden])", timeout=30_000)  # the restarted server wants a key
        page.fill("#keybox input", "sekret")
        page.click("#keybox button")
        page.wait_for_selector("#status.ok", timeout=15_000)
        complete(second.url, f"{SHARED}Hi.", Authorization="Bearer sekret")
        page.wait_for_function("document.querySelectorAll('#icicle .node').length > 0", timeout=15_000)
        assert not errors
    finally:
        page.close()
        assert second.stop() == 0
