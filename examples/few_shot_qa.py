"""Few-shot QA: every question shares the examples through the radix cache."""

from _backend import default_backend

import radixlm.lang as sgl

EXAMPLES = "Q: What is the capital of Japan?\nA: Tokyo\nQ: What is the capital of Spain?\nA: Madrid\n"


@sgl.function
def qa(s, question):
    s += EXAMPLES + f"Q: {question}\nA:" + sgl.gen("answer", max_tokens=8, stop="\n", temperature=0)


states = qa.run_batch([{"question": f"What is the capital of {c}?"} for c in ("France", "Italy", "Peru")],
                      backend=default_backend())
for st in states:
    print(st["answer"].strip(), st.get_meta_info("answer")["cached_tokens"], "cached tokens")
