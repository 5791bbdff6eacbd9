"""Rank-distribution estimators (mle, mes), adaptive sampling and the estimate() dispatcher."""

import math

import numpy as np
import pytest
import torch

from reco_sampled_plugin import registry, SampledRanks, SamplingDesign
from reco_sampled_plugin._rank_hist import as_histogram, sampled_rank_histogram
from reco_sampled_plugin.estimators import ESTIMATORS, estimate
from reco_sampled_plugin.metrics import metric_values
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks, adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.rank_distribution import fit_rank_distribution, rank_grid
from reco_sampled_plugin.simulate import draw_sampled_ranks, simulate_sampled_ranks

N, M, USERS = 10_000, 100, 20_000


def _exact(users=USERS, n=N, seed=0):
    """A two-part synthetic rank distribution: 40% near the top (geometric, mean 30), 60% lognormal."""
    rng = np.random.default_rng(seed)
    top = rng.geometric(1 / 30, size=int(0.4 * users))
    tail = np.exp(rng.normal(np.log(800), 1.3, size=users - top.size)).astype(np.int64) + 1
    return torch.as_tensor(np.clip(np.concatenate([top, tail]), 1, n))


@pytest.fixture(scope="module")
def data():
    exact = _exact()
    sampled = simulate_sampled_ranks(exact, N, M, generator=torch.Generator().manual_seed(7))
    return exact, sampled


@pytest.fixture(scope="module")
def mle_fit(data):
    return fit_rank_distribution(sampled_rank_histogram(data[1], N, M), registry.Mle(n_bootstrap=24, trace=True))


def test_grid_is_small_and_covers_every_rank():
    for n, m in [(10_000, 100), (10_000_000, 100), (100_000_000, 10_000)]:
        e = rank_grid(n, m)
        assert e[0] == 0 and e[-1] == n and np.all(np.diff(e) >= 1)
        assert len(e) < 2500
        np.testing.assert_array_equal(e[1:21], np.arange(1, 21))  # single ranks at the top


METRICS = ["hit@200", "hit@1000", "ndcg@500", "ndcg", "auc"]


def test_mle_recovers_known_distribution(data, mle_fit):
    exact, _ = data
    assert mle_fit.converged and np.isclose(mle_fit.probs.sum(), 1.0)
    for name in METRICS:
        res = mle_fit.metric(name)
        true = float(metric_values(name, exact, N).mean())
        assert res.stderr is not None and 0 < res.stderr < 0.05
        assert abs(res.value - true) <= 4 * res.stderr, (name, res.value, true, res.stderr)
    # the uncorrected sampled metric is far off at the same cut-offs (the estimator is doing the work)
    sampled_ndcg = float(metric_values("ndcg", data[1], M + 1).mean())
    assert abs(sampled_ndcg - float(metric_values("ndcg", exact, N).mean())) > 0.1


def test_em_loglik_never_decreases(mle_fit, data):
    tr = np.array(mle_fit.loglik_trace)
    assert len(tr) > 3
    assert np.all(np.diff(tr) >= -1e-9 * abs(tr[-1]))
    assert tr[-1] > tr[0] + 100  # it does move away from the uniform start
    hyp = fit_rank_distribution(sampled_rank_histogram(data[1][:3000], N, M), registry.Mle(n_bootstrap=0, trace=True),
                                sampling="hypergeometric")
    t2 = np.array(hyp.loglik_trace)
    assert np.all(np.diff(t2) >= -1e-9 * abs(t2[-1]))


def test_mes_objective_decreases_and_recovers(data):
    exact, sampled = data
    fit = fit_rank_distribution(sampled_rank_histogram(sampled, N, M), registry.Mes(n_bootstrap=6, trace=True))
    tr = np.array(fit.loglik_trace)
    assert fit.converged and len(tr) > 3
    assert np.all(np.diff(tr) <= 1e-12 * abs(tr[0]))
    for name in ("hit@1000", "ndcg"):
        res = fit.metric(name)
        true = float(metric_values(name, exact, N).mean())
        assert abs(res.value - true) <= 4 * res.stderr + 0.005, (name, res.value, true, res.stderr)


