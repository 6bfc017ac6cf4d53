"""Suffix decoding and adaptive speculation: the tables, the drafts, the namespaces they never cross, the pay
check, and exact output through the engine."""

from __future__ import annotations

import dataclasses

from radixlm.runtime.decode.speculative.policy import PayCheck
from radixlm.runtime.decode.speculative.proposers import SpecState
from radixlm.runtime.decode.speculative.suffix import NamespaceOutputs, SuffixProposer, SuffixTable, propose
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import random_model

from .conftest import TINY


def test_a_table_counts_what_followed_and_uncounts_it_exactly():
    t = SuffixTable(1, 3)
    seq = [5, 6, 7, 5, 6, 8, 5, 6, 7]
    t.add(seq)
    assert t.lookup([5, 6], 2) == {7: 2, 8: 1}
    assert t.lookup([9, 5, 6], 3) is None and t.lookup([7, 5, 6], 3) == {8: 1}
    t.add(seq, sign=-1)
    assert t.next == {}  # removing a sequence leaves nothing behind
    grown = SuffixTable(1, 3)  # grown in pieces, as a request decodes: the same counts
    grown.add(seq[:4])
    grown.add(seq, start=4)
    t.add(seq)
    assert grown.next == t.next


def test_drafts_follow_the_longest_known_context_while_it_is_clear():
    t = SuffixTable(1, 4)
    t.add([1, 2, 3, 4, 5, 1, 2, 3, 4, 9])
    # after [1, 2, 3] comes 4 twice; after 4 it is 5 or 9 (half each): the draft stops there at min_share 0.6
    assert propose([7, 1, 2, 3], [t], 8, 0.6, 4, 1) == [4]
    assert propose([7, 1, 2, 3], [t], 8, 0.5, 4, 1)[:2] == [4, 5]  # a tie goes to the smaller token id
    assert propose([7, 1, 2, 3], [t], 0, 0.5, 4, 1) == []
    assert propose([8, 8], [t], 4, 0.5, 4, 1) == []  # nothing known: no draft


def test_namespace_outputs_are_bounded_and_never_shared():
    outs = NamespaceOutputs(1, 2, max_tokens=8, max_namespaces=2)
    outs.add("a", [1, 2, 3, 4])
    outs.add("b", [9, 9, 9])
    assert outs.table("a").lookup([2], 1) == {3: 1} and outs.table("b").lookup([2], 1) is None
    outs.add("a", [5, 6, 7, 8, 1, 2])  # 10 tokens > 8: the oldest output is uncounted
    assert outs.table("a").lookup([2, 3], 2) is None and outs.table("a").lookup([8, 1], 2) == {2: 1}
    outs.add("c", [1, 1])  # a third namespace: the least recently used one ("b") goes
    assert outs.table("b") is None and outs.table("a") is not None


@dataclasses.dataclass
class FakeReq:
    fill_ids: list[int]
    namespace: str | None
    output_ids: list[int] = dataclasses.field(default_factory=list)


def test_a_request_drafts_from_its_own_namespace_only():
    p = SuffixProposer(1, 3, 0.5, 1024)
    p.finished(FakeReq([], "tenant-a", output_ids=[40, 41, 42, 43, 44]))
    mine, theirs = FakeReq([1, 40, 41], "tenant-a"), FakeReq([1, 40, 41], "tenant-b")
    drafts = p.propose([mine, theirs], [3, 3], [SpecState(), SpecState()])
    assert drafts == [[42, 43, 44], []]  # tenant b never sees tenant a's output


def test_the_pay_check_runs_the_faster_and_probes_the_other():
    pay = PayCheck(probe_every=4)
    assert pay.speculate(1)  # nothing measured: speculation first
    pay.observe("verify", 1, 50, 1.0)
    assert not pay.speculate(1)  # then plain decoding, to compare
    pay.observe("decode", 1, 60, 1.0)
    choices = [pay.speculate(1) for _ in range(8)]
    assert choices.count(True) == 2  # slower: only every 4th step probes it
    pay.observe("verify", 1, 62, 1.0)  # (50 + 62) / 2 = 56: faster, but not by the margin (1.1x)
    assert sum(pay.speculate(1) for _ in range(8)) == 2
    pay.observe("verify", 1, 300, 1.0)
    assert pay.speculate(2)  # an unmeasured size class follows the nearest measured one (here: faster)
    runs = [pay.speculate(1) for _ in range(32)]  # 178 against 60: far faster, plain probed every 16th step
    assert runs.count(False) == 2


def test_suffix_speculation_keeps_the_plain_tokens_and_turns_itself_off():
    """A random-weight model: drafts from its own repetitive output are rarely right, so speculation must not
    change a token, and the pay check or the cooldown stops it."""
    model = random_model(dataclasses.replace(TINY, max_position_embeddings=512), seed=1)
    plain = Engine.from_model(model, max_total_tokens=2048)
    spec = Engine.from_model(model, max_total_tokens=2048, check_invariants=True, speculative_algorithm="suffix",
                             speculative_ngram_min=1)
    prompts = [[(3 * j + i) % 50 for j in range(20)] for i in range(4)]
    sp = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    for _ in range(2):  # the second round drafts from the first round's outputs, too
        want = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=sp)]
        got = [o["output_ids"] for o in spec.generate(input_ids=prompts, sampling_params=sp)]
        assert got == want
    st = spec.scheduler.speculation.stats
    assert st["spec_verify_steps"] > 0
    assert spec.scheduler.speculation.suffix.outputs.table(None) is not None
    assert spec.cache.check([]) is None


def test_tenants_draft_only_from_their_own_outputs():
    """Two namespaces (two API keys' tenants): a finished output is counted in its own namespace's table only,
    and the other namespace's request leaves that table as it was."""
    import msgspec

    model = random_model(dataclasses.replace(TINY, max_position_embeddings=512), seed=2)
    e = Engine.from_model(model, max_total_tokens=2048, speculative_algorithm="suffix", speculative_adaptive=False,
                          disable_radix_cache=True)
    prompt = [(5 * j) % 40 for j in range(16)]
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}

    def run(namespace: str) -> list[int]:
        msgs = [msgspec.structs.replace(m, namespace=namespace) for m in e.build(input_ids=prompt, sampling_params=sp)]
        (req,) = e.submit(msgs)
        while req.finished is None:
            e.core.step()
        return req.output_ids

    outputs = e.scheduler.speculation.suffix.outputs
    a = run("tenant-a")
    assert outputs.table("tenant-a") is not None and outputs.table("tenant-b") is None
    counted = {k: dict(v) for k, v in outputs.table("tenant-a").next.items()}
    b = run("tenant-b")
    assert a == b  # the same model and prompt: the same tokens, whatever was drafted
    assert {k: dict(v) for k, v in outputs.table("tenant-a").next.items()} == counted  # b's output went to b's
    assert outputs.table("tenant-b") is not None
