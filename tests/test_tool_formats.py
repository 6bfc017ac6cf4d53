"""Tool formats by template: detection, the structural tag each tool_choice compiles to (checked against
xgrammar's own matcher), and tool results rendered into the prompt exactly as the template does."""

from __future__ import annotations

import json
import os

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from radixlm.constrained.xgrammar_backend import _schema_ebnf, bounded_format
from radixlm.runtime.api.chat.prompt import ChatSyntax, chat_prompt
from radixlm.runtime.api.chat.reasoning import PARSERS, reasoning_syntax, with_reasoning
from radixlm.runtime.api.chat.tool_formats import (
    FORMATS,
    HERMES,
    JSON_OBJECT,
    JSON_OBJECT_LINES,
    LLAMA3_JSON,
    MISTRAL,
    QWEN_FORMS,
    also_written,
    detect,
    structural_format,
)
from radixlm.runtime.api.openai_api.protocol import ChatMessage

HERE = os.path.dirname(__file__)
FUNCS = {"get_weather": {"parameters": {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"]}}, "ping": {}}
GOOD = [("get_weather", {"city": "Oslo", "days": 3}), ("ping", {})]


def accepts(fmt: dict, text: str) -> bool:
    bounded = bounded_format(fmt, lambda s: _schema_ebnf(json.dumps(s), True))
    grammar = xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": bounded}))
    return _is_grammar_accept_string(grammar, text)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_mode_enforces_the_calls(name):
    fmt = FORMATS[name]
    auto = structural_format(fmt, FUNCS, required=False, parallel=True)
    required = structural_format(fmt, FUNCS, required=True, parallel=True)
    single = structural_format(fmt, FUNCS, required=True, parallel=False)
    both, one = fmt.render(GOOD), fmt.render(GOOD[:1])
    bad_args = fmt.render([("get_weather", {"city": "Oslo", "days": 30})])  # over the maximum
    unknown = fmt.render([("nope", {})])
    assert accepts(auto, "Just text.") and accepts(auto, "Sure. " + one) and accepts(auto, both)
    assert not accepts(auto, bad_args) and not accepts(auto, "x " + unknown)
    assert accepts(required, both) and accepts(required, one) and not accepts(required, "text " + one)
    assert not accepts(required, "") and not accepts(required, bad_args)
    assert accepts(single, one) and not accepts(single, both)


def test_auto_holds_a_bare_or_fenced_object_that_names_a_function():
    """Qwen2.5's other forms in auto: an object opening with a function's name is held to its schema whether bare or
    in a fence; JSON naming no function stays free; required and named modes keep the template's form only."""
    auto = structural_format(HERMES, FUNCS, required=False, parallel=True, also=QWEN_FORMS)
    for form in (HERMES, *QWEN_FORMS):
        assert accepts(auto, "Let me check. " + form.render(GOOD[:1])), form.name
        assert not accepts(auto, form.render([("get_weather", {"city": "Oslo", "days": 30})])), form.name
    assert accepts(auto, '{"name": "Oslo", "days": 30}') and accepts(auto, '```json\n{"city": "Oslo"}\n```')
    for obj in (JSON_OBJECT, JSON_OBJECT_LINES):  # days is required
        assert not accepts(auto, obj.object_open("get_weather") + '{"city": "Oslo"}' + obj.object_close)
    assert structural_format(HERMES, FUNCS, required=True, parallel=True) == structural_format(
        HERMES, FUNCS, required=True, parallel=True, also=QWEN_FORMS)
    qwen = "{%- if tools %}<|im_start|>system ... <tool_call>{% endif %}<|im_start|>"
    assert also_written(qwen, HERMES) == QWEN_FORMS and also_written("<tool_call>", HERMES) == ()


def test_constraint_only_after_the_reasoning():
    schema = {"type": "json_schema", "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                     "required": ["a"]}}
    think = PARSERS["qwen3"]
    opened = with_reasoning(think, True, schema, None)
    assert accepts(opened, 'free {"a": "text"} here</think>{"a": 1}')
    assert not accepts(opened, '</think>not json')
    optional = with_reasoning(think, False, schema, None)
    assert accepts(optional, '<think>hm</think>{"a": 1}') and accepts(optional, '{"a": 1}')


def test_detection_and_reasoning_support():
    assert detect(None) == (HERMES, False)
    with open(os.path.join(HERE, "templates", "qwen_tools.jinja")) as f:
        assert detect(f.read()) == (HERMES, True)
    assert detect("{% for tools %}[TOOL_CALLS]{{ tool_calls }}")[0] is MISTRAL
    assert detect('{{ tools }}{{ "parameters" }}<|eot_id|>{{ tool_calls }}')[0] is LLAMA3_JSON
    with pytest.raises(ValueError, match="reasoning_parser"):
        reasoning_syntax("qwen3", "{{ messages }}")
    with pytest.raises(ValueError, match="reasoning_parser"):
        reasoning_syntax("nope", "<think></think>")
    assert reasoning_syntax("none", None) is None


def test_native_template_renders_the_call_as_generated(smol_tokenizer):
    """The earlier call comes back as the very text the model wrote, then the tool result as the template
    renders it: the next turn's prompt extends the first turn's prompt + answer (so the radix cache hits)."""
    tok = smol_tokenizer
    saved = tok.chat_template
    with open(os.path.join(HERE, "templates", "qwen_tools.jinja")) as f:
        tok.chat_template = f.read()
    try:
        chat = ChatSyntax.of(tok.chat_template, None)
        tools = {n: {"name": n, **f} for n, f in FUNCS.items()}
        ask = [ChatMessage(role="user", content="Weather in Oslo?")]
        first = chat_prompt(tok, chat, ask, tools, True)
        answer = HERMES.render(GOOD[:1])
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                 "arguments": json.dumps(GOOD[0][1])}}
        turn = ask + [ChatMessage(role="assistant", tool_calls=[call]),
                      ChatMessage(role="tool", tool_call_id="call_1", content="sunny")]
        second = chat_prompt(tok, chat, turn, tools, True)
        text = tok.decode(second.ids)
        assert tok.decode(first.ids) + answer + "<|im_end|>" in text
        assert "<tool_response>\nsunny\n</tool_response>" in text
    finally:
        tok.chat_template = saved
