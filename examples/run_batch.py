"""run_batch with a progress bar: 16 programs sharing a prefix, cached once."""

from _backend import default_backend

import radixlm.lang as sgl


@sgl.function
def capital(s, country):
    s += "Answer with one word.\n" + f"The capital of {country} is" + sgl.gen("city", max_tokens=4, stop="\n")


countries = ["France", "Spain", "Italy", "Germany", "Japan", "Chile", "Kenya", "Canada"] * 2
states = capital.run_batch([{"country": c} for c in countries], backend=default_backend(), progress_bar=True,
                           temperature=0)
print([s["city"].strip() for s in states])
