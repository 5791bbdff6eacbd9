"""gmod: g-modelling of log P(R) on the log-rank scale, and the users' metric (posterior means)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin._rank_hist import sampled_rank_histogram
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from reco_sampled_plugin import rank_distribution as rd, registry
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.simulate import simulate_sampled_ranks


def _smooth_ranks(n_pos: int, n: int, seed: int, power: float = 0.8) -> torch.Tensor:
    """Exact ranks from P(R) proportional to R^-power on 1..n (smooth on the log-rank scale)."""
    r = np.arange(1, n + 1, dtype=np.float64)
    p = r**-power
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.choice(np.arange(1, n + 1), size=n_pos, p=p / p.sum()))


def _population(metric: str, n: int, power: float = 0.8) -> float:
    r = torch.arange(1, n + 1)
    p = r.double() ** -power
    return float((rsp.metric_values(metric, r, n).double() * p / p.sum()).sum())


@pytest.mark.parametrize("metric", ["hit@10", "ndcg@10"])
def test_adaptive_recovers_users_and_population_values(metric):
    """Known truth: 3,000 positives from a smooth P(R), adaptive 50 -> 3,200 (resolved top). The users' value is
    within 4 standard errors of the exact metric of these users, and the population value within 10% of the
    population metric; both nearer than the fixed-m sampled metric."""
    n = 2000
    exact = _smooth_ranks(3000, n, seed=1)
    sampled = adaptive_sampled_ranks_from_exact(exact, n, rsp.SamplingDesign(50, adaptive_max=3200),
                                                generator=torch.Generator().manual_seed(2))
    est = rsp.estimate(metric, sampled, rsp.registry.Gmod(n_bootstrap=8))
    truth = float(rsp.metric_values(metric, exact, n).double().mean())
    assert est.details["target"] == "users"
    assert abs(est.value - truth) < 4 * est.stderr, (est.value, truth, est.stderr)
    assert abs(est.value / truth - 1) < 0.05
    assert est.details["population_value"] == pytest.approx(_population(metric, n), rel=0.10)
    lo, hi = est.interval(0.95)
    # where the design resolves a smooth top, the data's twins (positives one rank across K) shift the metric by
    # well under its sampling noise: the interval is at most 22% of the metric wide, a sampling interval of 20%
    # plus the twins' bias-aware margin
    down, up = est.twin_gap
    assert 0 < down < 0.5 * est.stderr and 0 < up < 0.5 * est.stderr
    assert lo <= est.value <= hi and hi - lo < 0.22 * truth
    s_lo, s_hi = est.sampling_interval(0.95)
    assert lo < s_lo and hi > s_hi


def test_users_value_is_exact_when_the_draw_ranks_everything():
    """Hypergeometric draws of all n - 1 other items give r~ = R: each posterior is a point mass on the positive's
    cell, so the users' HR@10 (cells of one rank up to 1/delta = 20) equals the exact value of these users."""
    n = 300
    exact = _smooth_ranks(400, n, seed=3)
    draws = simulate_sampled_ranks(exact, n, n - 1, "hypergeometric", torch.Generator().manual_seed(0))
    assert torch.equal(draws, exact)
    dist = fit_rank_distribution(sampled_rank_histogram(draws, n, n - 1), registry.Gmod(n_bootstrap=0),
                                 sampling="hypergeometric")
    got = dist.metric("hit@10", target="users")
    truth = float(rsp.metric_values("hit@10", exact, n).double().mean())
    assert got.value == pytest.approx(truth, abs=1e-9)
    assert got.stderr == pytest.approx(0.0, abs=1e-9)  # nothing left open about these users
    assert got.details["population_value"] != pytest.approx(truth, abs=1e-9)  # the smooth fit is not the sample


