"""Tree-of-thought: fork candidate ideas, fork again to judge each, join."""

from _backend import default_backend

import radixlm.lang as sgl


@sgl.function
def tree_of_thought(s, question):
    s += f"Question: {question}\n"
    ideas = s.fork(3)
    ideas += lambda i: f"Approach {i + 1}: " + sgl.gen("idea", max_tokens=24, temperature=0.8, seed=i)
    for idea in ideas:
        judges = idea.fork(2)
        judges += "\nIs this approach sound (yes or no)? " + sgl.select("verdict", ["yes", "no"])
        judges.join()
    ideas.join()
    s += "\nFinal answer:" + sgl.gen("answer", max_tokens=32, temperature=0)


st = tree_of_thought.run(question="How can a city reduce traffic?", backend=default_backend())
print(st["idea"], st["answer"], sep="\n")
