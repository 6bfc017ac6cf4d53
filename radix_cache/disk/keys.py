"""Content addresses of KV blocks: a hash chain over the model's fingerprint, the namespace and the token ids.

Block i covers tokens [i*B, (i+1)*B). Its key is SHA-256(key of block i-1 || the block's token ids), and the
chain starts from SHA-256 of the fingerprint and the namespace. So a key names the whole prefix up to the end
of its block (the KV of a token depends on every token before it), under one model and one tenant: two
namespaces, two models, two weight forms or two kernel paths never share a key.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Sequence

DOMAIN = b"radixlm-kv-v1\0"


def chain_seed(fingerprint: str, namespace: Hashable) -> bytes:
    """The chain's start for one model and one namespace (None: the shared default namespace)."""
    ns = b"\1" if namespace is None else b"\2" + repr(namespace).encode()
    return hashlib.sha256(DOMAIN + fingerprint.encode() + b"\0" + ns).digest()


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian int32, the form both the key and the page file hold."""
    arr = array("i", tokens)
    if arr.itemsize != 4:  # pragma: no cover - every platform we build for has a 4-byte C int
        raise RuntimeError("array('i') is not 4 bytes here")
    return arr.tobytes()


def block_keys(seed: bytes, tokens: Sequence[int], block: int, n_blocks: int | None = None) -> list[bytes]:
    """Keys of the first ``n_blocks`` whole blocks of ``tokens`` (all whole blocks when None)."""
    whole = len(tokens) // block
    n = whole if n_blocks is None else min(n_blocks, whole)
    raw = token_bytes(tokens[: n * block])
    keys, prev, step = [], seed, 4 * block
    for i in range(n):
        prev = hashlib.sha256(prev + raw[i * step:(i + 1) * step]).digest()
        keys.append(prev)
    return keys