def test_hypergeometric_and_per_user_candidates():
    rng = np.random.default_rng(3)
    exact = _exact(8000, n=3000, seed=3)
    n_user = torch.as_tensor(rng.choice([3000, 2500, 2000], size=exact.numel()))
    exact = torch.minimum(exact, n_user)
    sampled = simulate_sampled_ranks(exact, n_user, 50, "hypergeometric", generator=torch.Generator().manual_seed(1))
    hist = sampled_rank_histogram(sampled, n_user, 50)
    assert hist.n_groups == 3
    fit = fit_rank_distribution(hist, registry.Mle(n_bootstrap=16), sampling="hypergeometric")
    assert set(fit.edges.tolist()) >= {2000, 2500, 3000}  # every n is a cell edge
    for name in ("hit@300", "ndcg"):
        res = fit.metric(name)
        true = float(metric_values(name, exact, n_user).mean())
        assert abs(res.value - true) <= 4 * res.stderr + 0.005, (name, res.value, true, res.stderr)


def test_pooling_many_candidate_counts_is_reported():
    rng = np.random.default_rng(4)
    n_user = torch.as_tensor(rng.integers(1500, 1700, size=2000))
    exact = torch.as_tensor(rng.integers(1, 1500, size=2000))
    sampled = simulate_sampled_ranks(exact, n_user, 20, generator=torch.Generator().manual_seed(2))
    fit = fit_rank_distribution(sampled_rank_histogram(sampled, n_user, 20), registry.Mle(n_bootstrap=0, max_groups=4))
    assert "pooled_n" in fit.flags and fit.histogram.n_groups <= 4
    assert fit.histogram.total == 2000


def test_prior_from_fit(mle_fit):
    p = mle_fit.prior()
    assert p.shape == (N,) and np.all(p >= 0) and p.sum() == pytest.approx(1.0)
    fn = mle_fit.as_prior()
    np.testing.assert_allclose(fn(np.arange(1, N + 1), N), mle_fit.pmf(np.arange(1, N + 1)))
    from reco_sampled_plugin import corrections

    t_vec = corrections.correction_table("hit@200", N, M, registry.Bv(gamma=0.1, prior=p)).numpy()
    t_fn = corrections.correction_table("hit@200", N, M, registry.Bv(gamma=0.1, prior=fn)).numpy()
    assert np.all(np.isfinite(t_vec)) and t_vec.shape == (M + 1,)
    np.testing.assert_allclose(t_fn, t_vec, atol=0.02)  # callable: composite quadrature of a step function
    assert mle_fit.cdf(N) == pytest.approx(1.0)
    assert mle_fit.cdf(500) == pytest.approx(p[:500].sum(), rel=1e-9)


def test_adaptive_sampling_from_exact_ranks():
    exact = _exact(10_000, seed=5)
    drawn = adaptive_sampled_ranks_from_exact(exact, N, SamplingDesign(50, adaptive_max=400),
                                              generator=torch.Generator().manual_seed(0))
    ranks, sizes = drawn.ranks, drawn.n_samples
    assert set(sizes.unique().tolist()) <= {50, 100, 200, 400}
    assert bool(((ranks == 1) <= (sizes == 400)).all())  # only capped positives stay at r~ = 1
    assert bool((ranks <= sizes + 1).all())
    plain = simulate_sampled_ranks(exact, N, 50, generator=torch.Generator().manual_seed(0))
    fit_a = fit_rank_distribution(drawn, registry.Mle(n_bootstrap=12))  # the SampledRanks carry their design
    fit_p = fit_rank_distribution(sampled_rank_histogram(plain, N, 50), registry.Mle(n_bootstrap=0))
    true = float((exact <= 50).double().mean())
    ra = fit_a.metric("hit@50")
    assert abs(ra.value - true) <= 4 * ra.stderr + 0.005
    # the positives left at r~ = 1 have 400 samples: resolution 1 + 9999/401 < 50, so the top is resolved;
    # with 50 samples it is not (resolution ~197)
    assert "top_unresolved" not in ra.flags
    assert "top_unresolved" in fit_p.metric("hit@50").flags


def test_adaptive_sampling_from_scores():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 500, generator=gen)
    positives = torch.randint(0, 500, (64, 1), generator=gen)
    scores[torch.arange(32), positives[:32, 0]] = 10.0  # half the positives score best: they hit the cap
    drawn = adaptive_sampled_ranks(scores, positives, SamplingDesign(8, adaptive_max=64), generator=gen)
    ranks, sizes = drawn.ranks, drawn.n_samples
    assert ranks.shape == (64, 1)
    assert bool((sizes[:32] == 64).all()) and bool((ranks[:32] == 1).all())
    assert bool(((ranks == 1) <= (sizes == 64)).all())
    assert bool((ranks <= sizes + 1).all()) and bool((ranks >= 1).all())


