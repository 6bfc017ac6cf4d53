"""Constrained decoding: specs, both backends' matchers, and every sampled output obeying its grammar."""

from __future__ import annotations

import ipaddress
import json
import re

import jsonschema
import pytest
import torch

from radixlm.constrained import ConstraintSpec, make_backend, spec_from_response_format, spec_from_sampling
from radixlm.kernels.token_bitmask import unpack_bitmask

SCHEMAS = {
    "simple": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"]},
    "nested": {"type": "object", "properties": {"person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]}}, "required": ["name", "address"]}}, "required": ["person"]},
    "array_enum": {"type": "object", "properties": {"tags": {"type": "array", "minItems": 1, "maxItems": 3,
                                                             "items": {"enum": ["red", "green", "blue"]}}},
                   "required": ["tags"]},
    "enum_const": {"type": "object", "properties": {"status": {"enum": ["active", "inactive", "banned"]},
                                                    "version": {"const": 2}}, "required": ["status", "version"]},
    "optional": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999},
                                                  "nickname": {"type": "string", "maxLength": 8},
                                                  "vip": {"type": "boolean"}}, "required": ["id"]},
    "bounded_numbers": {"type": "object", "properties": {
        "cents": {"type": "integer", "minimum": 0, "maximum": 100000},
        "qty": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["cents", "qty"]},
    "pattern_format": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, "id": {"type": "string", "format": "uuid"}},
        "required": ["code", "id"]},
    "refs": {"type": "object", "$defs": {"pt": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -10, "maximum": 10}, "y": {"type": "integer", "minimum": -10,
                                                                     "maximum": 10}}, "required": ["x", "y"]}},
        "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}}, "required": ["a", "b"]},
    "any_of": {"type": "object", "properties": {"value": {"anyOf": [
        {"enum": [1, 2, 3]}, {"type": "string", "maxLength": 5}, {"type": "boolean"}]}}, "required": ["value"]},
    "array_of_objects": {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"k": {"type": "string", "maxLength": 6}, "v": {"type": "boolean"}},
        "required": ["k", "v"]}}}, "required": ["items"]},
    "nullable": {"type": "object", "properties": {"flag": {"type": "boolean"},
                                                  "note": {"type": ["string", "null"], "maxLength": 8}},
                 "required": ["flag", "note"]},
}
BACKENDS = ["xgrammar", "outlines"]
# Integers are bounded (a 135M model at temperature 1 can write digits until max_new_tokens otherwise), so
# schemas with integers run on xgrammar only: outlines-core does not enforce minimum / maximum.


@pytest.fixture(scope="module")
def backends(smol_tokenizer):
    return {name: make_backend(name, smol_tokenizer, 49152, [2]) for name in BACKENDS}


