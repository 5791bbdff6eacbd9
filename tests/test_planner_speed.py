"""The plan's fixed cost: the Monte Carlo repeats of a design fitted together
(``rank_distribution.ReplicateFits``: one pooling of the groups on the sum of the repeats, one likelihood, one
batched solver) forecast what the one-by-one fits forecast.

Oracles: ``pool_groups`` of the summed histogram (the pooling map must give its groups and counts exactly);
``fit_rank_distribution`` of their histograms on the same draws (the one-by-one path: exact for ``mle`` where the
groups agree, within the solvers' stopping tolerance for ``gmod`` and ``mes``); finite differences (the batched g-modelling
gradient); and the planner itself with ``planner._JOINT_FITS`` off (the previous path) on the same seeds.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import numpy as np
import pytest
import torch

from reco_sampled_plugin import planner, registry
from reco_sampled_plugin._rank_hist import as_histogram
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.rank_distribution import ReplicateFits, fit_rank_distribution, pool_groups
from reco_sampled_plugin.ranking import SampledRanks
from reco_sampled_plugin.simulate import simulate_sampled_ranks

R, U = 6, 1000


@pytest.fixture(scope="module")
def world():
    """R draws of the exact ranks of U users (Zipf-shaped, per-user n in 2000..2499: many (n, m) groups)."""
    rng = np.random.default_rng(3)
    n_u = torch.from_numpy(rng.integers(2000, 2500, U))
    exact = torch.from_numpy(np.minimum(rng.zipf(1.5, (R, U)), 2000))
    return n_u, exact


def _draw(world, design: SamplingDesign, seed: int = 1):
    n_u, exact = world
    gen = torch.Generator().manual_seed(seed)
    if design.adaptive_max is None:
        return simulate_sampled_ranks(exact, n_u, design.n_samples, "binomial", gen), design.n_samples
    res = adaptive_sampled_ranks_from_exact(exact, n_u, design, generator=gen)
    return res.ranks, res.n_samples


METRICS = ("ndcg@10", "hit@10")


def _values(fits, method: str) -> np.ndarray:
    """(metric, draw) estimates: the value estimate() reports for ``method`` (gmod: the users' metric)."""
    target = "users" if method == "gmod" else "population"
    return np.array([d.values(METRICS, target=target) for d in fits]).T


def _one_by_one(world, sampled, sizes, method: str) -> np.ndarray:
    n_u = world[0]
    hists = [as_histogram(sampled[j], n_u, sizes if isinstance(sizes, int) else sizes[j]) for j in range(R)]
    return _values(fit_rank_distribution(hists, method), method)


def _joint(world, sampled, sizes, method: str) -> np.ndarray:
    return _values(ReplicateFits(sampled, world[0], sizes, method).fit(), method)


# ------------------------------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("design", [SamplingDesign(100), SamplingDesign(10, adaptive_max=2560),
                                    SamplingDesign(100, adaptive_max=800)], ids=str)
def test_pooling_map_is_pool_groups_of_the_sum(world, design):
    """The groups are pooled once, on the sum of the draws: the same (n, m) groups and summed counts as
    ``pool_groups`` of the summed histogram (quantile bins of n; adaptive 10 -> 2560 also pools m: 9 sizes)."""
    sampled, sizes = _draw(world, design)
    n_u = world[0]
    sz = torch.as_tensor(sizes).expand(R, U) if isinstance(sizes, int) else sizes
    whole = as_histogram(sampled.reshape(-1), n_u.repeat(R), sz.reshape(-1))
    ref, changed = pool_groups(whole, 16)
    fits = ReplicateFits(sampled, n_u, sizes, "mes")
    assert changed and fits.pooled
    np.testing.assert_array_equal(fits.model.n, ref.n_items)
    np.testing.assert_array_equal(fits.model.m, ref.n_samples)
    summed = fits.model.group_counts(fits.counts.sum(axis=0))
    assert all(np.array_equal(a, b) for a, b in zip(summed, ref.counts))
    # and each draw's counts are its own histogram's (every positive counted once, in its draw)
    np.testing.assert_array_equal(fits.counts.sum(axis=1), np.full(R, U))


