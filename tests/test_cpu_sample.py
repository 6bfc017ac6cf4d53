"""The C++ sampling kernels (cpu_sample.cpp, cpu_penalties.cpp) against their torch references (kernels/sampling.py)
on every path this CPU has: the same token for the same logits, settings and uniform; never a masked token; the
right distribution; penalties and bias bit for bit; logprobs within float32 rounding."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels.sampling import (
    RowPenalties,
    RowSettings,
    penalize_cpu,
    penalize_torch,
    row_logprobs_torch,
    sample_rows,
    sample_rows_cpu,
    sample_rows_torch,
)

from .test_cpu_kernels import PATH_PARAMS, built, isa

# (temperature, top_k, top_p, min_p) a row: plain, each filter, all three, greedy
SETTINGS = [(0.7, 0, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (1.0, 40, 1.0, 0.0), (0.8, 0, 1.0, 0.05), (1.3, 20, 0.8, 0.01),
            (0.0, 0, 1.0, 0.0)]


def rows_of(settings: list[tuple]) -> RowSettings:
    return RowSettings(*[list(col) for col in zip(*settings, strict=True)])


def draws(logits: torch.Tensor, settings: list[tuple], us: torch.Tensor, fn) -> torch.Tensor:
    """fn(logits, rows, u) for each column of us [R, N] -> tokens [R, N]."""
    rows = rows_of(settings)
    return torch.stack([fn(logits, rows, us[:, j].tolist()) for j in range(us.shape[1])], dim=1)


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("vocab", [49152, 1000, 37])  # 37: a tail past the last 16 columns
def test_sample_kernel_matches_its_reference(path, vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(len(SETTINGS), vocab, generator=gen) * 4
    us = torch.rand(len(SETTINGS), 40, generator=gen, dtype=torch.float64)
    us[:, 0] = 0.0  # the first column of weight (near 1 the reference's float32 running sums stop short of the
    # last columns of weight, the kernel's double sums do not: test_masked_tokens... takes u = 1 - 2^-53)
    want = draws(logits, SETTINGS, us, sample_rows_torch)
    got = draws(logits, SETTINGS, us, lambda x, r, u: sample_rows_cpu(x, r, u, isa(path)))
    assert torch.equal(got, want)
    assert len(set(got[1].tolist())) > 5  # the draws do differ with u


@built
def test_sample_kernel_is_the_same_on_every_path_and_for_any_batch():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(len(SETTINGS), 49152, generator=gen) * 3
    us = torch.rand(len(SETTINGS), 20, generator=gen, dtype=torch.float64)
    results = [draws(logits, SETTINGS, us, lambda x, r, u, p=p: sample_rows_cpu(x, r, u, isa(p)))
               for p in cpu_ext.supported()]
    for other in results[1:]:
        assert torch.equal(other, results[0])
    for i in range(len(SETTINGS)):  # a row alone draws what it draws in the batch
        alone = draws(logits[i:i + 1], SETTINGS[i:i + 1], us[i:i + 1], lambda x, r, u: sample_rows(x, r, u, 0))
        assert torch.equal(alone[0], results[0][i])


@built
def test_a_long_tail_lowers_the_candidate_cut():
    """One token far above 49,151 others whose weights are each below the first cut but together hold most of the
    mass: top_p 0.9 keeps ~80% of the tail, so the ranking must go past the first cut."""
    logits = torch.full((2, 49152), 10.0)
    logits[:, 5] = 20.0
    logits[:, 100:] += torch.linspace(0, 1, 49152 - 100)  # distinct weights (no ties to order), all below 2^-12
    settings = [(1.0, 0, 0.9, 0.0), (1.0, 0, 0.5, 0.0)]
    us = torch.rand(2, 30, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = draws(logits, settings, us, lambda x, r, u: sample_rows(x, r, u, 0))
    assert torch.equal(got, draws(logits, settings, us, sample_rows_torch))
    assert (got[0] != 5).any()


@built
def test_masked_tokens_are_never_drawn_and_degenerate_rows_take_the_argmax():
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(3))
    logits[0, :] = float("-inf")
    logits[0, [17, 512, 998]] = torch.tensor([0.5, 2.0, 1.0])  # a grammar's three allowed tokens
    logits[1, 40] = logits[1, 700] = float("nan")  # -> the first NaN
    logits[2, :] = float("-inf")  # nothing allowed -> column 0, as torch's argmax
    logits[3, 9] = float("inf")  # an infinite maximum -> its column
    us = torch.cat([torch.zeros(4, 1, dtype=torch.float64), torch.full((4, 1), 1 - 2**-53, dtype=torch.float64),
                    torch.rand(4, 300, dtype=torch.float64)], dim=1)
    for settings in ([(1.0, 0, 1.0, 0.0)] * 4, [(2.0, 0, 0.99, 0.0)] * 4):
        got = draws(logits, settings, us, lambda x, r, u: sample_rows(x, r, u, 0))
        assert set(got[0].tolist()) == {17, 512, 998}
        assert set(got[1].tolist()) == {40} and set(got[2].tolist()) == {0} and set(got[3].tolist()) == {9}


@built
def test_sample_kernel_draws_the_softmax_distribution():
    """Chi-square over 20,000 draws of a 6-token distribution at temperature 1 (df = 5): fail above 20.5, the
    0.1% critical value; top_k 2 then draws the top two in their ratio."""
    probs = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.04, 0.01], dtype=torch.float64)
    n = 20_000
    logits = probs.log().float().expand(n, -1).contiguous()
    u = torch.rand(n, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for top_k, want in ((0, probs), (2, torch.tensor([0.4, 0.25, 0, 0, 0, 0], dtype=torch.float64) / 0.65)):
        rows = rows_of([(1.0, top_k, 1.0, 0.0)] * n)
        counts = torch.bincount(sample_rows(logits, rows, u.tolist(), 0), minlength=6).double()
        nz = want > 0
        assert counts[~nz].sum() == 0
        chi2 = ((counts[nz] - want[nz] * n) ** 2 / (want[nz] * n)).sum().item()
        assert chi2 < 20.5, (top_k, counts)


@built
def test_sample_kernel_rejects_bad_inputs_with_a_message():
    logits, rows, u = torch.zeros(2, 64), rows_of([(1.0, 0, 1.0, 0.0)] * 2), [0.0, 0.0]
    with pytest.raises(RuntimeError, match="need one value per logits row \\(2\\), got 1"):
        sample_rows_cpu(logits, rows, u[:1])
    with pytest.raises(RuntimeError, match="row 1: temperature must be >= 0, u in \\[0, 1\\)"):
        sample_rows_cpu(logits, rows, [0.5, 1.0])
    with pytest.raises(RuntimeError, match="row 0: temperature"):
        sample_rows_cpu(logits, rows_of([(-1.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0)]), u)
    with pytest.raises(RuntimeError, match="logits must be float32"):
        sample_rows_cpu(logits.half(), rows, u)


@built
def test_penalties_kernel_gives_the_references_bits():
    """Bias, repetition over seen tokens (repeats, positive and negative logits, -inf), frequency and presence over
    output counts, each alone and together, and a row with none."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 1000, generator=gen) * 5
    logits[2, 7] = float("-inf")
    seen = [[3, 7, 7, 999, 500], [1, 2, 3], [7, 8, 9, 8], [], [4, 4, 4, 10], [0]]
    outs = [[7, 7, 500], [], [8, 8, 9], [5], [4, 4, 10, 4], []]
    pen = RowPenalties([1.3, 0.8, 1.1, 1.0, 1.2, 1.0], [0.0, 0.5, 0.0, 0.7, 0.3, 0.0], [0.0, 0.25, 0.0, 0.0, 1.5, 0.0],
                       seen, outs, [{}, {3: -2.5}, {9: 100.0, 0: -1e9}, {}, {4: 0.1}, {}])
    want, got = logits.clone(), logits.clone()
    penalize_torch(want, pen)
    penalize_cpu(got, pen)
    assert torch.equal(got, want)
    assert torch.equal(got[5], logits[5]) and not torch.equal(got[0], logits[0])
    extended = pen.extended([[1], [2], [3], [4], [5], [6]])
    assert extended.seen[0] == [3, 7, 7, 999, 500, 1] and extended.outputs[5] == [6]
    want, got = logits.clone(), logits.clone()
    penalize_torch(want, extended)
    penalize_cpu(got, extended)
    assert torch.equal(got, want)


