"""pl_fit's niche-top test: where a recommender's top is LESS popularity-tilted than its depth
(beta_top < beta_deep), the constrained fit (beta_top >= beta_deep) overestimates HR@10 / NDCG@10; a one-sided
likelihood-ratio test of the constraint flags it (``details["niche_top"]``), the interval covers both branches, and
with ``niche="hedge"`` the value is the hedge of the constrained and free fits (docs/popularity.md, "Top-K metrics:
pl_fit"; the study: docs/research-notes.md, "Niche tops: the test, and the hedge").

Oracle: synthetic catalogues whose rankings are drawn from the model itself, a sequential Plackett-Luce ranking whose
tilt beta(r) runs linearly in log r from beta_top at r = 1 to beta_deep at r = 200 (the fit's parametrisation), the
positive at a rank from a known heavy-headed law: exact ranks, weights and both tilts known.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import metric_values, popularity
from reco_sampled_plugin._popularity_fit import NICHE_LR_CRITICAL, z_value
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.metric_names import parse_metric

from _popularity_helpers import tilted_world  # noqa: E402  (tests/ is on sys.path)

METRICS = ("hit@10", "ndcg@10")


def _world(seed: int, beta_top: float, beta_deep: float):
    """(scores, positives, weights) of 200 users ranking 300 Zipf-weighted items by the model's tilt curve
    (``_popularity_helpers.tilted_world``)."""
    return tilted_world(seed, beta_top, beta_deep)


def _draw(seed: int, beta_top: float, beta_deep: float, m: int = 50):
    scores, pos, w = _world(seed, beta_top, beta_deep)
    exact = rsp.exact_ranks(scores, pos, count_other_positives=False).view(-1)
    sampled = rsp.sampled_ranks(scores, pos, SamplingDesign(m, popularity=w),
                                generator=torch.Generator().manual_seed(100 + seed))
    truth = {s: float(metric_values(s, exact, torch.full_like(exact, scores.shape[1])).double().mean())
             for s in METRICS}
    return sampled, truth


def _constrained(f, spec):
    """The constrained branch alone (the estimator before the niche test): value and 95% interval."""
    value, se, _ = f.estimate(spec, f.best_constrained)
    lo, hi, _ = f.bounds(spec, f.curve_set_constrained)
    return value, max(0.0, lo - z_value(0.95) * se), min(1.0, hi + z_value(0.95) * se)


@pytest.fixture(scope="module")
def niche_draws():
    """A niche top: beta_top = 0 (popularity-blind) over a depth at beta_deep = 2, m = 50, three seeds."""
    return [_draw(seed, 0.0, 2.0) for seed in range(3)]


@pytest.mark.parametrize("count_term, hedge_bound", [("off", 0.25), ("on", 0.30)])
def test_niche_top_is_detected_and_the_hedge_beats_the_constrained_fit(niche_draws, count_term, hedge_bound):
    """On a niche top the test rejects beta_top >= beta_deep in every repeat (LR far above its critical value,
    the free fit's top below its depth); the constrained fit (``niche="constrained"``, flagged) overestimates NDCG@10
    by more than 25% on average (its mean |relative error| ~0.34 without the count term, ~0.42 with it) and its own
    interval misses the truth, while the new interval covers it and the hedge (the default, ``niche="hedge"``) is
    closer for both metrics: NDCG@10 within 25% without the count term (~0.20) and 30% with it (the default: ~0.27),
    and the free branch alone within 15% (the well-specified case identifies the tilt); the new interval covers in
    every repeat."""
    new, old, free = ({s: [] for s in METRICS} for _ in range(3))
    old_cover, new_cover = {s: 0 for s in METRICS}, {s: 0 for s in METRICS}
    # each draw's fits are kept on its popularity units, which the draw (the module's fixture) keeps: the hedge test
    # below finds seed 0's default fit there (``_popularity_fit.fit``, ``popularity.popularity_draws``)
    for sampled, truth in niche_draws[::-1]:
        f = popularity.pl_fit(sampled, count_term=count_term)
        assert f.niche and f.niche_lr > 2 * NICHE_LR_CRITICAL, f.niche_lr
        top, deep = f.beta_of(f.best_free)
        assert top < deep, (top, deep)
        for s in METRICS:
            spec = parse_metric(s)
            d = rsp.estimate(s, sampled, rsp.registry.PlFit(niche="constrained", count_term=count_term))
            e = rsp.estimate(s, sampled, rsp.registry.PlFit(niche="hedge", count_term=count_term))
            assert rsp.estimate(s, sampled, rsp.registry.PlFit(count_term=count_term)).value == e.value  # the default
            assert d.details["niche_top"] is True and e.details["niche_top"] is True
            assert d.details["identified"] == e.details["identified"]  # the option moves the value (and stderr) only
            new[s].append(abs(e.value / truth[s] - 1))
            lo, hi = e.interval(0.95)
            new_cover[s] += lo <= truth[s] <= hi
            v, clo, chi = _constrained(f, spec)
            assert d.value == v and d.details["branch_values"][0] == v
            old[s].append(abs(v / truth[s] - 1))
            old_cover[s] += clo <= truth[s] <= chi
            free[s].append(abs(f.estimate(spec, f.best_free)[0] / truth[s] - 1))
    assert np.mean(old["ndcg@10"]) > 0.25 and np.mean(new["ndcg@10"]) < hedge_bound, (old, new)
    assert old_cover["ndcg@10"] == 0, old_cover  # the constrained interval misses the niche top
    for s in METRICS:
        assert np.mean(new[s]) < np.mean(old[s]), (s, old[s], new[s])
        assert np.mean(free[s]) < 0.15, (s, free[s])
        assert new_cover[s] == 3, (s, new_cover[s])


def test_the_hedge_is_the_harmonic_mean_of_the_branches(niche_draws):
    """Where the test rejects, ``niche="hedge"`` gives 2 a b / (a + b) of the constrained (a) and free (b) branch values (the
    point that minimises the worst relative error if either branch holds), between the two, its standard error
    the larger of theirs; the interval holds both branches' values."""
    sampled, _ = niche_draws[0]
    f = popularity.pl_fit(sampled)
    for s in METRICS:
        spec = parse_metric(s)
        a, sa, _ = f.estimate(spec, f.best_constrained)
        b, sb, _ = f.estimate(spec, f.best_free)
        e = rsp.estimate(s, sampled, rsp.registry.PlFit(niche="hedge"))
        assert e.details["branch_values"] == (a, b)
        assert e.value == pytest.approx(2 * a * b / (a + b), rel=1e-12)
        assert min(a, b) <= e.value <= max(a, b)
        assert e.stderr == pytest.approx(max(sa, sb), rel=1e-12)
        lo, hi = e.interval(0.95)
        assert lo <= min(a, b) and max(a, b) <= hi
        # the harmonic mean's relative error is the same, |a - b| / (a + b), whichever branch holds: below either
        # branch's error against the other
        assert abs(e.value / a - 1) == pytest.approx(abs(a - b) / (a + b), rel=1e-9)
        assert abs(e.value / b - 1) == pytest.approx(abs(a - b) / (a + b), rel=1e-9)
        assert abs(a - b) / (a + b) <= min(abs(b / a - 1), abs(a / b - 1))


@pytest.mark.parametrize("beta_top,beta_deep,seed", [(2.0, 2.0, 0), (2.0, 2.0, 1), (3.0, 1.5, 2)])
def test_popularity_tilted_tops_keep_the_constrained_fit(beta_top, beta_deep, seed):
    """Where the top is at least as tilted as the depth the test does not reject (LR below its critical value):
    the value, standard error and fitted tilts are the constrained fit's exactly (the estimator before the test),
    within 15% of the exact HR@10 / NDCG@10, and the interval, the constrained one widened by the free branch's
    95% likelihood set, contains the constrained interval and the exact value."""
    sampled, truth = _draw(seed, beta_top, beta_deep)
    f = popularity.pl_fit(sampled)
    assert not f.niche and f.niche_lr <= NICHE_LR_CRITICAL, f.niche_lr
    assert f.best == f.best_constrained
    for s in METRICS:
        spec = parse_metric(s)
        e = rsp.estimate(s, sampled, method="pl_fit")
        v, clo, chi = _constrained(f, spec)
        assert e.value == v and e.details["beta"] == f.beta_of(f.best_constrained)
        assert rsp.estimate(s, sampled, rsp.registry.PlFit(niche="hedge")).value == v  # no rejection: nothing to hedge
        assert e.details["niche_top"] is False
        assert abs(e.value / truth[s] - 1) < 0.15, (s, e.value, truth[s])
        lo, hi = e.interval(0.95)
        assert lo <= clo + 1e-12 and chi - 1e-12 <= hi
        assert lo <= truth[s] <= hi, (s, lo, hi, truth[s])


def test_the_worlds_rank_by_numpys_own_gumbel_draws():
    """The worlds' sampler (``_popularity_helpers.tilted_world``) reads the Gumbel noise from the stream's uniforms
    with vectorised logs, in blocks of rows: its rankings, positives and weights are those of the plain loop over
    ``rng.gumbel`` (per-user tilts, 150 users: two blocks), and its stream ends where that loop's does."""
    import math

    from reco_sampled_plugin._popularity_fit import DEEP_RANK

    users, n, seed = 150, 40, 7
    top, deep = np.linspace(-1.0, 3.0, users), np.linspace(2.5, 0.0, users)
    rng = np.random.default_rng(seed)
    w = np.floor(2000.0 / np.arange(1, n + 1) ** 0.9) + 1.0
    taken = np.zeros((users, n), dtype=bool)
    order = np.empty((users, n), dtype=np.int64)
    for r in range(1, n + 1):
        b = top + (deep - top) * min(math.log(r) / math.log(DEEP_RANK), 1.0)
        j = np.where(taken, -np.inf, b[:, None] * np.log(w)[None, :] + rng.gumbel(size=(users, n))).argmax(1)
        order[:, r - 1] = j
        taken[np.arange(users), j] = True
    exact = np.minimum(np.ceil(rng.pareto(0.8, size=users) * 6.0), n - 1).astype(np.int64)
    scores, pos, weights = tilted_world(seed, top, deep, users, n)
    assert torch.equal(pos.view(-1), torch.from_numpy(order[np.arange(users), exact - 1]))
    assert torch.equal(torch.argsort(scores, dim=1, descending=True), torch.from_numpy(order))
    assert torch.equal(weights, torch.from_numpy(w))


def test_uniform_weights_have_no_niche_branch():
    """Under uniform weights beta has no effect: one curve, LR 0, no niche branch."""
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(100, 200, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 200, (100, 1), generator=g)
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(30, popularity=torch.ones(200)), generator=g)
    f = popularity.pl_fit(s)
    assert not f.niche and f.niche_lr == 0.0 and f.best_free == f.best_constrained == (0, 0)


def test_niche_option_is_checked():
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(20, 50, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 50, (20, 1), generator=g)
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(10, popularity=torch.arange(1.0, 51.0)), generator=g)
    with pytest.raises(ValueError, match="^niche"):
        rsp.estimate("hit@10", s, rsp.registry.PlFit(niche="free"))
