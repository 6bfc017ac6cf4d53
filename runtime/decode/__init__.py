"""Turning logits into tokens and tokens into text: sampling (sampler.py), stop conditions (stopping.py),
prompt logprobs (logprobs.py), grammar steps (grammar.py), speculative decoding (speculative/), and
incremental detokenization (text.py)."""
