"""The sampler's draw: the right distribution, never a zero-probability token, a row's token its own."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels.sampling import draw as draw_with
from radixlm.kernels.sampling import filter_probs
from radixlm.runtime.execute.sampler import choose_tokens
from radixlm.runtime.messages import SamplingParams

PROBS = torch.tensor([0.4, 0.0, 0.25, 0.2, 0.0, 0.1, 0.05, 0.0])


def seeded(seed: int) -> SimpleNamespace:
    """What draw reads of a request: its own generator."""
    return SimpleNamespace(generator=torch.Generator().manual_seed(seed))


def draw(weights: torch.Tensor, reqs: list) -> torch.Tensor:
    """kernels.sampling.draw with each request's next uniform, as the sampler takes it."""
    return draw_with(weights, torch.cat([torch.rand(1, generator=r.generator, dtype=torch.float64) for r in reqs]))


def test_draws_follow_the_distribution_and_skip_zeros():
    """Chi-square goodness of fit, 20,000 draws over the 5 tokens of non-zero probability (df = 4): fail above
    18.5, the 0.1% critical value. Seeds are fixed, so the run is reproducible."""
    n = 20_000
    reqs = [seeded(s) for s in range(n)]
    tokens = draw((PROBS * 3.0).expand(n, -1), reqs)  # unnormalized rows sample the same distribution
    counts = torch.bincount(tokens, minlength=len(PROBS)).double()
    assert counts[PROBS == 0].sum() == 0
    expected = PROBS.double() * n
    nz = PROBS > 0
    chi2 = ((counts[nz] - expected[nz]) ** 2 / expected[nz]).sum().item()
    assert chi2 < 18.5, f"chi2 {chi2:.1f}: {counts.tolist()}"


def test_a_rows_token_depends_on_its_generator_not_the_batch():
    rows = torch.softmax(torch.randn(6, 49152, generator=torch.Generator().manual_seed(0)) * 4, dim=-1)
    together = draw(rows, [seeded(s) for s in range(6)]).tolist()
    alone = [draw(rows[i:i + 1], [seeded(i)]).item() for i in range(6)]
    assert together == alone
    assert draw(rows[2:3], [seeded(2)]).item() == together[2]


def test_a_sparse_row_draws_only_its_allowed_tokens():
    """A grammar-masked row: a few allowed tokens among 49,152, the last far from the end of the vocabulary."""
    row = torch.zeros(1, 49152)
    row[0, [5, 700, 31000]] = torch.tensor([0.3, 0.3, 0.4])
    req = seeded(0)
    hits = {draw(row, [req]).item() for _ in range(2000)}
    assert hits == {5, 700, 31000}
    assert draw(torch.zeros(1, 49152), [req]).item() < 49152  # a degenerate row still gives a valid index


def sorted_reference(probs, top_k, top_p, min_p):
    """The filters over a full descending sort of each row."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[1]).unsqueeze(0)
    keep = (rank < top_k.unsqueeze(1)) | (top_k.unsqueeze(1) <= 0)
    keep &= (sorted_p.cumsum(dim=-1) - sorted_p) < top_p.unsqueeze(1)
    keep &= sorted_p >= min_p.unsqueeze(1) * sorted_p[:, :1]
    keep[:, 0] = True
    return torch.zeros_like(probs).scatter_(1, idx, sorted_p * keep)


def as_vocab(weights: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """The filter's ranked candidates [B, k] back in vocabulary order [B, V]."""
    return torch.zeros(weights.shape[0], vocab).scatter_(1, ids, weights)


def test_filters_rank_only_the_top_candidates_and_match_a_full_sort():
    """Sharp rows cut within 256 candidates; flat ones (scale 0.1) with top_p 0.99 need all 49,152. A row's
    weights and its draw are the same alone as in a batch that needed more candidates."""
    gen = torch.Generator().manual_seed(0)
    settings = [(0, 0.9, 0.0), (40, 1.0, 0.0), (0, 1.0, 0.05), (5000, 0.99, 0.0), (0, 0.99, 0.0), (1, 1.0, 0.0)]
    for scale in (4.0, 0.1):
        probs = torch.softmax(torch.randn(len(settings), 49152, generator=gen) * scale, dim=-1)
        top_k = torch.tensor([s[0] for s in settings])
        top_p = torch.tensor([s[1] for s in settings])
        min_p = torch.tensor([s[2] for s in settings])
        weights, ids = filter_probs(probs, top_k, top_p, min_p)
        got = as_vocab(weights, ids, 49152)
        assert torch.equal(got, sorted_reference(probs, top_k, top_p, min_p))
        picks = ids.gather(1, draw(weights, [seeded(i) for i in range(len(settings))]).unsqueeze(1)).squeeze(1)
        for i in range(len(settings)):
            w, j = filter_probs(probs[i:i + 1], top_k[i:i + 1], top_p[i:i + 1], min_p[i:i + 1])
            assert torch.equal(as_vocab(w, j, 49152), got[i:i + 1])
            assert j[0, draw(w, [seeded(i)])].item() == picks[i].item()


def test_filtered_and_plain_rows_draw_the_same_tokens_alone_and_together():
    """A seeded row's token never depends on its batch: one with top_p beside one with temperature only (which
    draws over V in vocabulary order, never through the filter's ranking) and one with top_k."""
    logits = torch.randn(3, 49152, generator=torch.Generator().manual_seed(1)) * 3
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.7, top_p=0.9),
              SamplingParams(temperature=1.0, top_k=40)]

    def reqs(rows):
        return [SimpleNamespace(params=params[i], generator=torch.Generator().manual_seed(10 + i)) for i in rows]

    paths = [None] + ([0] if cpu_ext.available() else [])  # torch's ops, the C++ kernel
    for _ in range(20):
        for isa in paths:
            together = choose_tokens(logits.clone(), reqs(range(3)), isa).tolist()
            alone = [choose_tokens(logits[i:i + 1].clone(), reqs([i]), isa).item() for i in range(3)]
            assert together == alone
        logits = logits.roll(1000, dims=1)