def test_blind_spot_and_bad_input():
    top = torch.ones(500, dtype=torch.int64)
    fit = fit_rank_distribution(sampled_rank_histogram(top, N, M), registry.Mle(n_bootstrap=4))
    res = fit.metric("hit@10")
    assert "all_at_top" in res.flags and "top_unresolved" in res.flags and res.stderr == math.inf
    assert math.isfinite(res.value)
    with pytest.raises(ValueError, match="empty"):
        fit_rank_distribution(sampled_rank_histogram(torch.zeros(4, dtype=torch.int64), N, M))
    with pytest.raises(ValueError, match="method"):
        fit_rank_distribution(sampled_rank_histogram(top, N, M), "magic")
    with pytest.raises(ValueError, match="^method: 'bv' does not fit a rank distribution"):
        fit_rank_distribution(sampled_rank_histogram(top, N, M), "bv")
    with pytest.raises(ValueError, match="larger than the catalogue"):
        fit.metric(f"hit@{N + 1}")
    slow = fit_rank_distribution(sampled_rank_histogram(torch.tensor([1, 5, 30, 101]), N, M),
                                 registry.Mle(n_bootstrap=0, max_iter=2))
    assert not slow.converged and "not_converged" in slow.flags
    assert "not_converged" in slow.metric("hit@1000").flags
    with pytest.raises(ValueError, match="n_samples"):
        fit_rank_distribution(sampled_rank_histogram(torch.tensor([1, 2]), 50, 60), sampling="hypergeometric")


def test_dispatcher_every_method(data):
    exact, sampled = data
    sub = sampled[:4000]
    true = float(metric_values("hit@500", exact[:4000], N).mean())
    for method in registry.names(metric="ndcg@20"):  # every method that estimates NDCG (hh: AUC only)
        kw = {"a": 0.5} if method == "beta" else {}
        if method in ("mle", "mes", "bv_mle"):
            kw["n_bootstrap"] = 4
        res = estimate("ndcg@20", SampledRanks.from_arrays(sub, N, M), registry.method_class(method)(**kw))
        assert math.isfinite(res.value) and res.stderr > 0 and res.n_instances == 4000, method
    good = estimate("hit@500", SampledRanks.from_arrays(sub, N, M), registry.Mle(n_bootstrap=8))
    assert abs(good.value - true) < 4 * good.stderr + 0.01
    with pytest.raises(ValueError, match="unknown estimator"):
        estimate("hit@10", SampledRanks.from_arrays(sub, N, M), "nope")
    with pytest.raises(ValueError, match="^n_bootstrap: method 'bound' does not use it; it takes no options"):
        estimate("hit@10", SampledRanks.from_arrays(sub, N, M), registry.Bound(n_bootstrap=3))
    with pytest.raises(ValueError, match="larger than the catalogue"):
        estimate(f"hit@{N + 5}", SampledRanks.from_arrays(sub, N, M), "bound")
    blind = estimate("hit@5", SampledRanks.from_arrays(torch.ones(50, dtype=torch.int64), N, M), "bv")
    assert blind.stderr == math.inf and "all_at_top" in blind.flags


@pytest.mark.parametrize("method", ["mes", "mle", "bv_mle"])
def test_several_metrics_from_one_histogram_fit_once(data, monkeypatch, method):
    """estimate() keeps the fitted rank distribution on the histogram, by method object and law: a second metric
    of the same histogram (or of the same SampledRanks) reuses it; an equal histogram built again fits afresh, to
    the same values; other counts or options refit."""
    from reco_sampled_plugin import rank_distribution

    hist = sampled_rank_histogram(data[1][:3000], N, M)
    fits = []
    real = rank_distribution._fit
    # the fits of the method itself (bv_mle's MLE prior is an mle fit; its table's plug-in bias, a mes fit of the
    # same ranks, is counted apart: every method object's fit once per histogram)
    counted = "mes" if method == "mes" else "mle"
    monkeypatch.setattr(rank_distribution, "_fit",
                        lambda h, m, *a, **k: (fits.append(1) if m.name == counted else None) or real(h, m, *a, **k))
    opts = {"n_bootstrap": 4}
    first = [estimate(m, hist, registry.method_class(method)(**opts)) for m in ("hit@100", "ndcg@50", "hit@100")]
    assert len(fits) == 1
    fresh = sampled_rank_histogram(data[1][:3000], N, M)  # equal counts, a new object: nothing kept on it
    again = [estimate(m, fresh, registry.method_class(method)(**opts)) for m in ("hit@100", "ndcg@50")]
    assert len(fits) == 2  # one fit per histogram, whatever the number of metrics
    for a, b in zip(first, again):
        assert (a.value, a.stderr, a.flags) == (b.value, b.stderr, b.flags)
    assert first[0].value == first[2].value
    estimate("hit@100", sampled_rank_histogram(data[1][:2999], N, M), registry.method_class(method)(**opts))  # other counts
    estimate("hit@100", hist, registry.method_class(method)(n_bootstrap=5))  # other options
    assert len(fits) == 4
    sample = SampledRanks.from_arrays(data[1][:3000], N, M)  # each estimate builds its histogram: equal ones reused
    via_sample = [estimate(m, sample, registry.method_class(method)(**opts)) for m in ("hit@100", "ndcg@50")]
    assert len(fits) == 5
    assert [(e.value, e.stderr) for e in via_sample] == [(e.value, e.stderr) for e in again]


