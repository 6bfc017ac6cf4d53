"""A tool-using agent loop: the model picks a tool (constrained), the program runs it, the result goes back."""

from _backend import default_backend

import radixlm.lang as sgl

TOOLS = {"add": lambda a, b: a + b, "multiply": lambda a, b: a * b}


@sgl.function
def agent(s, task):
    s += sgl.system("Solve the task with tools. Answer with the tool name and two integers.")
    s += sgl.user(task)
    for step in range(2):
        with s.assistant():
            s += "Tool: " + sgl.select(f"tool_{step}", list(TOOLS)) + "\nA: " + sgl.gen_int(f"a_{step}")
            s += "\nB: " + sgl.gen_int(f"b_{step}")
        result = TOOLS[s[f"tool_{step}"]](int(s[f"a_{step}"]), int(s[f"b_{step}"]))
        s += sgl.user(f"Result: {result}. Continue or stop.")


st = agent.run(task="What is (2 + 3) * 4?", backend=default_backend())
print(st.text())
