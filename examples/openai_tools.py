"""A tool loop with the official openai client, then the same call through the Responses API.

    radixlm serve &            # http://127.0.0.1:30000
    python examples/openai_tools.py

The calls are grammar-enforced: whatever the model writes, each call's arguments validate against its
function's schema. The second turn reuses the first from the radix cache (see usage.cached_tokens).
"""

import json

import openai

client = openai.OpenAI(base_url="http://127.0.0.1:30000/v1", api_key="none")
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"]}}}]
messages = [{"role": "user", "content": "What's the weather in Oslo for the next 3 days?"}]

first = client.chat.completions.create(model="default", messages=messages, tools=tools, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=80, temperature=0)
call = first.choices[0].message.tool_calls[0]
print("call:", call.function.name, json.loads(call.function.arguments))

messages += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny", "high_c": 4})}]
answer = client.chat.completions.create(model="default", messages=messages, tools=tools, max_tokens=60, temperature=0)
print("answer:", answer.choices[0].message.content)
print("cached:", answer.usage.prompt_tokens_details.cached_tokens, "of", answer.usage.prompt_tokens, "prompt tokens")

with client.responses.stream(model="default", input="Weather in Lima for 2 days?", tool_choice="required",
                             tools=[{"type": "function", **tools[0]["function"]}], max_output_tokens=80,
                             parallel_tool_calls=False, temperature=0) as stream:
    for event in stream:
        if event.type == "response.function_call_arguments.delta":
            print(event.delta, end="", flush=True)
    print("\nresponses:", [(o.type, getattr(o, "name", None)) for o in stream.get_final_response().output])
