"""OpenAI request models. Unknown parameters are rejected (400 naming them), never silently accepted."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class SamplingExtras(Strict):
    """Parameters shared by chat and text completions, OpenAI's and the SGLang/vLLM extras."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # extras
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0
    priority: int = 0
    skip_special_tokens: bool = True
    regex: str | None = None
    ebnf: str | None = None
    json_schema: dict[str, Any] | str | None = None
    rid: str | None = None
    cache_salt: str | None = None  # splits the caller's radix namespace (never joins another tenant's)
    speculative: bool | str = True  # false: no speculation; a name: that method (where the server speculates)


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(SamplingExtras):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # default true: a turn may hold several calls
    reasoning_effort: str | None = None  # minimal / low / medium / high: a reasoning budget
    max_reasoning_tokens: int | None = None  # reasoning longer than this is closed (the end marker is forced)


class CompletionRequest(SamplingExtras):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for text completions (vLLM's and SGLang's too); null: no limit
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None  # generate best_of, return the n with the highest total logprob
    suffix: str | None = None  # rejected with a 400 naming it (no fill-in-the-middle)


class GenerateRequest(Strict):
    """SGLang's native /generate."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    rid: str | None = None
    cache_salt: str | None = None
    priority: int = 0


class ResponsesRequest(Strict):
    """OpenAI's Responses API: stored unless store is false; previous_response_id continues a stored one."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    reasoning: dict[str, Any] | None = None  # {"effort": ...}
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool | None = None  # None: true, as OpenAI's API (a 400 only where asked for and the server has no store)
    previous_response_id: str | None = None  # a stored response of the same tenant (404 otherwise)
    background: bool | None = None
    include: list[str] | None = None
    truncation: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    # extras
    seed: int | None = None
    top_k: int = -1
    min_p: float = 0.0
    max_reasoning_tokens: int | None = None
    priority: int = 0
    rid: str | None = None
    cache_salt: str | None = None
