"""The in-process Engine: batched prompts, a shared prefix served from the radix cache, streaming.

    python examples/offline_generate.py
"""

from radixlm.runtime import Engine

engine = Engine()  # the embedded SmolLM2-135M-Instruct
system = "You are a terse assistant. Answer in one short sentence.\n\n"
questions = ["What is the capital of France?", "What color is the sky?", "How many legs does a spider have?"]
outs = engine.generate([system + q for q in questions], {"temperature": 0, "max_new_tokens": 24})
for q, o in zip(questions, outs, strict=True):
    print(f"{q} -> {o['text'].strip()!r} (cached prompt tokens: {o['meta_info']['cached_tokens']})")

print(engine.chat([{"role": "user", "content": "Say hello in French."}], {"max_new_tokens": 16})["text"])
for chunk in engine.generate("Once upon a time", {"max_new_tokens": 32, "temperature": 0.7, "seed": 1}, stream=True):
    print(chunk["text"], end="", flush=True)
print()
