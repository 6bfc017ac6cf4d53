"""A model's tokenizer through transformers, without torch. A GGUF file's tokenizer is rebuilt from the
file's metadata, which is slow, so the result is kept in the cache folder keyed by the file and the
installed transformers; later loads read it back with the fast tokenizer's own class."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import tempfile

from radixlm.runtime.model.sources import ModelSource, resolve_model


def load_tokenizer(model: str | ModelSource | None):
    """transformers' tokenizer for ``model`` (a path, a resolved source, or None for the default)."""
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    if source.kind == "hf":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source.path)
    cached = os.path.join(cache_dir(), "tokenizers", _tokenizer_key(source.path))
    if os.path.isfile(os.path.join(cached, "tokenizer.json")):
        # what _save_atomically wrote is a fast tokenizer: its class loads it without AutoTokenizer's
        # registry of every model family, whose import costs more than the load, in each process
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(cached)
    from transformers import AutoTokenizer

    folder, name = os.path.split(source.path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _save_atomically(tokenizer, cached)
    return tokenizer


def cache_dir() -> str:
    """radixlm's cache folder: $RADIXLM_CACHE_DIR, else ~/.cache/radixlm."""
    return os.environ.get("RADIXLM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "radixlm")


def _tokenizer_key(path: str) -> str:
    st = os.stat(path)
    ident = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{importlib.metadata.version('transformers')}"
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def _save_atomically(tokenizer, folder: str) -> None:
    """save_pretrained into a fresh folder beside ``folder``, then renamed to it: processes loading at once
    never see a half-written one. Without a writable cache (or when another process won) nothing is kept."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(folder))
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, folder)
    except OSError:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
