"""sampled_ranks_from_scorer: the scorer loop equals the score-matrix path on the same draws, scores only
what it draws, within max_pairs per call, reports its cost, and refuses a misbehaving scorer by name."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

import reco_sampled_plugin as rsp
from reco_sampled_plugin import SamplingDesign, adaptive_sampled_ranks, sampled_ranks, sampled_ranks_from_scorer


class MatrixScorer:
    """A scorer reading a materialised (B, n) matrix by user id; records every call's shape."""

    def __init__(self, scores: torch.Tensor, user_rows: torch.Tensor | None = None) -> None:
        self.scores, self.user_rows, self.shapes = scores, user_rows, []

    def __call__(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(items.shape))
        rows = users if self.user_rows is None else self.user_rows[users]
        return self.scores[rows.unsqueeze(1).expand_as(items), items]


def _data(b=40, n=200, p=3, e=20, seed=0, decimals=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g).round(decimals=decimals)  # many ties
    picks = torch.stack([torch.randperm(n, generator=g)[: p + e] for _ in range(b)])
    pos, exc = picks[:, :p].clone(), picks[:, p:].contiguous()
    pos[::4, p - 1] = -1  # padded slots
    if b > 2:
        pos[1] = -1  # a row without a positive
    return scores.to(device), pos.to(device), exc.to(device)


def _same(a, b):
    assert torch.equal(a.ranks, b.ranks)
    assert torch.equal(a.n_candidates, b.n_candidates)
    if a.negatives is None:
        assert b.negatives is None
    else:
        assert torch.equal(a.negatives, b.negatives)
    if a.n_samples is None:
        assert b.n_samples is None
    else:
        assert torch.equal(a.n_samples, b.n_samples)
    assert a.design == b.design


DESIGNS = [7, SamplingDesign(7, replacement=False), SamplingDesign(4, adaptive_max=64)]


@pytest.mark.parametrize("ties", rsp.ranking.TIES)
@pytest.mark.parametrize("design", DESIGNS, ids=["m7", "m7-without", "adaptive4-64"])
def test_equals_score_matrix_path(design, ties, device):
    scores, pos, exc = _data(device=device)
    g1 = torch.Generator(device=device).manual_seed(5)
    g2 = torch.Generator(device=device).manual_seed(5)
    if isinstance(design, SamplingDesign) and design.adaptive_max:
        ref = adaptive_sampled_ranks(scores, pos, design, exclude=exc, generator=g1, ties=ties)
    else:
        ref = sampled_ranks(scores, pos, design, exclude=exc, generator=g1, ties=ties)
    got = sampled_ranks_from_scorer(MatrixScorer(scores), pos, scores.shape[1], design, exclude=exc, generator=g2,
                                    ties=ties, max_pairs=50)
    _same(ref, got)
    assert torch.equal(torch.rand(3, generator=g1, device=device), torch.rand(3, generator=g2, device=device))


def test_equals_with_popularity_and_masks():
    scores, pos, exc = _data(b=30, n=120)
    n = scores.shape[1]
    w = torch.arange(1, n + 1, dtype=torch.float64) ** -0.8
    w[::7] = 0.0
    wide = torch.zeros((scores.shape[0], n + 1), dtype=torch.bool)
    pos_mask = wide.scatter_(1, torch.where(pos >= 0, pos, n), True)[:, :n]  # padding lands in a spare column
    exc_mask = torch.zeros_like(pos_mask).scatter_(1, exc, True) & ~pos_mask
    for rep in (True, False):
        design = SamplingDesign(5, replacement=rep, popularity=w)
        ref = sampled_ranks(scores, pos_mask, design, exclude=exc_mask, generator=torch.Generator().manual_seed(1))
        got = sampled_ranks_from_scorer(MatrixScorer(scores), pos_mask, n, design, exclude=exc_mask,
                                        generator=torch.Generator().manual_seed(1))
        _same(ref, got)
        # popularity-zero items are never drawn
        drawn = got.negatives[got.negatives >= 0]
        assert not bool((w[drawn] == 0).any())


def test_adaptive_with_masks_and_one_dimensional_positives():
    scores, pos, exc = _data(b=25, n=150, p=1)
    pos1 = pos[:, 0].clone()
    pos1[1] = 0  # (B,) form: every row has one positive
    exc = torch.where(exc == 0, torch.full_like(exc, -1), exc)
    design = SamplingDesign(3, adaptive_max=96)
    ref = adaptive_sampled_ranks(scores, pos1, design, exclude=exc, generator=torch.Generator().manual_seed(2))
    got = sampled_ranks_from_scorer(MatrixScorer(scores), pos1, 150, design, exclude=exc,
                                    generator=torch.Generator().manual_seed(2))
    _same(ref, got)
    assert got.cost.stages >= 2


