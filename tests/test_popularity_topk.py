"""Top-K metrics under popularity sampling: the per-positive popularity classes every draw keeps,
the estimator ``pl_fit`` (a rank-distribution fit whose likelihood reads which drawn items beat each positive, under
a Plackett-Luce model of the items above it; docs/popularity.md), its intervals and refusals.

Oracles: brute-force counts of the drawn items on a small catalogue; synthetic catalogues whose rankings are drawn
from the model itself (exact ranks, weights and beta known); the uniform-design fit on the same ranks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import metric_values, popularity, registry
from reco_sampled_plugin._popularity import POP_BINS, weight_bins
from reco_sampled_plugin.design import SamplingDesign

from _popularity_helpers import factor_world  # noqa: E402  (tests/ is on sys.path)


# ------------------------------------------------------------------------------------ the statistics kept
def test_class_counts_match_a_brute_force_count():
    """profile = the row's drawable candidates per class; beat_bins / miss_bins = the DISTINCT drawn items per class
    that beat the positive or not (an item drawn twice counts once), for every positive of every row."""
    g = torch.Generator().manual_seed(0)
    n, rows = 60, 40
    w = torch.randint(1, 300, (n,), generator=g).double()
    scores = torch.randn(rows, n, generator=g, dtype=torch.float64)
    perm = torch.stack([torch.randperm(n, generator=g)[:5] for _ in range(rows)])
    pos, exc = perm[:, :2], perm[:, 2:]
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(30, popularity=w), exclude=exc, generator=g)
    st = s.popularity_stats
    cls = weight_bins(w).numpy()
    assert cls.min() == 0 and cls.max() == POP_BINS - 1  # the smallest and largest weights end the classes
    for r in range(rows):
        forb = set(pos[r].tolist()) | {e for e in exc[r].tolist() if e >= 0}
        drawable = [j for j in range(n) if j not in forb]
        prof = np.bincount(cls[drawable], minlength=POP_BINS)
        for p in range(2):
            np.testing.assert_array_equal(st.profile[r, p].numpy(), prof)
            items = sorted(set(s.negatives[r, p].tolist()))
            beat = [j for j in items if scores[r, j] > scores[r, pos[r, p]]]
            miss = [j for j in items if j not in beat]
            np.testing.assert_array_equal(st.beat_bins[r, p].numpy(), np.bincount(cls[beat], minlength=POP_BINS))
            np.testing.assert_array_equal(st.miss_bins[r, p].numpy(), np.bincount(cls[miss], minlength=POP_BINS))


def test_weight_bins_equal_weights_and_zero_weights():
    assert weight_bins(torch.ones(7)).tolist() == [0] * 7
    c = weight_bins(torch.tensor([0.0, 1.0, math.e ** 16, math.e ** 8.5]))
    assert c.tolist() == [0, 0, POP_BINS - 1, POP_BINS // 2]


# ------------------------------------------------------------------------------- synthetic known truth
def _model_catalogue(seed: int, users: int = 200, n: int = 300, beta: float = 1.0, alpha: float = 1.0):
    """Items with Zipf counts, weights count^alpha; each user's ranking is Plackett-Luce with weights w^beta
    (exponential clocks), and its positive sits at a rank drawn from a known heavy-headed law: the model holds."""
    rng = np.random.default_rng(seed)
    counts = np.floor(2000.0 / np.arange(1, n + 1) ** 0.9) + 1.0
    w = counts ** alpha
    clocks = rng.exponential(size=(users, n)) / w[None, :] ** beta  # smaller clock: ranked higher
    order = np.argsort(clocks, axis=1)
    exact = np.minimum(np.ceil(rng.pareto(0.8, size=users) * 6.0), n - 1).astype(np.int64)  # 1-based rank
    pos = order[np.arange(users), exact - 1]
    scores = np.empty((users, n))
    scores[np.arange(users)[:, None], order] = -np.arange(n, dtype=np.float64)[None, :]
    return torch.from_numpy(scores), torch.from_numpy(pos).view(-1, 1), torch.from_numpy(w), exact


def test_pl_fit_recovers_top_k_metrics_where_the_model_holds():
    """Rankings drawn from the model (beta = 1.5: popularity-biased), m = 50, 3 seeded repeats: HR@10 and NDCG@10
    within 20% of the exact value on average (the sampling sd of 200 positives' HR@10 is ~8%), the interval
    covering the exact value in every repeat, and the fitted depth's beta within 0.5 of the truth."""
    beta = 1.5
    errs, cover, betas, truths = {"hit@10": [], "ndcg@10": []}, {"hit@10": 0, "ndcg@10": 0}, [], {}
    for seed in range(3):
        scores, pos, w, _ = _model_catalogue(seed, beta=beta)
        exact = rsp.exact_ranks(scores, pos, count_other_positives=False).view(-1)
        g = torch.Generator().manual_seed(100 + seed)
        s = rsp.sampled_ranks(scores, pos, SamplingDesign(50, popularity=w), generator=g)
        for metric in errs:
            truth = float(metric_values(metric, exact, torch.full_like(exact, scores.shape[1])).double().mean())
            truths.setdefault(metric, []).append(truth)
            e = rsp.estimate(metric, s, method="pl_fit")
            errs[metric].append(e.value / truth - 1.0)
            lo, hi = e.interval(0.95)
            cover[metric] += lo <= truth <= hi
            assert 0.0 <= lo <= e.value <= hi <= 1.0
        betas.append(e.details["beta"])
    for metric in errs:
        assert abs(np.mean(errs[metric])) < 0.2, (metric, errs[metric], truths[metric])
        assert cover[metric] == 3, (metric, cover[metric])
    deep = [b[1] for b in betas]
    assert abs(np.median(deep) - beta) <= 0.5, betas


def test_pl_fit_beats_the_uncorrected_metric_and_hh_stays_unbiased_on_auc():
    """The uncorrected popularity-sampled HR@10 is several times the exact one (popularity sampling draws the items
    a biased recommender ranks high); pl_fit is far closer, and its interval holds the truth."""
    scores, pos, w, _ = _model_catalogue(7, beta=1.5)
    exact = rsp.exact_ranks(scores, pos, count_other_positives=False).view(-1)
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(50, popularity=w), generator=torch.Generator().manual_seed(1))
    truth = float(metric_values("hit@10", exact, torch.full_like(exact, 300)).double().mean())
    raw = rsp.estimate("hit@10", s, method="none").value
    fit = rsp.estimate("hit@10", s, method="pl_fit")
    assert abs(fit.value - truth) < 0.5 * abs(raw - truth)
    assert "top_unresolved" in fit.flags and fit.details["interval"] == "identified"


