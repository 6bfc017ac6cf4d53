"""radixlm.constrained: grammar-constrained decoding (JSON schema, regex, EBNF, choices) over two backends.

The names below load lazily: ``radixlm.constrained.spec`` (what IPC messages carry) must not pull in torch,
so that the processes which only move messages (the detokenizer, the API) start without it.
"""

from __future__ import annotations

import importlib

_HOMES = {"Grammar": "base", "GrammarBackend": "base", "Matcher": "base", "GrammarCache": "grammar_cache",
          "make_backend": "grammar_cache", "ConstraintSpec": "spec", "spec_from_response_format": "spec",
          "spec_from_sampling": "spec"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'radixlm.constrained' has no attribute {name!r}")
    return getattr(importlib.import_module(f"radixlm.constrained.{_HOMES[name]}"), name)