def test_kept_fits_are_bounded_and_not_pickled(data):
    """A histogram keeps at most ``DERIVED_MAX`` fits (the least recently used goes); pickles, copies and
    ``with_design`` start without them, and compare and merge as before."""
    import copy
    import pickle

    from reco_sampled_plugin import _rank_hist

    hist = sampled_rank_histogram(data[1][:500], N, M)
    first = fit_rank_distribution(hist, registry.Mle(n_bootstrap=0))
    assert fit_rank_distribution(hist, registry.Mle(n_bootstrap=0)) is first
    for k in range(_rank_hist.DERIVED_MAX):
        fit_rank_distribution(hist, registry.Mle(n_bootstrap=0, tol=1e-6 + k * 1e-7, max_iter=3))
    assert len(hist._kept) == _rank_hist.DERIVED_MAX
    assert fit_rank_distribution(hist, registry.Mle(n_bootstrap=0)) is not first  # dropped, fitted again
    for other in (pickle.loads(pickle.dumps(hist)), copy.copy(hist), copy.deepcopy(hist), hist.with_design(None)):
        assert "_kept" not in other.__dict__ and other.same_groups(hist)
        np.testing.assert_array_equal(other.flat_counts, hist.flat_counts)
    merged = hist.merge(hist)
    np.testing.assert_array_equal(merged.flat_counts, 2 * hist.flat_counts)
    assert "_kept" not in merged.__dict__


def test_prior_beyond_the_fitted_range_extends_the_tail(mle_fit):
    """A user with more candidates than the largest fitted group: the last cell's per-rank mass carries on."""
    p = mle_fit.prior(N + 50)
    assert p.shape == (N + 50,) and p.sum() == pytest.approx(1.0)
    tail = mle_fit.pmf(np.array([N]))[0]
    base = mle_fit.pmf(np.arange(1, N + 1))
    np.testing.assert_allclose(p, np.concatenate([base, np.full(50, tail)]) / (base.sum() + 50 * tail), rtol=1e-12)
    np.testing.assert_allclose(mle_fit.as_prior()(np.array([N + 10, N + 49]), N + 50), [tail, tail])
    with pytest.raises(ValueError, match="n_items"):
        mle_fit.prior(0)


def test_bv_with_mle_prior_on_many_candidate_counts():
    """Per-user n from 900 to 1100 (more groups than the mle fit keeps, users beyond its largest n): bv_mle
    runs and is accurate."""
    from reco_sampled_plugin import estimate

    rng = np.random.default_rng(0)
    n = rng.integers(900, 1100, size=4000)
    r = np.clip(np.ceil(rng.beta(0.4, 3.0, size=4000) * n).astype(np.int64), 1, n)
    sampled = simulate_sampled_ranks(torch.as_tensor(r), torch.as_tensor(n), 100, generator=torch.Generator().manual_seed(1))
    truth = float(np.mean(r <= 50))
    res = estimate("hit@50", SampledRanks.from_arrays(sampled, torch.as_tensor(n), 100), "bv_mle")
    assert np.isfinite(res.value) and np.isfinite(res.stderr)
    # the sampling noise of HR@50 itself is sqrt(p (1 - p) / 4000) ~ 0.007; bias of bv stays within a few of it
    assert abs(res.value - truth) < 5 * res.stderr + 0.01


