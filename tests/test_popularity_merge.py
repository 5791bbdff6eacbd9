"""pl_fit's per-positive class counts on today's paths, with exclusions in CSR form (``exclusions.Exclusions``).

Oracles: a brute-force numpy count over each row's forbidden set (positives and exclusions, each once; weight-0 items
never in a class) for the row totals from the padded list and from CSR exclusions; a numpy count of the distinct drawn
items per class for the beating / other counts; the score-matrix path for the scorer loop (same generator, every
field equal); the core's estimate for the torchmetrics state under ``auto``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _popularity_helpers import canonical_rows
from _profiles import examples

import reco_sampled_plugin as rsp
from reco_sampled_plugin import SamplingDesign, sampled_ranks, sampled_ranks_from_scorer
from reco_sampled_plugin._popularity import (POP_BINS, PROFILE_FIELDS, class_totals, exclusion_totals,
                                             forbidden_weight, weight_bins)
from reco_sampled_plugin.exclusions import prepare_exclusions
from reco_sampled_plugin.ranking import forbidden_sorted

_FIELDS = ("beating", "inv_q", "inv_q2", "unreachable") + PROFILE_FIELDS + ("positive_weight",)


def _case(seed: int, n: int, b: int, zero_share: float, pattern: str):
    """Random weights (some 0), padded positives (-1) and ragged exclusions under one of several patterns."""
    rng = np.random.default_rng(seed)
    w = rng.pareto(1.2, n) + 0.05
    w[rng.random(n) < zero_share] = 0.0
    if not (w > 0).any():
        w[0] = 1.0
    p, e = 3, 6
    pos = np.full((b, p), -1, dtype=np.int64)
    exc = np.full((b, e), -1, dtype=np.int64)
    for r in range(b):
        items = rng.permutation(n)
        k = int(rng.integers(0, p + 1))
        pos[r, :k] = items[:k]
        ke = int(rng.integers(0, e + 1))
        exc[r, :ke] = items[p: p + ke]
        if pattern == "positives_excluded" and k and ke:
            exc[r, 0] = pos[r, 0]  # a positive also excluded (RecBole's used items hold the target)
        if pattern == "duplicates" and ke >= 2:
            exc[r, 1] = exc[r, 0]  # an exclusion listed twice (the padded list's form only)
        if pattern == "duplicates" and k >= 2:
            pos[r, 1] = pos[r, 0]  # a positive listed twice
        if pattern == "zero_weight" and ke:
            exc[r, 0] = int(np.flatnonzero(w == 0)[0]) if (w == 0).any() else exc[r, 0]
    return torch.from_numpy(w), torch.from_numpy(pos), torch.from_numpy(exc)


def _brute(w: np.ndarray, cls: np.ndarray, pos: np.ndarray, exc: np.ndarray):
    """Per row: forbidden weight, forbidden weight-0 count, forbidden weight>0 items per class; and the profile."""
    b = pos.shape[0]
    weight, zeros, classes = np.zeros(b), np.zeros(b, dtype=np.int64), np.zeros((b, POP_BINS))
    for r in range(b):  # the oracle: a set per row
        forb = {int(i) for i in pos[r] if i >= 0} | {int(i) for i in exc[r] if i >= 0}
        for j in forb:
            weight[r] += w[j]
            zeros[r] += int(w[j] == 0)
            if w[j] > 0:
                classes[r, cls[j]] += 1
    total = np.bincount(cls[w > 0], minlength=POP_BINS).astype(np.float64)
    return weight, zeros, classes, total[None, :] - classes


def _csr(exc: torch.Tensor, n: int):
    """Exclusions of the padded rows with each row's items once (CSR refuses duplicates)."""
    rows = [sorted({int(i) for i in row if i >= 0}) for row in exc]
    width = max([len(r) for r in rows] + [1])
    dedup = torch.full((len(rows), width), -1, dtype=torch.int64)
    for r, items in enumerate(rows):
        dedup[r, :len(items)] = torch.tensor(items, dtype=torch.int64)
    return prepare_exclusions(dedup, n)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(10, 40), st.integers(1, 12), st.sampled_from([0.0, 0.2, 0.6]),
       st.sampled_from(["plain", "positives_excluded", "duplicates", "zero_weight"]))
