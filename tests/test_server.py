"""The whole server over HTTP on 127.0.0.1 with the default model, driven by the official openai client."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest

from radixlm.runtime.engine import Engine

pytestmark = pytest.mark.slow
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
LONG = " ".join(f"Item {i} is a small blue stone from the river bank." for i in range(60))


@pytest.fixture(scope="module")
def server(server_process):
    srv = server_process("--dtype", "float32", "--check-invariants")
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


def test_chat_text_stream_and_usage(client, smol_tokenizer):
    msgs = [{"role": "user", "content": "Name a fruit."}]
    chat = client.chat.completions.create(model="default", messages=msgs, max_tokens=16, temperature=0)
    text = chat.choices[0].message.content
    assert text and chat.choices[0].finish_reason in ("stop", "length")
    assert chat.choices[0].message.refusal is None and "refusal" in chat.choices[0].message.model_fields_set
    text_prompt = smol_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = smol_tokenizer(text_prompt, add_special_tokens=False)["input_ids"]
    assert chat.usage.prompt_tokens == len(ids)
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    stream = client.chat.completions.create(model="default", messages=msgs, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert "refusal" in chunks[0].choices[0].delta.model_fields_set  # null, as OpenAI's first delta has it
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    comp = client.completions.create(model="default", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert comp.choices[0].text.startswith(" Paris")
    tok_prompt = client.completions.create(model="default", prompt=smol_tokenizer("The capital of France is")["input_ids"],
                                           max_tokens=8, temperature=0)
    assert tok_prompt.choices[0].text == comp.choices[0].text


def test_n_logprobs_seed_and_cached_tokens(client):
    msgs = [{"role": "user", "content": "Tell me a word."}]
    two = client.chat.completions.create(model="default", messages=msgs, max_tokens=8, n=2, temperature=1.0, seed=3)
    assert len(two.choices) == 2 and {c.index for c in two.choices} == {0, 1}
    again = client.chat.completions.create(model="default", messages=msgs, max_tokens=8, n=2, temperature=1.0, seed=3)
    assert [c.message.content for c in again.choices] == [c.message.content for c in two.choices]
    lp = client.chat.completions.create(model="default", messages=msgs, max_tokens=4, temperature=0, logprobs=True,
                                        top_logprobs=3)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens and all(c.logprob <= 0 for c in content)
    assert len(content[0].top_logprobs) == 3 and content[0].top_logprobs[0].token == content[0].token
    first = client.completions.create(model="default", prompt=LONG, max_tokens=2, temperature=0)
    second = client.completions.create(model="default", prompt=LONG, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens > 400
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_http_greedy_equals_engine(server, smol_model_fp32, smol_tokenizer):
    engine = Engine.from_model(smol_model_fp32, smol_tokenizer)
    sp = {"temperature": 0, "max_new_tokens": 24}
    want = engine.generate("Write a short poem about the sea.", sp)
    got = httpx.post(f"{server.url}/generate", json={"text": "Write a short poem about the sea.",
                                                       "sampling_params": sp}, timeout=60).json()
    assert got["output_ids"] == want["output_ids"] and got["text"] == want["text"]


def test_disconnect_mid_stream_frees_the_request(server):
    body = {"prompt": "Count to one thousand:", "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break
        assert server.metric("num_running_reqs") >= 0
    gone = time.monotonic()
    while server.stats()["running"] > 0:
        assert time.monotonic() - gone < 1.5, "request still running after the client left"
        time.sleep(0.05)
    stats = server.wait_idle()
    assert stats["leak"] is None


@pytest.mark.parametrize("body, status, param", [
    ("{not json", 400, None),
    ({"model": "default"}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, 400, "max_new_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "warm"}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "modalities": ["audio"]}, 400, "modalities"),
    ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"999999": 5}}, 400, "logit_bias"),
    ({"messages": [{"role": "user", "content": "hi"}], "speculative": "suffix"}, 400, "speculative"),  # none here
    ({"messages": [{"role": "user", "content": "hi"}], "speculative": 2}, 400, "speculative"),
    ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}],  # a tool whose parameters are not an object schema
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, 400, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL], "tool_choice":
      {"type": "function", "function": {"name": "nope"}}}, 400, "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "1"}]},
     400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}],  # OpenAI requires the schema's name
      "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}, 400, "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}, 400, "response_format"),
])
def test_bad_input_gets_openai_errors(server, body, status, param):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error" and err["param"] == param
    if param == "response_format":
        assert "response_format.json_schema.name" in err["message"]
    ok = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert ok.status_code == 200


def test_completions_echo(client, smol_tokenizer):
    prompt = "The capital of France is"
    out = client.completions.create(model="default", prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2)
    c = out.choices[0]
    assert c.text.startswith(prompt) and len(c.text) > len(prompt)
    n_prompt = len(smol_tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert len(c.logprobs.tokens) == n_prompt + out.usage.completion_tokens
    assert c.logprobs.token_logprobs[0] is None and all(x <= 0 for x in c.logprobs.token_logprobs[1:])
    assert "".join(c.logprobs.tokens) == c.text
    plain = client.completions.create(model="default", prompt=prompt, max_tokens=3, temperature=0)
    assert c.text == prompt + plain.choices[0].text  # echo changes nothing of the answer
    chunks = list(client.completions.create(model="default", prompt=[prompt, "Two plus two is"], max_tokens=3,
                                            temperature=0, echo=True, stream=True))
    firsts = {}
    for ch in chunks:
        for x in ch.choices:
            firsts.setdefault(x.index, x.text)
    assert firsts == {0: prompt, 1: "Two plus two is"}


def test_completions_default_to_16_tokens_as_openai(server):
    body = {"prompt": [1], "temperature": 0, "ignore_eos": True}  # an id prompt, no end of its own
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
    r = httpx.post(f"{server.url}/v1/completions", json={**body, "max_tokens": 24}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 24


def test_completions_best_of_picks_the_most_likely(client):
    kw = {"model": "default", "prompt": "A short poem:", "max_tokens": 8, "temperature": 1.0, "seed": 5}
    best = client.completions.create(best_of=3, **kw)
    assert len(best.choices) == 1 and best.choices[0].index == 0
    three = client.completions.create(n=3, logprobs=0, **kw)  # the same three samples (seeds 5, 6, 7)
    totals = {c.text: sum(c.logprobs.token_logprobs) for c in three.choices}
    assert best.choices[0].text == max(totals, key=totals.get)
    assert best.usage.completion_tokens == three.usage.completion_tokens  # every sample drawn is counted
    for bad in ({"best_of": 0}, {"best_of": 2, "n": 3}, {"best_of": 3, "stream": True}):
        with pytest.raises(openai.BadRequestError, match="best_of"):
            client.completions.create(**{**kw, **bad})


def test_unknown_model_is_404(server):
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "gpt-9", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_64_concurrent_streams_complete_with_the_right_text(server):
    prompts = [f"List {i % 8 + 2} animals that live in the {['sea', 'forest', 'desert', 'city'][i % 4]}:"
               for i in range(64)]

    async def one(client, p, stream):
        body = {"prompt": p, "max_tokens": 12, "temperature": 0, "stream": stream}
        if not stream:
            return (await client.post(f"{server.url}/v1/completions", json=body)).json()["choices"][0]["text"]
        text = ""
        async with client.stream("POST", f"{server.url}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    text += __import__("json").loads(line[6:])["choices"][0]["text"]
        return text

    async def main(stream):
        async with httpx.AsyncClient(timeout=300) as c:
            return await asyncio.gather(*(one(c, p, stream) for p in prompts))

    plain = asyncio.run(main(False))
    streamed = asyncio.run(main(True))
    assert streamed == plain and all(plain)
    assert server.wait_idle()["leak"] is None


def test_native_endpoints(server):
    u = server.url
    assert httpx.get(f"{u}/health_generate", timeout=30).status_code == 200
    assert httpx.get(f"{u}/model_info").json()["is_generation"] is True
    tok = httpx.post(f"{u}/tokenize", json={"text": "hello world"}).json()
    assert httpx.post(f"{u}/detokenize", json={"tokens": tok["tokens"]}).json()["text"] == "hello world"
    batch = httpx.post(f"{u}/generate", json={"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}},
                       timeout=30).json()
    assert len(batch) == 2 and all(b["meta_info"]["completion_tokens"] == 2 for b in batch)
    lines = []
    with httpx.stream("POST", f"{u}/generate", json={"text": "Hi", "stream": True,
                                                     "sampling_params": {"max_new_tokens": 4}}, timeout=30) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 2
    server.wait_idle()
    assert httpx.post(f"{u}/flush_cache", timeout=30).status_code == 200
    metrics = httpx.get(f"{u}/metrics").text
    for name in ("prompt_tokens_total", "generation_tokens_total", "time_to_first_token_seconds_bucket",
                 "num_running_reqs", "cache_hit_rate", "e2e_request_latency_seconds_count"):
        assert f"radixlm:{name}" in metrics
    assert httpx.get(f"{u}/v1/models").json()["data"][0]["id"]


def test_api_key_stream_interval_and_clean_shutdown(server_process):
    srv = server_process("--api-key", "sekrit", "--max-total-tokens", "4096", "--stream-interval", "4")
    try:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/generate"),
                             ("GET", "/metrics"), ("POST", "/v1/responses")):
            for auth in ({"Authorization": "Bearer wrong"}, {}):  # an unknown key, and none
                r = httpx.request(method, f"{srv.url}{path}", headers=auth, json={})
                # OpenAI's body for a wrong key, whatever the route
                assert r.status_code == 401 and r.json() == {"error": {
                    "message": "invalid or missing API key", "type": "invalid_request_error", "param": None,
                    "code": "invalid_api_key"}}, (path, r.text)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{srv.url}/v1", api_key="wrong").models.list()
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="sekrit")
        assert client.models.list().data
        # --stream-interval 4: the same text in fewer chunks, the first one alone
        args = {"model": client.models.list().data[0].id, "prompt": "The capital of France is", "max_tokens": 20, "temperature": 0,
                "extra_body": {"ignore_eos": True}}
        whole = client.completions.create(**args).choices[0].text
        chunks = [c.choices[0].text for c in client.completions.create(**args, stream=True) if c.choices]
        assert "".join(chunks) == whole
        assert 5 <= len([c for c in chunks if c]) <= 8  # 1 + 19 tokens in fours (a chunk may hold no text yet)
    finally:
        assert srv.stop() == 0
    threading.Event().wait(0.5)
