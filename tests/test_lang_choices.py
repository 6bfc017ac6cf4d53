"""The three select methods on fixed logprobs (no model), and import hygiene of radixlm.lang."""

from __future__ import annotations

import subprocess
import sys

import pytest

from radixlm.lang.choices import ChoiceScores, decide

CHOICES = ["Paris", "Antidisestablishmentarianism", "Lyon"]
# The long word: an unlikely first token, then tokens that are near-certain with or without the prompt;
# Lyon: the likeliest first token, then an unlikely one; Paris: likely here, unlikely without the prompt.
FIXTURE = ChoiceScores(
    token_logprobs=[[-0.9, -0.1], [-2.5, -0.01, -0.01, -0.01, -0.01, -0.01], [-0.5, -3.0]],
    unconditional_logprobs=[[0.0, -4.0], [0.0, -0.01, -0.01, -0.01, -0.01, -0.01], [0.0, -0.2]],
)


def test_three_methods_give_their_documented_answers():
    assert CHOICES[decide(CHOICES, FIXTURE, "token_length_normalized")[0]] == "Antidisestablishmentarianism"
    assert CHOICES[decide(CHOICES, FIXTURE, "greedy_token_selection")[0]] == "Lyon"
    assert CHOICES[decide(CHOICES, FIXTURE, "unconditional_likelihood_normalized")[0]] == "Paris"


def test_bad_method_and_missing_unconditional():
    with pytest.raises(ValueError, match="choices_method"):
        decide(CHOICES, FIXTURE, "vibes")
    with pytest.raises(ValueError, match="unconditional"):
        decide(CHOICES, ChoiceScores(FIXTURE.token_logprobs), "unconditional_likelihood_normalized")


def test_lang_imports_without_torch():
    code = "import sys, radixlm.lang; assert 'torch' not in sys.modules, 'torch was imported'"
    assert subprocess.run([sys.executable, "-P", "-c", code], capture_output=True).returncode == 0