def test_uniform_weights_reduce_to_the_uniform_binomial_fit():
    """popularity = ones: one class, beta has no effect, and the likelihood is the binomial of the uniform design on
    the distinct drawn items; pl_fit then agrees with pl_fit on the same ranks read as uniform (the binomial on all
    m draws) to 0.02 (the distinct items are ~m^2 / (2 (n - 1)) = 1.6 fewer of the 40 draws); both are smoothed NPMLEs of P(R) under the uniform binomial law, as Jin et al.'s mle / mes:
    within 4 standard errors (+ 0.02) of the exact value."""
    g = torch.Generator().manual_seed(3)
    n, users = 500, 400
    scores = torch.randn(users, n, generator=g, dtype=torch.float64)
    pos = torch.randint(0, n, (users, 1), generator=g)
    scores[torch.arange(users), pos[:, 0]] += 2.5
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(40, popularity=torch.ones(n)), generator=g)
    f = popularity.pl_fit(s)
    assert f.units.uniform and tuple(f.betas) == (0.0,)
    ranks = s.ranks.view(-1)
    exact = rsp.exact_ranks(scores, pos, count_other_positives=False).view(-1)
    for metric in ("hit@10", "ndcg@10", "auc"):
        a = rsp.estimate(metric, s, method="pl_fit").value
        b = rsp.estimate(metric, rsp.SampledRanks.from_arrays(ranks, n, 40), "pl_fit").value
        e = rsp.estimate(metric, rsp.SampledRanks.from_arrays(ranks, n, 40), "pl_fit")
        truth = float(metric_values(metric, exact, torch.full_like(exact, n)).double().mean())
        assert abs(a - b) < 0.02 and abs(b - truth) < 4 * e.stderr + 0.02, (metric, a, b, truth)


