"""How `select` picks among choices from the prompt logprobs of ``prompt + choice`` (SGLang's three methods).

Each choice comes with the logprobs of its own tokens (after token healing at the boundary) and of the
unconditional continuation, if asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized")


@dataclass
class ChoiceScores:
    token_logprobs: list[list[float]]  # per choice, logprob of each of its tokens given the prompt
    unconditional_logprobs: list[list[float]] | None = None  # per choice, without the prompt


def decide(choices: list[str], scores: ChoiceScores, method: str) -> tuple[int, list[float]]:
    """-> (index of the chosen choice, the score of each choice)."""
    if method not in METHODS:
        raise ValueError(f"choices_method must be one of {METHODS}, got {method!r}")
    lps = scores.token_logprobs
    if method == "token_length_normalized":
        values = [sum(lp) / max(len(lp), 1) for lp in lps]
        return values.index(max(values)), values
    if method == "greedy_token_selection":
        # compare token by token; a choice that ran out of tokens keeps its mean (SGLang's rule)
        width = max(len(lp) for lp in lps)
        padded = [lp + [sum(lp) / max(len(lp), 1)] * (width - len(lp)) for lp in lps]
        alive = list(range(len(lps)))
        for k in range(width):
            best = max(padded[i][k] for i in alive)
            alive = [i for i in alive if padded[i][k] == best]
            if len(alive) == 1:
                break
        return alive[0], [p[0] for p in padded]
    if scores.unconditional_logprobs is None:
        raise ValueError("unconditional_likelihood_normalized needs the unconditional logprobs")
    values = [(sum(lp) - sum(u)) / max(len(lp), 1) for lp, u in zip(lps, scores.unconditional_logprobs, strict=True)]
    return values.index(max(values)), values
