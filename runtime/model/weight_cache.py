"""Prepared weights on disk: a model's weight arena (its kernels' weights quantized, repacked and laid out in read
order: weight_arena.py) with the QuantWeights that view it, written after a start that prepared them and read
back by later starts, which then neither parse the GGUF file's blocks nor repack them.

An entry is keyed by the file's content (its SHA-256, remembered per path, size, mtime and inode so that a warm
start does not hash it again), the code that lays weights out (radixlm's model code and its kernels' sources)
and every setting that changes the layout (dtype, quantization, kernel path, deterministic, quantized
prefill). Same key, same bytes: a restored model computes what the freshly prepared one does, bit for bit.
An entry is written into a temporary folder and renamed into place, so a start killed while writing leaves
nothing that reads back half-written; the KEEP most recently used entries are kept.

An entry's files: ``arena.bin``, the arena's bytes; ``layout.pt`` (torch.save, loadable with weights_only): per
module its QuantWeight's fields, each tensor as ("tensor", offset, dtype, shape) into the arena, and the
model's remaining state dict (norms, biases, any dense weight: what lives outside the arena).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixlm.runtime.model.quantization import QuantWeight
from radixlm.runtime.model.weight_arena import WeightArena, advise_huge_pages, allocate, release_freed_heap

CACHE_DIR_ENV = "RADIXLM_WEIGHT_CACHE_DIR"
KEEP = 4  # entries kept, the most recently used
FORMAT = 1  # bump when an entry's files change shape
ARENA, LAYOUT, FILES = "arena.bin", "layout.pt", "files.json"
HERE = os.path.dirname(os.path.abspath(__file__))
log = logging.getLogger("radixlm.model")


def cache_root() -> str:
    """$RADIXLM_WEIGHT_CACHE_DIR, else ~/.cache/radixlm/weights."""
    return os.path.expanduser(os.environ.get(CACHE_DIR_ENV) or os.path.join("~", ".cache", "radixlm", "weights"))


@dataclass(frozen=True)
class WeightCache:
    """One entry: ``folder`` (it exists once the entry is complete)."""

    folder: str

    @classmethod
    def entry(cls, path: str, settings: dict[str, Any], root: str | None = None) -> WeightCache:
        """The entry for the model file at ``path`` prepared with ``settings`` (JSON-able values)."""
        root = root or cache_root()
        parts = [FORMAT, file_digest(path, root), code_digest(), sorted(settings.items())]
        key = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]
        return cls(os.path.join(root, key))

    def exists(self) -> bool:
        return all(os.path.isfile(os.path.join(self.folder, f)) for f in (ARENA, LAYOUT))

    def load(self, model: nn.Module) -> WeightArena | None:
        """Fill ``model`` (built with empty weights) from the entry -> the arena its QuantWeights view; None, with
        the entry removed and a log line, where it cannot be read (the caller prepares the weights itself)."""
        try:
            layout = torch.load(os.path.join(self.folder, LAYOUT), weights_only=True)
            arena = _read_arena(os.path.join(self.folder, ARENA), layout["arena_bytes"], layout["tensors"])
            for name, fields in layout["modules"].items():
                module = model.get_submodule(name)
                module.quant = _decode(fields["quant"], arena.buffer)
                module.blocks = None
                if not fields["dense"]:
                    module.weight = None
            model.load_state_dict(layout["state"], strict=True)
        except (OSError, RuntimeError, ValueError, KeyError, AttributeError, EOFError) as e:
            log.warning("weight cache: entry %s unreadable (%s); preparing the weights from the file", self.folder, e)
            shutil.rmtree(self.folder, ignore_errors=True)
            return None
        os.utime(self.folder)  # most recently used
        release_freed_heap()  # the empty model's dense weights, dropped
        return arena

    def save(self, model: nn.Module, arena: WeightArena) -> bool:
        """Write ``model``'s prepared weights as this entry (False, with a log line, where every QuantWeight
        tensor is not in ``arena`` or the disk refuses: serving goes on without the entry)."""
        try:
            modules = {name: {"quant": _encode(m.quant, arena), "dense": m.weight is not None}
                       for name, m in model.named_modules() if isinstance(getattr(m, "quant", None), QuantWeight)}
        except ValueError as e:
            log.info("weight cache: not written (%s)", e)
            return False
        layout = {"format": FORMAT, "arena_bytes": arena.nbytes, "tensors": arena.tensors, "modules": modules,
                  "state": model.state_dict()}
        tmp = f"{self.folder}.tmp-{os.getpid()}"
        try:
            os.makedirs(tmp, exist_ok=True)
            with open(os.path.join(tmp, ARENA), "wb") as f:
                f.write(memoryview(arena.buffer.numpy()))
            torch.save(layout, os.path.join(tmp, LAYOUT))
            os.rename(tmp, self.folder)
        except OSError as e:  # a full or read-only disk, or another process's entry got there first
            shutil.rmtree(tmp, ignore_errors=True)
            if not self.exists():
                log.warning("weight cache: could not write %s (%s)", self.folder, e)
            return False
        evict(os.path.dirname(self.folder), KEEP)
        return True


def evict(root: str, keep: int) -> None:
    """Remove all but the ``keep`` most recently used entries of ``root``, and temporary folders an hour old."""
    entries = [p for p in glob.glob(os.path.join(root, "*")) if os.path.isdir(p)]
    stale = [p for p in entries if ".tmp-" in p and time.time() - os.path.getmtime(p) > 3600]
    done = sorted((p for p in entries if ".tmp-" not in p), key=os.path.getmtime, reverse=True)
    for p in stale + done[keep:]:
        shutil.rmtree(p, ignore_errors=True)


def file_digest(path: str, root: str) -> str:
    """The SHA-256 of the file at ``path``, remembered in ``root``/files.json under its path, size, mtime and
    inode (a changed file has another stamp, so it is hashed again)."""
    st = os.stat(path)
    stamp = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    index_path = os.path.join(root, FILES)
    try:
        with open(index_path) as f:
            index = json.load(f)
    except (OSError, ValueError):
        index = {}
    if stamp not in index:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        index = {k: v for k, v in index.items() if not k.startswith(os.path.realpath(path) + "|")}
        index[stamp] = digest.hexdigest()
        os.makedirs(root, exist_ok=True)
        tmp = f"{index_path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(index, f)
        os.replace(tmp, index_path)
    return index[stamp]


@functools.cache
def code_digest() -> str:
    """16 hex digits over the code that decides the weights' layout: radixlm's model code and kernels."""
    from radixlm.kernels import cpu_build

    kernels = os.path.dirname(os.path.abspath(cpu_build.__file__))
    digest = hashlib.sha256(cpu_build.content_digest(kernels).encode())
    for path in sorted(glob.glob(os.path.join(HERE, "**", "*.py"), recursive=True)
                       + glob.glob(os.path.join(kernels, "*.py"))):
        with open(path, "rb") as f:
            digest.update(os.path.relpath(path, os.path.dirname(HERE)).encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def _encode(q: QuantWeight, arena: WeightArena) -> dict[str, Any]:
    """A QuantWeight's fields with each tensor as its place in ``arena`` (ValueError where one is elsewhere)."""
    base = arena.buffer.data_ptr()

    def value(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            if not (arena.holds(v) and v.is_contiguous()):
                raise ValueError("a quantized weight outside the weight arena")
            return ("tensor", v.data_ptr() - base, str(v.dtype).removeprefix("torch."), tuple(v.shape))
        if isinstance(v, torch.dtype):
            return ("dtype", str(v).removeprefix("torch."))
        return _encode(v, arena) if isinstance(v, QuantWeight) else v

    return {f.name: value(getattr(q, f.name)) for f in dataclasses.fields(q)}


def _decode(fields: dict[str, Any], buffer: torch.Tensor) -> QuantWeight:
    def value(v: Any) -> Any:
        if isinstance(v, tuple) and v and v[0] == "tensor":
            _, offset, dtype, shape = v
            dt = getattr(torch, dtype)
            n = torch.Size(shape).numel() * dt.itemsize
            return buffer[offset:offset + n].view(dt).view(shape)
        if isinstance(v, tuple) and v and v[0] == "dtype":
            return getattr(torch, v[1])
        return _decode(v, buffer) if isinstance(v, dict) else v

    return QuantWeight(**{name: value(v) for name, v in fields.items()})


def _read_arena(path: str, nbytes: int, tensors: int) -> WeightArena:
    """The file's bytes into a fresh arena block (2 MB aligned, advised for huge pages once filled)."""
    if os.path.getsize(path) != nbytes:
        raise ValueError(f"{ARENA} holds {os.path.getsize(path)} bytes, the layout {nbytes}")
    buffer, block = allocate(nbytes)
    view, done = memoryview(buffer.numpy()), 0
    with open(path, "rb", buffering=0) as f:
        while done < nbytes:
            n = f.readinto(view[done:])
            if not n:
                raise EOFError(f"{ARENA} ended at byte {done} of {nbytes}")
            done += n
    return WeightArena(buffer, tensors, advise_huge_pages(block))
