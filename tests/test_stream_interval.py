"""stream_interval: the scheduler process holds a running request's tokens back and sends them merged,
never delaying its first token or its end, and never losing or reordering a token."""

from __future__ import annotations

import types

import pytest

from radixlm.runtime.config import ServerConfig
from radixlm.runtime.messages import TokenUpdate
from radixlm.runtime.serve.scheduler_process import SchedulerProcess


def update(rid: str, token: int, done: int, finished: bool = False, **extra) -> TokenUpdate:
    return TokenUpdate(rid=rid, new_ids=[token], finished=finished, completion_tokens=done, **extra)


def test_tokens_are_held_merged_and_flushed_in_order():
    proc = types.SimpleNamespace(held={}, interval=3)
    due = SchedulerProcess._due
    sent: list[TokenUpdate] = []
    sent += due(proc, [update("a", 10, 1, queue_time=0.5), update("b", 20, 1)])  # first tokens: at once
    assert [u.rid for u in sent] == ["a", "b"]
    for step in range(2, 8):
        sent += due(proc, [update("a", 10 + step, step, output_logprobs=[[-0.1, 10 + step]])])
    # a: tokens 2..4 went as one update, 5..7 as another
    a = [u for u in sent if u.rid == "a"]
    assert [u.new_ids for u in a] == [[10], [12, 13, 14], [15, 16, 17]]
    assert [lp[1] for lp in a[1].output_logprobs] == [12, 13, 14]
    assert a[1].completion_tokens == 4
    sent += due(proc, [update("a", 18, 8, finished=True), update("b", 21, 2)])  # the end goes at once
    assert sent[-1].rid == "a" and sent[-1].new_ids == [18] and sent[-1].finished
    assert list(proc.held) == ["b"] and proc.held["b"].new_ids == [21]


def test_held_tokens_go_with_the_end():
    proc = types.SimpleNamespace(held={}, interval=8)
    SchedulerProcess._due(proc, [update("a", 1, 1)])
    assert SchedulerProcess._due(proc, [update("a", 2, 2)]) == []
    out = SchedulerProcess._due(proc, [update("a", 3, 3, finished=True)])
    assert out[0].new_ids == [2, 3] and out[0].finished and not proc.held


def test_stream_interval_must_be_positive():
    with pytest.raises(ValueError, match="stream_interval"):
        ServerConfig(stream_interval=0)
