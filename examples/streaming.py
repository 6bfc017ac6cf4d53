"""Stream a program's text as it is generated."""

from _backend import default_backend

import radixlm.lang as sgl


@sgl.function
def poem(s, topic):
    s += sgl.user(f"Write a short poem about {topic}.")
    s += sgl.assistant(sgl.gen("poem", max_tokens=64, temperature=0.7))


state = poem.run(topic="the sea", stream=True, backend=default_backend())
for chunk in state.text_iter("poem"):
    print(chunk, end="", flush=True)
print()
