"""One KV block's file: a fixed header, the block's token ids, then the K/V payload.

    header  "<8sHHI32s32sQI": magic, format version, flags (0), token count, the fingerprint's SHA-256,
            the block's key, payload length, CRC-32 over the token ids and the payload
    tokens  token count x int32 (little-endian)
    payload the K/V bytes, in the runtime's pool layout

A reader checks every field against what it asked for: a torn write (a short file), a flipped bit (the CRC), a
foreign model (the fingerprint) or a mixed-up name (the key and the token ids) all raise ``CorruptPage``.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

from radixlm.radix_cache.disk.keys import token_bytes

MAGIC = b"RLXKVPG\0"
VERSION = 1
HEADER = struct.Struct("<8sHHI32s32sQI")


class CorruptPage(ValueError):
    """A page file that does not read back as what was written."""


def fingerprint_digest(fingerprint: str) -> bytes:
    return hashlib.sha256(fingerprint.encode()).digest()


def encode_header(fingerprint: str, key: bytes, tokens: bytes, payload: memoryview | bytes) -> bytes:
    """The header and the token ids, to be followed by ``payload`` in the file."""
    crc = zlib.crc32(payload, zlib.crc32(tokens))
    head = HEADER.pack(MAGIC, VERSION, 0, len(tokens) // 4, fingerprint_digest(fingerprint), key,
                       len(payload), crc)
    return head + tokens


def decode_page(data: bytes, fingerprint: str, key: bytes, tokens: list[int]) -> memoryview:
    """The payload of a page file's bytes ``data`` (CorruptPage when any check fails)."""
    if len(data) < HEADER.size:
        raise CorruptPage(f"{len(data)} bytes: shorter than the header")
    magic, version, _, n, fp, k, payload_len, crc = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptPage(f"not a version-{VERSION} page (magic {magic!r}, version {version})")
    if fp != fingerprint_digest(fingerprint) or k != key:
        raise CorruptPage("written for another model or block")
    body = memoryview(data)[HEADER.size:]
    if len(body) != 4 * n + payload_len:
        raise CorruptPage(f"torn: {len(body)} bytes after the header, {4 * n + payload_len} expected")
    ids, payload = body[: 4 * n], body[4 * n:]
    if zlib.crc32(payload, zlib.crc32(ids)) != crc:
        raise CorruptPage("checksum mismatch")
    if bytes(ids) != token_bytes(tokens):
        raise CorruptPage("holds other token ids than its key names")
    return payload