def test_several_metrics_of_one_draw_fit_once(monkeypatch):
    """The fit is kept on the draw's popularity units, which the draw returns again for equal statistics: several
    metrics estimated from one draw (and ``popularity.pl_fit`` of it, and weights equal to the default ones) fit
    once; another count term, or other weights, fit apart; an equal draw made again fits afresh, to the same values. A uniform
    sample's fit is kept on its histogram alike."""
    from reco_sampled_plugin import _popularity_fit as pf

    fits = []
    real = pf._fit
    monkeypatch.setattr(pf, "_fit", lambda units, how, count_rank: fits.append((how, count_rank)) or
                        real(units, how, count_rank))
    scores, pos, w, _ = _model_catalogue(11, users=80, n=150, beta=1.5)

    def draw() -> rsp.SampledRanks:
        return rsp.sampled_ranks(scores, pos, SamplingDesign(30, popularity=w), generator=torch.Generator().manual_seed(5))

    s = draw()
    first = [rsp.estimate(m, s, method="pl_fit") for m in ("hit@10", "ndcg@10", "hit@10")]
    assert len(fits) == 1 and first[0].value == first[2].value
    f = popularity.pl_fit(s)
    rsp.estimate("ndcg@10", s, method="pl_fit", weights=torch.ones(s.ranks.shape))  # the same units
    assert len(fits) == 1 and popularity.pl_fit(s) is f
    rsp.estimate("hit@10", s, registry.PlFit(count_term="off"))
    assert fits == [("positive", pf.COUNT_EXACT_RANK), ("positive", 0)]
    rsp.estimate("hit@10", s, method="pl_fit", weights=torch.full(s.ranks.shape, 2.0))  # other weights: other units
    assert len(fits) == 3
    other = draw()
    again = [rsp.estimate(m, other, method="pl_fit") for m in ("hit@10", "ndcg@10")]
    assert len(fits) == 4  # an equal draw, a new object: nothing kept on it
    for a, b in zip(first, again):
        assert (a.value, a.stderr, a.interval(0.95)) == (b.value, b.stderr, b.interval(0.95))
    uniform = rsp.SampledRanks.from_arrays(s.ranks.view(-1), scores.shape[1], 30)
    for m in ("hit@10", "ndcg@10"):
        rsp.estimate(m, uniform, method="pl_fit")
    assert len(fits) == 5


def _kept_world() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scores, pos, w, _ = _model_catalogue(11, users=80, n=150, beta=1.5)
    return scores, pos, w


def _draw(world: tuple[torch.Tensor, torch.Tensor, torch.Tensor], seed: int = 5) -> rsp.SampledRanks:
    scores, pos, w = world
    return rsp.sampled_ranks(scores, pos, SamplingDesign(30, popularity=w), generator=torch.Generator().manual_seed(seed))


