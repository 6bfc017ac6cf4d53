"""Agents through the official openai client: tool calls streamed and whole, single and parallel, every
tool_choice mode, a tool loop that hits the radix cache, reasoning with a JSON schema, and the Responses API."""

from __future__ import annotations

import json
import os

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow
HERE = os.path.dirname(__file__)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 20},
                                                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                                                "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Oslo for 3 days, and the time in Tokyo? Use the tools."}]


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


def valid_calls(calls) -> list[str]:
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return [c.function.name for c in calls]


def test_parallel_calls_whole_and_streamed_agree(client):
    """Each of several calls in one turn validates against its own function's schema; the SDK's stream helper
    assembles the same message from the deltas as the whole response holds."""
    args = dict(model="default", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=160)
    whole = client.chat.completions.create(**args)
    with client.chat.completions.stream(**args) as stream:
        streamed = stream.get_final_completion()
    for r in (whole, streamed):
        assert r.choices[0].message.content is None
        assert len(valid_calls(r.choices[0].message.tool_calls)) >= 2
    w, s = whole.choices[0].message.tool_calls, streamed.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in w] == [(c.function.name, c.function.arguments) for c in s]
    assert len({c.id for c in w}) == len(w)


def test_single_call_streams_in_openai_shape(client):
    chunks = list(client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, temperature=0,
                                                 tool_choice="required", parallel_tool_calls=False, max_tokens=160,
                                                 stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    first, rest = deltas[0], deltas[1:]
    assert first.id and first.type == "function" and first.function.name in SCHEMAS and first.index == 0
    assert len(rest) > 2 and all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    jsonschema.validate(json.loads("".join(d.function.arguments or "" for d in deltas)), SCHEMAS[first.function.name])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_modes(client):
    named = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, temperature=1, seed=3,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}},
                                           max_tokens=80)
    assert valid_calls(named.choices[0].message.tool_calls) == ["get_time"]
    none = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="none",
                                          max_tokens=30, temperature=0)
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content
    for seed in range(6):  # auto: text stays free; a call that starts is complete and valid
        r = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="auto",
                                           temperature=1, seed=seed, max_tokens=120)
        msg = r.choices[0].message
        if msg.tool_calls and r.choices[0].finish_reason == "tool_calls":
            valid_calls(msg.tool_calls)
        else:
            assert msg.content is not None


def test_tool_loop_hits_the_cache(client):
    """call -> tool result -> answer: the later turn's cached tokens cover the whole earlier turn (its prompt
    and the call the model wrote, rendered back as the same text)."""
    first = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=80)
    msg = first.choices[0].message
    turn = ASK + [msg.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": '{"result": "sunny"}'} for c in msg.tool_calls]
    second = client.chat.completions.create(model="default", messages=turn, tools=TOOLS, max_tokens=30, temperature=0)
    earlier = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= earlier - 1  # (the last token is never cached)
    assert second.choices[0].message.content or second.choices[0].message.tool_calls


def test_bad_tool_requests_are_400(server):
    bad = [({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, "tools"),
           ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
           ({"messages": ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]}, "messages"),
           ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
           ({"max_reasoning_tokens": 5}, "max_reasoning_tokens"), ({"reasoning_effort": "low"}, "reasoning_effort")]
    for body, param in bad:
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={"messages": ASK, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "a", "suffix": "b"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert server.wait_idle()["kv_used"] == 0 if "kv_used" in server.stats() else True


def test_responses_create_and_stream(client):
    tools = [{"type": "function", **TIME["function"]}]
    r = client.responses.create(model="default", input="Time in Tokyo?", tools=tools, tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=80, temperature=0)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_time"])
    assert r.usage.input_tokens > 0 and r.usage.input_tokens_details.cached_tokens >= 0
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "population_millions": {"type": "number"}},
              "required": ["city", "population_millions"], "additionalProperties": False}
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}}
    with client.responses.stream(model="default", instructions="Answer in JSON.", input="The largest city in France?",
                                 text=fmt, max_output_tokens=80, temperature=0) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") > 1
    jsonschema.validate(json.loads(final.output_text), schema)
    whole = client.responses.create(model="default", instructions="Answer in JSON.", temperature=0,
                                    input="The largest city in France?", text=fmt, max_output_tokens=80)
    assert whole.output_text == final.output_text


def test_responses_unsupported_are_400(server):
    for body, param in [({"background": True}, "background"),
                        ({"tools": [{"type": "web_search"}]}, "tools"), ({"include": ["x"]}, "include"),
                        ({"input": [{"type": "image", "url": "x"}]}, "input"), ({"frequency": 1}, "frequency"),
                        ({"text": {"verbosity": "low"}}, "text"), ({"reasoning": {"x": 1}}, "reasoning"),
                        ({"reasoning": {"effort": "low"}}, "reasoning"),
                        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text")]:  # no name
        r = httpx.post(f"{server.url}/v1/responses", json={"input": "hi", **body}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


@pytest.fixture(scope="module")
def think_server(server_process, tmp_path_factory):
    """A Qwen-style template (native tools) whose answer opens with <think>, and the reasoning parser."""
    with open(os.path.join(HERE, "templates", "qwen_tools.jinja")) as f:
        text = f.read().replace("{{- '<|im_start|>assistant\\n' }}{%- endif %}",
                                "{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")
    assert "<think>" in text
    path = tmp_path_factory.mktemp("tpl") / "think.jinja"
    path.write_text(text)
    srv = server_process("--chat-template", str(path), "--reasoning-parser", "qwen3")
    yield srv
    assert srv.stop() == 0


def test_reasoning_then_json_schema(think_server):
    """The reasoning is free and split out; max_reasoning_tokens forces </think>; the schema applies after."""
    client = openai.OpenAI(base_url=f"{think_server.url}/v1", api_key="unused")
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}}, "required": ["answer"]}
    args = dict(model="default", messages=[{"role": "user", "content": "Name a color."}], temperature=0,
                max_tokens=120, extra_body={"max_reasoning_tokens": 12},
                response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    r = client.chat.completions.create(**args)
    msg = r.choices[0].message
    assert msg.reasoning_content and "</think>" not in msg.reasoning_content
    jsonschema.validate(json.loads(msg.content), schema)
    chunks = [c for c in client.chat.completions.create(**args, stream=True) if c.choices]
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert (reasoning, content) == (msg.reasoning_content, msg.content)
    resp = client.responses.create(model="default", input="Name a color.", max_output_tokens=120, temperature=0,
                                   text={"format": {"type": "json_schema", "name": "a", "schema": schema}},
                                   extra_body={"max_reasoning_tokens": 12})
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == msg.reasoning_content and resp.output_text == msg.content
    assert 0 < resp.usage.output_tokens_details.reasoning_tokens < resp.usage.output_tokens


def test_reasoning_with_native_tool_calls(think_server):
    client = openai.OpenAI(base_url=f"{think_server.url}/v1", api_key="unused")
    r = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=200, extra_body={"max_reasoning_tokens": 8})
    msg = r.choices[0].message
    assert msg.reasoning_content and valid_calls(msg.tool_calls)


def test_reasoning_parser_the_template_cannot_support(server_process):
    with pytest.raises(RuntimeError, match="reasoning_parser"):
        server_process("--reasoning-parser", "deepseek-r1")
