"""outlines-core: JSON Schema -> regex -> DFA index with a precomputed token set per state."""

from __future__ import annotations

import torch

from radixlm.constrained.number_bounds import bound_outlines_regex
from radixlm.constrained.schema_support import check_supported
from radixlm.constrained.spec import ConstraintSpec
from radixlm.constrained.xgrammar_backend import special_ids

MAX_ROLLBACK = 64


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-in characters back to raw bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class OutlinesMatcher:
    def __init__(self, index, eos_id: int) -> None:
        from outlines_core import Guide

        self._index, self._eos = index, eos_id
        self._guide = Guide(index, max_rollback=MAX_ROLLBACK)
        self._history: list[int] = []
        self._terminated = False

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id == self._eos:  # allowed in final states, but the index has no transition for it
            if not self._guide.is_finished():
                return False
            self._terminated = True
            self._history.append(token_id)
            return True
        try:
            self._guide.advance(token_id, return_tokens=False)
        except ValueError:
            return False
        self._history.append(token_id)
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        target = bitmask[row]
        self._guide.write_mask_into(target.data_ptr(), target.numel(), 4)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._terminated:  # the EOS never entered the guide
            self._terminated, num_tokens = False, num_tokens - 1
            self._history.pop()
        if num_tokens:
            self._guide.rollback_state(num_tokens)
            del self._history[-num_tokens:]

    def is_terminated(self) -> bool:
        return self._terminated

    def jump_forward_string(self) -> str:
        return ""  # outlines-core has no forced-string API; jump-forward is an xgrammar feature here

    def copy(self) -> OutlinesMatcher:
        twin = OutlinesMatcher(self._index, self._eos)
        for t in self._history:
            twin.accept_token(t)
        return twin


class OutlinesGrammar:
    def __init__(self, index, eos_id: int) -> None:
        self.index, self.eos_id = index, eos_id

    def matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self.index, self.eos_id)


class OutlinesBackend:
    name = "outlines"

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int]) -> None:
        from outlines_core import Vocabulary

        self.eos_id = stop_ids[0]
        decoder, skip = _byte_decoder(), set(special_ids(tokenizer)) | set(stop_ids)
        tokens: dict[bytes, list[int]] = {}
        for i, t in enumerate(tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), vocab_size))))):
            if i in skip or t is None:
                continue
            try:
                key = bytes(decoder[c] for c in t)
            except KeyError:  # not a byte-level token (a non-BPE tokenizer): use its UTF-8 text
                key = t.encode()
            tokens.setdefault(key, []).append(i)
        self.vocab = Vocabulary(self.eos_id, tokens)

    def compile(self, spec: ConstraintSpec) -> OutlinesGrammar:
        from outlines_core import Index
        from outlines_core.json_schema import build_regex_from_schema

        try:
            if spec.kind == "json_schema":
                check_supported(spec.schema(), self.name)
                regex = bound_outlines_regex(build_regex_from_schema(spec.value))
            elif spec.kind == "json_object":
                regex = bound_outlines_regex(build_regex_from_schema('{"type": "object"}'))
            elif spec.kind == "regex":
                regex = spec.value
            elif spec.kind == "choices":
                regex = spec.choices_regex()
            elif spec.kind == "structural_tag":
                raise ValueError("structural_tag: tool calls and reasoning need the xgrammar backend "
                                 "(--grammar-backend xgrammar)")
            else:
                raise ValueError("ebnf: not supported by the outlines backend (regular languages only)")
            return OutlinesGrammar(Index(regex, self.vocab), self.eos_id)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"{spec.kind}: cannot compile: {str(e).strip()[:500]}") from e