def test_a_dropped_draw_frees_its_fit_without_garbage_collection():
    """The fit kept on a draw's units holds a copy of them that keeps nothing (no reference cycle units <-> fit):
    dropping the draw frees its fit at once, by reference counting alone (the garbage collector off), for a
    popularity draw and a uniform one (whose units are kept on its histogram)."""
    import gc
    import weakref

    world = _kept_world()
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        s = _draw(world)
        f = popularity.pl_fit(s)
        units = weakref.ref(popularity.popularity_draws(s).units)
        assert f.units.w is units().w  # the fit's units: the draw's (a copy sharing the arrays)
        fit, draw = weakref.ref(f), weakref.ref(s)
        del s, f
        assert draw() is None and units() is None and fit() is None
        uniform = rsp.SampledRanks.from_arrays(_draw(world).ranks.view(-1), world[0].shape[1], 30)
        uf = weakref.ref(popularity.pl_fit(uniform))
        assert uf() is not None  # kept on the uniform draw's histogram while it lives
        del uniform
        assert uf() is None
    finally:
        if was:
            gc.enable()


def test_units_keep_at_most_two_fits(monkeypatch):
    """A draw's units keep at most ``Units._derived_max`` = 2 fits (a fit holds about 100 times the units' data): a
    third set of options drops the least recently used fit, which is fitted again when asked for."""
    from reco_sampled_plugin import _popularity_fit as pf

    fits = []
    real = pf._fit
    monkeypatch.setattr(pf, "_fit", lambda units, how, count_rank: fits.append((how, count_rank)) or
                        real(units, how, count_rank))
    s = _draw(_kept_world())
    units = popularity.popularity_draws(s).units
    first = popularity.pl_fit(s)
    popularity.pl_fit(s, count_term="off")
    assert popularity.pl_fit(s) is first and len(fits) == 2  # both kept
    popularity.pl_fit(s, strata="none")  # a third: the least recently used ("off") goes
    assert len(units.__dict__["_kept"]) == 2 and len(fits) == 3
    assert popularity.pl_fit(s) is first and len(fits) == 3
    popularity.pl_fit(s, count_term="off")
    assert fits[-1] == ("positive", 0) and len(fits) == 4
    assert pf.Units._derived_max == 2


def test_kept_fits_units_are_read_only():
    """The units a fit is kept on are read-only (so a kept fit cannot go stale): writing into ``pl_fit(s).units``
    (a popularity draw's, a stratum's, a uniform histogram's) raises, and the next fit is the same object."""
    from reco_sampled_plugin import _popularity_fit as pf

    world = _kept_world()
    s = _draw(world)
    f = popularity.pl_fit(s)
    arrays = ("profile", "beat", "miss", "n", "m", "w", "log_v", "mean_w", "covariate")
    for u in (f.units, popularity.popularity_draws(s).units, f.units.select(np.arange(3))):
        for k in arrays:
            assert not getattr(u, k).flags.writeable, k
    with pytest.raises(ValueError, match="read-only"):
        f.units.w[:] = 2.0
    with pytest.raises(ValueError, match="read-only"):
        popularity.popularity_draws(s).units.profile[0, 0] = 1.0
    assert popularity.pl_fit(s) is f
    uniform = popularity.pl_fit(rsp.SampledRanks.from_arrays(s.ranks.view(-1), world[0].shape[1], 30))
    assert isinstance(uniform.units, pf.Units)
    with pytest.raises(ValueError, match="read-only"):
        uniform.units.w[0] = 5.0


def test_units_are_compared_bitwise_outside_the_lock(monkeypatch):
    """A draw's units are compared with the ones it returned before outside the process-wide lock (other threads'
    lookups do not wait on a comparison of large arrays), bit for bit: -0.0 is not 0.0, a NaN equals its own bits,
    dtype and shape count, non-contiguous arrays compare by value."""
    from reco_sampled_plugin import _kept

    real = popularity._equal_units
    held = []
    monkeypatch.setattr(popularity, "_equal_units", lambda a, b: held.append(_kept.LOCK.locked()) or real(a, b))
    s = _draw(_kept_world())
    u = popularity.popularity_draws(s).units
    assert popularity.popularity_draws(s).units is u
    assert held and not any(held)
    same = popularity._same_bits
    assert same(np.array([0.0, np.nan]), np.array([0.0, np.nan]))
    assert not same(np.array([0.0]), np.array([-0.0]))
    assert not same(np.zeros(2), np.zeros(2, dtype=np.float32)) and not same(np.zeros(2), np.zeros((2, 1)))
    x = np.arange(12.0).reshape(3, 4)
    assert same(x[:, ::2], x[:, ::2].copy()) and not same(x[:, ::2], x[:, 1::2])