def test_mle_bootstrap_stderr_is_calibrated():
    """Over 30 independent samplings the bootstrap standard error of mle matches the actual spread of the
    estimates (each replicate reruns the whole early-stopped EM from the uniform start). The sd of 30
    values has a relative standard error of ~13%, so the ratio must lie in 0.6..1.6 (3-4 sigma)."""
    rng = np.random.default_rng(1)
    n, m = 2000, 100
    exact = torch.as_tensor(np.clip(np.ceil(rng.beta(0.5, 4.0, size=5000) * n).astype(np.int64), 1, n))
    values, ses = [], []
    for rep in range(30):
        s = simulate_sampled_ranks(exact, n, m, generator=torch.Generator().manual_seed(rep))
        fit = fit_rank_distribution(sampled_rank_histogram(s, n, m), registry.Mle(n_bootstrap=32, seed=rep))
        r = fit.metric("hit@100")
        values.append(r.value)
        ses.append(r.stderr)
    ratio = float(np.mean(ses)) / float(np.std(values, ddof=1))
    assert 0.6 < ratio < 1.6, ratio
    truth = float((exact <= 100).double().mean())
    assert abs(np.mean(values) - truth) < 3 * np.std(values, ddof=1) / np.sqrt(30) + 0.01


@pytest.mark.parametrize("method", ["mes", "mle", "bv", "none", "bound"])
def test_zero_weight_and_empty_groups_do_not_move_estimates(method):
    """A positive of weight 0 (or an (n, m) group of total 0) is not data: the estimate equals the one without
    it (its n used to stretch the rank grid of mes: 0.34 -> 0.999)."""
    from reco_sampled_plugin import RankHistogram, estimate

    r, n = torch.tensor([1, 2, 3, 2, 4]), torch.tensor([10, 10, 10, 12, 12])
    base = estimate("recall@3", SampledRanks.from_arrays(r, n, 3), method)
    padded = estimate(
        "recall@3",
        SampledRanks.from_arrays(torch.cat([r, torch.tensor([3])]), torch.cat([n, torch.tensor([5000])]), 3),
        method,
        weights=torch.tensor([1.0] * 5 + [0.0]),
    )
    assert padded.value == pytest.approx(base.value, rel=1e-12) and padded.stderr == pytest.approx(base.stderr, rel=1e-9)
    c = np.array([1.0, 2.0, 1.0, 0.0])
    h = RankHistogram(np.array([10]), np.array([3]), (c,))
    with_empty = RankHistogram(np.array([10, 5000]), np.array([3, 3]), (c, np.zeros(4)))
    assert estimate("recall@3", with_empty, method=method).value == pytest.approx(estimate("recall@3", h, method=method).value, rel=1e-12)


def test_histogram_copies_its_inputs_and_few_instances_are_flagged():
    """A histogram never changes after it is built (the estimators cache fits by its bytes), and a total weight of
    at most 1 gives an infinite standard error with a flag, never NaN."""
    from reco_sampled_plugin import RankHistogram, estimate
    from reco_sampled_plugin.estimators import ESTIMATORS

    c = np.array([3.0, 2.0, 1.0, 0.0])
    h = RankHistogram(np.array([50]), np.array([3]), (c,))
    before = estimate("recall@2", h, method="mle").value
    c[:] = [0.0, 0.0, 1.0, 5.0]  # the caller reuses its array
    assert h.counts[0].tolist() == [3.0, 2.0, 1.0, 0.0] and h.total == 6.0 and not h.counts[0].flags.writeable
    assert estimate("recall@2", h, method="mle").value == before
    assert set(ESTIMATORS) - set(registry.names(metric="recall@2")) == {"hh"}  # AUC only
    for method in registry.names(metric="recall@2"):
        extra = {"a": 0.5} if method == "beta" else {}
        e = estimate(
            "recall@2",
            SampledRanks.from_arrays(torch.tensor([1, 2, 3, 1]), 50, 3),
            registry.method_class(method)(**extra),
            weights=torch.full((4,), 0.1),
        )
        assert math.isfinite(e.value) and e.stderr == math.inf and "few_instances" in e.flags, method