def test_users_target_of_any_fit_and_bad_target():
    exact = _smooth_ranks(500, 500, seed=4)
    draws = simulate_sampled_ranks(exact, 500, 50, "binomial", torch.Generator().manual_seed(1))
    dist = fit_rank_distribution(sampled_rank_histogram(draws, 500, 50), registry.Mes(n_bootstrap=4))
    pop = dist.metric("ndcg@10")
    users = dist.metric("ndcg@10", target="users")
    assert pop.value == users.details["population_value"]
    assert "target" not in pop.details and users.value != pop.value
    with pytest.raises(ValueError, match="^target"):
        dist.metric("ndcg@10", target="everyone")


def test_batched_fits_equal_single_fits():
    exact = _smooth_ranks(600, 800, seed=5)
    hists = [rsp.sampled_rank_histogram(simulate_sampled_ranks(exact, 800, 100, "binomial",
                                                               torch.Generator().manual_seed(s)), 800, 100)
             for s in range(3)]
    batch = rd.fit_rank_distribution(hists, "gmod")
    for h, b in zip(hists, batch):
        single = rd.fit_rank_distribution(h, registry.Gmod(n_bootstrap=0))
        np.testing.assert_allclose(b.probs, single.probs, rtol=1e-10, atol=1e-14)


def test_fits_one_by_one_carry_no_reference():
    """Histograms of different group structures are fitted one by one, as the batch does: the same probabilities
    as single fits, and no second (reference) fit, which only the users' standard error of a single fit reads."""
    exact = _smooth_ranks(600, 800, seed=7)
    hists = [rsp.sampled_rank_histogram(simulate_sampled_ranks(exact, 800, m, "binomial",
                                                               torch.Generator().manual_seed(m)), 800, m)
             for m in (50, 100)]
    batch = rd.fit_rank_distribution(hists, "gmod")
    for h, b in zip(hists, batch):
        single = rd.fit_rank_distribution(h, registry.Gmod(n_bootstrap=0))
        np.testing.assert_allclose(b.probs, single.probs, rtol=1e-10, atol=1e-14)
        assert b.reference is None and single.reference is not None
        assert "reference_method" not in b.details and single.details["reference_method"] == "mes"


def test_options_validated_and_only_for_gmod():
    exact = _smooth_ranks(200, 400, seed=6)
    draws = simulate_sampled_ranks(exact, 400, 20, "binomial", torch.Generator().manual_seed(0))
    a = rsp.estimate(
        "hit@10",
        rsp.SampledRanks.from_arrays(draws, 400, 20),
        rsp.registry.Gmod(df=6, penalty=0.0, n_bootstrap=0),
    )
    b = rsp.estimate(
        "hit@10",
        rsp.SampledRanks.from_arrays(draws, 400, 20),
        rsp.registry.Gmod(df=14, penalty=10.0, n_bootstrap=0),
    )
    assert a.value != b.value and math.isfinite(a.value) and math.isfinite(b.value)
    for bad, match in ((dict(df=3), "^df"), (dict(df=2.5), "^df"), (dict(penalty=-1.0), "^penalty"),
                       (dict(penalty=math.nan), "^penalty"), (dict(df="10"), "^df")):
        with pytest.raises(ValueError, match=match):
            rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(draws, 400, 20), rsp.registry.Gmod(**bad))
    with pytest.raises(ValueError, match="df"):
        rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(draws, 400, 20), rsp.registry.Mes(df=10))
    with pytest.raises(ValueError, match="penalty"):
        rd.fit_rank_distribution(sampled_rank_histogram(draws, 400, 20), registry.Mle(penalty=1.0))


def test_penalty_zero_approaches_the_unsmoothed_fit_and_large_penalty_a_power_law():
    """The penalty acts on second differences only: a huge penalty leaves log P(R) linear in log R (a power law,
    which the B-spline basis represents exactly), fitted to the data's slope."""
    n = 1000
    exact = _smooth_ranks(3000, n, seed=7, power=1.1)
    draws = simulate_sampled_ranks(exact, n, 200, "binomial", torch.Generator().manual_seed(0))
    dist = fit_rank_distribution(sampled_rank_histogram(draws, n, 200), registry.Gmod(penalty=1e6, n_bootstrap=0))
    mid = (dist.edges[:-1] + dist.edges[1:] + 1) / 2.0
    dens = dist.probs / np.diff(dist.edges)
    slope = np.polyfit(np.log(mid), np.log(dens), 1)[0]
    assert slope == pytest.approx(-1.1, abs=0.15)


