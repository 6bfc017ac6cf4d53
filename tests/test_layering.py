"""Import direction and packaging rules (DEVELOPERS.md): checked on the source with ast, no imports run."""

from __future__ import annotations

import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ("lang", "runtime", "radix_cache", "constrained", "kernels")
FORBIDDEN = {  # folder -> radixlm subpackages it must not import
    "radix_cache": {"runtime", "lang", "constrained", "kernels"},
    "constrained": {"runtime", "lang"},
    "kernels": {"runtime", "lang"},
    "lang": {"runtime"},  # lang reaches runtime over HTTP or a lazy import inside a function
}


def imports(path: pathlib.Path, top_level_only: bool) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_dependencies_point_one_way():
    for folder, banned in FORBIDDEN.items():
        for path in (ROOT / folder).glob("*.py"):
            for name in imports(path, top_level_only=folder == "lang"):
                parts = name.split(".")
                assert not (parts[0] == "radixlm" and len(parts) > 1 and parts[1] in banned), f"{path}: {name}"


def test_radix_cache_is_pure_python_and_no_bare_imports():
    for path in (ROOT / "radix_cache").glob("*.py"):
        assert not any(n.split(".")[0] in ("torch", "numpy") for n in imports(path, False)), path
    for folder in FOLDERS + ("tests", "benchmarks", "examples"):
        for path in (ROOT / folder).glob("*.py"):
            for name in imports(path, False):
                assert name.split(".")[0] not in FOLDERS, f"{path}: bare import {name}"


def test_every_package_folder_is_in_the_wheel():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert sorted(cfg["packages"]) == sorted(f"radixlm.{f}" for f in FOLDERS)
    assert all(cfg["package-dir"][f"radixlm.{f}"] == f for f in FOLDERS)
    for f in FOLDERS:
        nested = [p for p in (ROOT / f).iterdir() if p.is_dir() and (p / "__init__.py").exists()]
        assert not nested, f"nested package {nested} would be left out of the wheel"