def test_likelihood_on_occupied_columns_equals_the_dense_law():
    """The fit's likelihood holds only the occupied (group, r~) columns, evaluated pointwise (binomial) or cut
    from whole rows (hypergeometric): every column equals the dense law of ``dense_likelihood`` at that column."""
    from reco_sampled_plugin.rank_distribution import _build_model, dense_likelihood

    rng = np.random.default_rng(4)
    n = rng.integers(300, 900, size=400)
    m = rng.choice([10, 20, 40], size=400)
    exact = np.minimum(rng.geometric(0.02, size=400), n)
    for law in ("binomial", "hypergeometric"):
        r = draw_sampled_ranks(exact, n, m, sampling=law, repeats=1, seed=1)[0]
        hist = as_histogram(r, n, m)
        model = _build_model(hist, law, 16, 0.05, 0.25)
        dense, inside = dense_likelihood(model.edges, model.n, model.m, law)
        dense[dense < 1e-16] = 0.0
        g, i = model.cols[:, 0], model.cols[:, 1]
        np.testing.assert_allclose(model.lik, dense[g, :, i].T, rtol=1e-10, atol=1e-300)
        np.testing.assert_array_equal(model.inside, inside)
        # the columns are exactly the occupied ones, and the flat counts rebuild the pooled histogram
        assert np.all(model.counts > 0) and model.counts.sum() == pytest.approx(hist.total)


def test_adaptive_fit_likelihood_equals_the_dense_law():
    """Adaptive sampled ranks (m doubling 50 -> 1600, six groups): the log-likelihood of the fit on the occupied
    columns equals the log-likelihood under the dense law over every r~ column (brute force)."""
    from reco_sampled_plugin import rank_distribution as rd

    rng = np.random.default_rng(5)
    exact = np.minimum(rng.geometric(1 / 400, size=2000), 5000)
    gen = torch.Generator().manual_seed(2)
    drawn = adaptive_sampled_ranks_from_exact(torch.as_tensor(exact), 5000, SamplingDesign(50, adaptive_max=1600), gen)
    ranks, sizes = drawn.ranks, drawn.n_samples
    fit = fit_rank_distribution(sampled_rank_histogram(ranks, 5000, sizes), registry.Mle(n_bootstrap=0))
    model = rd._build_model(as_histogram(ranks, 5000, sizes), "binomial", 16, 0.05, 0.25)
    dense, _ = rd.dense_likelihood(model.edges, model.n, model.m, "binomial")
    dense[dense < 1e-16] = 0.0
    counts = np.zeros(dense.shape[::2])
    for (g, i), c in zip(model.cols.tolist(), model.counts.tolist()):
        counts[g, i] = c
    pi = fit.probs
    prob = np.einsum("c,gci->gi", pi, dense)
    ll_dense = float(np.sum(np.where(counts > 0, counts * np.log(np.where(counts > 0, prob, 1.0)), 0.0)))
    assert fit.loglik == pytest.approx(ll_dense, rel=1e-10)
    assert fit.converged
    # sanity: HR@50 near the truth (0.127; early-stopped EM from 2000 positives: about 2 sd of its spread)
    assert fit.cdf(50) == pytest.approx(float(np.mean(exact <= 50)), abs=0.05)


def test_mes_base_measure_beta():
    """With the data saying nothing (huge entropy weight), mes returns its base measure: uniform over ranks
    (beta = 0) or r^-1 (beta = 1): pmf(1) / pmf(10) = 1 and 10."""
    rng = np.random.default_rng(0)
    ranks = rng.integers(1, 12, size=200)
    hist = sampled_rank_histogram(ranks, 1000, 10)
    flat = fit_rank_distribution(hist, registry.Mes(lam=1e6, n_bootstrap=0))
    tilted = fit_rank_distribution(hist, registry.Mes(lam=1e6, n_bootstrap=0, beta=1.0))
    assert flat.pmf(1) / flat.pmf(10) == pytest.approx(1.0, rel=0.03)
    assert tilted.pmf(1) / tilted.pmf(10) == pytest.approx(10.0, rel=0.03)
    with pytest.raises(ValueError, match="beta"):
        fit_rank_distribution(hist, registry.Mle(beta=0.5))
    with pytest.raises(ValueError, match="beta"):
        fit_rank_distribution(hist, registry.Mes(beta=float("nan")))


def test_histogram_with_very_different_widths_matches_brute_force():
    """Adaptive-like designs (many n groups at m = 10, a few at m = 2000) take the ragged layout: every
    group's counts equal a direct bincount, and the histogram equals the validating constructor's."""
    from reco_sampled_plugin._rank_hist import RankHistogram

    rng = np.random.default_rng(3)
    size = 6000
    n = rng.integers(3000, 3400, size=size)
    m = np.where(rng.random(size) < 0.98, 10, 2000)
    r = 1 + rng.integers(0, m + 1)
    w = rng.random(size)
    h = sampled_rank_histogram(r, n, m, weights=w)
    assert h.n_groups > 300 and h.n_groups * 2001 > 4 * (int((h.n_samples + 1).sum()) + 1024)  # ragged path
    for g in range(h.n_groups):
        sel = (n == h.n_items[g]) & (m == h.n_samples[g])
        np.testing.assert_allclose(h.counts[g], np.bincount(r[sel] - 1, weights=w[sel], minlength=h.n_samples[g] + 1))
    again = RankHistogram(h.n_items, h.n_samples, h.counts)
    np.testing.assert_array_equal(again.flat_counts, h.flat_counts)
    np.testing.assert_allclose(again.totals, h.totals)
    assert not h.counts[0].flags.writeable


