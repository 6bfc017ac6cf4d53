"""Incremental detokenization (IncrementalText.delta decodes a window, not the whole output every step): the
deltas of any id sequence, fed in any pieces, add up to the whole sequence's decode, for the embedded
byte-level tokenizer and for a Metaspace (sentencepiece-style, leading-space) one; and a step decodes a
window, so a long stream costs linear, not quadratic, work."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.decode.text import IncrementalText

TEXTS = ["Hello, world! How are you?", "naïve café — 東京タワー 🎉🎉 emoji👩‍👩‍👧 end", "  two  spaces\n\nand\ttabs ",
         "{\"name\": \"value\", \"n\": [1, 2, 3]}", "Ελληνικά, русский, עברית, हिन्दी"]


def feed(inc: IncrementalText, ids: list[int], cuts: list[int]) -> str:
    """The deltas of ``ids`` fed up to each cut, then whole and finished."""
    out = ""
    for b in sorted({c for c in cuts if 0 < c < len(ids)}):
        out += inc.delta(ids[:b], False)
    return out + inc.delta(ids, True)


@pytest.fixture(scope="module")
def decode(smol_tokenizer):
    return lambda ids: smol_tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_equals_whole_decode(smol_tokenizer, decode, text):
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    inc = IncrementalText(decode, [])
    pieces = [inc.delta(ids[:i], i == len(ids)) for i in range(1, len(ids) + 1)]
    assert "".join(pieces) == decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)  # a character cut between tokens is held back, never sent


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60))
def test_random_ids_in_random_pieces(smol_tokenizer, decode, seed, n):
    rng = random.Random(seed)
    vocab = len(smol_tokenizer)
    # byte tokens (multi-byte characters split across ids) and ordinary ones, special tokens included
    ids = [rng.randrange(vocab) if rng.random() < 0.7 else rng.randrange(256) for _ in range(n)]
    cuts = [rng.randrange(n + 1) for _ in range(rng.randrange(n + 1))]
    assert feed(IncrementalText(decode, []), ids, cuts) == decode(ids)


def test_metaspace_tokenizer_keeps_leading_spaces():
    from tokenizers import Tokenizer, decoders, models

    words = ["▁Hello", "▁world", "▁again", "!", "▁", "x", "<0xE6>", "<0x9D>", "<0xB1>"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="x"))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])

    def dec(ids):
        return tok.decode(ids)

    ids = [0, 1, 3, 2, 6, 7, 8, 4, 5, 1]  # Hello world! again 東 x world (東 as three byte tokens)
    for step in (1, 2, 3):
        inc = IncrementalText(dec, [])
        out = "".join(inc.delta(ids[:i], i == len(ids)) for i in range(step, len(ids) + 1, step))
        out += inc.delta(ids, True)
        assert out == dec(ids) == "Hello world! again東 x world"


def test_stop_string_cut_and_held_back(decode, smol_tokenizer):
    ids = smol_tokenizer.encode("The answer is 42. END of story", add_special_tokens=False)
    last = next(i for i in range(1, len(ids) + 1) if "END" in decode(ids[:i]))  # where the scheduler stops
    inc = IncrementalText(decode, ["END", "42!"])
    out = [inc.delta(ids[:i], False) for i in range(1, last)]
    held = next(i for i in range(1, last) if decode(ids[:i]).endswith("42"))
    assert "".join(out[:held]).endswith("is ")  # "42" may start "42!": held back until the next token
    assert "".join(out) + inc.delta(ids[:last], True, "END") == "The answer is 42. "


def test_a_step_decodes_a_window_not_the_whole_output(decode, smol_tokenizer):
    ids = smol_tokenizer.encode("word " * 400, add_special_tokens=False)
    lengths: list[int] = []

    def counting(window):
        lengths.append(len(window))
        return decode(window)

    inc = IncrementalText(counting, [])
    text = "".join(inc.delta(ids[:i], i == len(ids)) for i in range(1, len(ids) + 1))
    assert text == decode(ids)
    assert max(lengths[2:]) <= 4  # each step: the last ids taken and the new one


@pytest.mark.parametrize("skip", [True, False])
def test_backend_decode_equals_the_tokenizers_decode(smol_tokenizer, skip):
    """The detokenizer decodes in the Rust backend when the tokenizer cleans up no spaces: the same text as
    ``tokenizer.decode`` for random ids (special and byte tokens included)."""
    from radixlm.runtime.decode.text import ids_to_text

    fast = ids_to_text(smol_tokenizer, skip)
    assert fast.func == smol_tokenizer.backend_tokenizer.decode
    rng = random.Random(7)
    for _ in range(500):
        ids = [rng.randrange(len(smol_tokenizer)) for _ in range(rng.randrange(0, 10))] + [0, 1, 2][: rng.randrange(4)]
        assert fast(ids) == smol_tokenizer.decode(ids, skip_special_tokens=skip)


def test_a_tokenizer_that_cleans_up_spaces_keeps_its_own_decode(smol_tokenizer):
    from radixlm.runtime.decode.text import ids_to_text

    class CleaningUp:
        clean_up_tokenization_spaces = True
        backend_tokenizer = smol_tokenizer.backend_tokenizer

        def decode(self, ids, skip_special_tokens):
            return "cleaned"

    assert ids_to_text(CleaningUp(), True)([1, 2]) == "cleaned"


@pytest.mark.parametrize("skip", [True, False])
def test_the_light_rust_tokenizer_decodes_as_transformers(smol_tokenizer, skip):
    """light_tokenizer gives the scheduler the cached Rust tokenizer alone (smol_tokenizer's load wrote the
    cache and its mark): the same text as transformers' decode for random ids, special tokens included."""
    from tokenizers import Tokenizer

    from radixlm.runtime.decode.text import ids_to_text
    from radixlm.runtime.model.sources import resolve_model
    from radixlm.runtime.model.tokenizer_files import light_tokenizer

    decoder, _ = light_tokenizer(resolve_model(None))
    assert isinstance(decoder, Tokenizer)
    fast = ids_to_text(decoder, skip)
    rng = random.Random(11)
    for _ in range(300):
        ids = [rng.randrange(len(smol_tokenizer)) for _ in range(rng.randrange(0, 10))] + [0, 1, 2][: rng.randrange(4)]
        assert fast(ids) == smol_tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("mark", ['{"backend_decode": false}', "not json", None])
