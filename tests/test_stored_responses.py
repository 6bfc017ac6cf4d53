"""Stored Responses over HTTP: store, GET, input_items, DELETE; previous_response_id continues a conversation
on its own cached prefix, across a restart (the prefix then comes back from the disk tier); another tenant's
id is a 404, like an unknown one; the store's TTL and size bound."""

from __future__ import annotations

import time

import httpx
import pytest

from radixlm.runtime.api.responses.store import ResponseStore, StoredResponse

TERSE = "You are terse."  # instructions are not carried over to a continuation (as in OpenAI's API)
KEYS = {"tenant-a": "key-a-secret", "tenant-b": "key-b-secret"}


def post(srv, key: str, **body) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/responses", json={"temperature": 0, "max_output_tokens": 12, **body},
                      headers={"Authorization": f"Bearer {key}"}, timeout=120)


def get(srv, key: str, path: str, method: str = "GET") -> httpx.Response:
    return httpx.request(method, f"{srv.url}/v1/responses/{path}", headers={"Authorization": f"Bearer {key}"},
                         timeout=30)


@pytest.fixture(scope="module")
def flags(tmp_path_factory):
    root = tmp_path_factory.mktemp("stored")
    keys = root / "keys.txt"
    keys.write_text("".join(f"{k} {t}\n" for t, k in KEYS.items()))
    return ["--api-keys-file", str(keys), "--responses-db", str(root / "responses.sqlite3"),
            "--kv-disk-path", str(root / "kv"), "--check-invariants"]


def test_store_continue_restart_and_tenants(server_process, flags):
    srv = server_process(*flags)
    try:
        first = post(srv, KEYS["tenant-a"], instructions=TERSE,
                     input="Write one sentence about the sea, then stop. " * 20)
        assert first.status_code == 200, first.text
        r1 = first.json()
        assert r1["store"] is True and r1["previous_response_id"] is None
        assert get(srv, KEYS["tenant-a"], r1["id"]).json() == r1
        items = get(srv, KEYS["tenant-a"], f"{r1['id']}/input_items").json()
        assert items["object"] == "list" and items["data"][0]["content"][0]["type"] == "input_text"
        for key in (KEYS["tenant-b"],):  # another tenant's id reads as absent, for every route
            assert get(srv, key, r1["id"]).status_code == 404
            assert get(srv, key, f"{r1['id']}/input_items").status_code == 404
            assert get(srv, key, r1["id"], "DELETE").status_code == 404
            r = post(srv, key, input="And the sky?", previous_response_id=r1["id"])
            assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
        second = post(srv, KEYS["tenant-a"], instructions=TERSE, input="And one about the sky.", previous_response_id=r1["id"])
        assert second.status_code == 200, second.text
        r2 = second.json()
        assert r2["previous_response_id"] == r1["id"]
        assert r2["usage"]["input_tokens"] > r1["usage"]["input_tokens"] + r1["usage"]["output_tokens"]
        assert r2["usage"]["input_tokens_details"]["cached_tokens"] >= r1["usage"]["input_tokens"] - 1
        assert post(srv, KEYS["tenant-a"], input="x", store=False).json()["store"] is False
    finally:
        assert srv.stop() == 0
    srv = server_process(*flags)  # a restart: empty RAM cache, the same database and disk tier
    try:
        third = post(srv, KEYS["tenant-a"], instructions=TERSE, input="And one about the land.",
                     previous_response_id=r2["id"])
        assert third.status_code == 200, third.text
        details = third.json()["usage"]["input_tokens_details"]
        assert details["cached_tokens_disk"] >= 64 and details["cached_tokens"] == details["cached_tokens_disk"]
        assert get(srv, KEYS["tenant-a"], r1["id"], "DELETE").json() == {"id": r1["id"], "object": "response.deleted",
                                                                 "deleted": True}
        assert get(srv, KEYS["tenant-a"], r1["id"]).status_code == 404
        metrics = httpx.get(f"{srv.url}/metrics", headers={"Authorization": f"Bearer {KEYS['tenant-a']}"}).text
        assert 'radixlm:kv_disk_on{model_name="' in metrics and "cached_tokens_disk_total" in metrics
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the scheduler's stats come every so often
            info = httpx.get(f"{srv.url}/server_info", headers={"Authorization": f"Bearer {KEYS['tenant-a']}"})
            disk = (info.json()["stats"] or {}).get("disk") or {}
            if disk.get("cached_tokens", 0) >= 64:
                break
            time.sleep(0.2)
        assert disk["on"] and disk["cached_tokens"] >= 64 and disk["bytes_read"] > 0
        auth = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
        tree = httpx.get(f"{srv.url}/cache/tree", headers=auth).json()  # the dashboard's view of the tiers
        assert {n["tier"] for n in tree["nodes"]} <= {"ram", "ram+disk"} and any(n["tier"] == "ram+disk"
                                                                               for n in tree["nodes"])
        time.sleep(2.2)  # two samples of the live series
        stats = httpx.get(f"{srv.url}/cache/stats", headers=auth).json()
        assert stats["now"]["disk"]["pages"] > 0 and "disk_hit_tps" in stats["series"][-1]
    finally:
        assert srv.stop() == 0


def test_without_a_store(server_process):
    srv = server_process("--responses-db", "off")
    try:
        assert post(srv, "k", input="hi").json()["store"] is False  # the default quietly stores nothing
        for body, param in (({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id")):
            r = post(srv, "k", input="hi", **body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param
        assert get(srv, "k", "resp_1").status_code == 404
    finally:
        assert srv.stop() == 0


def test_store_bounds(tmp_path):
    store = ResponseStore(str(tmp_path / "db.sqlite3"), ttl_s=3600, max_records=3)
    for i in range(5):
        store.put("t", StoredResponse({"id": f"resp_{i}", "output": []}, [], []))
    assert store.count() == 3 and store.get("t", "resp_0") is None and store.get("t", "resp_4") is not None
    assert store.get("other", "resp_4") is None
    short = ResponseStore(str(tmp_path / "short.sqlite3"), ttl_s=0.05, max_records=10)
    short.put(None, StoredResponse({"id": "resp_x", "output": []}, [], []))
    time.sleep(0.1)
    assert short.get(None, "resp_x") is None