@built
def test_penalties_kernel_rejects_tokens_outside_the_vocabulary():
    pen = RowPenalties([1.0], [0.0], [0.0], [[]], [[]], [{64: 1.0}])
    with pytest.raises(RuntimeError, match="bias: token 64 is outside the vocabulary of 64"):
        penalize_cpu(torch.zeros(1, 64), pen)


@built
@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("vocab", [49152, 300, 37])
def test_logprob_kernel_matches_its_reference(path, vocab):
    """Each row's log-softmax at its token and at its top n, against torch's: within a few float32 ulps, the top n
    the same columns (no ties in random logits), a -inf column -inf, the same on one row as in a batch."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen) * 5
    logits[1, 3] = float("-inf")
    tokens = [0, 3, vocab - 1, 7, 11]
    got = torch.ops.radixlm_cpu.logprob_rows(logits, vocab, tokens, 6, isa(path))
    want = row_logprobs_torch(logits, tokens, 6)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-5)
    assert got[0][1] == float("-inf")
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-5)
    for r in range(5):  # a row alone: the same bits
        alone = torch.ops.radixlm_cpu.logprob_rows(logits[r:r + 1].contiguous(), vocab, tokens[r:r + 1], 6, isa(path))
        assert all(torch.equal(a[0], b[r]) for a, b in zip(alone, got, strict=True))


@built
def test_logprob_kernel_ties_degenerate_rows_and_bad_inputs():
    logits = torch.zeros(3, 100)
    logits[0, [5, 50, 90]] = 2.0  # a tie: the lower column first, as ranks go everywhere in the sampler
    logits[1] = float("-inf")  # nothing to normalize: NaN, as torch's log_softmax gives
    logits[2, 40] = float("nan")
    chosen, ids, vals = torch.ops.radixlm_cpu.logprob_rows(logits, 100, [5, 0, 1], 4, 0)
    assert ids[0].tolist()[:3] == [5, 50, 90] and ids[0, 3] == 0  # then the first of the zeros
    assert vals[0, 0] == vals[0, 2] and chosen[0] == vals[0, 0]
    assert chosen[1].isnan() and chosen[2].isnan()
    rand = torch.randn(4, 49152, generator=torch.Generator().manual_seed(2)) * 4
    each = [torch.ops.radixlm_cpu.logprob_rows(rand, 49152, [1, 2, 3, 4], 5, isa(p)) for p in cpu_ext.supported()]
    assert all(torch.equal(a, b) for other in each[1:] for a, b in zip(other, each[0], strict=True))  # every path
    with pytest.raises(RuntimeError, match="token 100"):
        torch.ops.radixlm_cpu.logprob_rows(logits, 100, [0, 0, 100], 2, 0)
    with pytest.raises(RuntimeError, match="n must be"):
        torch.ops.radixlm_cpu.logprob_rows(logits, 100, [0, 0, 0], 101, 0)
    with pytest.raises(RuntimeError, match="one per logits row"):
        torch.ops.radixlm_cpu.logprob_rows(logits, 100, [0], 2, 0)
