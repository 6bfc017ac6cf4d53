"""The detokenizer process: token ids -> final text deltas, per request, in one loop."""

from __future__ import annotations

import logging
from collections import OrderedDict

import zmq

from radixlm.runtime.decode.text import IncrementalText, ids_to_text
from radixlm.runtime.ipc import IpcPaths, pull, push
from radixlm.runtime.messages import (
    Progress,
    Ready,
    Shutdown,
    TextBatch,
    TextUpdate,
    ToDetokenizer,
    TokenBatch,
    TokenUpdate,
    decoder,
    encode,
)
from radixlm.runtime.serve.process_utils import die_with_parent, parent_alive

MAX_STATES = 65536  # bound on live requests tracked; the oldest are dropped past it


class Detokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: OrderedDict[str, tuple[IncrementalText, list[int]]] = OrderedDict()

    def handle(self, batch: TokenBatch) -> TextBatch:
        return TextBatch([self._one(u) for u in batch.updates])

    def _one(self, u: TokenUpdate) -> TextUpdate:
        state = self.states.get(u.rid)
        if state is None:
            decode = ids_to_text(self.tokenizer, u.skip_special_tokens)
            state = self.states[u.rid] = (IncrementalText(decode, u.stop, u.no_stop_trim), [])
            while len(self.states) > MAX_STATES:
                self.states.popitem(last=False)
        text, ids = state
        ids.extend(u.new_ids)
        matched = (u.finish_reason or {}).get("matched")
        delta = text.delta(ids, u.finished, matched)
        if u.finished:
            del self.states[u.rid]
        progress = {f: getattr(u, f) for f in Progress.__struct_fields__}
        return TextUpdate(**progress, text=delta)


def run_detokenizer(model: str | None, paths: IpcPaths, parent_pid: int, log_level: str) -> None:
    """Entry point of the detokenizer process (spawned)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    die_with_parent()
    ctx = zmq.Context()
    ready = push(ctx, paths.ready)
    try:
        from radixlm.runtime.model.tokenizer_files import load_decoder

        detok = Detokenizer(load_decoder(model))
        recv, to_api = pull(ctx, paths.to_detokenizer), push(ctx, paths.to_api)
    except Exception as e:
        ready.send(encode(Ready("detokenizer", error=f"{type(e).__name__}: {e}")))
        return
    ready.send(encode(Ready("detokenizer")))
    dec = decoder(ToDetokenizer)
    try:
        while parent_alive(parent_pid):
            if not recv.poll(200):
                continue
            msg = dec.decode(recv.recv())
            if isinstance(msg, Shutdown):
                return
            to_api.send(encode(detok.handle(msg)))
    except KeyboardInterrupt:
        pass
