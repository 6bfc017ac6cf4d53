"""What the OpenAI routes share: the model check and a request's sampling parameters."""

from __future__ import annotations

from typing import Any

from radixlm.runtime.api.errors import ApiError
from radixlm.runtime.api.openai_api.protocol import SamplingExtras
from radixlm.runtime.api.serving import Serving


def check_model(serving: Serving, name: str | None) -> str:
    """Accept the served name, "default", or no name; anything else is OpenAI's 404."""
    if name in (None, "", "default", serving.model_name):
        return serving.model_name
    raise ApiError(404, f"The model '{name}' does not exist (this server serves '{serving.model_name}')",
                   param="model", code="model_not_found")


def sampling_from(req: SamplingExtras, max_tokens: int | None) -> dict[str, Any]:
    """The request's sampling dict (SamplingParams' names, constraint keys included); max_tokens None: until a
    stop or the end of the context, as for every API."""
    return {
        "max_new_tokens": max_tokens, "temperature": req.temperature,
        "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p, "repetition_penalty": req.repetition_penalty,
        "frequency_penalty": req.frequency_penalty, "presence_penalty": req.presence_penalty,
        "stop": [req.stop] if isinstance(req.stop, str) else (req.stop or []),
        "stop_token_ids": req.stop_token_ids or [], "ignore_eos": req.ignore_eos, "min_new_tokens": req.min_tokens,
        "skip_special_tokens": req.skip_special_tokens, "logit_bias": req.logit_bias or None, "n": req.n,
        "seed": req.seed, "speculative": req.speculative,
        "regex": req.regex, "ebnf": req.ebnf, "json_schema": req.json_schema,
    }
