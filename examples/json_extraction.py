"""Extract fields from a document into a JSON schema."""

import json

from _backend import default_backend

import radixlm.lang as sgl

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                           "city": {"type": "string", "maxLength": 20}},
          "required": ["name", "age", "city"]}


@sgl.function
def extract(s, document):
    s += sgl.user(f"Extract the person from: {document}\nAnswer in JSON.")
    s += sgl.assistant(sgl.gen("person", json_schema=json.dumps(SCHEMA), max_tokens=64, temperature=0))


st = extract.run(document="Ana Ruiz, 41, moved to Lisbon last year.", backend=default_backend())
print(json.loads(st["person"]))
