"""select: pick among choices by their likelihood (three choice methods)."""

from _backend import default_backend

import radixlm.lang as sgl


@sgl.function
def classify(s, review, method):
    s += f"Review: {review}\nSentiment:" + sgl.select("label", [" positive", " negative", " neutral"],
                                                        choices_method=method)


backend = default_backend()
for method in ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized"):
    st = classify.run(review="The food was wonderful and the staff were kind.", method=method, backend=backend)
    print(f"{method}: {st['label'].strip()}  scores={st.get_meta_info('label')['scores']}")