@settings(max_examples=examples(30), deadline=None)
@given(b=st.integers(1, 12), n=st.integers(8, 60), p=st.integers(1, 4), e=st.integers(0, 4), m=st.integers(1, 6),
       cap=st.sampled_from([None, 2, 4]), rep=st.booleans(), ties=st.sampled_from(rsp.ranking.TIES),
       max_pairs=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_fuzz_equals_score_matrix_path(b, n, p, e, m, cap, rep, ties, max_pairs, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 5, (b, n), generator=g).double()  # heavy ties
    picks = torch.stack([torch.randperm(n, generator=g)[: p + e] for _ in range(b)])
    pos, exc = picks[:, :p].clone(), picks[:, p:].contiguous()
    pos[torch.rand(b, p, generator=g) < 0.3] = -1
    if cap is not None:
        design = SamplingDesign(m, adaptive_max=m * cap)
        ref = adaptive_sampled_ranks(scores, pos, design, exclude=exc, generator=torch.Generator().manual_seed(seed),
                                     ties=ties)
    else:
        design = SamplingDesign(m, replacement=rep) if rep or n - p - e >= m else SamplingDesign(m)
        ref = sampled_ranks(scores, pos, design, exclude=exc, generator=torch.Generator().manual_seed(seed), ties=ties)
    scorer = MatrixScorer(scores)
    got = sampled_ranks_from_scorer(scorer, pos, n, design, exclude=exc, generator=torch.Generator().manual_seed(seed),
                                    ties=ties, max_pairs=max_pairs)
    _same(ref, got)
    assert all(r * c <= max_pairs for r, c in scorer.shapes)
    assert got.cost.pairs == sum(r * c for r, c in scorer.shapes)
    assert got.cost.calls == len(scorer.shapes)


def test_cost_record_counts_pairs_and_full_ranking():
    scores, pos, exc = _data(b=20, n=100)
    scorer = MatrixScorer(scores)
    m = 9
    nap = 0.002  # each scorer call sleeps this long: a known lower bound on the time inside the scorer

    def slow(users, items):
        time.sleep(nap)
        return scorer(users, items)

    t0 = time.perf_counter()
    got = sampled_ranks_from_scorer(slow, pos, 100, m, exclude=exc, generator=torch.Generator().manual_seed(0),
                                    max_pairs=64)
    wall = time.perf_counter() - t0
    k = int((pos >= 0).sum())
    assert got.cost.pairs == k * (1 + m)  # each positive and its m draws, nothing else
    assert sum(r * c for r, c in scorer.shapes) == k * (1 + m)
    assert all(r * c <= 64 for r, c in scorer.shapes) and all(c == 1 + m for _, c in scorer.shapes)
    rows_with = (pos >= 0).any(1)
    assert got.cost.full_pairs == int(rows_with.sum()) * 100 - int(((exc >= 0).sum(1) * rows_with).sum())
    assert got.cost.share_of_full == pytest.approx(k * (1 + m) / got.cost.full_pairs)
    # the clock: at least the calls' sleeps inside the scorer, and scorer + loop within the call's wall time
    assert got.cost.scorer_seconds >= nap * got.cost.calls
    assert got.cost.scorer_seconds + got.cost.loop_seconds <= wall
    d = got.cost.as_dict()
    assert d["pairs"] == got.cost.pairs and d["stages"] == 1


def test_adaptive_scores_only_positives_still_first():
    """Stage s scores exactly the new m_{s-1} items of the positives that ranked first at stage s - 1."""
    scores, pos, exc = _data(b=30, n=400, p=2, decimals=3)
    design = SamplingDesign(4, adaptive_max=128)
    got = sampled_ranks_from_scorer(MatrixScorer(scores), pos, 400, design, exclude=exc,
                                    generator=torch.Generator().manual_seed(4))
    sizes = got.n_samples[got.ranks > 0]
    k = sizes.numel()
    # a positive that ends with M = m 2^s scored 1 + m (stage 0) + m + 2m + ... + m 2^(s-1) = 1 + M pairs
    assert got.cost.pairs == int(k + sizes.sum())
    assert got.cost.stages == int(math.log2(int(sizes.max()) // 4)) + 1


def test_max_pairs_smaller_than_a_list_splits_columns():
    scores, pos, exc = _data(b=6, n=80)
    scorer = MatrixScorer(scores)
    ref = sampled_ranks(scores, pos, 30, exclude=exc, generator=torch.Generator().manual_seed(0))
    got = sampled_ranks_from_scorer(scorer, pos, 80, 30, exclude=exc, generator=torch.Generator().manual_seed(0),
                                    max_pairs=8)
    _same(ref, got)
    assert max(r * c for r, c in scorer.shapes) <= 8


def test_user_ids_reach_the_scorer_and_estimators_take_the_result():
    scores, pos, exc = _data(b=50, n=300)
    ids = torch.arange(50) * 3 + 1000  # the scorer's own user ids
    lookup = torch.full((ids.max() + 1,), -1, dtype=torch.int64)
    lookup[ids] = torch.arange(50)
    got = sampled_ranks_from_scorer(MatrixScorer(scores, lookup), pos, 300, 20, exclude=exc, users=ids.numpy(),
                                    generator=torch.Generator().manual_seed(0))
    ref = sampled_ranks(scores, pos, 20, exclude=exc, generator=torch.Generator().manual_seed(0))
    _same(ref, got)
    for method in ("none", "bv", "mes"):
        a = rsp.estimate("ndcg@10", ref, method=method)
        b = rsp.estimate("ndcg@10", got, method=method)
        assert a.value == b.value and a.interval(0.95) == b.interval(0.95)


# ---------------------------------------------------------------- bad input


def _bad(fn, match):
    scores, pos, exc = _data(b=8, n=50)
    with pytest.raises(ValueError, match=match):
        sampled_ranks_from_scorer(fn(scores), pos, 50, 5, exclude=exc, max_pairs=16)


def test_scorer_wrong_shape():
    _bad(lambda s: (lambda u, i: s[u][:, : i.shape[1] - 1]), r"^scorer .* returned shape .* call 1 \(")


def test_scorer_wrong_type_and_dtype():
    _bad(lambda s: (lambda u, i: s[u.unsqueeze(1).expand_as(i), i].numpy()), r"^scorer .* returned ndarray")
    _bad(lambda s: (lambda u, i: s[u.unsqueeze(1).expand_as(i), i] > 0), r"^scorer .* dtype torch.bool")
    _bad(lambda s: (lambda u, i: s[u.unsqueeze(1).expand_as(i), i].to(torch.complex64)), r"^scorer .* dtype")


def test_scorer_wrong_device():
    _bad(lambda s: (lambda u, i: torch.empty(i.shape, device="meta")), r"^scorer .* on meta .* items' device")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_scorer_non_finite(value):
    def make(s):
        def f(u, i):
            out = s[u.unsqueeze(1).expand_as(i), i].clone()
            if u.numel() and int(u[0]) >= 4:
                out[0, 0] = value
            return out
        return f

    _bad(make, r"^scorer .* 1 non-finite score\(s\) .* call \d+ \(\d+ rows from row \d+")


def test_scorer_raising_is_named_with_its_batch():
    def boom(u, i):
        raise RuntimeError("CUDA out of memory (simulated)")

    scores, pos, exc = _data(b=8, n=50)
    with pytest.raises(ValueError, match=r"^scorer 'test_scorer_raising_is_named_with_its_batch.<locals>.boom' "
                                         r"raised RuntimeError on call 1 .*out of memory") as info:
        sampled_ranks_from_scorer(boom, pos, 50, 5, exclude=exc)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_bad_arguments_named():
    scores, pos, exc = _data(b=8, n=50)
    ok = MatrixScorer(scores)
    with pytest.raises(ValueError, match="^scorer: expected a callable"):
        sampled_ranks_from_scorer(scores, pos, 50, 5)
    with pytest.raises(ValueError, match="^max_pairs"):
        sampled_ranks_from_scorer(ok, pos, 50, 5, max_pairs=0)
    with pytest.raises(ValueError, match="^users: expected"):
        sampled_ranks_from_scorer(ok, pos, 50, 5, users=torch.arange(7))
    with pytest.raises(ValueError, match="^users: expected"):
        sampled_ranks_from_scorer(ok, pos, 50, 5, users=torch.arange(8.0))
    with pytest.raises(ValueError, match="^positives"):
        sampled_ranks_from_scorer(ok, pos + 50, 50, 5)
    with pytest.raises(ValueError, match="^exclude"):
        sampled_ranks_from_scorer(ok, pos, 50, 5, exclude=pos)
    with pytest.raises(ValueError, match="^n_items"):
        sampled_ranks_from_scorer(ok, pos, 0, 5)
    with pytest.raises(ValueError, match="^ties"):
        sampled_ranks_from_scorer(ok, pos, 50, 5, ties="first")
    with pytest.raises(ValueError, match="^n_samples"):
        sampled_ranks_from_scorer(ok, pos, 50, SamplingDesign(60, replacement=False))
    assert ok.shapes == []  # nothing was scored before the refusals


def test_numpy_and_list_inputs():
    scores, pos, exc = _data(b=8, n=50)
    ref = sampled_ranks(scores, pos, 5, exclude=exc, generator=torch.Generator().manual_seed(0))
    got = sampled_ranks_from_scorer(MatrixScorer(scores), pos.numpy(), 50, 5, exclude=exc.tolist(),
                                    generator=torch.Generator().manual_seed(0))
    _same(ref, got)
    assert np.array_equal(got.ranks.numpy(), ref.ranks.numpy())
