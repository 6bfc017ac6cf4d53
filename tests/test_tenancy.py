"""Tenants who share a server do not share a cache: namespaces from API keys, cache_salt, over HTTP."""

from __future__ import annotations

import time

import httpx
import pytest

from radixlm.runtime.api.tenancy import Tenancy, load_api_keys
from radixlm.runtime.serve.scheduler_process import STATS_INTERVAL_S

LONG = " ".join(f"Clause {i}: the tenant's confidential instructions say to be brief." for i in range(30))
KEYS = {"a": "key-of-tenant-a", "b": "key-of-tenant-b"}


def test_keys_file_errors_name_the_line(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# comment\nkey-of-tenant-a tenant-a\n\nkey-of-tenant-b tenant-b  # trailing\n")
    assert load_api_keys(str(f)) == {"key-of-tenant-a": "tenant-a", "key-of-tenant-b": "tenant-b"}
    for text, why in (("short t\n", "line 1: a key must be at least 8"), ("key-one-x bad/name\n", "line 1: tenant"),
                      ("key-one-x a b\n", "line 1 must be 'KEY TENANT'"), ("key-one-x default\n", "reserved"),
                      ("key-one-x a\nkey-one-x b\n", "line 2: the key is listed twice"), ("\n", "lists no keys")):
        f.write_text(text)
        with pytest.raises(ValueError, match=why):
            load_api_keys(str(f))
    with pytest.raises(ValueError, match="api_keys_file: cannot read"):
        load_api_keys(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not both"):
        Tenancy.from_config("k" * 8, str(f), None)


def test_namespaces_by_sharing_mode():
    keys = {"ka-12345": "a", "kb-12345": "b"}
    tenant, glob, salt = Tenancy(keys, "tenant"), Tenancy(keys, "global"), Tenancy(keys, "salt")
    assert tenant.namespace("a", None, "r1") == "a" != tenant.namespace("b", None, "r1")
    assert glob.namespace("a", None, "r1") is None and glob.namespace("b", None, "r1") is None
    for t in (tenant, glob, salt):  # a salt splits its tenant's namespace and never meets another tenant's
        a, b = t.namespace("a", "s", "r1"), t.namespace("b", "s", "r1")
        digest = a.removeprefix("a/salt:")
        assert a != b and len(digest) == 16 and int(digest, 16) >= 0  # the salt itself never shows
        assert a == t.namespace("a", "s", "r2") and a != t.namespace("a", "t", "r1")
    assert salt.namespace("a", None, "r1") != salt.namespace("a", None, "r2")  # no salt: shares with nobody
    with pytest.raises(ValueError, match="cache_salt"):
        tenant.namespace("a", "", "r1")
    assert tenant.authenticate("Bearer ka-12345") == "a" and tenant.authenticate("Bearer ka-1234") is None
    assert tenant.owns("a", "a/salt:00") and not tenant.owns("a", "b") and not tenant.owns("a", "default")
    assert Tenancy.from_config(None, None, None).namespace(None, None, "r") is None
    with pytest.raises(ValueError, match="cache_sharing"):
        Tenancy(keys, "everyone")


# ---------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def server(server_process, tmp_path_factory):
    f = tmp_path_factory.mktemp("keys") / "keys.txt"
    f.write_text("".join(f"{key} tenant-{t}\n" for t, key in KEYS.items()))
    srv = server_process("--api-keys-file", str(f), "--check-invariants")
    yield srv
    assert srv.stop() == 0


def ask(server, tenant: str, prompt: str, **extra) -> httpx.Response:
    body = {"model": "default", "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {KEYS[tenant]}"})


def cached(server, tenant: str, prompt: str, **extra) -> int:
    r = ask(server, tenant, prompt, **extra)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def computed(server, tenant: str) -> int:
    """Prompt tokens the server computed so far (admitted minus served from the cache)."""
    time.sleep(2 * STATS_INTERVAL_S + 0.1)  # the scheduler's stats are this fresh
    s = httpx.get(f"{server.url}/cache/stats", headers={"Authorization": f"Bearer {KEYS[tenant]}"}).json()["now"]
    return s["prompt_tokens"] - s["cached_tokens"]


@pytest.mark.slow
def test_tenant_b_never_hits_tenant_a_cache(server):
    assert cached(server, "a", LONG) == 0
    assert cached(server, "a", LONG) > 300  # A's own prompt is cached for A
    before = computed(server, "b")
    assert cached(server, "b", LONG) == 0  # the same prompt from B: cold
    after = computed(server, "b")
    assert after - before >= 300  # B's prompt was computed in full: a cold prefill, not a hit
    assert cached(server, "b", LONG) > 300  # now B has its own copy
    assert cached(server, "a", LONG) > 300  # and A still hits its own


@pytest.mark.slow
def test_a_cache_salt_never_reaches_another_tenant(server):
    prompt = LONG + " Salted."
    assert cached(server, "a", prompt, cache_salt="shared-salt") == 0
    assert cached(server, "a", prompt, cache_salt="shared-salt") > 300
    assert cached(server, "b", prompt, cache_salt="shared-salt") == 0  # the same salt from B: B's own
    assert cached(server, "a", prompt, cache_salt="other-salt") == 0  # another salt: another namespace


@pytest.mark.slow
def test_dashboard_shows_each_tenant_only_its_own(server):
    cached(server, "a", LONG)
    auth_b = {"Authorization": f"Bearer {KEYS['b']}"}
    tree_b = httpx.get(f"{server.url}/cache/tree", params={"top": 100}, headers=auth_b).json()
    assert tree_b["nodes"] and all(n["namespace"].startswith("tenant-b") for n in tree_b["nodes"])
    assert all(k.startswith("tenant-b") for k in tree_b["namespaces"])
    r = httpx.get(f"{server.url}/cache/tree", params={"namespace": "tenant-a"}, headers=auth_b)
    assert r.status_code == 400 and r.json()["error"]["param"] == "namespace"


@pytest.mark.slow
@pytest.mark.parametrize("salt", ["", "x" * 257, 7])
def test_bad_salts_and_keys(server, salt):
    r = ask(server, "a", "hi", cache_salt=salt)
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                   headers={"Authorization": "Bearer key-of-tenant-c"})
    assert r.status_code == 401
    info = httpx.get(f"{server.url}/server_info", headers={"Authorization": f"Bearer {KEYS['a']}"}).json()
    assert info["stats"]["leak"] is None and info["tenants"] == 2 and info["cache_sharing"] == "tenant"
