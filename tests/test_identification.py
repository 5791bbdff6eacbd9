"""Identified intervals: containment of the identified set by brute force, coverage on ml-100k with
known exact ranks, and the Estimate.interval contract."""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin._rank_hist import RankHistogram
from reco_sampled_plugin.identification import TopShape, identified_interval, top_sensitive
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.metrics import metric_values
from reco_sampled_plugin.sampling_laws import sampled_rank_pmf
from reco_sampled_plugin.simulate import draw_sampled_ranks

N_ITEMS, M = 400, 9  # resolution b = 399 / 10 + 1 = 40.9: K = 1..40 lie inside the first sampled bin


def _law_matrix(n: int, m: int) -> np.ndarray:
    """P(r~ = i | R = r), r = 1..n (rows)."""
    return sampled_rank_pmf(torch.arange(1, n + 1), n, m, "binomial").numpy()


def _expected_histogram(p: np.ndarray, n: int, m: int, total: float) -> RankHistogram:
    return RankHistogram(np.array([n]), np.array([m]), (total * (p @ _law_matrix(n, m)),))


def _top_shape_density(rng: np.random.Generator, n: int, b: float, gamma: float) -> np.ndarray:
    """A random density obeying TopShape(gamma, 1, 2): r^-gamma times a random non-decreasing factor over 1..b,
    non-increasing over 1..2b, anything positive beyond."""
    r = np.arange(1, n + 1, dtype=np.float64)
    g = np.maximum.accumulate(rng.gamma(0.3, size=n))  # non-decreasing
    top = r ** (-rng.uniform(0, gamma)) * (g / g.max()) ** rng.uniform(0, 1)
    p = top.copy()
    cut = int(math.ceil(b))
    # within 1..b: r^gamma p non-decreasing holds for r^-a with a <= gamma times a non-decreasing g;
    # beyond 1..b keep the density non-increasing up to 2b, then a random tail below it
    p = np.minimum.accumulate(p)
    tail_level = p[min(2 * cut, n) - 1]
    p[2 * cut:] = tail_level * rng.uniform(0.05, 1.0, size=n - 2 * cut) * rng.uniform(0.2, 1.0)
    return p / p.sum()


def _in_class(p: np.ndarray, b: float, gamma: float) -> bool:
    r = np.arange(1, len(p) + 1, dtype=np.float64)
    cut = int(math.ceil(b))
    mono = np.all(np.diff(p[: 2 * cut]) <= 1e-15)
    steep = np.all(np.diff((r**gamma * p)[:cut]) >= -1e-15)
    return bool(mono and steep)


@pytest.mark.parametrize("metric", ["hit@1", "hit@5", "ndcg@10", "hit@20", "mrr"])
def test_identified_interval_contains_every_distribution_of_the_class(metric):
    """Brute force on small n: distributions of the shape class whose expected histograms equal the observed one
    (large N, no noise) must all have their metric inside the LP bounds; and the bounds are attained closely by
    the extreme shapes (the interval is not the metric's whole range)."""
    rng = np.random.default_rng(7)
    b = (N_ITEMS - 1) / (M + 1) + 1
    spec = parse_metric(metric)
    r = np.arange(1, N_ITEMS + 1)
    mvals = metric_values(spec, torch.from_numpy(r), N_ITEMS).numpy()
    checked = 0
    for _ in range(40):
        p = _top_shape_density(rng, N_ITEMS, b, 1.0)
        if not _in_class(p, b, 1.0):
            continue
        hist = _expected_histogram(p, N_ITEMS, M, 1e6)
        iv = identified_interval(spec, hist, level=0.95)
        truth = float(p @ mvals)
        assert iv.lp_lo - 1e-9 <= truth <= iv.lp_hi + 1e-9, (truth, iv)
        assert iv.lo <= iv.lp_lo and iv.hi >= iv.lp_hi
        assert "shape_rejected" not in iv.flags
        checked += 1
    assert checked >= 20


