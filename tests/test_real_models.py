"""A real model, Qwen2.5-Coder-0.5B-Instruct (the catalog's GGUF, Q5_0 with Q8_0 / Q6_K / Q4_K tensors), where the
toy model hides what users meet: greedy tokens against transformers, the default path's closeness to the float
model, and tools in every tool_choice mode and a schema over the OpenAI API. Skipped, saying why, where the file
is not installed (``radixlm models install qwen2.5-coder-0.5b``; .ci/run installs it)."""

from __future__ import annotations

import json
import os

import httpx
import jsonschema
import openai
import pytest
import torch

from .conftest import catalog_file, transformers_greedy, transformers_reference

pytestmark = pytest.mark.slow
NAME = "qwen2.5-coder-0.5b"
TEXT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "data", "fidelity_text.txt")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def qwen_path():
    return catalog_file(NAME)


@pytest.fixture(scope="module")
def reference(qwen_path):
    return transformers_reference(qwen_path)


def test_float_weights_give_transformers_greedy_tokens(qwen_path, reference):
    """Qwen2 (qkv bias, tied embedding, GQA) in float32 with the file's weights dequantized: every token of a
    greedy continuation is transformers' own."""
    from radixlm.runtime.engine import Engine

    tok, model = reference
    engine = Engine(qwen_path, dtype="float32", quantization="none", max_total_tokens=2048)
    prompts = ["def fibonacci(n):", "The three primary colors are", "SELECT name FROM users WHERE"]
    for p in prompts:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        want = transformers_greedy(model, ids, 24)
        got = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 24,
                                                              "ignore_eos": True})["output_ids"]
        assert got == want, p
    engine.shutdown()


def test_the_default_path_stays_close_to_the_float_model(qwen_path, reference):
    """The KL divergence of the default path (the file's quantized weights, int8 activations per group of 32,
    float32 activations between the kernels and float32 logits) from transformers in float32, over 2 chunks of 512
    tokens of the fidelity benchmark's text, second halves scored. Measured on the Zen 4: 0.00055 mean, 0.0033 p99,
    99.0% top-1; llama.cpp over 40 chunks of the same text: 0.00089, 0.0070, 98.4% (bench_fidelity.py). The bounds
    are llama.cpp's (the kernels give the same bits on every path, so the margin holds on any CPU)."""
    from radixlm.runtime.batch import ForwardBatch
    from radixlm.runtime.config import EngineConfig
    from radixlm.runtime.core import EngineCore

    tok, model = reference
    with open(TEXT) as f:
        ids = tok(f.read(), add_special_tokens=False)["input_ids"]
    core = EngineCore(EngineConfig.from_flat(model=qwen_path, max_total_tokens=600), progress=False)
    row, ctx = core.runner.req_to_token.alloc(), 512
    slots = torch.tensor(core.runner.allocator.alloc_pages(ctx))
    core.runner.req_to_token.table[row, :ctx] = slots
    kld, same = [], []
    for chunk in (ids[:ctx], ids[5 * ctx:6 * ctx]):
        with torch.inference_mode():
            ref = torch.log_softmax(model(torch.tensor([chunk])).logits[0, ctx // 2:-1].double(), -1)
        batch = ForwardBatch("extend", torch.tensor(chunk), torch.arange(ctx), slots, torch.tensor([row]), [ctx],
                             [ctx], torch.arange(ctx // 2, ctx - 1))
        got = torch.log_softmax(core.runner.forward(batch).double(), -1)
        kld.append(torch.where(ref > -16, ref.exp() * (ref - got), 0).sum(-1))
        same.append(got.argmax(-1) == ref.argmax(-1))
    kld, same = torch.cat(kld), torch.cat(same)
    p99 = torch.quantile(kld.float(), 0.99)
    assert kld.mean() < 0.00089 and p99 < 0.0070, (kld.mean(), p99)
    assert same.float().mean() > 0.984


@pytest.fixture(scope="module")
def qwen_server(server_process, qwen_path):
    srv = server_process("--model", NAME, "--max-total-tokens", "8192", "--check-invariants")
    yield srv
    assert srv.stop() == 0


def chat(server, **kw):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    return client.chat.completions.create(model="default", temperature=0, max_tokens=120, **kw)


def valid_call(call, tools) -> bool:
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), schema)
    return True


def test_tools_in_every_tool_choice_mode(qwen_server):
    tools = [WEATHER, TIME]
    ask = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
    auto = chat(qwen_server, messages=ask, tools=tools)
    calls = auto.choices[0].message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather" and valid_call(calls[0], tools)
    assert auto.choices[0].finish_reason == "tool_calls"
    plain = chat(qwen_server, messages=[{"role": "user", "content": "Write a haiku about the sea."}], tools=tools)
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    required = chat(qwen_server, messages=ask, tools=tools, tool_choice="required")
    assert all(valid_call(c, tools) for c in required.choices[0].message.tool_calls)
    named = chat(qwen_server, messages=ask, tools=tools, tool_choice={"type": "function",
                                                                      "function": {"name": "get_time"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_time" and valid_call(call, tools)
    none = chat(qwen_server, messages=ask, tools=tools, tool_choice="none")
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")
    streamed = chat(qwen_server, messages=ask, tools=tools, stream=True)
    deltas = [tc for c in streamed if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == calls[0].function.name
    assert "".join(d.function.arguments or "" for d in deltas) == calls[0].function.arguments


def test_a_json_schema_answer_validates(qwen_server):
    schema = {"type": "object", "properties": {"language": {"type": "string", "maxLength": 20},
                                               "year": {"type": "integer", "minimum": 1950, "maximum": 2030}},
              "required": ["language", "year"]}
    r = chat(qwen_server, messages=[{"role": "user", "content": "Which programming language did Guido van Rossum "
                                                                "create, and in which year? Answer in JSON."}],
             response_format={"type": "json_schema", "json_schema": {"name": "lang", "schema": schema}})
    answer = json.loads(r.choices[0].message.content)
    jsonschema.validate(answer, schema)
    assert "python" in answer["language"].lower()
    assert r.choices[0].message.tool_calls is None
    assert httpx.get(f"{qwen_server.url}/server_info", timeout=5).json()["stats"]["leak"] is None