def test_few_groups_are_not_pooled():
    """At most ``max_groups`` groups and 8 sizes: the single fits' groups, unpooled, and ``mle`` equal to them."""
    gen = torch.Generator().manual_seed(0)
    exact = torch.randint(1, 3001, (4, 800), generator=gen)
    n_u = torch.tensor([3000, 3100, 3200, 3300]).repeat(200)
    sampled = simulate_sampled_ranks(exact, n_u, 50, "binomial", gen)
    fits = ReplicateFits(sampled, n_u, 50, "mle")
    assert not fits.pooled
    np.testing.assert_array_equal(fits.model.n, [3000, 3100, 3200, 3300])
    joint = [d.probs for d in fits.fit()]
    single = [d.probs for d in fit_rank_distribution([as_histogram(s, n_u, 50) for s in sampled], "mle")]
    for a, b in zip(joint, single):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-15)


# --------------------------------------------------------------------------------------- the batched fits
def test_fixed_m_joint_fits_match_single_fits(world):
    """Fixed m (the draws share their groups, so the likelihood is the single fits'): ``gmod`` within 1e-4
    relative (scipy's L-BFGS-B against the batched L-BFGS, both stopped at ftol = 1e-10 on the same smooth
    10-parameter problem; measured 1e-5), ``mes`` within 0.3 sd of the estimates' spread over the draws (the
    batched solver stops by the same rule, ftol 1e-7, but not at the same point on a flat objective: measured
    0.10-0.19 sd, 0.2-1% of the value). ``mle``: the same batched EM (test_few_groups_are_not_pooled)."""
    sampled, sizes = _draw(world, SamplingDesign(50))
    for method in ("gmod", "mes"):
        joint, single = _joint(world, sampled, sizes, method), _one_by_one(world, sampled, sizes, method)
        if method == "gmod":
            np.testing.assert_allclose(joint, single, rtol=1e-4)
        else:
            assert np.all(np.abs(joint - single).max(1) <= 0.3 * single.std(axis=1, ddof=1)), (joint, single)


@pytest.mark.parametrize("method", ["mes", "gmod"])
def test_adaptive_joint_fits_match_single_fits(world, method):
    """Adaptive 50 -> 3200 (each draw's final sizes pool into other groups, so the one-by-one path fits each draw on
    its own likelihood): the joint fits, pooled once on the sum, agree with them within 0.4 sd of the spread over
    the draws (measured 0.05-0.33 sd, under 1% of the value): pooling differs by each bin's representative n only."""
    sampled, sizes = _draw(world, SamplingDesign(50, adaptive_max=3200))
    joint = _joint(world, sampled, sizes, method)
    single = _one_by_one(world, sampled, sizes, method)
    assert np.all(np.abs(joint - single).max(1) <= 0.4 * single.std(axis=1, ddof=1)), (joint, single)
    assert np.max(np.abs(joint - single) / single) < 0.02


def test_batched_g_objective_gradient():
    """The batched g-modelling objective's gradient against central finite differences, per problem."""
    from reco_sampled_plugin import rank_distribution as rd

    gen = torch.Generator().manual_seed(4)
    exact = torch.randint(1, 200, (3, 400), generator=gen) ** 2 // 40 + 1
    sampled = simulate_sampled_ranks(exact, 1000, 50, "binomial", gen)
    fits = ReplicateFits(sampled, 1000, 50, "gmod")
    basis = rd._g_basis(fits.model.edges, 10)
    evaluate = rd._g_objective_batched(fits.model, fits.counts, basis, 1.0)
    alpha = torch.randn(3, 10, generator=gen, dtype=torch.float64).numpy() * 0.3
    rows = np.arange(3)
    f, g, _ = evaluate(alpha, rows)
    h = 1e-6
    for k in range(10):
        e = np.zeros(10)
        e[k] = h
        fd = (evaluate(alpha + e, rows)[0] - evaluate(alpha - e, rows)[0]) / (2 * h)
        np.testing.assert_allclose(g[:, k], fd, rtol=1e-5, atol=1e-8)
    # and each problem's value is the single objective's (``_g_objective``) on its own counts
    for b in range(3):
        single, _ = rd._g_objective(fits.model, fits.counts[b], basis, 1.0)
        assert f[b] == pytest.approx(single(alpha[b])[0], rel=1e-12)


