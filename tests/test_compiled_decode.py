"""The torch.compile'd CPU decode step (--enable-torch-compile) against the eager engine on a tiny random
Llama and on a small GGUF file laid out as Q4_K_M: the same greedy tokens for single requests, batches, a shared-prefix (cascade) group, and the
batches it leaves to the eager path; no graph compiled after startup; KV accounting intact."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
from torch._dynamo.utils import counters

from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.gguf_file import GGUFModel
from radixlm.runtime.model.loader import load_model, random_model

from .conftest import TINY

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(250) for _ in range(n)]


# float32 with torch's attention ops (the cascade group's bias included), on TINY (head dim 16); and a file laid
# out as llama.cpp's Q4_K_M (head dim 64: radixlm's C++ decode attention, and int4 / int6 / int5 matmuls, run
# inside the graph where the CPU has them; torch's ops where it has no radixlm kernels). Each pair compiles its
# graphs once per module.
KINDS = ("float32", "q4_k_m-gguf")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """(eager, compiled) engine pairs built so far in this module, by kind: a cold compile is most of this
    module's time, so each pair is built once whichever test asks first. ``folder`` holds the GGUF file."""
    return {"folder": tmp_path_factory.mktemp("compiled")}


def kind_model(built: dict, kind: str) -> tuple[Callable[[], torch.nn.Module], str]:
    """A maker of the kind's model (each engine gets its own) and the quantization it runs with."""
    if kind == "float32":
        return (lambda: random_model(TINY, seed=0)), "none"
    from .test_gguf_blocks import write_mixed_file

    path = str(built["folder"] / "mixed.gguf")
    write_mixed_file(path)
    files = GGUFModel(path)
    return (lambda: load_model(files, torch.float32, progress=False, quant_blocks=True)), "mixed"


def pair(built: dict, kind: str) -> tuple[Engine, Engine]:
    if kind not in built:
        model, quantization = kind_model(built, kind)

        def make(**extra) -> Engine:
            return Engine.from_model(model(), None, quantization=quantization, deterministic=False,
                                     max_total_tokens=4096, check_invariants=True, **extra)

        built[kind] = make(), make(enable_torch_compile=True, torch_compile_max_bs=4)
    return built[kind]


@pytest.fixture(scope="module", params=KINDS)
def engines(request, built):
    if request.param == "q4_k_m-gguf" and not cpu_ext.available():
        pytest.skip("radixlm's CPU kernels did not build (GGUF blocks run on them)")
    return pair(built, request.param)


def run_both(engines, prompts: list[list[int]]) -> tuple[list, list, int]:
    """Greedy outputs of the eager and compiled engines; how often the compiled step ran."""
    eager, compiled = engines
    calls = {"n": 0}
    step = compiled.runner.compiled.run

    def counted(batch):
        calls["n"] += 1
        return step(batch)

    compiled.runner.compiled.run = counted
    try:
        want = eager.generate(input_ids=prompts, sampling_params=GREEDY)
        got = compiled.generate(input_ids=prompts, sampling_params=GREEDY)
    finally:
        compiled.runner.compiled.run = step
    eager.check_invariants()
    compiled.check_invariants()
    return [r["output_ids"] for r in want], [r["output_ids"] for r in got], calls["n"]


def test_single_and_batched_requests_match_eager(engines):
    graphs = counters["stats"]["unique_graphs"]
    for prompts in ([ids(5, 0)], [ids(n, n) for n in (3, 40, 7)]):
        want, got, steps = run_both(engines, prompts)
        assert got == want
        assert steps >= GREEDY["max_new_tokens"] - 1  # every decode step after the first token was compiled
    assert counters["stats"]["unique_graphs"] == graphs  # the warm-up compiled every graph these batches need


def test_shared_prefix_group_matches_eager(engines):
    prefix = ids(64, 99)
    prompts = [prefix + ids(n, n) for n in (2, 9, 30)]
    engines[0].generate(input_ids=prefix, sampling_params={**GREEDY, "max_new_tokens": 1})
    engines[1].generate(input_ids=prefix, sampling_params={**GREEDY, "max_new_tokens": 1})
    graphs = counters["stats"]["unique_graphs"]
    want, got, steps = run_both(engines, prompts)
    assert got == want and steps >= GREEDY["max_new_tokens"] - 1
    assert counters["stats"]["unique_graphs"] == graphs