def test_bounds_match_the_extreme_shapes_of_the_first_bin():
    """Uniform and 1/r tops are in the class: with the data of a uniform top (no noise), the lower LP bound of
    HR@K sits at the uniform value, and the 1/r top's value lies inside; a narrower class (gamma = 0.5) gives
    a narrower interval that still contains both values it allows."""
    n, m = 2000, 19  # b = 101
    r = np.arange(1, n + 1, dtype=np.float64)
    uniform_top = np.where(r <= 300, 1.0, 0.2)
    uniform_top /= uniform_top.sum()
    hist = _expected_histogram(uniform_top, n, m, 1e7)
    wide = identified_interval("hit@10", hist)
    narrow = identified_interval("hit@10", hist, shape=TopShape(gamma=0.5))
    truth = float(uniform_top[:10].sum())
    assert wide.lp_lo == pytest.approx(truth, rel=0.05)
    assert narrow.lp_hi < wide.lp_hi
    assert narrow.lp_lo <= truth <= narrow.lp_hi
    # the whole range of HR@10 would be [0, 1]: the interval is a few times the value, not the range
    assert wide.hi < 0.5


def test_identified_interval_covers_on_ml100k_and_is_wider_than_sampling(ml100k_held_out):
    """Coverage of Estimate.interval(0.95) for the default estimator on ml-100k sampled at m = 100 (fixed seed):
    20 repeats x 2 recommenders x 3 unresolved metrics. With true coverage 0.95 the count of misses out of 120 is
    Binomial(120, 0.05): mean 6, sd 2.4; more than 18 misses (coverage < 0.85) is a > 5 sd event."""
    held_out, n_u = ml100k_held_out  # the session's trained recommenders (tests/conftest.py)
    ranks = {"pop": held_out["Popularity"], "knn": held_out["ItemKNN(q=3)"]}
    misses, total, widths = 0, 0, []
    for i, r in enumerate(ranks.values()):
        draws = draw_sampled_ranks(r, n_u, 100, repeats=20, seed=11 + i)
        for metric in ("hit@1", "hit@10", "ndcg@10"):
            exact = float(metric_values(metric, torch.from_numpy(r), torch.from_numpy(n_u)).mean())
            for d in draws:
                est = rsp.estimate(metric, rsp.SampledRanks.from_arrays(d, n_u, 100), rsp.registry.Auto(n_bootstrap=0))
                assert "top_unresolved" in est.flags and est.identification is not None
                lo, hi = est.interval(0.95)
                s_lo, s_hi = est.sampling_interval(0.95)
                assert lo <= max(s_lo, 0.0) and hi >= min(s_hi, 1.0)  # both clipped to the metric range
                widths.append((hi - lo) / (s_hi - s_lo))
                misses += not (lo <= exact <= hi)
                total += 1
    assert misses <= 18, f"{misses} of {total} intervals missed"
    assert np.median(widths) > 1.0


def test_resolved_metrics_keep_the_sampling_interval():
    rng = np.random.default_rng(0)
    n, m = 300, 99  # b = 4: K = 10 is resolved for hit rates
    ranks = rng.integers(1, m + 2, size=500)
    for metric in ("hit@10", "recall@20", "precision@50", "auc"):
        est = rsp.estimate(metric, rsp.SampledRanks.from_arrays(ranks, n, m), "bv")
        assert est.identification is None
        # nothing identified: the interval is the sampling interval, widened only by the table's plug-in bias
        assert est.twin_gap is not None
        assert dataclasses.replace(est, twin_gap=None).interval(0.9) == est.sampling_interval(0.9)
        lo, hi = est.interval(0.9)
        slo, shi = est.sampling_interval(0.9)
        assert lo <= slo and hi >= shi
    # NDCG and RR weigh ranks 1..4 of the first bin differently: the bin's shape still matters at K = 20
    for metric in ("ndcg@20", "mrr", "ap@50"):
        assert rsp.estimate(metric, rsp.SampledRanks.from_arrays(ranks, n, m), "bv").identification is not None
    # one sampled rank per exact rank (b < 2): nothing is unresolved
    assert rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(ranks, 100, 99), "bv").identification is None  # b = 1.99
    # the uncorrected sampled metric estimates the sampled metric: never widened
    est = rsp.estimate("hit@1", rsp.SampledRanks.from_arrays(ranks, 10_000, m), "none")
    assert est.identification is None
    assert top_sensitive(parse_metric("hit@1"), RankHistogram(np.array([10_000]), np.array([m]),
                                                               (np.bincount(ranks, minlength=m + 2)[1:],)))