def test_row_totals_from_csr_equal_the_padded_list_and_a_brute_force_count(seed, n, b, zero_share, pattern):
    w, pos, exc = _case(seed, n, b, zero_share, pattern)
    cls = weight_bins(w)
    weight, zeros, classes, profile = _brute(w.numpy(), cls.numpy(), pos.numpy(), exc.numpy())
    padded = forbidden_weight(forbidden_sorted(pos, exc, n), w)
    csr = exclusion_totals(forbidden_sorted(pos, None, n), _csr(exc, n), w)
    for got in (padded, csr):
        np.testing.assert_allclose(got.weight.numpy(), weight, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(got.zeros.numpy(), zeros)
        np.testing.assert_array_equal(got.classes.numpy(), classes)
        np.testing.assert_array_equal((class_totals(w, cls)[None, :] - got.classes).numpy(), profile)
    assert got.classes.dtype == torch.float32 and got.classes.shape == (b, POP_BINS)


def test_weight_bins_are_equal_steps_of_log_w():
    w = torch.tensor([0.0, 1.0, 2.0, 4.0, 8.0, 1000.0, 3.0, 0.0], dtype=torch.float64)
    lw = np.log(w.numpy()[w.numpy() > 0])
    step = (lw.max() - lw.min()) / POP_BINS
    want = np.clip(np.floor((np.log(np.where(w.numpy() > 0, w.numpy(), 1.0)) - lw.min()) / step), 0, POP_BINS - 1)
    want[w.numpy() == 0] = 0
    np.testing.assert_array_equal(weight_bins(w).numpy(), want.astype(np.int64))
    assert bool((weight_bins(torch.full((5,), 3.0)) == 0).all())  # equal weights: one class


def _problem(seed=0, b=30, n=90, p=3, e=12):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g, dtype=torch.float64).round(decimals=1)  # ties
    picks = torch.stack([torch.randperm(n, generator=g)[: p + e] for _ in range(b)])
    pos, exc = picks[:, :p].clone(), picks[:, p:].clone()
    pos[::4, p - 1] = -1
    exc[::3, e - 4:] = -1  # ragged
    w = torch.rand(n, generator=g, dtype=torch.float64) ** 3 * 50 + 0.1
    return scores, pos, exc, w


@pytest.mark.parametrize("ties", ["pessimistic", "average", "random"])
def test_drawn_classes_equal_a_numpy_count_of_distinct_draws(ties):
    scores, pos, exc, w = _problem()
    s = sampled_ranks(scores, pos, SamplingDesign(40, popularity=w), exclude=exc, ties=ties,
                      generator=torch.Generator().manual_seed(3))
    st_ = s.popularity_stats
    cls = weight_bins(w).numpy()
    neg, sc = s.negatives.numpy(), scores.numpy()
    for r in range(pos.shape[0]):
        for k in range(pos.shape[1]):
            if pos[r, k] < 0:
                assert not st_.profile[r, k].any() and not st_.beat_bins[r, k].any()
                continue
            beat, miss = np.zeros(POP_BINS), np.zeros(POP_BINS)
            for j in set(neg[r, k].tolist()):  # each distinct drawn item once
                s_j, s_p = sc[r, j], sc[r, int(pos[r, k])]
                if ties == "random":  # its share: as counted in the rank (the draw's tie order)
                    continue
                b = 1.0 if s_j > s_p else (0.0 if s_j < s_p else (1.0 if ties == "pessimistic" else 0.5))
                beat[cls[j]] += b
                miss[cls[j]] += 1.0 - b
            distinct = len(set(neg[r, k].tolist()))
            assert float(st_.beat_bins[r, k].sum() + st_.miss_bins[r, k].sum()) == distinct
            if ties != "random":
                np.testing.assert_array_equal(st_.beat_bins[r, k].numpy(), beat)
                np.testing.assert_array_equal(st_.miss_bins[r, k].numpy(), miss)
    # the beating draws counted once per distinct item never exceed the beating draws
    assert bool((st_.beat_bins.sum(-1) <= st_.beating.float() + 1e-6).all())