def test_batches_it_cannot_run_fall_back_to_eager(engines):
    """Two shared-prefix groups (torch's cascade attention takes one inside the graph; radixlm's C++ attention
    needs no groups, so with it the graph runs them) and more requests than torch_compile_max_bs."""
    two_groups = [p + ids(n, n) for p in (ids(48, 1), ids(48, 2)) for n in (3, 5)]
    too_many = [ids(n, n) for n in range(3, 9)]  # 6 requests > torch_compile_max_bs 4
    native = engines[1].runner.compiled.isa is not None
    for prompts, runs_compiled in ((two_groups, native), (too_many, False)):
        want, got, steps = run_both(engines, prompts)
        assert got == want and (steps > 0) == runs_compiled


def test_compiled_logits_match_eager_step(engines):
    """One decode step on the same KV: the compiled logits equal the eager ones (float32)."""
    _, compiled = engines
    out = compiled.generate(input_ids=[ids(20, 5), ids(33, 6)], sampling_params={**GREEDY, "max_new_tokens": 2})
    assert all(len(o["output_ids"]) == 2 for o in out)
    runner = compiled.runner
    captured = {}
    step = runner.compiled.run

    def both(batch):
        captured["compiled"] = step(batch)
        # the eager model over the same KV (it rewrites the same K/V into the same slots)
        captured["eager"] = runner.model(batch)
        return captured["compiled"]

    runner.compiled.run = both
    try:
        compiled.generate(input_ids=[ids(20, 7), ids(45, 8)], sampling_params={**GREEDY, "max_new_tokens": 2})
    finally:
        runner.compiled.run = step
    torch.testing.assert_close(captured["compiled"], captured["eager"], rtol=1e-4, atol=1e-4)


def test_config_errors():
    with pytest.raises(ValueError, match="enable_torch_compile compiles the CPU decode step"):
        Engine.from_model(random_model(TINY, seed=0), None, enable_torch_compile=True, device="cuda",
                          deterministic=False)
    with pytest.raises(ValueError, match="not batch-invariant.*--no-deterministic"):
        Engine.from_model(random_model(TINY, seed=0), None, enable_torch_compile=True)
    with pytest.raises(ValueError, match="torch_compile_max_bs must be >= 1"):
        Engine.from_model(random_model(TINY, seed=0), None, enable_torch_compile=True, torch_compile_max_bs=0)


def test_two_engines_run_their_own_models(built):
    """Graphs are cached per engine: another model in the same process (here seed 1, built as the float32 pair's
    compiled engine, so its graphs are the same code) gets its own, with its own weights."""
    engines = pair(built, "float32")
    other = Engine.from_model(random_model(TINY, seed=1), None, quantization="none", enable_torch_compile=True,
                              torch_compile_max_bs=4, max_total_tokens=4096, deterministic=False)
    reference = Engine.from_model(random_model(TINY, seed=1), None, max_total_tokens=1024, deterministic=False)
    prompts = [ids(9, 3), ids(17, 4)]
    got = [r["output_ids"] for r in other.generate(input_ids=prompts, sampling_params=GREEDY)]
    assert got == [r["output_ids"] for r in reference.generate(input_ids=prompts, sampling_params=GREEDY)]
    mine = [r["output_ids"] for r in engines[1].generate(input_ids=prompts, sampling_params=GREEDY)]
    assert mine == [r["output_ids"] for r in engines[0].generate(input_ids=prompts, sampling_params=GREEDY)]


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
def test_the_mixed_width_file_keeps_its_widths(built):
    """Every native matmul of the Q4_K_M-like file has a fake for tracing (int5 and int6 had none, and tracing
    failed): the compiled engine holds them as the eager one does, and the tests above compare their tokens."""
    eager, compiled = pair(built, "q4_k_m-gguf")
    for engine in (eager, compiled):
        qkv = engine.model.layers[0].self_attn.qkv_proj.quant
        assert (qkv.kind, qkv.tail.kind) == ("int4", "int6")
    assert compiled.runner.compiled is not None
