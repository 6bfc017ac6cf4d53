"""The backend interface: compile a spec once, then one matcher per request."""

from __future__ import annotations

from typing import Protocol

import torch

from radixlm.constrained.spec import ConstraintSpec


class Matcher(Protocol):
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False if the grammar forbids it (the state is then unchanged)."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into bitmask[row] (int32, bit i = token i); False if all allowed."""

    def rollback(self, num_tokens: int) -> None: ...

    def is_terminated(self) -> bool:
        """The grammar is complete and a stop token was accepted (nothing more may follow)."""

    def jump_forward_string(self) -> str:
        """The text the grammar forces next ("" if more than one continuation is possible)."""

    def copy(self) -> Matcher: ...


class Grammar(Protocol):
    def matcher(self) -> Matcher: ...


class GrammarBackend(Protocol):
    name: str

    def compile(self, spec: ConstraintSpec) -> Grammar:
        """Raise ValueError with a message saying what in the spec is wrong."""
