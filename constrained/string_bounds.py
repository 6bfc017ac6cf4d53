"""Length-bounded JSON strings in xgrammar's EBNF, made JSON strings again.

xgrammar (0.2.x) writes a string with ``minLength`` / ``maxLength`` as a bounded repetition of
``[^\\"\\\\\\r\\n]``: a class that admits raw control characters (U+0000 to U+001F but CR and LF), which JSON
forbids inside strings, and that has no escape, so ``\\n``, ``\\"`` and ``\\uXXXX`` cannot be written at all
(xgrammar issue #800; seen here: a sampled ``{"note": "\\x03}.error"}`` that ``json.loads`` refuses). Each such
character rule is rewritten to one JSON character: an unescaped code point other than a control character,
``"`` or ``\\``, or one escape. A repetition then counts characters of the decoded string, as JSON Schema's
lengths do.
"""

from __future__ import annotations

import re

# the character rule of a length-bounded string, as xgrammar prints it
_BOUNDED_CHAR = re.compile(r'^(\w+_characters) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.MULTILINE)
ESCAPE_RULE = "radixlm_json_escape"
_ESCAPE = (f'{ESCAPE_RULE} ::= (([\\"\\\\/bfnrt]) | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))')
_ONE_CHAR = r'\1 ::= (([^\\0-\\x1f\\"\\\\]) | ("\\\\" ' + ESCAPE_RULE + "))"


def json_bounded_strings(ebnf: str) -> str:
    """xgrammar's EBNF with each length-bounded string's character rule admitting exactly JSON's characters."""
    fixed, count = _BOUNDED_CHAR.subn(_ONE_CHAR, ebnf)
    return fixed + "\n" + _ESCAPE + "\n" if count else ebnf
