"""Small files with one purpose and short functions, in the spirit of tinygrad's sz.py: no package file over
MAX_FILE_LINES lines and no Python function over MAX_FUNCTION_LINES, but for the exceptions listed with why."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ("lang", "runtime", "radix_cache", "constrained", "kernels")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
FILE_EXCEPTIONS: dict[str, str] = {}  # path -> why it may be longer
FUNCTION_EXCEPTIONS: dict[str, str] = {}  # "path:function" -> why it may be longer


def package_files(suffixes: tuple[str, ...]) -> list[pathlib.Path]:
    return sorted(p for f in FOLDERS for p in (ROOT / f).rglob("*") if p.suffix in suffixes)


def test_no_file_is_too_long():
    long = {str(p.relative_to(ROOT)): n for p in package_files((".py", ".cpp", ".h"))
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert set(long) <= set(FILE_EXCEPTIONS), f"over {MAX_FILE_LINES} lines: {long}"


def test_no_function_is_too_long():
    long = {}
    for path in package_files((".py",)):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = n
    assert set(long) <= set(FUNCTION_EXCEPTIONS), f"over {MAX_FUNCTION_LINES} lines: {long}"
