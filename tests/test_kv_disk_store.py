"""The disk tier's store (pure Python): content keys per namespace and model, atomic checksummed pages, the LRU
bound, and what it does with a torn page, a corrupt one, a foreign model's and a writer killed mid-write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from radixlm.radix_cache.disk import DiskStore, PageWriter, block_keys, chain_seed

FP = "model-a"
TOKENS = list(range(1000, 1256))


def keys(ns=None, fp=FP, tokens=TOKENS, block=64):
    return block_keys(chain_seed(fp, ns), tokens, block)


def payload(i: int, size: int = 4096) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(size))


def test_keys_name_the_whole_prefix_per_namespace_and_model():
    a = keys()
    assert len(a) == 4 and len(set(a)) == 4
    assert keys(tokens=TOKENS[:128]) == a[:2]  # a shared prefix shares its blocks' keys
    other = TOKENS[:64] + [7] + TOKENS[65:]
    assert keys(tokens=other)[0] == a[0] and not set(keys(tokens=other)[1:]) & set(a)  # every later block differs
    assert not set(keys(ns="tenant-b")) & set(a) and not set(keys(ns="")) & set(a)
    assert not set(keys(fp="model-b")) & set(a)


def test_put_get_roundtrip_and_lru_bound(tmp_path):
    store = DiskStore(str(tmp_path), capacity_bytes=3 * 4500, fingerprint=FP)
    ks = keys()
    for i, k in enumerate(ks[:3]):
        assert store.put(k, TOKENS[i * 64:(i + 1) * 64], payload(i))
    assert bytes(store.get(ks[0], TOKENS[:64])) == payload(0)  # touched: ks[1] is now the oldest
    assert store.put(ks[3], TOKENS[192:256], payload(3))
    assert store.used_bytes <= store.capacity and store.stats.evicted_pages == 1
    assert not store.find(ks[1]) and store.find(ks[0]) and store.find(ks[3])
    assert store.run_length(ks) == 1  # block 1 is gone: the run from block 0 stops there
    reopened = DiskStore(str(tmp_path), capacity_bytes=3 * 4500, fingerprint=FP)  # a restart
    assert reopened.pages == 3 and bytes(reopened.get(ks[3], TOKENS[192:256])) == payload(3)


@pytest.mark.parametrize("damage", ["flip", "truncate", "tokens", "foreign"])
def test_damaged_page_is_dropped_and_counted(tmp_path, damage):
    store = DiskStore(str(tmp_path), 1 << 20, FP)
    k = keys()[0]
    store.put(k, TOKENS[:64], payload(0))
    path = store.path(k)
    data = bytearray(open(path, "rb").read())
    if damage == "flip":
        data[-100] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) // 2]
    open(path, "wb").write(bytes(data))
    reader = DiskStore(str(tmp_path), 1 << 20, "model-b" if damage == "foreign" else FP)
    asked = TOKENS[1:65] if damage == "tokens" else TOKENS[:64]
    assert reader.get(k, asked) is None
    assert reader.stats.corrupt_dropped == 1 and not os.path.exists(path) and reader.on


def test_unwritable_folder_raises(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    if os.access(ro, os.W_OK):  # root ignores the mode
        ro = tmp_path / "file"
        ro.write_text("not a folder")
    with pytest.raises(OSError):
        DiskStore(str(ro), 1 << 20, FP)


def test_failing_disk_turns_the_store_off(tmp_path, caplog):
    """A write the kernel refuses (a per-file size limit, as a full disk would) turns the store off."""
    script = textwrap.dedent(f"""
        import resource, signal, json
        from radixlm.radix_cache.disk import DiskStore, block_keys, chain_seed
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        store = DiskStore({str(tmp_path)!r}, 1 << 20, "m")
        k = block_keys(chain_seed("m", None), list(range(128)), 64)
        ok1 = store.put(k[0], list(range(64)), bytes(4096))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        ok2 = store.put(k[1], list(range(64, 128)), bytes(4096))
        print(json.dumps([ok1, ok2, store.on, store.stats.off_reason, store.get(k[0], list(range(64))) is None]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ok1, ok2, on, reason, gone = __import__("json").loads(out.stdout)
    assert ok1 and not ok2 and not on and "File too large" in reason and gone
    assert "KV disk tier off" in out.stderr
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]  # the failed write left nothing


def test_kill_9_mid_write_leaves_only_whole_pages(tmp_path):
    """A writer killed at a random moment: every page a restart finds reads back whole, or is dropped."""
    script = textwrap.dedent(f"""
        from radixlm.radix_cache.disk import DiskStore, block_keys, chain_seed
        store = DiskStore({str(tmp_path)!r}, 1 << 30, "m")
        toks = list(range(64 * 400))
        for i, k in enumerate(block_keys(chain_seed("m", None), toks, 64)):
            store.put(k, toks[i * 64:(i + 1) * 64], bytes([i % 256]) * (1 << 18))
            print(i, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    while int(proc.stdout.readline() or 0) < 20:
        pass
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = DiskStore(str(tmp_path), 1 << 30, "m")
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]  # the dead writer's temporary file is gone
    toks = list(range(64 * 400))
    ks = block_keys(chain_seed("m", None), toks, 64)
    n = store.run_length(ks)
    assert n >= 20 and store.pages == n
    for i in range(n):
        assert bytes(store.get(ks[i], toks[i * 64:(i + 1) * 64])) == bytes([i % 256]) * (1 << 18)


def test_writer_thread_writes_and_bounds_its_queue(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30, FP)
    writer = PageWriter(store, max_pending_bytes=10_000)
    ks = keys()
    submitted = [writer.submit(k, TOKENS[i * 64:(i + 1) * 64], memoryview(payload(i))) for i, k in enumerate(ks)]
    writer.close()
    assert sum(submitted) + writer.skipped == 4 and store.pages == sum(submitted) >= 1
    assert writer.pending_bytes == 0
