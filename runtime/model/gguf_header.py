"""A GGUF file's header read in one pass: its metadata and tensor table, tensor data as memory-mapped views.

``gguf.GGUFReader`` builds a numpy view for every part of every field, the 49,152 tokens and 48,900 merges
of SmolLM2's vocabulary included, in each of a server's three processes at once. Serving needs the
scalars and the tensor table only, so this reader decodes scalars and small arrays, records the length of
large string arrays and steps over them (the tokenizer is rebuilt from the file by transformers, once, and
cached). The format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (little-endian).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

_SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
            GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
            GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
            GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
MAX_DECODED_STRINGS = 1024  # string arrays longer than this (vocabularies, merges) keep only their length


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table; ``shape`` is in GGUF order (innermost dimension first)."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    offset: int  # absolute, in bytes
    nbytes: int


class _Cursor:
    """Little-endian reads from a buffer; running past its end is a ValueError."""

    def __init__(self, buf, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"truncated at byte {self.pos}")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.unpack("Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"truncated string at byte {self.pos}")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_strings(self, count: int) -> None:
        """Past ``count`` strings (a vocabulary's 150k tokens: one tight loop, no call per string)."""
        buf, pos, length = self.buf, self.pos, struct.Struct("<Q").unpack_from
        try:
            for _ in range(count):
                pos += 8 + length(buf, pos)[0]
        except struct.error as e:
            raise ValueError(f"truncated string at byte {pos}") from e
        if pos > len(buf):
            raise ValueError(f"truncated string at byte {self.pos}")
        self.pos = pos


class GGUFHeader:
    """``meta``: key -> value (scalars, strings, small arrays as lists); ``array_lengths``: key -> length of
    every array field; ``tensors``: the tensor table in file order. The file stays mapped while this lives."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(self._map)
        if bytes(self._map[:4]) != b"GGUF":
            raise ValueError("not a GGUF file (bad magic)")
        cur.pos = 4
        version = cur.unpack("I")
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        n_tensors, n_kv = cur.unpack("Q"), cur.unpack("Q")
        self.meta: dict[str, Any] = {}
        self.array_lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.meta[key] = self._value(cur, GGUFValueType(cur.unpack("I")), key)
        table = [self._tensor_entry(cur) for _ in range(n_tensors)]
        align = int(self.meta.get("general.alignment", 32))
        start = -(-cur.pos // align) * align
        self.tensors = [TensorInfo(name, shape, qtype, start + off, _nbytes(shape, qtype))
                        for name, shape, qtype, off in table]
        for t in self.tensors:
            if t.offset + t.nbytes > len(self._map):
                raise ValueError(f"tensor {t.name} runs past the end of the file")

    def _value(self, cur: _Cursor, vtype: GGUFValueType, key: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return cur.string()
        if vtype != GGUFValueType.ARRAY:
            return cur.unpack(_SCALARS[vtype])
        etype, count = GGUFValueType(cur.unpack("I")), cur.unpack("Q")
        self.array_lengths[key] = count
        if etype == GGUFValueType.STRING:
            if count > MAX_DECODED_STRINGS:
                cur.skip_strings(count)
                return None
            return [cur.string() for _ in range(count)]
        if etype == GGUFValueType.ARRAY:
            raise ValueError(f"nested arrays are not supported ({key})")
        dtype = np.dtype("<" + _SCALARS[etype])
        end = cur.pos + count * dtype.itemsize
        if end > len(self._map):
            raise ValueError(f"truncated array {key}")
        values = np.frombuffer(self._map, dtype, count, cur.pos).tolist()
        cur.pos = end
        return values

    @staticmethod
    def _tensor_entry(cur: _Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = cur.string()
        shape = tuple(cur.unpack("Q") for _ in range(cur.unpack("I")))
        return name, shape, GGMLQuantizationType(cur.unpack("I")), cur.unpack("Q")

    def drop_pages(self) -> None:
        """Take the file's pages out of this process's resident memory (they stay in the page cache, and a
        later read maps them back): once the weights are copied out, the mapping need not hold 1 GB of them."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def data(self, t: TensorInfo) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapped file, flat."""
        return np.frombuffer(self._map, np.uint8, t.nbytes, t.offset)


def _nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape, dtype=np.int64))
    if n % block:
        raise ValueError(f"{n} elements is not a whole number of {qtype.name} blocks")
    return n // block * size
