"""Import direction and packaging rules, checked on the source with ast (no imports run).

Across folders: radix_cache, constrained and kernels never import runtime or lang; lang reaches runtime only
lazily. Inside runtime: each unit (a sub-package, or a top-level module) imports only units of lower layers,
so a request's path through the files runs one way; only the public entry points import the offline Engine.
"""

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
# runtime's units from the bottom up: a unit may import its own modules and those of lower layers only
RUNTIME_LAYERS = (
    ("config", "messages", "ipc", "progress"),  # the vocabulary: configuration, typed messages, progress bars
    ("request", "batch", "request_builder"),
    ("step_plan",),  # the contract between the step's halves
    ("kv",),
    ("model",),
    ("decode",),
    ("policy",),
    ("scheduler", "execute"),  # the step's two halves: neither imports the other
    ("core",),
    ("engine", "api"),  # the two fronts: in-process, and the HTTP process
    ("serve",),  # the processes
    ("cli",),
    ("__main__", "__init__"),  # the entry points
)
ENGINE_ENTRY_POINTS = {"runtime/__init__.py", "runtime/cli.py", "lang/engine_backend.py"}


def sources(folder: str) -> list[pathlib.Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def imports(path: pathlib.Path, top_level_only: bool) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]  # `from radixlm.runtime import engine`
    return names


def runtime_unit(parts: list[str]) -> str:
    """The unit of a module path inside runtime: ['kv', 'pool'] -> 'kv', ['scheduler'] -> 'scheduler'."""
    return parts[0]


def layer_of(unit: str) -> int:
    for i, units in enumerate(RUNTIME_LAYERS):
        if unit in units:
            return i
    raise AssertionError(f"runtime unit {unit!r} is in no layer of RUNTIME_LAYERS")


def test_dependencies_point_one_way_across_folders():
    for folder, banned in FORBIDDEN.items():
        for path in sources(folder):
            for name in imports(path, top_level_only=folder == "lang"):
                parts = name.split(".")
                assert not (parts[0] == "radixlm" and len(parts) > 1 and parts[1] in banned), f"{path}: {name}"


def test_runtime_units_import_only_lower_layers():
    for path in sources("runtime"):
        rel = path.relative_to(ROOT / "runtime").with_suffix("").parts
        unit = runtime_unit(list(rel))
        for name in imports(path, top_level_only=False):
            parts = name.split(".")
            if parts[:2] != ["radixlm", "runtime"] or len(parts) < 3 or not (ROOT / "runtime" / parts[2]).exists() \
                    and not (ROOT / "runtime" / f"{parts[2]}.py").exists():
                continue
            other = runtime_unit(parts[2:])
            if other != unit:
                assert layer_of(other) < layer_of(unit), f"{path}: {unit} imports {name} (layer {other})"


def test_the_scheduler_never_reaches_the_model():
    """The scheduler plans and postprocesses; the executor calls the model. Neither imports model/ for it, lazily
    or not, nor the other's half of the step."""
    for path in sources("runtime/scheduler"):
        for name in imports(path, top_level_only=False):
            assert not name.startswith(("radixlm.runtime.model", "radixlm.runtime.execute")), f"{path}: {name}"


def test_only_the_entry_points_import_the_engine():
    for folder in FOLDERS:
        for path in sources(folder):
            rel = str(path.relative_to(ROOT))
            if rel in ENGINE_ENTRY_POINTS:
                continue
            assert not any(n.startswith("radixlm.runtime.engine") for n in imports(path, False)), rel


def test_radix_cache_is_pure_python_and_no_bare_imports():
    for path in sources("radix_cache"):
        assert not any(n.split(".")[0] in ("torch", "numpy") for n in imports(path, False)), path
    for folder in FOLDERS + ("tests", "benchmarks", "examples"):
        for path in sources(folder):
            for name in imports(path, False):
                assert name.split(".")[0] not in FOLDERS, f"{path}: bare import {name}"


def test_every_package_folder_is_in_the_wheel():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(cfg["package-dir"][f"radixlm.{f}"] == f for f in FOLDERS)
    found = {"radixlm." + ".".join(p.parent.relative_to(ROOT).parts) for f in FOLDERS
             for p in (ROOT / f).rglob("__init__.py")}
    assert found >= {f"radixlm.{f}" for f in FOLDERS}
    assert sorted(cfg["packages"]) == sorted(found), "every folder with an __init__.py must be listed in pyproject"
    for f in FOLDERS:  # a folder of modules without an __init__.py would be left out of the wheel silently
        for d in (ROOT / f).rglob("*"):
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")):
                assert (d / "__init__.py").exists(), f"{d} holds modules but is not a package"


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
    return ".".join(["radixlm", *parts])


def executed_imports(path: pathlib.Path, known: set[str]) -> set[str]:
    """The radixlm modules a file imports when it runs, lazy imports inside functions included and those under
    ``if TYPE_CHECKING:`` left out; ``from package import name`` counts the submodule where ``name`` is one."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for stmt in node.body for n in ast.walk(stmt)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs or {node.module}
    return found & known


def test_no_import_cycles_lazy_ones_included():
    """No module reaches itself through the imports it runs (a lazy import inside a function counts)."""
    paths = [p for f in FOLDERS for p in sources(f)]
    known = {module_name(p) for p in paths}
    graph = {module_name(p): executed_imports(p, known) - {module_name(p)} for p in paths}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles
