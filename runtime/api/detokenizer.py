"""Token ids -> final text deltas, per request, in the API process as each scheduler update arrives.

It ran as a process of its own. On two cores that process's wake-ups, its ZeroMQ I/O thread and a second
encode and decode of every update took, for each streamed token, the core that the forward pass's second
thread needs (bench_stream_cpu.py measures the API process's CPU per streamed token)."""

from __future__ import annotations

from collections import OrderedDict

from radixlm.runtime.decode.text import IncrementalText, ids_to_text
from radixlm.runtime.messages import Progress, TextUpdate, TokenUpdate

MAX_STATES = 65536  # bound on live requests tracked; the oldest are dropped past it


class Detokenizer:
    """Holds an IncrementalText per unfinished request; a request's state goes with its finishing update."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: OrderedDict[str, tuple[IncrementalText, list[int]]] = OrderedDict()

    def text_update(self, u: TokenUpdate) -> TextUpdate:
        state = self.states.get(u.rid)
        if state is None:
            decode = ids_to_text(self.tokenizer, u.skip_special_tokens)
            state = self.states[u.rid] = (IncrementalText(decode, u.stop, u.no_stop_trim), [])
            while len(self.states) > MAX_STATES:
                self.states.popitem(last=False)
        text, ids = state
        ids.extend(u.new_ids)
        matched = (u.finish_reason or {}).get("matched")
        try:
            delta = text.delta(ids, u.finished, matched)
        finally:
            if u.finished:
                del self.states[u.rid]
        progress = {f: getattr(u, f) for f in Progress.__struct_fields__}
        return TextUpdate(**progress, text=delta)
