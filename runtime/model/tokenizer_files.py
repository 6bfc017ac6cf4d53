"""A model's tokenizer through transformers, without torch. A GGUF file's tokenizer is rebuilt from the
file's metadata, which is slow, so the result is kept in the cache folder keyed by the file and the
installed transformers; later loads read it back with the fast tokenizer's own class. The scheduler, until a
request needs more than decoding, reads the cached Rust tokenizer alone (``light_tokenizer``) where that
decodes as transformers does."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile

from tokenizers import Tokenizer

from radixlm.runtime.model.chat_templates import BY_ARCHITECTURE, TURN_ENDS
from radixlm.runtime.model.sources import ModelSource, resolve_model

# written beside a cached tokenizer: whether transformers' decode of it is its Rust backend's decode (no
# clean-up of spaces), as the transformers that wrote it decides (the cache key includes its version)
DECODE_MARK = "radixlm_decode.json"


def load_tokenizer(model: str | ModelSource | None):
    """transformers' tokenizer for ``model`` (a path, a resolved source, or None for the default)."""
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    if source.kind == "hf":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source.path)
    cached = _cached_folder(source)
    if os.path.isfile(os.path.join(cached, "tokenizer.json")):
        # what _save_atomically wrote is a fast tokenizer: its class loads it without AutoTokenizer's
        # registry of every model family, whose import costs more than the load, in each process
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(cached)
        if not os.path.isfile(os.path.join(cached, DECODE_MARK)):  # a cache written before the mark existed
            _write_decode_mark(tokenizer, cached)
        return _with_template(tokenizer, source)
    from transformers import AutoTokenizer

    folder, name = os.path.split(source.path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _save_atomically(tokenizer, cached)
    return _with_template(tokenizer, source)


def _with_template(tokenizer, source: ModelSource):
    """A GGUF file without a chat template gets its architecture's (chat_templates.py), where there is one."""
    if tokenizer.chat_template is None:
        from radixlm.runtime.model.gguf_header import GGUFHeader

        tokenizer.chat_template = BY_ARCHITECTURE.get(GGUFHeader(source.path).meta.get("general.architecture"))
    return tokenizer


def turn_end_ids(decoder) -> tuple[int, ...]:
    """The ids of the turn-end tokens (chat_templates.TURN_ENDS) the vocabulary of ``decoder`` (transformers' or
    the Rust tokenizer) has."""
    if isinstance(decoder, Tokenizer):
        found = [decoder.token_to_id(t) for t in TURN_ENDS]
    else:
        vocab = decoder.get_vocab()
        found = [vocab.get(t) for t in TURN_ENDS]
    return tuple(i for i in found if i is not None)


def light_tokenizer(source: ModelSource) -> tuple[Tokenizer, int | None] | None:
    """A GGUF file's cached tokenizer as the Rust ``tokenizers.Tokenizer`` alone, with the eos id that
    transformers' tokenizer of it has, where transformers' decode is exactly that one's (the mark written
    with the cache says so); None where there is no such cache (not written yet, an HF folder, a tokenizer
    that cleans up spaces)."""
    if source.kind != "gguf":
        return None
    cached = _cached_folder(source)
    try:
        with open(os.path.join(cached, DECODE_MARK)) as f:
            if json.load(f)["backend_decode"] is not True:
                return None
        with open(os.path.join(cached, "tokenizer_config.json")) as f:
            eos = json.load(f).get("eos_token")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    tokenizer = Tokenizer.from_file(os.path.join(cached, "tokenizer.json"))
    eos = eos.get("content") if isinstance(eos, dict) else eos  # saved either as the token or as its fields
    return tokenizer, tokenizer.token_to_id(eos) if isinstance(eos, str) else None


def backend_decoder(tokenizer) -> Tokenizer | None:
    """The Rust backend whose decode is exactly transformers' decode of ``tokenizer`` (a fast tokenizer that
    cleans up no spaces), or None. ``tokenizer`` may also be such a backend alone (a ``tokenizers.Tokenizer``,
    as light_tokenizer gives the scheduler)."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True) else None


def _cached_folder(source: ModelSource) -> str:
    return os.path.join(cache_dir(), "tokenizers", _tokenizer_key(source.path))


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
        _write_decode_mark(tokenizer, tmp)
        os.replace(tmp, folder)
    except OSError:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_decode_mark(tokenizer, folder: str) -> None:
    """DECODE_MARK into ``folder``, whole or not at all (written aside, then renamed)."""
    backend_decode = backend_decoder(tokenizer) is not None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"backend_decode": backend_decode}, f)
        os.replace(tmp, os.path.join(folder, DECODE_MARK))
    except OSError:
        pass