def test_subsets_fit_as_the_whole(world):
    """``fit(rows)`` of a subset gives the same fits as those rows of ``fit()`` (each draw stops on its own rule:
    the planner's screening fits 5 repeats, then the rest)."""
    sampled, sizes = _draw(world, SamplingDesign(50, adaptive_max=800))
    fits = ReplicateFits(sampled, world[0], sizes, "gmod")
    whole = [d.values(["ndcg@10"], target="users")[0] for d in fits.fit()]
    parts = [d.values(["ndcg@10"], target="users")[0] for d in fits.fit(range(3)) + fits.fit(range(3, R))]
    np.testing.assert_allclose(parts, whole, rtol=1e-9)


@pytest.mark.parametrize("kwargs, match", [
    (dict(sampled_ranks=torch.tensor([1, 2, 3])), "sampled_ranks"),
    (dict(sampled_ranks=torch.tensor([[1, 60]])), "sampled_ranks"),
    (dict(sampled_ranks=torch.tensor([[1, 0]])), "sampled_ranks"),
    (dict(n_items=torch.tensor([100, 100, 100])), "n_items"),
    (dict(n_items=1), "n_items"),
    (dict(n_samples=torch.tensor([[50, 50], [50, 50]])), "n_samples"),
    (dict(method="nope"), "method"),
    (dict(method="bv"), "method"),
    (dict(sampling="hypergeometric", n_items=40), "n_samples"),
])
def test_bad_input(kwargs, match):
    args = dict(sampled_ranks=torch.tensor([[1, 2]]), n_items=100, n_samples=50)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ReplicateFits(args.pop("sampled_ranks"), args.pop("n_items"), args.pop("n_samples"), **args)


def test_options_are_the_method_objects():
    """The fit options travel in the method object (checked at its construction) and reach the fits."""
    with pytest.raises(ValueError, match="^max_groups: "):
        ReplicateFits(torch.tensor([[1, 2]]), 100, 50, registry.Mes(max_groups=0))
    ranks = torch.tensor([[1, 2, 5, 9], [2, 1, 3, 30]])
    short = ReplicateFits(ranks, 100, 50, registry.Mle(max_iter=3)).fit()
    assert all(not d.converged and d.iterations == 3 for d in short)


@pytest.mark.parametrize("exact_at_cap", [False, True], ids=["joint", "one_by_one"])
def test_plan_fits_with_the_method_options(monkeypatch, exact_at_cap):
    """A plan's method object reaches its replicate fits with its options (``n_bootstrap=0``, ``trace`` off) on both paths, so
    a fit cut to 2 EM iterations forecasts other errors than the converged default (before, the fits read the
    method's name alone: ``plan(..., method=Mle(max_iter=2))`` forecast what ``Mle()`` did)."""
    from reco_sampled_plugin import rank_distribution

    seen = []
    real_joint, real_single = rank_distribution.ReplicateFits.__init__, rank_distribution.fit_rank_distribution

    def joint(self, sampled, n, m, method="mes", **kw):
        seen.append(method)
        real_joint(self, sampled, n, m, method, **kw)

    def single(hists, method="mle", **kw):  # the replicates' fits (estimate()'s, of the interval widths, apart)
        if sys._getframe(1).f_code.co_name == "_histogram_fits":
            seen.append(method)
        return real_single(hists, method, **kw)

    monkeypatch.setattr(rank_distribution.ReplicateFits, "__init__", joint)
    monkeypatch.setattr(rank_distribution, "fit_rank_distribution", single)
    design = SamplingDesign(50, adaptive_max=800, exact_at_cap=True) if exact_at_cap else SamplingDesign(50)
    kw = dict(designs=[design], repeats=4, seed=3)
    short = planner.plan(3000, 500, "ndcg@10", 0.1, method=registry.Mle(max_iter=2, trace=True), **kw)
    assert seen and all(m == registry.Mle(max_iter=2, n_bootstrap=0) for m in seen)  # a trace is of one fit: off
    seen.clear()
    full = planner.plan(3000, 500, "ndcg@10", 0.1, method="mle", **kw)
    assert seen and all(m == registry.Mle(n_bootstrap=0) for m in seen)
    assert short.forecasts[0].rel_bias != full.forecasts[0].rel_bias
    seen.clear()  # a grid of n: fitted one by one (ReplicateFits pools none), the option read
    planner.plan(3000, 500, "ndcg@10", 0.1, method=registry.Mle(max_rel_n_spread=0.5), **kw)
    assert seen and all(m == registry.Mle(max_rel_n_spread=0.5, n_bootstrap=0) for m in seen)



