"""The prepared weights on disk (runtime/model/weight_cache.py): a second start reads what the first prepared,
without parsing the file's blocks, and computes the same bits; a changed file or setting is another entry; a
damaged entry is dropped and rebuilt; a cache folder that cannot be written turns the cache off, nothing else."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.engine import Engine
from radixlm.runtime.model import loader
from radixlm.runtime.model.quantization import QuantWeight
from radixlm.runtime.model.weight_cache import ARENA, FILES

from .test_gguf_blocks import prompt_logprobs, write_mixed_file

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    """A Q4_K_M-like file (a Q6_K tail in layer 0's qkv, a Q8_0 tied embedding) and an empty cache folder."""
    monkeypatch.setenv("RADIXLM_WEIGHT_CACHE_DIR", str(tmp_path / "cache"))
    path = str(tmp_path / "mixed.gguf")
    write_mixed_file(path)
    return path


def load(path: str, **flat):
    _, model, _, cfg = loader.load_for(EngineConfig.from_flat(model=path, max_total_tokens=1024, **flat),
                                       progress=False)
    return model, cfg


def entries(root: str) -> list[str]:
    return sorted(e for e in os.listdir(root) if e != FILES)


def quant_tensors(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, m in model.named_modules():
        q = getattr(m, "quant", None)
        while isinstance(q, QuantWeight):
            out.update({f"{name}.{f}": getattr(q, f) for f in ("data", "scales", "mins") if getattr(q, f) is not None})
            name, q = f"{name}.tail", q.tail
    return out


def test_a_second_start_reads_the_prepared_weights_and_computes_the_same_bits(gguf, monkeypatch):
    root = os.environ["RADIXLM_WEIGHT_CACHE_DIR"]
    first, cfg = load(gguf)
    assert first.prepared and first.weight_arena is not None and len(entries(root)) == 1

    def no_parse(*a, **k):
        raise AssertionError("the file's blocks were parsed again")

    monkeypatch.setattr(loader, "load_model", no_parse)
    second, _ = load(gguf)
    assert second.prepared and second.weight_arena.nbytes == first.weight_arena.nbytes
    a, b = quant_tensors(first), quant_tensors(second)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and second.weight_arena.holds(b[k]) for k in b)
    assert second.layers[0].self_attn.qkv_proj.quant.tail.kind == "int6"
    assert second.embed_tokens.weight is None and second.lm_head is second.embed_tokens
    sa, sb = first.state_dict(), second.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    engines = [Engine.from_model(m, None, quantization=cfg.load.quantization, max_total_tokens=1024)
               for m in (first, second)]
    assert all(e.runner.fused is not None for e in engines)
    assert torch.equal(prompt_logprobs(engines[0]), prompt_logprobs(engines[1]))
    for e in engines:
        e.shutdown()


def test_another_file_or_setting_is_another_entry_and_off_writes_none(gguf, tmp_path):
    root = os.environ["RADIXLM_WEIGHT_CACHE_DIR"]
    load(gguf)
    load(gguf, quantization="int4")
    assert len(entries(root)) == 2
    write_mixed_file(gguf, base="Q3_K")  # the same path, other content
    model, _ = load(gguf)
    assert len(entries(root)) == 3 and model.layers[0].self_attn.o_proj.quant.kind == "int3"
    load(gguf, weight_cache=False, quantization="int8")
    assert len(entries(root)) == 3


def test_a_damaged_entry_is_dropped_and_rebuilt(gguf, caplog):
    root = os.environ["RADIXLM_WEIGHT_CACHE_DIR"]
    want, cfg = load(gguf)
    (entry,) = entries(root)
    with open(os.path.join(root, entry, ARENA), "r+b") as f:
        f.truncate(1000)  # a torn write, a disk error
    with caplog.at_level(logging.WARNING, logger="radixlm.model"):
        got, _ = load(gguf)
    assert "unreadable" in caplog.text
    a, b = quant_tensors(want), quant_tensors(got)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert entries(root) == [entry] and os.path.getsize(os.path.join(root, entry, ARENA)) == want.weight_arena.nbytes


def test_a_cache_folder_that_cannot_be_written_leaves_the_cache_off(gguf, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RADIXLM_WEIGHT_CACHE_DIR", str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger="radixlm.model"):
        model, cfg = load(gguf)
    assert "weight cache: off" in caplog.text
    engine = Engine.from_model(model, None, quantization=cfg.load.quantization, max_total_tokens=1024)
    assert model.prepared and engine.runner.weight_arena is not None and prompt_logprobs(engine).isfinite().all()
    engine.shutdown()
