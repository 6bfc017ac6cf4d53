"""Multi-turn chat with the context-manager role form."""

from _backend import default_backend

import radixlm.lang as sgl


@sgl.function
def chat(s, turns):
    for turn in turns:
        with s.user():
            s += turn
        with s.assistant():
            s += sgl.gen(max_tokens=40, temperature=0)


state = chat.run(turns=["Hi! Who are you?", "What can you do?", "Thanks!"], backend=default_backend())
for m in state.messages():
    print(f"{m['role']:>9}: {m['content']}")