@pytest.mark.parametrize("prepared", [False, True])
def test_scorer_loop_statistics_equal_the_score_matrix_path(prepared):
    """The scorer loop's popularity statistics (every field, the class counts included) equal sampled_ranks' on the
    materialised score matrix with the same generator, with padded and with prepared (CSR) exclusions."""
    from test_scorer_ranks import MatrixScorer

    scores, pos, exc, w = _problem(seed=4)
    n = scores.shape[1]
    ex = prepare_exclusions(exc, n) if prepared else exc
    design = SamplingDesign(25, popularity=w)
    ref = sampled_ranks(scores, pos, design, exclude=ex, generator=torch.Generator().manual_seed(9))
    got = sampled_ranks_from_scorer(MatrixScorer(scores), pos, n, design, exclude=ex, max_pairs=64,
                                    generator=torch.Generator().manual_seed(9))
    assert torch.equal(ref.ranks, got.ranks)
    for f in _FIELDS:
        assert torch.equal(getattr(ref.popularity_stats, f), getattr(got.popularity_stats, f)), f
    # padded and CSR exclusions: the same statistics
    other = sampled_ranks(scores, pos, design, exclude=exc if prepared else prepare_exclusions(exc, n),
                          generator=torch.Generator().manual_seed(9))
    for f in _FIELDS:
        assert torch.equal(getattr(ref.popularity_stats, f), getattr(other.popularity_stats, f)), f
    assert rsp.estimate("ndcg@10", got).value == rsp.estimate("ndcg@10", ref, method="pl_fit").value


def test_torchmetrics_state_carries_the_class_counts_and_auto_runs_the_choice():
    """SampledRankingMetrics under a popularity design: its state's class counts are the core's on the same keyed
    draws (padded exclusions through ``_keyed.keyed_ranks``), and ``auto`` reports hh's AUC and pl_fit's NDCG."""
    from reco_sampled_plugin._keyed import MatrixScores, RowKeys, keyed_ranks
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics
    from reco_sampled_plugin.ranking import padded_candidate_counts

    scores, pos, exc, w = _problem(seed=6, b=40, n=120)
    design = SamplingDesign(30, popularity=w)
    metric = SampledRankingMetrics(["auc", "ndcg@10"], design, estimators=["auto"], seed=5)
    ids = torch.arange(scores.shape[0])
    metric.update(scores, pos, exc, ids=ids)
    kr = keyed_ranks(MatrixScores(scores.float()), pos, exc, scores.shape[1], design, RowKeys.of(5, ids, ids.device),
                     "pessimistic")
    core = rsp.SampledRanks(kr.ranks, padded_candidate_counts(scores.shape[1], pos, exc, False), None, design,
                            popularity_stats=kr.stats)
    got = metric.popularity_ranks().popularity_stats
    valid = pos >= 0
    # every positive's row (class counts and own weight included) is the core's; the state reads them sorted
    assert np.array_equal(canonical_rows(metric.popularity_ranks()), canonical_rows(core))
    assert bool((got.profile.sum(-1) > 0).all())
    assert torch.equal(kr.stats.positive_weight[valid], w.to(torch.float64)[pos[valid]])
    est = metric.estimates()
    popn = metric.popularity_ranks()
    assert est["auc/auto"].value == rsp.estimate("auc", popn, method="hh").value
    assert est["ndcg@10/auto"].value == rsp.estimate("ndcg@10", popn, method="pl_fit").value
    assert est["ndcg@10/auto"].details["auto"]["method"] == "pl_fit"