def test_model_term_is_half_the_gap_to_the_mes_prior():
    """The users' standard error adds a model term: half the difference between the users' value under gmod's
    prior and under mes fitted to the same histogram (what no bootstrap of one fit sees); se^2 is the sum of
    the three parts' squares; the interval of a smooth truth still covers and stays narrower than mes's."""
    n = 2000
    exact = _smooth_ranks(3000, n, seed=4)
    sampled = adaptive_sampled_ranks_from_exact(exact, n, rsp.SamplingDesign(50, adaptive_max=3200),
                                                generator=torch.Generator().manual_seed(5))
    hist = rsp.sampled_rank_histogram(sampled.ranks, sampled.n_candidates, sampled.n_samples)
    dist = rd.fit_rank_distribution(hist, registry.Gmod(n_bootstrap=8))
    mes = rd.fit_rank_distribution(hist, registry.Mes(n_bootstrap=0))
    assert dist.details["reference_method"] == "mes"
    np.testing.assert_allclose(dist.reference, mes.probs, rtol=0, atol=1e-12)
    for metric in ("hit@10", "ndcg@10"):
        est = dist.metric(metric, target="users")
        under_mes = mes.metric(metric, target="users").value  # the users' value under the mes prior
        parts = est.details["stderr_parts"]
        assert parts["model"] == pytest.approx(0.5 * abs(under_mes - est.value), rel=1e-12)
        assert est.stderr == pytest.approx(math.sqrt(sum(v * v for v in parts.values())), rel=1e-12)
        truth = float(rsp.metric_values(metric, exact, n).double().mean())
        assert abs(est.value - truth) < 1.96 * est.stderr
        mes_est = rsp.estimate(metric, sampled, method="mes")
        assert 1.96 * est.stderr < 1.96 * mes_est.stderr  # still narrower than mes's own interval here


def test_tiny_weights_give_the_limit_not_an_error():
    """Frequency weights of any scale a float64 holds: gmod's posterior variance divided the weighted sum by the
    squared total, which underflows to 0 below ~1e-154 (a ZeroDivisionError at weights of 1e-200); the value at
    1e-300 equals that at 1e-20 (the scale where the data's pull on the prior has vanished), its stderr inf (fewer
    than one instance: flagged)."""
    g = torch.Generator().manual_seed(0)
    s = rsp.SampledRanks.from_arrays(torch.randint(1, 102, (200,), generator=g), 1000, 100)
    limit = rsp.estimate("ndcg@10", s, "gmod", weights=torch.full((200,), 1e-20, dtype=torch.float64))
    for w in (1e-200, 1e-300):
        e = rsp.estimate("ndcg@10", s, "gmod", weights=torch.full((200,), w, dtype=torch.float64))
        assert e.value == pytest.approx(limit.value, rel=1e-9) and math.isfinite(e.value)
        assert "few_instances" in e.flags


def test_tiny_weights_of_an_unresolved_top_give_the_whole_range():
    """The identified interval's Wilson bounds of (weighted) proportions at a total weight of 2e-298: its square
    underflowed (a ZeroDivisionError); fewer than one instance tells nothing, so the interval is the metric's whole
    range, flagged ``few_instances``."""
    h = rsp.sampled_rank_histogram(torch.tensor([1] * 100 + [2] * 50 + [3] * 50), 10**6, 2,
                                   torch.full((200,), 1e-300, dtype=torch.float64))
    e = rsp.estimate("ap", h)
    lo, hi = e.interval()
    assert "few_instances" in e.flags and "top_unresolved" in e.flags
    assert lo == pytest.approx(1e-6) and hi == 1.0
