"""Decoding: sampling defaults, grammars, and speculation."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.config.options import SPECULATIVE_METHODS, check_choices, opt


@dataclass(frozen=True)
class DecodingConfig:
    """Sampling defaults and grammar-constrained decoding."""

    random_seed: int = opt(0, "seed of the engine's RNG (requests without a seed draw from it)")
    grammar_backend: str = opt("xgrammar", "grammar backend for constrained decoding",
                                choices=("xgrammar", "outlines"))
    grammar_timeout_s: float = opt(60.0, "a grammar that takes longer to compile fails its request")
    jump_forward: bool = opt(True, "append grammar-forced text in one step instead of token by token")

    def __post_init__(self) -> None:
        check_choices(self)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: suffix decoding, n-gram prompt lookup, a draft model or self-speculation, adaptive;
    the method a request gets unless it names another."""

    speculative_algorithm: str | None = opt(None, "speculative decoding: 'suffix' (drafts from what followed the "
                                             "same tokens in the request and in its namespace's recent outputs), "
                                             "'ngram' (prompt lookup) or 'draft' (a draft model, else the model's "
                                             "first layers + LM head): the requests' default; each may name "
                                             "another (the request's 'speculative') or opt out",
                                             choices=SPECULATIVE_METHODS)
    speculative_num_draft_tokens: int = opt(3, "speculative decoding: the most tokens proposed per step (each "
                                             "request's draft length follows its acceptance up to this; 3 keeps a "
                                             "request's verify at 4 positions, the CPU matmuls' decode tile)")
    speculative_ngram_min: int = opt(2, "ngram and suffix speculation: shortest n-gram matched")
    speculative_ngram_max: int = opt(4, "ngram and suffix speculation: longest n-gram matched")
    speculative_suffix_min_share: float = opt(0.5, "suffix speculation: a drafted token's least share of the "
                                               "counts after its context")
    speculative_suffix_memory_tokens: int = opt(65536, "suffix speculation: recent output tokens kept per "
                                                 "namespace (0: the request's own tokens only)")
    speculative_adaptive: bool = opt(True, "measure tokens a second with and without speculation at each batch "
                                      "size and speculate only where it pays")
    speculative_draft_model: str | None = opt(None, "draft speculation with a separate draft model (a GGUF file, "
                                               "folder or catalog name sharing the model's tokenizer, e.g. "
                                               "Qwen2.5-Coder-0.5B for the 1.5B): the 'draft' method's drafter; "
                                               "implies --speculative-algorithm draft where none is given; unset: "
                                               "the model's own first layers draft")
    speculative_draft_layers: int = opt(8, "draft speculation: layers of the model the self-draft runs")
    speculative_min_accept_rate: float = opt(0.3, "a request whose recent acceptance is below this stops "
                                              "speculating for a while")

    def __post_init__(self) -> None:
        check_choices(self)
        if self.speculative_num_draft_tokens < 1 or self.speculative_draft_layers < 1:
            raise ValueError("speculative_num_draft_tokens and speculative_draft_layers must be >= 1")
        if not 0 < self.speculative_suffix_min_share <= 1 or self.speculative_suffix_memory_tokens < 0:
            raise ValueError("speculative_suffix_min_share must be in (0, 1] and speculative_suffix_memory_tokens "
                             ">= 0")
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ValueError(f"speculative ngram sizes must satisfy 1 <= min <= max, got "
                             f"{self.speculative_ngram_min}, {self.speculative_ngram_max}")
        if self.speculative_draft_model is not None and self.speculative_algorithm is None:
            object.__setattr__(self, "speculative_algorithm", "draft")  # (frozen: the one implied value)