@pytest.mark.parametrize("method", ["mes", "mle", "bv", "cls", "bound", "beta_fit", "rank_estimate", "bv_mle"])
def test_every_estimator_gets_the_identified_interval(method):
    rng = np.random.default_rng(1)
    ranks = np.minimum(rng.geometric(0.3, size=400), 101)
    est = rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(ranks, 20_000, 100),
        rsp.registry.method_class(method)(**{"n_bootstrap": 0} if method in ("mes", "mle") else {}),
    )
    lo, hi = est.interval()
    assert est.identification is not None and "top_unresolved" in est.flags
    assert 0.0 <= lo <= hi <= 1.0 and not math.isnan(lo) and not math.isnan(hi)
    assert (lo, hi) == est.interval(0.95)  # cached per level
    assert pickle.loads(pickle.dumps(est)).interval() == (lo, hi)


def test_all_at_top_gives_a_finite_honest_interval():
    ranks = np.ones(50, dtype=np.int64)
    est = rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(ranks, 50_000, 100), "bv")
    assert math.isinf(est.stderr)
    lo, hi = est.interval()
    assert 0.0 <= lo < hi <= 1.0


def test_bad_input():
    with pytest.raises(ValueError, match="level"):
        identified_interval("hit@10", [1, 2, 3], 1000, 10, level=1.5)
    with pytest.raises(ValueError, match="shape"):
        TopShape(gamma=float("nan"))
    with pytest.raises(ValueError, match="top_shape"):
        rsp.estimate("hit@10", rsp.SampledRanks.from_arrays([1, 2, 3], 1000, 10), rsp.registry.Bv(top_shape="steep"))
    with pytest.raises(ValueError, match="level"):
        rsp.estimate("hit@10", rsp.SampledRanks.from_arrays([1, 2, 3], 1000, 10), "bv").interval(0.0)


def test_several_sample_sizes_are_flagged_and_contradictions_give_the_whole_range():
    rng = np.random.default_rng(2)
    exact = np.minimum(rng.geometric(1 / 300, size=600), 2000)
    m = np.where(np.arange(600) % 2 == 0, 10, 20)
    sampled = draw_sampled_ranks(exact, 2000, m, repeats=1, seed=1)[0]
    iv = identified_interval("hit@5", sampled, 2000, m)
    assert "several_m" in iv.flags and 0.0 <= iv.lo <= iv.hi <= 1.0 and "identification_failed" not in iv.flags
    assert "several_m" not in identified_interval("hit@5", sampled[m == 10], 2000, 10).flags
    # every m = 20 positive in r~ 1..3 while the m = 10 ones spread over 1..11: no P(R) fits both bands
    bad = np.concatenate([rng.integers(1, 12, size=300), rng.integers(1, 4, size=300)])
    iv = identified_interval("hit@5", bad, 2000, np.repeat([10, 20], 300))
    assert iv.flags == ("identification_failed", "several_m") and (iv.lo, iv.hi) == (0.0, 1.0)


def test_band_cdfs_are_kept_for_the_next_evaluation_read_only():
    """The band's per-group cdfs depend on the grid, n, m and the checkpoints only (not the counts): kept across
    evaluations (an epoch's users have the last epoch's n), equal to a fresh computation and not writeable."""
    from reco_sampled_plugin import identification as ident
    from reco_sampled_plugin.rank_distribution import model_grid

    edges = model_grid([1500, 1200], [100, 100]).astype(np.int64)
    pts = ident._checkpoints(100)
    ident._cell_cdf_cached.cache_clear()
    kept = ident._cell_cdf_cached(edges.tobytes(), 1200, 100, pts.tobytes(), "binomial")
    np.testing.assert_array_equal(kept, ident._cell_cdf(edges, 1200, 100, pts, "binomial"))
    assert not kept.flags.writeable
    again = ident._cell_cdf_cached(edges.tobytes(), 1200, 100, pts.tobytes(), "binomial")
    assert again is kept and ident._cell_cdf_cached.cache_info().hits == 1


