"""Bounded digits for the numbers of schema-derived grammars, as llama.cpp's schema converter bounds them.

An unbounded ``[1-9][0-9]*`` lets a small model at temperature 0 write digits until ``max_tokens`` (seen:
``"population_millions": 31112222221122222211222223``, 48 tokens, never closing the object). A JSON number
carries about 17 significant digits, so the integer part, the fraction and the exponent get at most
``INT_DIGITS``, ``FRACTION_DIGITS`` and ``EXPONENT_DIGITS`` digits. Each backend's grammar text is rewritten
where it spells a number; a rewrite that finds nothing to rewrite is an error (the backend changed how it
spells numbers), never a silently unbounded grammar.
"""

from __future__ import annotations

INT_DIGITS = 16  # after the leading [1-9]: 17 digits in all
FRACTION_DIGITS = 16
EXPONENT_DIGITS = 3

# (unbounded, bounded) as each backend prints them
XGRAMMAR_EBNF = (
    ('[1-9] [0-9]*', f'[1-9] [0-9]{{0, {INT_DIGITS}}}'),
    ('"." basic_number_digits{1, -1}', f'"." basic_number_digits{{1, {FRACTION_DIGITS}}}'),
    ('basic_number_4 basic_number_digits{1, -1}', f'basic_number_4 basic_number_digits{{1, {EXPONENT_DIGITS}}}'),
)
OUTLINES_REGEX = (
    ("[1-9][0-9]*", f"[1-9][0-9]{{0,{INT_DIGITS}}}"),
    (r"(\.[0-9]+)", rf"(\.[0-9]{{1,{FRACTION_DIGITS}}})"),
    ("([eE][+-][0-9]+)", f"([eE][+-][0-9]{{1,{EXPONENT_DIGITS}}})"),
)


def _rewrite(text: str, table: tuple[tuple[str, str], ...], backend: str) -> str:
    for unbounded, bounded in table:
        text = text.replace(unbounded, bounded)
    leftover = [u for u, _ in table if u in text]
    if leftover:
        raise RuntimeError(f"{backend}: unbounded number pattern {leftover[0]!r} left in the grammar")
    return text


def bound_xgrammar_ebnf(ebnf: str) -> str:
    """xgrammar's EBNF for a JSON schema (``str(Grammar.from_json_schema(...))``) with bounded numbers."""
    return _rewrite(ebnf, XGRAMMAR_EBNF, "xgrammar")


def bound_outlines_regex(regex: str) -> str:
    """outlines-core's regex for a JSON schema (``build_regex_from_schema``) with bounded numbers."""
    return _rewrite(regex, OUTLINES_REGEX, "outlines-core")