@pytest.mark.parametrize("rows", [[2], [-1], [0.7], [[0, 1]], ["a"]])
def test_bad_rows(rows):
    """``fit(rows)``: only draw indices 0..R - 1 (not a wrapped -1, a truncated 0.7 or a flattened 2-D list)."""
    fits = ReplicateFits(torch.tensor([[1, 2], [2, 1]]), 100, 50, "mle")
    with pytest.raises(ValueError, match="rows"):
        fits.fit(rows)
    assert len(fits.fit([])) == 0 and len(fits.fit([1, 0])) == 2


# ------------------------------------------------------------------------------------------------ the plan
def _both(monkeypatch, *args, **kwargs):
    """The plan on the joint path and on the one-by-one path (``planner._JOINT_FITS`` off), same seeds; every
    design forecast."""
    kwargs.setdefault("execution", planner.PlanExecution(forecast_all=True))
    joint = planner.plan(*args, **kwargs)
    monkeypatch.setattr(planner, "_JOINT_FITS", False)
    single = planner.plan(*args, **kwargs)
    monkeypatch.setattr(planner, "_JOINT_FITS", True)
    return joint, single


def _pick(p, target: float) -> str | None:
    """The plan's pick at another target: the cheapest forecast meeting it below full ranking (``plan``'s rule; the
    same seed gives the same forecasts whatever the target, tests/test_planner.py)."""
    ok = [f for f in p.forecasts if f.rel_error <= target and f.pairs < p.full_pairs]
    return min(ok, key=lambda f: f.pairs).label if ok else None


def _assert_same_forecasts(joint, single, *, se_share: float = 0.35):
    """The same draws (costs equal exactly, truth equal), relative errors within ``se_share`` of the forecast's
    Monte Carlo se (the fits differ by the solvers' stopping and the pooled n only; the Monte Carlo error of a
    forecast is the spread over repeats, several times larger), and the same pick, at the plan's target and at
    every target half-way between two forecasts."""
    assert joint.truth == single.truth
    assert [f.label for f in joint.forecasts] == [f.label for f in single.forecasts]
    for a, b in zip(joint.forecasts, single.forecasts):
        assert (a.mean_samples, a.pairs, a.pairs_se, a.method) == (b.mean_samples, b.pairs, b.pairs_se, b.method)
        if a.screened == b.screened:
            assert abs(a.rel_error - b.rel_error) <= se_share * b.rel_error_se, (a.label, a.rel_error, b.rel_error)
        else:  # screening's all-miss rule flipped on a replicate at the target's edge: both far from it
            assert not a.meets_target and not b.meets_target
    label = (lambda p: None if p.recommended is None else p.recommended.label)
    assert label(joint) == label(single)
    errors = sorted(f.rel_error for f in single.forecasts)
    for target in [(x + y) / 2 for x, y in zip(errors, errors[1:])]:
        assert _pick(joint, target) == _pick(single, target), target


def test_plan_small_world_same_pick(monkeypatch):
    """tests/test_planner.py's ``small_plan`` world (default family, fixed m and adaptive): the same forecasts
    and picks on both paths."""
    joint, single = _both(monkeypatch, 5000, 1500, "ndcg@10", 0.10,
                          designs=[SamplingDesign(50), SamplingDesign(1000), SamplingDesign(100, adaptive_max=3200)],
                          repeats=6, seed=2)
    _assert_same_forecasts(joint, single)


@pytest.mark.parametrize("metric", ["ndcg@10", "hit@10"])
def test_plan_adaptive_pilot_same_pick(monkeypatch, metric):
    """A plan from an adaptive pilot on per-user n (tests/test_planner.py's designs at a third of its catalogue:
    pilot 50 -> 3200, designs m = 50 and adaptive 50 -> 1600, screening off) on the world of a Zipf-ranked
    recommender: the same forecasts and picks on both paths (the adaptive design meets the target)."""
    rng = np.random.default_rng(11)
    n_u = rng.integers(3000, 3600, 600)
    r = np.minimum(rng.zipf(1.4, 600), n_u)
    gen = torch.Generator().manual_seed(2024)
    pilot = adaptive_sampled_ranks_from_exact(torch.from_numpy(r), torch.from_numpy(n_u),
                                              SamplingDesign(50, adaptive_max=3200), generator=gen)
    joint, single = _both(monkeypatch, n_u, len(n_u), metric, 0.1, pilot=pilot,
                          designs=[SamplingDesign(50), SamplingDesign(50, adaptive_max=1600)], repeats=12, seed=1,
                          target_rel_halfwidth=10.0,  # the point target decides (cap_reached widens the interval)
                          execution=planner.PlanExecution(forecast_all=True, screen=False))
    _assert_same_forecasts(joint, single)
    assert single.recommended is not None


