"""The streaming state machine (stop strings -> reasoning -> content and tool calls): the same text fed one
character at a time, in random pieces or whole gives the same final message, and the deltas add up to it."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.api.chat.message_stream import MessageStream, Syntax, value_end
from radixlm.runtime.api.chat.reasoning import PARSERS
from radixlm.runtime.api.chat.tool_formats import FORMATS, HERMES, QWEN_FORMS
from radixlm.runtime.decode.text import IncrementalText

THINK = PARSERS["qwen3"]
FUNCS = ("get_weather", "search", "add")
# text that brushes against every marker
PIECES = list("ab <>/{}[]\"\n,;:`") + ["<think>", "</think", "<tool_call", "[TOOL", '{"name": ', "STOP", "```json\n",
                                       '{"name": "search"', "\n```", '{\n  "name": ', "\n}"]
QWEN = QWEN_FORMS  # what Qwen2.5 models also write beside their template's hermes tags
TEXT = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
ARGS = st.dictionaries(st.text("xyz", min_size=1, max_size=3),
                       st.one_of(st.integers(-5, 5), st.text('ab"}\\{ ', max_size=4), st.booleans(),
                                 st.lists(st.integers(0, 3), max_size=2)), max_size=3)


def assemble(deltas: list[dict]) -> dict:
    """What the openai SDK's stream helpers build from chat deltas."""
    msg: dict = {"content": None, "reasoning_content": None, "tool_calls": []}
    for d in deltas:
        for key in ("content", "reasoning_content"):
            if key in d:
                msg[key] = (msg[key] or "") + d[key]
        for tc in d.get("tool_calls", []):
            if tc["index"] == len(msg["tool_calls"]):
                msg["tool_calls"].append({"id": tc["id"], "type": tc["type"],
                                          "function": {"name": tc["function"]["name"], "arguments": ""}})
            msg["tool_calls"][tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
    return msg


def normal(msg: dict) -> dict:
    return {"content": msg.get("content") or None, "reasoning_content": msg.get("reasoning_content") or None,
            "tool_calls": msg.get("tool_calls") or []}


def run(text: str, cuts: list[int], syntax: Syntax, stop: list[str]) -> tuple[dict, dict, bool]:
    """Feed ``text`` as code points cut at ``cuts`` through IncrementalText (stops) and MessageStream."""
    ids = [ord(c) for c in text]
    hit = min((text.find(s) + len(s) for s in stop if s in text), default=None)
    matched = next((s for s in stop if s in text and text.find(s) + len(s) == hit), None)
    ids = ids[:hit] if hit else ids
    inc = IncrementalText(lambda t: "".join(map(chr, t)), stop)
    ms = MessageStream(syntax, "call_x")
    deltas = []
    bounds = sorted({c for c in cuts if 0 < c < len(ids)} | {len(ids)})
    for b in bounds:
        last = b == len(ids)
        deltas += ms.feed(inc.delta(ids[:b], last, matched if last else None), last)
    return ms.message(), assemble(deltas), ms.tool_calls_done()


@st.composite
def answers(draw):
    name = draw(st.sampled_from([*sorted(FORMATS), "qwen"]))
    fmt, also = (HERMES, QWEN) if name == "qwen" else (FORMATS[name], ())
    written = draw(st.sampled_from([fmt, *also]))  # the form the calls come in
    opened = draw(st.booleans())
    think = draw(st.one_of(st.none(), TEXT))
    calls = draw(st.lists(st.tuples(st.sampled_from(FUNCS), ARGS), max_size=3))
    text = ""
    if think is not None:
        text += ("" if opened else "<think>") + think + draw(st.sampled_from(["</think>", "</think>\n\n", ""]))
    text += draw(TEXT)
    if calls:
        text += written.render(calls)
    text += draw(st.one_of(st.just(""), TEXT))
    if draw(st.booleans()):  # cut short anywhere, as max_tokens would
        text = text[:draw(st.integers(0, len(text)))]
    syntax = Syntax(reasoning=draw(st.sampled_from([None, THINK])), reasoning_opened=opened, tools=fmt,
                    functions=frozenset(FUNCS), also=also)
    stop = draw(st.lists(st.sampled_from(["STOP", "</think", "zz"]), max_size=2))
    return text, syntax, stop


@settings(max_examples=400, deadline=None)
@given(answers(), st.lists(st.integers(0, 400), max_size=20))
def test_chunking_never_changes_the_message(case, cuts):
    text, syntax, stop = case
    whole, whole_deltas, whole_done = run(text, [], syntax, stop)
    chars, char_deltas, chars_done = run(text, list(range(len(text))), syntax, stop)
    pieces, piece_deltas, pieces_done = run(text, cuts, syntax, stop)
    assert whole == chars == pieces
    assert whole_done == chars_done == pieces_done
    for assembled in (whole_deltas, char_deltas, piece_deltas):
        assert normal(assembled) == normal(whole)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(FORMATS)), st.lists(st.tuples(st.sampled_from(FUNCS), ARGS), min_size=1, max_size=3),
       TEXT, st.booleans())
