"""The twin gap of ``gmod``'s interval: how far the users' metric moves in a twin of the data whose draws
barely differ (positives moved to other exact ranks, squared Hellinger distances summing to at most ``TWIN_H2``), and
the bias-aware interval ends built on it (Armstrong & Kolesar 2020)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

import reco_sampled_plugin as rsp
from reco_sampled_plugin._rank_hist import sampled_rank_histogram
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from reco_sampled_plugin.sampling_laws import sampled_rank_pmf
from reco_sampled_plugin import rank_distribution as rd, registry
from reco_sampled_plugin._estimate import Estimate, bias_aware_halfwidth
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.simulate import simulate_sampled_ranks

N_ITEMS, M = 400, 60


def _smooth_draws(n_pos: int, seed: int, law: str = "binomial") -> tuple[torch.Tensor, torch.Tensor]:
    r = np.arange(1, N_ITEMS + 1, dtype=np.float64)
    p = r**-0.8
    exact = torch.from_numpy(np.random.default_rng(seed).choice(np.arange(1, N_ITEMS + 1), size=n_pos, p=p / p.sum()))
    return exact, simulate_sampled_ranks(exact, N_ITEMS, M, law, torch.Generator().manual_seed(seed + 1))


def _lp_gap(dist: rd.RankDistribution, sampled: torch.Tensor, metric: str, budget: float, top: int,
            law: str) -> tuple[float, float]:
    """The same twin gap from its definition, computed independently: per-rank posteriors from the sampling law
    (``sampled_rank_pmf``) and the fitted prior, move costs as the squared Hellinger distance of the two laws of
    r~ - 1 (scipy's binomial or hypergeometric pmf) by enumeration,
    metric values from ``metric_values``, and a linear program (each positive moved at most once)."""
    ranks = torch.arange(1, N_ITEMS + 1)
    lik = sampled_rank_pmf(ranks, N_ITEMS, M, law).double().numpy()  # (n, m + 1)
    prior = dist.prior(N_ITEMS)
    counts = np.bincount(sampled.numpy() - 1, minlength=M + 1).astype(np.float64)
    post = prior[:, None] * lik / (prior @ lik)[None, :]
    count = (post * counts[None, :]).sum(1)[:top]  # positives expected at ranks 1..top
    value = rsp.metric_values(metric, ranks[:top], N_ITEMS).double().numpy()
    j = np.arange(M + 1)

    def pmf(r: int) -> np.ndarray:  # r~ - 1 for a positive at 0-based rank index r
        if law == "binomial":
            return stats.binom.pmf(j, M, r / (N_ITEMS - 1.0))
        return stats.hypergeom.pmf(j, N_ITEMS - 1, r, M)

    moves = [(i, j) for i in range(top) for j in range(top) if i != j]  # any rank to any other in the window
    gain = np.array([(value[b] - value[a]) / len(sampled) for a, b in moves])
    cost = np.array([1.0 - np.sum(np.sqrt(pmf(a) * pmf(b))) for a, b in moves])
    ok = np.isfinite(cost)
    out = []
    for sign in (-1.0, 1.0):
        a_src = np.zeros((top, len(moves)))
        for col, (a, _) in enumerate(moves):
            a_src[a, col] = 1.0
        a_ub = np.vstack([np.where(ok, cost, 0.0)[None, :], a_src])
        b_ub = np.concatenate([[budget], count])
        bounds = [(0.0, None) if o else (0.0, 0.0) for o in ok]
        res = optimize.linprog(-sign * gain, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
        assert res.status == 0
        out.append(-res.fun)
    return out[0], out[1]


@pytest.mark.parametrize("law", ["binomial", "hypergeometric"])
@pytest.mark.parametrize("metric", ["hit@10", "ndcg@10", "hit@5"])
@pytest.mark.parametrize("budget", [0.003, rd.TWIN_H2, 0.1])
def test_twin_gap_is_the_linear_program_of_its_definition(metric, budget, law):
    exact, sampled = _smooth_draws(2000, seed=0, law=law)
    dist = fit_rank_distribution(sampled_rank_histogram(sampled, N_ITEMS, M), registry.Gmod(n_bootstrap=0),
                                 sampling=law)
    assert np.array_equal(dist.edges[:30], np.arange(30))  # single-rank cells where the moves are
    spec = parse_metric(metric)
    first, top = rd._twin_ranks(spec, N_ITEMS, (N_ITEMS - 1) / (M + 1) + 1)
    assert first == 1
    down, up = dist.twin_gap(spec, budget)
    lp_down, lp_up = _lp_gap(dist, sampled, metric, budget, top, law)
    assert down > 0 and up > 0
    assert down == pytest.approx(lp_down, rel=1e-6) and up == pytest.approx(lp_up, rel=1e-6)


def test_twin_gap_shrinks_as_one_over_the_positives():
    """Twice the positives with the same histogram and prior: each move is worth half as much and costs the same,
    so the gap halves (while the budget buys less than the cheapest rank's positives); sampling noise shrinks only
    as 1/sqrt(N), so the twins matter less the more positives there are."""
    _, sampled = _smooth_draws(2000, seed=3)
    one = fit_rank_distribution(sampled_rank_histogram(sampled, N_ITEMS, M), registry.Gmod(n_bootstrap=0))
    doubled = rsp.sampled_rank_histogram(torch.cat([sampled, sampled]), N_ITEMS, M)
    two = dataclasses.replace(one, histogram=doubled)
    assert two.histogram.total == 2 * one.histogram.total
    for metric in ("hit@10", "ndcg@10"):
        spec = parse_metric(metric)
        g1, g2 = np.array(one.twin_gap(spec, 0.003)), np.array(two.twin_gap(spec, 0.003))
        assert np.all(g1 > 0)
        np.testing.assert_allclose(g2, g1 / 2, rtol=1e-9)


def test_no_budget_or_nothing_to_move_gives_no_gap():
    _, sampled = _smooth_draws(500, seed=5)
    dist = fit_rank_distribution(sampled_rank_histogram(sampled, N_ITEMS, M), registry.Gmod(n_bootstrap=0))
    assert dist.twin_gap(parse_metric("hit@10"), 0.0) == (0.0, 0.0)
    # a draw of every other item ranks each positive exactly (hypergeometric, m = n - 1): a positive moved by one
    # rank changes its sampled rank for sure (H^2 = 1: disjoint laws), so the budget moves a 0.02 share of one
    # positive; with replacement the same m leaves a little room (a move costs H^2 = 0.014 at rank 10)
    exact = _smooth_draws(500, seed=6)[0]
    dist = fit_rank_distribution(sampled_rank_histogram(exact, N_ITEMS, N_ITEMS - 1), registry.Gmod(n_bootstrap=0),
                                 sampling="hypergeometric")
    assert dist.twin_gap(parse_metric("hit@10")) == pytest.approx((rd.TWIN_H2 / 500, rd.TWIN_H2 / 500), rel=1e-9)
    binomial = simulate_sampled_ranks(exact, N_ITEMS, N_ITEMS - 1, "binomial", torch.Generator().manual_seed(0))
    dist = fit_rank_distribution(sampled_rank_histogram(binomial, N_ITEMS, N_ITEMS - 1), registry.Gmod(n_bootstrap=0))
    down, up = dist.twin_gap(parse_metric("hit@10"))
    assert 0 < down < 0.01 and 0 < up < 0.01


@pytest.mark.parametrize("se,bias", [(1.0, 0.0), (1.0, 0.3), (1.0, 1.0), (0.5, 3.0), (2e-3, 1e-3), (1.0, 40.0)])
@pytest.mark.parametrize("level", [0.8, 0.95, 0.99])
def test_bias_aware_halfwidth_is_the_folded_normal_quantile(se, bias, level):
    h = bias_aware_halfwidth(se, bias, level)
    assert h == pytest.approx(se * stats.foldnorm.ppf(level, bias / se), rel=1e-9)
    z = stats.norm.ppf(0.5 + level / 2)
    assert z * se - 1e-12 <= h <= bias + z * se + 1e-12
    # covers at the level exactly when the shift is the bias, more when it is less
    assert stats.norm.cdf(h, bias, se) - stats.norm.cdf(-h, bias, se) == pytest.approx(level, abs=1e-9)


def test_bias_aware_halfwidth_edges():
    assert bias_aware_halfwidth(0.0, 0.25, 0.95) == 0.25
    assert bias_aware_halfwidth(math.inf, 0.25, 0.95) == math.inf


def test_interval_reaches_the_twin_gap_and_stays_in_range():
    est = Estimate(0.02, 0.01, 100, twin_gap=(0.004, 0.02), metric_range=(0.0, 1.0))
    lo, hi = est.interval(0.95)
    assert lo == 0.0  # clipped: the left end would be 0.02 - 0.021
    assert hi == pytest.approx(0.02 + bias_aware_halfwidth(0.01, 0.02, 0.95))
    assert est.sampling_interval(0.95) == pytest.approx((0.02 - 1.959964 * 0.01, 0.02 + 1.959964 * 0.01))
    plain = Estimate(0.5, 0.01, 100, metric_range=(0.0, 1.0))
    assert plain.interval(0.9) == plain.sampling_interval(0.9)


def test_gmod_estimates_carry_the_gap_and_other_methods_do_not():
    _, sampled = _smooth_draws(2000, seed=7)
    s = rsp.SampledRanks(sampled, torch.full((2000,), N_ITEMS), None, rsp.SamplingDesign(M))
    g = rsp.estimate("hit@10", s, method="gmod")
    assert g.twin_gap is not None and g.twin_gap == pytest.approx(g.details["twin_gap"])
    lo, hi = g.interval(0.95)
    assert lo == pytest.approx(g.value - bias_aware_halfwidth(g.stderr, g.twin_gap[0], 0.95))
    assert hi == pytest.approx(g.value + bias_aware_halfwidth(g.stderr, g.twin_gap[1], 0.95))
    for method in ("mes", "mle"):
        assert rsp.estimate("hit@10", s, method=method).twin_gap is None
    # a correction table's interval reaches as far as its plug-in bias, each way (details["table_bias"])
    b = rsp.estimate("hit@10", s, method="bv_mle")
    assert b.twin_gap == (abs(b.details["table_bias"]), abs(b.details["table_bias"]))



def test_auto_interval_spans_gmods_bias_just_above_a_coarse_resolution():
    """K = 100 just above the resolution b = 96.2 (n = 2,000, m = 20): ``auto`` runs ``gmod``, whose smooth prior
    puts too little mass just inside K even in a smooth world (P(R) ~ R^-0.5, 600 positives): a bias of several
    Monte Carlo standard errors. About one positive sits at each rank near K there, so twins that move positives
    one rank gained about 1/N (0.001: coverage 10 of 12 on these seeds); twins that move them several ranks within
    the same Hellinger budget span the bias, and every interval holds the users' exact value."""
    n, m, k = 2000, 20, 100
    p = np.arange(1, n + 1, dtype=np.float64) ** -0.5
    exact_ranks = torch.from_numpy(np.random.default_rng(0).choice(np.arange(1, n + 1), size=600, p=p / p.sum()))
    exact = float((exact_ranks <= k).double().mean())
    values, gaps, held = [], [], []
    for seed in range(12):
        sampled = simulate_sampled_ranks(exact_ranks, n, m, "binomial", torch.Generator().manual_seed(seed))
        est = rsp.estimate(f"hit@{k}", rsp.SampledRanks.from_arrays(sampled, torch.full_like(exact_ranks, n), m,
                                                                   rsp.SamplingDesign(m)))
        assert est.details["auto"]["method"] == "gmod" and est.twin_gap is not None
        lo, hi = est.interval(0.95)
        values.append(est.value)
        gaps.append(est.twin_gap[1] if est.value < exact else est.twin_gap[0])
        held.append(lo <= exact <= hi)
    bias, mcse = np.mean(values) - exact, np.std(values, ddof=1) / math.sqrt(len(values))
    assert abs(bias) > 3 * mcse  # the smooth fit's bias is there
    assert np.mean(gaps) > abs(bias) + 2 * mcse  # the twins span it
    assert all(held)


# ------------------------------------------------------------------------------------------------ properties
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from _profiles import examples

FAST = settings(deadline=None, max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(se=st.floats(1e-6, 1e3), bias=st.floats(0.0, 1e3), level=st.floats(0.5, 0.999),
       more=st.floats(0.0, 10.0))
def test_bias_aware_halfwidth_properties(se, bias, level, more):
    h = bias_aware_halfwidth(se, bias, level)
    z = stats.norm.ppf(0.5 + level / 2)
    assert math.isfinite(h)
    assert z * se * (1 - 1e-9) <= h <= (bias + z * se) * (1 + 1e-9)
    assert bias_aware_halfwidth(se, bias + more * se, level) >= h * (1 - 1e-12)  # a larger shift, no narrower
    # the interval value -+ h covers a N(bias, se) estimate with probability level (within float precision)
    covered = stats.norm.cdf((h - bias) / se) - stats.norm.cdf((-h - bias) / se)
    assert covered == pytest.approx(level, abs=1e-7)


@FAST
@given(n=st.integers(30, 400), m=st.integers(5, 150), n_pos=st.integers(30, 400), power=st.floats(0.3, 1.5),
       seed=st.integers(0, 2**31 - 1), law=st.sampled_from(["binomial", "hypergeometric"]),
       metric=st.sampled_from(["hit@5", "hit@10", "ndcg@10", "mrr", "ap"]))
def test_twin_gap_properties(n, m, n_pos, power, seed, law, metric):
    """On any smooth histogram: the gap is finite and >= 0 each way, grows with the budget, cannot move the users'
    value outside the metric's range, and is at most the budget times the best metric change per unit cost."""
    m = min(m, n - 1)
    r = np.arange(1, n + 1, dtype=np.float64)
    rng = np.random.default_rng(seed)
    exact = torch.from_numpy(rng.choice(np.arange(1, n + 1), size=n_pos, p=r**-power / (r**-power).sum()))
    sampled = simulate_sampled_ranks(exact, n, m, law, torch.Generator().manual_seed(seed % 1000))
    dist = fit_rank_distribution(sampled_rank_histogram(sampled, n, m), registry.Gmod(n_bootstrap=0), sampling=law)
    spec = parse_metric(metric)
    small, big = np.array(dist.twin_gap(spec, 0.005)), np.array(dist.twin_gap(spec, 0.05))
    assert np.all(np.isfinite(big))
    if law == "binomial":  # every rank >= 2 can give every r~ >= 2: posterior mass near K, a gap each way
        assert np.all(small > 0)  # (without replacement a near-exhaustive draw pins ranks: a gap of 0 is right)
    assert np.all(big >= small - 1e-15)
    users = dist.metric(spec, target="users").value
    assert big[0] <= users + 1e-12 and big[1] <= 1.0 - users + 1e-12
    # one positive moved changes the users' metric by at most 1/N and costs at least the cheapest one-rank move's
    # H^2 (a move's cost grows with its distance; positive: m >= 1 draws see every move): the budget buys at most
    # budget / that many positives
    first, last = rd._twin_ranks(spec, n, (n - 1) / (m + 1) + 1)
    ranks = np.arange(first, last, dtype=np.float64)
    cheapest = float(np.min(rd._move_h2(dist.details["sampling"], n, m, ranks, ranks + 1)))
    assert cheapest > 0
    assert np.all(big <= 0.05 / cheapest / n_pos + 1e-12)


@FAST
@given(value=st.floats(0.0, 1.0), se=st.one_of(st.floats(0.0, 2.0), st.just(math.inf)), down=st.floats(0.0, 2.0),
       up=st.floats(0.0, 2.0), level=st.floats(0.5, 0.999))
def test_interval_with_a_twin_gap_stays_in_range_and_holds_the_sampling_interval(value, se, down, up, level):
    """Every point estimate() builds lies in the metric's range (``_estimate.in_range``): there the interval never
    leaves the range, and the twins only widen it."""
    est = Estimate(value, se, 100, twin_gap=(down, up), metric_range=(0.0, 1.0))
    lo, hi = est.interval(level)
    s_lo, s_hi = est.sampling_interval(level)
    assert not (math.isnan(lo) or math.isnan(hi))
    assert 0.0 <= lo <= hi <= 1.0
    assert lo <= s_lo and hi >= s_hi  # the twins only widen