def test_plan_screened_default_grid_same_pick(monkeypatch):
    """The default grid with screening (its first 5 repeats, then the rest from the same prepared fits) from a
    fixed-m pilot: the same forecasts and picks on both paths."""
    gen = torch.Generator().manual_seed(8)
    exact = (torch.rand(1500, generator=gen) ** 2 * 1999).long() + 1
    pilot = SampledRanks(simulate_sampled_ranks(exact, 2000, 100, "binomial", gen), torch.tensor(2000),
                         design=SamplingDesign(100))
    kwargs = dict(pilot=pilot, repeats=10, seed=4, execution=planner.PlanExecution(forecast_all=True))
    joint = planner.plan(2000, 1500, "ndcg@10", 0.1, **kwargs)
    # The grid's designs with an exact share (last) take neither path: each replicate is estimated by the difference
    # estimator (``_Replicates._shares``, chosen before ``_JOINT_FITS`` is read), so their forecasts are the same bits
    # on both paths and are planned once, here on the joint one. The one-by-one path plans the other designs: each
    # design draws from its own generator (seeded by its index) on the shared exact ranks, so their forecasts are
    # those of the whole grid, and the pick is the plan's rule (``planner._recommend``) over all of them.
    grid = [f.design for f in joint.forecasts]
    k = sum(d.exact_share is None for d in grid)
    assert 0 < k < len(grid) and all(d.exact_share is not None for d in grid[k:])
    monkeypatch.setattr(planner, "_JOINT_FITS", False)
    part = planner.plan(2000, 1500, "ndcg@10", 0.1, designs=grid[:k], **kwargs)
    monkeypatch.setattr(planner, "_JOINT_FITS", True)
    forecasts = part.forecasts + joint.forecasts[k:]
    _, recommended = planner._recommend(list(forecasts), part._replicates.n_mean, True)
    single = dataclasses.replace(part, forecasts=forecasts, recommended=recommended)
    assert any(f.screened for f in single.forecasts) and not all(f.screened for f in single.forecasts)
    _assert_same_forecasts(joint, single)


def test_plan_exact_at_cap_keeps_the_single_path(monkeypatch):
    """Designs that complete the top (``exact_at_cap``) keep the one-by-one path (exact groups): both settings
    give the very same plan."""
    kw = dict(designs=[SamplingDesign(50, adaptive_max=800, exact_at_cap=True)], repeats=4, seed=3)
    joint, single = _both(monkeypatch, 3000, 500, "ndcg@10", 0.1, **kw)
    assert [f.rel_error for f in joint.forecasts] == [f.rel_error for f in single.forecasts]


def test_binomial_logpmf_is_the_direct_formula():
    """The likelihood's binomial terms (log j! from a table, products only where non-zero, sums in place): the very
    numbers of the direct formula (gammaln per element, np.where), and scipy's binomial law within 1e-9 relative;
    0 log 0 = 0 at p = 0 and p = 1."""
    from scipy import special, stats

    from reco_sampled_plugin import rank_distribution as rd

    m = 300
    p = np.concatenate([[0.0, 1.0], np.random.default_rng(0).random((40, 8)).reshape(-1)])[None, :]
    j = np.arange(m + 1)[:, None]
    with np.errstate(divide="ignore"):
        logp, log1mp = np.log(p), np.log1p(-p)
    got = rd._binomial_logpmf(logp, log1mp, j, m)
    jf = j.astype(np.float64)
    with np.errstate(invalid="ignore"):
        direct = (math.lgamma(m + 1.0) - special.gammaln(jf + 1.0) - special.gammaln(m - jf + 1.0)
                  + np.where(jf > 0, jf * logp, 0.0) + np.where(m - jf > 0, (m - jf) * log1mp, 0.0))
    np.testing.assert_array_equal(got, direct)
    ref = stats.binom.logpmf(j, m, p)
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-9, atol=1e-9)
    assert np.all(got[~finite] == -np.inf)
    assert got[0, 0] == pytest.approx(0.0, abs=1e-9) and got[m, 1] == pytest.approx(0.0, abs=1e-9)  # probability 1
