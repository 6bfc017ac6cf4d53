"""radixlm.constrained: grammar-constrained decoding (JSON schema, regex, EBNF, choices) over two backends."""

from radixlm.constrained.base import Grammar, GrammarBackend, Matcher
from radixlm.constrained.grammar_cache import GrammarCache, make_backend
from radixlm.constrained.spec import ConstraintSpec, spec_from_response_format, spec_from_sampling

__all__ = ["ConstraintSpec", "Grammar", "GrammarBackend", "GrammarCache", "Matcher", "make_backend",
           "spec_from_response_format", "spec_from_sampling"]