def test_an_lp_that_fails_without_presolve_is_solved_again_with_it(monkeypatch):
    """The programs are solved without HiGHS's presolve first; a status other than 0 there repeats the solve with it
    (before any relaxation of the shape): the interval is the one of direct solves."""
    from scipy import optimize

    import reco_sampled_plugin.identification as ident

    rng = np.random.default_rng(3)
    ranks = rng.integers(1, 102, size=400)
    # each call builds its own histogram from the ranks, so nothing is kept between the two (what is solved is kept
    # on the histogram)
    want = ident.identified_interval("ndcg@10", ranks, 3_000, 100)
    calls = []
    real = optimize.linprog

    def flaky(*args, **kwargs):
        res = real(*args, **kwargs)
        calls.append(kwargs.get("options"))
        if kwargs.get("options") == {"presolve": False}:
            res.status = 4  # "numerical difficulties"
        return res

    monkeypatch.setattr(optimize, "linprog", flaky)
    got = ident.identified_interval("ndcg@10", ranks, 3_000, 100)
    assert calls == [{"presolve": False}, None] * 2
    assert got.flags == want.flags  # solved, not relaxed: the same optimum to HiGHS's tolerance (with or without presolve)
    assert (got.lo, got.hi) == pytest.approx((want.lo, want.hi), abs=1e-7)


def test_steep_shapes_far_from_the_top_widen_the_interval_without_failing():
    """The steepness rows as rho_c d_c <= d_{c+1} (rho = the ratio of cell means of r^-gamma): the same rows as
    before for moderate gammas; where the cell means leave float64's range (gamma 64 at n = 10^6, 300 at n = 1,000:
    a division by 0, then linprog's error naming A_ub) the bound there is 0, so a steeper gamma's interval still
    holds the gentler one's."""
    from reco_sampled_plugin.identification import _shape_rows
    from reco_sampled_plugin.quadrature import power_sums

    edges = np.array([0, 1, 3, 7, 15, 40, 100, 400])
    for gamma in (0.5, 1.0, 3.0):
        widths = np.diff(edges).astype(np.float64)
        ref = power_sums(edges[:-1] + 1, edges[1:], gamma) / widths
        old = np.zeros((len(widths) - 1, len(widths)))
        i = np.arange(len(widths) - 1)
        old[i, i + 1], old[i, i] = -1.0 / (widths[1:] * ref[1:]), 1.0 / (widths[:-1] * ref[:-1])
        np.testing.assert_allclose(_shape_rows(edges, 400, gamma), old / np.abs(old).max(1, keepdims=True), rtol=1e-12)
    g = torch.Generator().manual_seed(0)
    for n, m, gammas in ((1000, 100, (1.0, 250.0, 300.0, 1e4)), (10**6, 10, (1.0, 32.0, 64.0, 100.0))):
        ranks = torch.randint(1, m + 2, (50,), generator=g)
        ranks[:10] = 1
        ivs = [identified_interval("ndcg@10", ranks, n, m, shape=TopShape(gamma=gam, decay_widths=3.0))
               for gam in gammas]
        for gentle, steep in zip(ivs, ivs[1:]):
            assert steep.lo <= gentle.lo + 1e-9 and gentle.hi <= steep.hi + 1e-9, (n, gentle, steep)
            assert "identification_failed" not in steep.flags


@pytest.mark.parametrize("bad", ["10", b"10", 10, (100,), None.__class__])
def test_an_adaptive_argument_that_is_no_design_or_pair_is_named(bad):
    """``adaptive=`` takes an AdaptiveDesign, a SamplingDesign or an (m, adaptive_max) pair: a string ('10' unpacked
    into ('1', '0'), an error naming n_samples) or anything else is refused naming ``adaptive``."""
    with pytest.raises(ValueError, match=r"^adaptive: expected an AdaptiveDesign or \(n_samples, adaptive_max\)"):
        identified_interval("ndcg@10", torch.tensor([1, 2]), 100, 5, adaptive=bad)