# ------------------------------------------------------------------------------------------- refusals
def test_refusals_name_the_argument():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(50, 80, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 80, (50, 1), generator=g)
    with pytest.raises(ValueError, match="^method: 'pl_fit' does not support the design"):  # without replacement
        rsp.estimate(
            "hit@10",
            rsp.SampledRanks.from_arrays(torch.tensor([1, 2, 3]), 80, 10, rsp.SamplingDesign(10, replacement=False)),
            "pl_fit",
        )
    with pytest.raises(ValueError, match="^n_samples"):
        rsp.estimate(
            "hit@1",
            rsp.SampledRanks.from_arrays(torch.tensor([2, 1]), 5, 10, rsp.SamplingDesign(10, replacement=False)),
            "pl_fit",
        )
    wor = rsp.sampled_ranks(scores, pos, SamplingDesign(10, replacement=False, popularity=torch.ones(80)), generator=g)
    with pytest.raises(ValueError, match="^method: 'pl_fit' does not support"):
        rsp.estimate("hit@10", wor, method="pl_fit")
    with pytest.raises(ValueError, match="^sampled: "):
        popularity.pl_fit(torch.tensor([1, 2]))
    w = torch.ones(80)
    w[:5] = 0.0  # drawable items of weight 0: never drawn, the count above is not identified
    zero = rsp.sampled_ranks(scores, pos, SamplingDesign(10, popularity=w), generator=g)
    with pytest.raises(ValueError, match="^popularity: "):
        rsp.estimate("ndcg@10", zero, method="pl_fit")
    with pytest.raises(ValueError, match="^design: "):
        rsp.SampledRanks.from_arrays(torch.tensor([1, 2]), 80, 10, SamplingDesign(10, popularity=w))
    ok = rsp.sampled_ranks(scores, pos, SamplingDesign(10, popularity=torch.ones(80) + torch.arange(80.0)), generator=g)
    with pytest.raises(ValueError, match="^top_shape: "):  # the uniform law's shape option would be ignored silently
        rsp.estimate("hit@10", ok, rsp.registry.PlFit(top_shape=rsp.identification.TopShape(gamma=2.0)))


def test_registry_entry_declares_popularity_and_its_metrics():
    e = registry.get("pl_fit")
    assert e.popularity and not e.without_replacement and e.family == "popularity_fit"
    design = SamplingDesign(10, popularity=torch.ones(5))
    assert "pl_fit" in registry.names(design=design, metric="ndcg@10")
    assert set(registry.names(design=design, metric="hit@10")) == {"auto", "none", "pl_fit"}  # auto runs pl_fit


def test_evaluate_factors_corrects_top_k_with_pl_fit():
    """Factor models draw through the same helper, so their statistics carry the popularity classes: pl_fit's
    NDCG@10 from ``evaluate_factors`` equals ``estimate`` on the SampledRanks it keeps."""
    train, test, a, b, design = factor_world()
    res = rsp.evaluate_factors(train, test, a, b, metrics=["ndcg@10"], n_samples=design, method="pl_fit",
                               as_df=False)
    ev = res.sampled
    assert ev.popularity_stats.profile.shape == ev.sampled_ranks.shape + (16,)
    again = rsp.estimate("ndcg@10", rsp.SampledRanks(ev.sampled_ranks, ev.n_candidates, None, design,
                                                     popularity_stats=ev.popularity_stats), method="pl_fit")
    row = res.summary["NDCG@10"]
    assert row["corrected"] == pytest.approx(again.value, rel=1e-12)
