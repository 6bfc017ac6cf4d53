"""Structured output over HTTP: response_format, tools with tool_choice, native constraints, bad grammars."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 20},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}}, "required": ["zone"]}}}


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


def test_response_format_json_schema_and_object(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 15},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"]}
    for seed in range(3):
        r = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Describe Paris as JSON."}], temperature=1.0,
            seed=seed, max_tokens=80,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}})
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "A tiny JSON object."}],
                                       max_tokens=300, temperature=0, response_format={"type": "json_object"},
                                       stream=True)
    chunks = [c for c in r if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.startswith("{")
    if chunks[-1].choices[0].finish_reason == "stop":  # a 135M model may write a large object until max_tokens
        assert isinstance(json.loads(text), dict)


def test_tool_choice_required_always_yields_valid_calls(client):
    params = {f["function"]["name"]: f["function"]["parameters"] for f in (WEATHER, TIME)}
    for seed in range(4):
        r = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "What's the weather in Oslo?"}],
            tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed,
            max_tokens=80)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])
    named = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Time in Tokyo?"}], tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=60, temperature=0,
        stream=True)
    chunks = [c for c in named if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    # OpenAI's shape: the first delta names the call, later ones carry fragments of its arguments
    assert calls and calls[0].id and calls[0].type == "function" and calls[0].function.name == "get_time"
    assert len(calls) > 2 and all(tc.index == 0 and tc.id is None and tc.function.name is None for tc in calls[1:])
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    jsonschema.validate(json.loads(arguments), params["get_time"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_native_generate_constraints(server):
    r = httpx.post(f"{server.url}/generate", timeout=60, json={
        "text": "My IP address is ", "sampling_params": {"regex": r"(\d{1,3}\.){3}\d{1,3}", "max_new_tokens": 20}})
    assert r.status_code == 200 and r.json()["text"].count(".") == 3
    r = httpx.post(f"{server.url}/generate", timeout=60, json={
        "text": "Answer: ", "sampling_params": {"ebnf": 'root ::= "yes" | "no"', "max_new_tokens": 5}})
    assert r.json()["text"] in ("yes", "no")


@pytest.mark.parametrize("sampling, param", [
    ({"json_schema": "{not json"}, "json_schema"),
    ({"regex": "(unclosed"}, "regex"),
    ({"ebnf": "root ::= missing_rule"}, None),
    ({"json_schema": {"type": "array", "uniqueItems": True}}, None),
])
def test_bad_grammars_are_400_and_the_server_keeps_serving(server, sampling, param):
    for stream in (False, True):
        r = httpx.post(f"{server.url}/generate", timeout=60,
                       json={"text": "x", "stream": stream, "sampling_params": {**sampling, "max_new_tokens": 4}})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["message"] and (param is None or err["param"] == param)
    ok = httpx.post(f"{server.url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                    timeout=60)
    assert ok.status_code == 200
    assert server.wait_idle()["leak"] is None