def test_without_a_yes_mark_there_is_no_light_tokenizer(smol_tokenizer, tmp_path, monkeypatch, mark):
    """A cache whose mark says transformers' decode differs (spaces cleaned up), is unreadable or missing
    (a cache from before the mark, or the first load, which wrote none yet) gives no Rust tokenizer alone:
    the scheduler keeps transformers' tokenizer."""
    import pathlib
    import shutil

    from tokenizers import Tokenizer

    from radixlm.runtime.model import tokenizer_files
    from radixlm.runtime.model.sources import resolve_model

    source = resolve_model(None)
    real = tokenizer_files._cached_folder(source)
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    copy = tokenizer_files._cached_folder(source)
    shutil.copytree(real, copy)
    marked = pathlib.Path(copy) / tokenizer_files.DECODE_MARK
    marked.unlink()
    if mark is not None:
        marked.write_text(mark)
    assert tokenizer_files.light_tokenizer(source) is None
    marked.write_text('{"backend_decode": true}')  # the same cache with a yes mark: the Rust tokenizer alone
    assert isinstance(tokenizer_files.light_tokenizer(source)[0], Tokenizer)


def test_the_api_detokenizes_each_update_and_a_failing_request_fails_alone(smol_tokenizer, tmp_path):
    """The scheduler's TokenBatch reaches the API, which detokenizes it: each request's streamed texts add up to
    its decode, and its state goes with its last update. A request whose text cannot be decoded gets a 500 on
    its own stream while the other request in the same batch goes on."""
    from radixlm.runtime.api.metrics import Metrics
    from radixlm.runtime.api.scheduler_client import ReqState, SchedulerClient
    from radixlm.runtime.ipc import IpcPaths
    from radixlm.runtime.messages import ReqError, TokenBatch, TokenUpdate

    ids = smol_tokenizer("naïve café 🎉 end", add_special_tokens=False)["input_ids"]
    client = SchedulerClient(smol_tokenizer, IpcPaths(str(tmp_path)), Metrics("test"))
    client.states.update({"ok": ReqState(), "bad": ReqState()})
    real = client.detokenizer.text_update

    def text_update(u: TokenUpdate):  # the real decode for "ok", a broken one for "bad"
        if u.rid == "bad":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "test: a broken decode")
        return real(u)

    client.detokenizer.text_update = text_update
    try:
        for i, tok in enumerate(ids):
            client._on_message(TokenBatch([TokenUpdate(rid, [tok], finished=i == len(ids) - 1) for rid in ("ok", "bad")]))
        ok = client.states["ok"].queue
        assert "".join(ok.get_nowait().text for _ in range(ok.qsize())) == smol_tokenizer.decode(ids)
        assert "ok" not in client.detokenizer.states
        err = client.states["bad"].queue.get_nowait()
        assert isinstance(err, ReqError) and err.status == 500 and "detokenizing failed" in err.message
    finally:
        client.recv.close(linger=0)  # a socket of a shadow context: the asyncio context's destroy does not see it
        client.ctx.destroy(linger=0)
