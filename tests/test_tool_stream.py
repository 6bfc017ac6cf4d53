"""The tool-call stream: fed one character at a time, in random pieces, or whole, the same final message."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.api.tool_stream import ToolCallStream, match_opening

FUNCTIONS = {"get_weather": {}, "search": {}}
json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                                                     max_size=3), max_leaves=8)
calls = st.builds(lambda name, args, sep: "{" + sep + '"name":' + sep + json.dumps(name) + "," + sep +
                  '"arguments":' + sep + json.dumps(args) + sep + "}",
                  st.sampled_from(["get_weather", "search", "unknown"]), st.dictionaries(st.text(max_size=6),
                                                                                         json_values, max_size=4),
                  st.sampled_from(["", " ", "\n  "]))
texts = calls | st.text(max_size=40) | calls.map(lambda c: c[: len(c) // 2])  # calls, prose, cut-short calls


def assemble(text: str, cuts: list[int]) -> tuple[dict, bool]:
    """Feed ``text`` in pieces and add the deltas up the way the openai SDK's helpers do."""
    s = ToolCallStream(FUNCTIONS, "call_1")
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    content, call = None, None
    for k, piece in enumerate(pieces):
        for d in s.feed(piece, finished=k == len(pieces) - 1):
            if "content" in d:
                content = (content or "") + d["content"]
            for tc in d.get("tool_calls", []):
                if "id" in tc:
                    call = {"id": tc["id"], "type": tc["type"], "function": {"name": tc["function"]["name"],
                                                                             "arguments": ""}}
                call["function"]["arguments"] += tc["function"]["arguments"]
    msg = {"content": content if call is None else None}
    if call is not None:
        msg["tool_calls"] = [call]
    elif content is None:
        msg["content"] = ""
    return msg, s.complete()


@settings(max_examples=300, deadline=None)
@given(text=texts, data=st.data())
def test_streamed_equals_whole(text, data):
    whole = ToolCallStream(FUNCTIONS, "call_1")
    whole.feed(text, finished=True)
    expected = whole.result()
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=12))))
    for pieces in (cuts, list(range(1, len(text)))):  # random pieces, then one character at a time
        got, complete = assemble(text, pieces)
        assert got == expected and complete == whole.complete(), (text, pieces)
    if whole.complete():  # a whole call: its arguments parse, and are the ones written
        obj = json.loads(text)
        assert json.loads(expected["tool_calls"][0]["function"]["arguments"]) == obj["arguments"]
        assert obj["name"] in FUNCTIONS


def test_unknown_functions_and_prose_are_content():
    for text in ('{"name": "unknown", "arguments": {}}', "Hello {there}", '{"name": "search", "arguments": 5}'):
        s = ToolCallStream(FUNCTIONS, "c")
        s.feed(text, finished=True)
        assert s.result() == {"content": text} and not s.complete()
    assert match_opening('  {"name" : "search" ,"arguments":')[0] == "match"
    assert match_opening('{"nam')[0] == "prefix" and match_opening('{"x"')[0] == "no"
