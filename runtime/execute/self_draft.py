"""Self-speculation: the target's first layers draft, greedily."""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.runtime.batch import ForwardBatch, make_decode_batch
from radixlm.runtime.execute.sampler import argmax_rows
from radixlm.runtime.request import Req


class SelfDraftProposer:
    """The target's first ``num_layers`` layers plus its final norm and LM head, run greedily.

    Its KV for layers < num_layers goes to the slots the scheduler planned for the draft positions; the
    verify pass writes the very same layers' KV there again (same weights, same inputs), so no separate pool
    is needed and the accepted prefix's KV is always the target's own.
    """

    def __init__(self, forward: Callable[[ForwardBatch], torch.Tensor], num_layers: int) -> None:
        self.forward, self.num_layers = forward, num_layers

    def propose(self, reqs: list[Req], ks: list[int], locs: list[torch.Tensor]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in reqs]
        for j in range(max(ks, default=0)):
            live = [i for i, k in enumerate(ks) if k > j]
            inputs = [reqs[i].output_ids[-1] if j == 0 else drafts[i][-1] for i in live]
            batch = make_decode_batch([reqs[i] for i in live], [locs[i][j:j + 1] for i in live], inputs, offset=j,
                                      num_layers=self.num_layers)
            for i, t in zip(live, argmax_rows(self.forward(batch)).tolist(), strict=True):
                drafts[i].append(t)
        return drafts