def test_rendered_calls_parse_back(fmt_name, calls, before, think):
    """Whatever precedes them, calls the template format renders parse back to the same names and arguments
    (the last parameter included), and the text before them is the content."""
    fmt = FORMATS[fmt_name]
    before = before.replace(fmt.trigger, "")
    text = ("<think>why</think>" if think else "") + before + fmt.render(calls)
    syntax = Syntax(reasoning=THINK if think else None, tools=fmt, functions=frozenset(FUNCS))
    msg, _, done = run(text, [], syntax, [])
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]
    if fmt.trigger[:3] in before or (fmt_name == "llama3_json" and "{" in before):
        return  # the text itself looked like the start of a call
    assert got == calls and done
    # the text before the calls is the content (less whitespace after the reasoning and before the calls)
    assert (msg["content"] or "") == (before.lstrip() if think else before).rstrip()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(QWEN), st.lists(st.tuples(st.sampled_from(FUNCS), ARGS), min_size=1, max_size=3),
       st.text("ab .\n", max_size=10))
def test_qwen_writes_calls_as_bare_or_fenced_objects(form, calls, before):
    """In auto, a Qwen2.5 answer's bare object or ```json fence, on one line or with its keys on lines of their own,
    that names a function is a call (the fence is not content); the text before it is the content."""
    syntax = Syntax(tools=HERMES, functions=frozenset(FUNCS), also=QWEN)
    msg, _, done = run(before + form.render(calls), [], syntax, [])
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]
    assert got == calls and done
    assert (msg["content"] or "") == before.rstrip()


def test_json_that_names_no_function_stays_text():
    syntax = Syntax(tools=HERMES, functions=frozenset(FUNCS), also=QWEN)
    for text in ('{"name": "Paris", "population": 2}', '```json\n{"city": "Paris"}\n```',
                 '```json\n{"name": "lookup", "arguments": {}}\n```', 'Use {"name": "x"} here.',
                 '```json\n{\n  "name": "schedule_visit",\n  "arguments": {}\n}\n```'):
        msg, _, done = run(text, [], syntax, [])
        assert msg["content"] == text and "tool_calls" not in msg and not done, text
    msg, _, _ = run('{"name": "search", "arguments": {}}', [], Syntax(), [])  # no tools: response_format's JSON
    assert msg["content"] == '{"name": "search", "arguments": {}}' and "tool_calls" not in msg


def test_value_end_scans_json():
    assert value_end('{"a": "}", "b": [1, {"c": 2}]}} tail', 0) == 30
    assert value_end('{"a": "\\"}"', 0) is None
    assert value_end('12, ', 0) == 2
    assert value_end('"x"}', 0) == 3


def test_markers_held_back_until_known():
    s = MessageStream(Syntax(tools=FORMATS["hermes"], functions=frozenset({"f"})), "c")
    assert s.feed("Hi <tool_") == [{"content": "Hi"}]  # the space may precede a call: held too
    out = s.feed('call>\n{"name": "f", "arguments": {"q"')
    assert out == [{"tool_calls": [{"index": 0, "id": "c_0", "type": "function",
                                    "function": {"name": "f", "arguments": ""}}]},
                   {"tool_calls": [{"index": 0, "function": {"arguments": '{"q"'}}]}]
    s.feed(': 1}}\n</tool_call>', True)
    assert s.tool_calls_done() and s.message()["content"] == "Hi"
