"""Talk to a running `radixlm serve` with the official openai client.

    radixlm serve &            # http://127.0.0.1:30000
    python examples/openai_client.py
"""

import openai

client = openai.OpenAI(base_url="http://127.0.0.1:30000/v1", api_key="none")
reply = client.chat.completions.create(
    model="default", messages=[{"role": "user", "content": "Give me three fruit names."}], max_tokens=32, temperature=0)
print(reply.choices[0].message.content, reply.usage)
for chunk in client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Count to five."}],
                                            max_tokens=32, stream=True):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