def test_spec_builders_and_errors():
    assert ConstraintSpec.json_schema('{"type": "object"}') == ConstraintSpec.json_schema({"type": "object"})
    assert spec_from_response_format({"type": "json_object"}).kind == "json_object"
    assert spec_from_response_format({"type": "text"}) is None
    sp = {"regex": "[a-z]+", "temperature": 0}
    assert spec_from_sampling(sp).kind == "regex" and "regex" not in sp
    with pytest.raises(ValueError, match="regex"):
        ConstraintSpec.regex("(unclosed")
    with pytest.raises(ValueError, match="json_schema"):
        ConstraintSpec.json_schema("{not json")
    with pytest.raises(ValueError, match="only one"):
        spec_from_sampling({"regex": "a", "json_schema": {}})
    deep: dict = {"type": "object"}
    for _ in range(80):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(ValueError, match="nested deeper"):
        ConstraintSpec.json_schema(deep)
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("nope", None, 10, [0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_unenforced_keywords_are_rejected_not_ignored(backends, backend):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(ValueError, match="uniqueItems.*not enforced"):
        backends[backend].compile(ConstraintSpec.json_schema(schema))


@pytest.mark.parametrize("backend", BACKENDS)
def test_matcher_masks_specials_and_allows_eos_only_at_the_end(backends, smol_tokenizer, backend):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    grammar = backends[backend].compile(ConstraintSpec.json_schema(schema))
    m = grammar.matcher()
    doc = '{"name": "Ann", "age": 7}'
    ids = smol_tokenizer(doc, add_special_tokens=False)["input_ids"]
    bitmask = torch.zeros(1, 49152 // 32, dtype=torch.int32)
    for k, t in enumerate(ids):
        bitmask.fill_(-1)
        m.fill_bitmask(bitmask, 0)
        allowed = unpack_bitmask(bitmask, 49152)[0]
        assert allowed[t], f"valid token {t} masked at step {k}"
        assert not allowed[2], "EOS allowed inside the document"
        if k == 9:  # inside the "Ann" string: no control token may appear
            assert not allowed[:17].any()
        assert m.accept_token(t)
    bitmask.fill_(-1)
    m.fill_bitmask(bitmask, 0)
    assert unpack_bitmask(bitmask, 49152)[0][2]
    assert m.accept_token(2) and m.is_terminated()


@pytest.fixture(scope="module")
def engines(smol_model_default, smol_tokenizer):
    from radixlm.runtime.engine import Engine

    def make(**kw):
        return Engine.from_model(smol_model_default, smol_tokenizer, check_invariants=True, quantization="int4", **kw)

    return {"xgrammar": make(), "outlines": make(grammar_backend="outlines"),
            "no-jump-forward": make(jump_forward=False)}


def generate(engine, spec_kw, n, max_new_tokens=200, temperature=1.0, prompt=None):
    prompt = prompt or "Output a JSON object:"
    res = engine.generate(prompt, {"temperature": temperature, "max_new_tokens": max_new_tokens, "n": n, "seed": 1,
                                   **spec_kw})
    return res if isinstance(res, list) else [res]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_samples_validate(engines, backends, backend, name):
    try:
        backends[backend].compile(ConstraintSpec.json_schema(SCHEMAS[name]))
    except ValueError as e:
        pytest.skip(f"{backend} does not claim this schema: {e}")
    outs = generate(engines[backend], {"json_schema": json.dumps(SCHEMAS[name])}, n=24)
    checker = jsonschema.Draft202012Validator(SCHEMAS[name], format_checker=jsonschema.FormatChecker())
    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "stop", o
        checker.validate(json.loads(o["text"]))
    engines[backend].check_invariants()


REGEXES = {
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    "date": r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "enum": r"(cat|dog|bird|fish)",
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(REGEXES))
def test_regex_samples_full_match(engines, backend, name):
    outs = generate(engines[backend], {"regex": REGEXES[name]}, n=20, max_new_tokens=40,
                    prompt=f"Write a {name}:")
    for o in outs:
        assert re.fullmatch(REGEXES[name], o["text"]), o["text"]
        if name == "ipv4":
            ipaddress.ip_address(o["text"])


ARITH = """root ::= expr
expr ::= term (op term){0,3}
term ::= num | "(" num op num ")"
op ::= "+" | "-" | "*"
num ::= [1-9] [0-9]{0,2}
"""


@pytest.mark.slow
def test_ebnf_arithmetic_outputs_parse(engines):
    outs = generate(engines["xgrammar"], {"ebnf": ARITH}, n=20, max_new_tokens=60, prompt="A sum: ")
    for o in outs:
        assert re.fullmatch(r"[0-9+\-*() ]+", o["text"]), o["text"]
        assert isinstance(eval(o["text"], {"__builtins__": {}}), int)  # noqa: S307 - digits and operators only


@pytest.mark.slow
def test_choices_and_bad_grammars(engines):
    eng = engines["xgrammar"]
    outs = generate(eng, {"choices": ["yes", "no", "maybe"]}, n=10, max_new_tokens=5)
    assert all(o["text"] in ("yes", "no", "maybe") for o in outs)
    with pytest.raises(ValueError, match="ebnf"):
        generate(eng, {"ebnf": "root ::= undefined_rule"}, n=1)
    with pytest.raises(ValueError, match="regex"):
        generate(eng, {"regex": "(a"}, n=1)
    with pytest.raises(ValueError, match="json_schema"):
        generate(eng, {"json_schema": '{"type": "object", "properties": 5}'}, n=1)
    assert generate(eng, {}, n=1, max_new_tokens=3)[0]["output_ids"]
    eng.check_invariants()


@pytest.mark.slow
def test_jump_forward_saves_decode_steps_and_stays_valid(engines):
    schema = {"type": "object", "properties": {"first_name": {"type": "string", "maxLength": 8},
                                               "last_name": {"type": "string", "maxLength": 8},
                                               "employee_identifier": {"type": "integer", "minimum": 0,
                                                                       "maximum": 999}},
              "required": ["first_name", "last_name", "employee_identifier"]}
    sp = {"json_schema": json.dumps(schema)}
    steps = {}
    for jf, eng in ((False, engines["no-jump-forward"]), (True, engines["xgrammar"])):
        before = eng.scheduler.stats["decode_steps"]
        outs = generate(eng, sp, n=1, temperature=0, prompt="Employee record as JSON:")
        steps[jf] = eng.scheduler.stats["decode_steps"] - before
        jsonschema.validate(json.loads(outs[0]["text"]), schema)
        if jf:
            assert eng.scheduler.stats["jump_forward_tokens"] > 0
    print(f"decode steps without / with jump-forward: {steps[False]} / {steps[True]}")
    assert steps[True] < steps[False]


# the strings are bounded so that only the number could keep a sample open: a free string at temperature 1
# may ramble past max_new_tokens on some CPU's rounding, and that is not what the test is about
CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                         "country": {"type": "string", "maxLength": 20},
                                         "population_millions": {"type": "number"}},
        "required": ["name", "country", "population_millions"]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_numbers_have_bounded_digits(backends, smol_tokenizer, backend):
    """No more digits than a JSON number carries: 17 in the integer part pass, 18 do not."""
    grammar = backends[backend].compile(ConstraintSpec.json_schema(
        {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}))

    def accepts(doc: str) -> bool:
        m = grammar.matcher()
        return all(m.accept_token(t) for t in smol_tokenizer(doc, add_special_tokens=False)["input_ids"])

    assert accepts('{"n": ' + "1" * 17 + ".25}") and accepts('{"n": -0.5}')
    assert not accepts('{"n": ' + "1" * 18)
    assert not accepts('{"n": 1.' + "5" * 17)


@pytest.mark.parametrize("backend", BACKENDS)
def test_length_bounded_strings_are_json_strings(backends, smol_tokenizer, backend):
    """A string with maxLength admits JSON's escapes, each one character of the decoded string, and never a raw
    control character (xgrammar 0.2's own grammar admitted U+0003 and no escape: string_bounds.py)."""
    grammar = backends[backend].compile(ConstraintSpec.json_schema(
        {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}, "required": ["s"]}))

    def accepts(doc: str) -> bool:
        m = grammar.matcher()
        return all(m.accept_token(t) for t in smol_tokenizer(doc, add_special_tokens=False)["input_ids"])

    for doc in ('{"s": "abc"}', '{"s": "a\\nb"}', '{"s": "\\"\\\\\\/"}'):
        assert accepts(doc) and len(json.loads(doc)["s"]) <= 3, doc
    assert accepts('{"s": "\\u0003"}') == (backend == "xgrammar")  # outlines-core has no \u escape here
    for doc in ('{"s": "abcd"}', '{"s": "a\x03"}', '{"s": "\\n\\n\\n\\n"}'):
        assert not accepts(doc), doc


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_schema_with_a_float_closes(engines, backend, temperature):
    """The extraction call that used to run to max_tokens writing digits: now every sample closes."""
    outs = generate(engines[backend], {"json_schema": CITY}, n=4 if temperature else 1, max_new_tokens=120,
                    temperature=temperature, prompt="Paris, capital of France, has about 2.1 million people. JSON:")
    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "stop", o["text"]
        doc = json.loads(o["text"])
        assert set(doc) == set(CITY["required"]) and isinstance(doc["population_millions"], (int, float))