def test_many_sample_sizes_are_pooled_onto_a_grid_of_m(monkeypatch):
    """m proportional to each user's n (60 distinct m): groups move to the largest m' of their bin with
    n' - 1 = (n - 1) m' / m (counts and r~ kept, brute force), the fit is flagged pooled_n, and its estimates
    agree with the unpooled fit on the exact laws."""
    from reco_sampled_plugin import rank_distribution as rd

    rng = np.random.default_rng(8)
    size = 4000
    n = rng.integers(2000, 8000, size=size)
    m = np.maximum(n // 60, 20)
    exact = np.minimum(np.exp(rng.normal(np.log(200), 1.5, size=size)).astype(np.int64) + 1, n)
    r = draw_sampled_ranks(exact, n, m, repeats=1, seed=4)[0].numpy()
    hist = sampled_rank_histogram(r, n, m)
    assert len(np.unique(hist.n_samples)) > rd._MAX_EXACT_M
    pooled = rd._pool_m(hist)
    assert pooled.total == pytest.approx(hist.total)
    assert len(np.unique(pooled.n_samples)) < len(np.unique(hist.n_samples))
    bins, start = {}, None  # the rule, walked by hand: a bin starts at m0 and takes every m <= 1.1 m0
    for v in sorted(set(hist.n_samples.tolist())):
        start = v if start is None or v > start * 1.1 else start
        bins.setdefault(start, []).append(v)
    top = {v: max(vs) for vs in bins.values() for v in vs}
    where = {(int(a), int(b)): k for k, (a, b) in enumerate(zip(pooled.n_items, pooled.n_samples))}
    expected = [np.zeros(int(mm) + 1) for mm in pooled.n_samples]
    for g in range(hist.n_groups):
        mg, m_new = int(hist.n_samples[g]), top[int(hist.n_samples[g])]
        k = where[(1 + round((int(hist.n_items[g]) - 1) * m_new / mg), m_new)]
        expected[k][: mg + 1] += hist.counts[g]
    for k in range(pooled.n_groups):
        np.testing.assert_allclose(pooled.counts[k], expected[k])
    fit = fit_rank_distribution(hist, registry.Mle(n_bootstrap=0))
    assert "pooled_n" in fit.flags
    monkeypatch.setattr(rd, "_MAX_EXACT_M", 10_000)
    exact_fit = fit_rank_distribution(hist, registry.Mle(n_bootstrap=0, max_groups=200))
    for metric in ("hit@50", "hit@500", "ndcg@100", "auc"):
        assert fit.metric(metric).value == pytest.approx(exact_fit.metric(metric).value, abs=0.01, rel=0.05)


def test_batched_mes_fits_reach_the_single_fits_optima():
    """``_mes_fit_batched`` (bootstrap replicates, batches of histograms) against scipy's L-BFGS-B run to a tight
    tolerance on each problem alone: at the default tol each batched objective is within the L-BFGS-B stopping
    rule's reach of the optimum, and at a tight tol the fitted distributions agree (the problems are solved, not
    merely stopped), including per-user candidate counts (16 pooled groups) and lam differing per problem."""
    from reco_sampled_plugin import rank_distribution as rd

    rng = np.random.default_rng(3)
    n = 1400 + rng.integers(0, 280, 900)
    exact = 1 + np.floor((n - 1) * rng.beta(0.4, 3.0, n.size)).astype(np.int64)
    sampled = draw_sampled_ranks(torch.as_tensor(exact), torch.as_tensor(n), 100, seed=5).reshape(-1).numpy()
    model = rd._build_model(as_histogram(sampled, n, 100), "binomial", 16, 0.05, 0.25)
    total = model.counts.sum()
    draws = rng.multinomial(int(total), model.counts / total, size=6).astype(np.float64)
    lam = 10.0 / total * np.array([1.0, 1.0, 0.5, 2.0, 1.0, 4.0])
    start = rd._mes_start(model, np.broadcast_to(model.widths / model.widths.sum(), draws.shape[:1] + (len(model.widths),)), draws)
    evaluate, logw = rd._mes_objective(model, draws, lam, 0.0)

    def objective(pi):
        return evaluate(np.log(np.maximum(pi, 1e-300)) - logw, np.arange(len(draws)))[0]

    best = np.stack([rd._mes_fit(model, draws[b], lam[b], start[b], 1e-14, 20000)[0] for b in range(len(draws))])
    f_best = objective(best)
    pi, iters, conv = rd._mes_fit_batched(model, draws, lam, start, 1e-7, 5000)
    assert conv.all() and np.all(iters >= 1) and np.allclose(pi.sum(-1), 1.0)
    assert np.all(objective(pi) - f_best <= 1e-4 * np.abs(f_best)), objective(pi) - f_best
    tight, _, conv = rd._mes_fit_batched(model, draws, lam, start, 1e-14, 20000)
    assert conv.all() and np.all(objective(tight) - f_best <= 2e-7 * np.abs(f_best))  # ill-conditioned: scipy
    # itself needs 1,000-3,400 iterations for tol 1e-14
    cdf_t, cdf_b = np.cumsum(tight, -1), np.cumsum(best, -1)
    assert np.abs(cdf_t - cdf_b).max() < 2e-3, np.abs(cdf_t - cdf_b).max()
    # one problem alone equals itself in the batch up to rounding (each is frozen when it stops)
    one, _, _ = rd._mes_fit_batched(model, draws[2:3], lam[2:3], start[2:3], 1e-7, 5000)
    np.testing.assert_allclose(one[0], pi[2], rtol=1e-6, atol=1e-12)  # batched products round differently


@pytest.mark.parametrize("n,m", [(50_000, 2000), (1683, 100), (30, 27), (10_000, 5)])
def test_banded_likelihood_equals_the_dense_one(n, m):
    """The binomial likelihood is built only on the (cell, column) pairs within Bernstein's band (probabilities
    beyond it are below 1e-18, under the 1e-16 floor): it equals the dense table of every r~ from the
    independent pmf of ``sampling_laws`` (``dense_likelihood``) on every column, zeros included, for groups of
    several n sharing one grid and cells at both ends of the catalogue (p = 0 and p = 1)."""
    from reco_sampled_plugin import rank_distribution as rd

    ns = (n, max(m + 2, n - n // 3), max(m + 2, n // 2))
    ms = (m, m, max(1, m // 2))
    keys = tuple(int(g * (m + 1) + i) for g in range(3) for i in range(ms[g] + 1))
    model = rd._likelihood(ns, ms, "binomial", 0.05, 0.25, (), keys)
    dense, inside = rd.dense_likelihood(model.edges, ns, ms, "binomial")
    want = dense[model.cols[:, 0], :, model.cols[:, 1]].T  # (C, K)
    want = np.where(want < rd._LIK_FLOOR, 0.0, want)
    np.testing.assert_array_equal(inside, model.inside)
    close = np.abs(model.lik - want) <= 1e-11 * want + 1e-300
    near_floor = np.abs(want - rd._LIK_FLOOR) < 1e-11 * rd._LIK_FLOOR  # rounding may put these either side
    assert np.all(close | near_floor), np.abs(model.lik - want).max()
    for g in range(3):  # every cell's law over all m + 1 values of r~ sums to 1 (floored entries are < 1e-16 each)
        rows = model.lik[:, model.cols[:, 0] == g][inside[g]]
        np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-12)


def test_mes_bootstrap_with_a_huge_entropy_weight_returns_the_base_measure_without_overflow():
    """lam = 1e300 (accepted: finite): the fit's and every replicate's optimum is the base measure (uniform over
    ranks), reached without an overflow in the L-BFGS products (warnings are errors in this suite); within 3%
    as test_mes_base_measure_beta (the objective is flat near it: L-BFGS-B's ftol stops a little short)."""
    ranks = torch.tensor([1, 2, 3, 5, 8, 11, 2, 1, 4, 6] * 5)
    fit = fit_rank_distribution(sampled_rank_histogram(ranks, 1000, 10), registry.Mes(lam=1e300, n_bootstrap=4))
    widths = np.diff(fit.edges)
    assert fit.converged and fit.bootstrap.shape == (4, len(widths))
    np.testing.assert_allclose(fit.probs, widths / widths.sum(), rtol=0.03)
    np.testing.assert_allclose(fit.bootstrap, np.broadcast_to(widths / widths.sum(), fit.bootstrap.shape), rtol=0.03)
