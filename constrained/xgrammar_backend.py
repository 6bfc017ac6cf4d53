"""xgrammar: Earley-based matcher with precomputed token-mask caches (the default backend)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from radixlm.constrained.number_bounds import bound_xgrammar_ebnf
from radixlm.constrained.schema_support import check_supported
from radixlm.constrained.spec import ConstraintSpec
from radixlm.constrained.string_bounds import json_bounded_strings


class XGrammarMatcher:
    def __init__(self, matcher) -> None:
        self._m = matcher

    def accept_token(self, token_id: int) -> bool:
        return self._m.accept_token(token_id)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        need = self._m.fill_next_token_bitmask(bitmask, row)
        return True if need is None else bool(need)

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self._m.is_terminated()

    def jump_forward_string(self) -> str:
        return self._m.find_jump_forward_string()

    def copy(self) -> XGrammarMatcher:
        return XGrammarMatcher(self._m.fork())


class XGrammarGrammar:
    def __init__(self, compiled) -> None:
        self.compiled = compiled

    def matcher(self) -> XGrammarMatcher:
        import xgrammar as xgr

        return XGrammarMatcher(xgr.GrammarMatcher(self.compiled))


class XGrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int]) -> None:
        import xgrammar as xgr

        probe = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        vocab += [""] * (vocab_size - len(vocab))
        for i in special_ids(tokenizer):  # blank control tokens so they are never allowed inside strings
            if i < vocab_size:
                vocab[i] = ""
        info = xgr.TokenizerInfo(vocab, probe.vocab_type, vocab_size=vocab_size, stop_token_ids=stop_ids,
                                 add_prefix_space=probe.add_prefix_space)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)

    def _schema(self, schema: str, strict_mode: bool = True) -> XGrammarGrammar:
        """A JSON schema as xgrammar's EBNF with its numbers' digits bounded (number_bounds)."""
        return XGrammarGrammar(self.compiler.compile_grammar(_schema_ebnf(schema, strict_mode)))

    def compile(self, spec: ConstraintSpec) -> XGrammarGrammar:
        try:
            if spec.kind == "json_schema":
                check_supported(spec.schema(), self.name)
                return self._schema(spec.value)
            if spec.kind == "json_object":  # compact, like json_schema: a small model can drift into whitespace
                return self._schema('{"type": "object"}', strict_mode=False)
            if spec.kind == "structural_tag":
                fmt = bounded_format(spec.schema(), lambda schema: _schema_ebnf(json.dumps(schema), True))
                return XGrammarGrammar(self.compiler.compile_structural_tag(
                    json.dumps({"type": "structural_tag", "format": fmt})))
            if spec.kind == "regex":
                return XGrammarGrammar(self.compiler.compile_regex(spec.value))
            if spec.kind == "choices":
                return XGrammarGrammar(self.compiler.compile_regex(spec.choices_regex()))
            return XGrammarGrammar(self.compiler.compile_grammar(spec.value))
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"{spec.kind}: cannot compile: {str(e).strip().splitlines()[0][:500]}") from e


def bounded_format(fmt: Any, ebnf: Callable[[Any], str]) -> Any:
    """A structural-tag format with each json_schema part replaced by its EBNF with bounded numbers (the
    schemas are checked for support first)."""
    if isinstance(fmt, list):
        return [bounded_format(f, ebnf) for f in fmt]
    if not isinstance(fmt, dict):
        return fmt
    if fmt.get("type") == "json_schema":
        check_supported(fmt.get("json_schema"), "xgrammar")
        return {"type": "grammar", "grammar": ebnf(fmt.get("json_schema"))}
    return {k: bounded_format(v, ebnf) for k, v in fmt.items()}


def _schema_ebnf(schema: str, strict_mode: bool) -> str:
    import xgrammar as xgr

    return bound_xgrammar_ebnf(json_bounded_strings(str(xgr.Grammar.from_json_schema(
        schema, any_whitespace=False, strict_mode=strict_mode))))


def special_ids(tokenizer) -> list[int]:
    ids = set(tokenizer.all_special_ids)
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return sorted(ids)
