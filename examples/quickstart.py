"""A two-turn chat program. `python examples/quickstart.py` (RADIXLM_URL=http://127.0.0.1:30000 for a server)."""

from _backend import default_backend

import radixlm.lang as sgl


@sgl.function
def multi_turn(s, question_1, question_2):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=48, temperature=0))
    s += sgl.user(question_2)
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=48, temperature=0))


sgl.set_default_backend(default_backend())
state = multi_turn.run(question_1="What is the capital of France?", question_2="And of Italy?")
for m in state.messages():
    print(f"{m['role']}: {m['content']}")
