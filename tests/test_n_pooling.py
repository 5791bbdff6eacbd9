"""Grouping candidate counts on a geometric grid (max_rel_n_spread), many metrics from one table build or
one fit, batched rank-distribution fits and the cheap posterior standard error."""

import math

import numpy as np
import pytest
import torch

from reco_sampled_plugin._rank_hist import (
    RankHistogram,
    interval_mean_metric,
    interval_mean_metrics,
    n_grid,
    pool_by_n,
    sampled_rank_histogram,
)
from reco_sampled_plugin.corrections import correction_table, correction_tables, table_bias
from reco_sampled_plugin.estimators import estimate
from reco_sampled_plugin.mapping import mapping_table, mapping_tables
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.metrics import metric_values
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from reco_sampled_plugin.simulate import draw_sampled_ranks
from reco_sampled_plugin import SampledRanks
from reco_sampled_plugin import registry

M = 100


@pytest.fixture(scope="module")
def wide():
    """Positives with n log-uniform in 1e3..1e5 (about 1,900 distinct n) and ranks skewed to the top."""
    rng = np.random.default_rng(3)
    n = np.rint(np.exp(rng.uniform(np.log(1e3), np.log(1e5), 3000))).astype(np.int64)
    r = 1 + np.floor((n - 1) * rng.beta(0.3, 1.0, n.size)).astype(np.int64)
    sampled = draw_sampled_ranks(r, n, M, seed=1)[0]
    return torch.as_tensor(r), torch.as_tensor(n), sampled


@pytest.fixture(scope="module")
def wide_estimate(wide):
    """``estimate(metric, <wide's sampled ranks>, method)`` (``max_rel_n_spread``: the method built with that
    spread), each computed once for the module: the tests below compare the same exact-n and pooled estimates."""
    _, n, sampled = wide
    cache: dict = {}

    def get(metric: str, method: str, max_rel_n_spread: float | None = None):
        key = (metric, method, max_rel_n_spread)
        if key not in cache:
            how = method if max_rel_n_spread is None else registry.method_class(method)(max_rel_n_spread=max_rel_n_spread)
            cache[key] = estimate(metric, SampledRanks.from_arrays(sampled, n, M), how)
        return cache[key]

    return get


def test_n_grid_and_pooling_preserve_counts(wide):
    _, n, sampled = wide
    grid = n_grid(1000, 100000, 0.1)
    assert grid[0] == 1000 and grid[-1] == 100000 and np.all(np.diff(grid) > 0)
    assert np.all(grid[1:] / grid[:-1] <= 1.1 + 1e-3)
    hist = sampled_rank_histogram(sampled, n, M)
    pooled = pool_by_n(hist, 0.1)
    assert pooled.n_groups <= len(n_grid(int(n.min()), int(n.max()), 0.1)) < hist.n_groups
    assert math.isclose(pooled.total, hist.total, rel_tol=1e-12)
    assert np.allclose(np.sum(pooled.counts, axis=0), np.sum(hist.counts, axis=0))
    assert pool_by_n(hist, None) is hist
    # a group sitting on a node keeps all its counts there
    on_node = RankHistogram(np.array([1000, 1210, 1100]), np.array([5, 5, 5]), (np.ones(6), np.ones(6), np.ones(6)))
    p = pool_by_n(on_node, 0.1)
    assert list(p.n_items) == [1000, 1100, 1210] and all(np.allclose(c, 1.0) for c in p.counts)
    with pytest.raises(ValueError, match="max_rel_n_spread"):
        pool_by_n(hist, -0.1)


# measured worst relative differences (benchmarks/studies/n_pooling_error.py; docs/research-notes.md, "Pooling
# candidate counts") are below these bounds for s = 0.1; smooth tables (bv, cls) are far more accurate than the
# floor-based ones
BOUNDS = {"bv": 1e-3, "cls": 1e-3, "bound": 2e-2}


@pytest.mark.parametrize("method", list(BOUNDS))
def test_pooled_estimates_within_the_documented_bound(wide_estimate, method):
    for metric in ("hit@10", "ndcg@10", "hit@50"):
        exact_n = wide_estimate(metric, method)
        pooled = wide_estimate(metric, method, 0.1)
        assert "pooled_n" in pooled.flags and "pooled_n" not in exact_n.flags
        rel = abs(pooled.value - exact_n.value) / exact_n.value
        assert rel < BOUNDS[method], (metric, rel)
        finer = wide_estimate(metric, method, 0.01)
        assert abs(finer.value - exact_n.value) / exact_n.value < BOUNDS[method] / 2


def test_pooled_correction_tables_within_1e_3_of_exact_n(wide_estimate):
    for method in ("bv", "cls", "none"):
        a = wide_estimate("ndcg@10", method, 0.1)
        exact_n = wide_estimate("ndcg@10", method)
        assert abs(a.value - exact_n.value) <= 1e-3 * abs(exact_n.value) + 1e-12, method


@pytest.mark.parametrize("n,m", [(1500, 100), (20000, 100), (1200, 500), (300, 50)])
@pytest.mark.parametrize("method,gamma", [("bv", 0.1), ("bv", 0.01), ("bv", 0.001), ("bv", 1.0), ("cls", 0.0)])
def test_correction_tables_agree_with_single_tables(n, m, method, gamma):
    metrics = ["hit@1", "hit@10", "hit@50", "ndcg@10", "ndcg@50", "recall@5"]
    method = registry.Bv(gamma=gamma) if method == "bv" else method
    many = correction_tables(metrics, n, m, method)
    one = np.stack([correction_table(mt, n, m, method).numpy() for mt in metrics])
    assert many.shape == (len(metrics), m + 1)
    assert np.abs(many - one).max() <= 1e-9 * np.abs(one).max()


def test_correction_tables_ls_vector_prior_and_fallback():
    rng = np.random.default_rng(0)
    n, m = 900, 60
    prior = rng.random(n) ** 4
    prior /= prior.sum()
    many = correction_tables(["hit@10", "ndcg@20"], n, m, registry.Bv(gamma=0.1, prior=prior))
    one = np.stack([correction_table(mt, n, m, registry.Bv(gamma=0.1, prior=prior)).numpy() for mt in ["hit@10", "ndcg@20"]])
    assert np.abs(many - one).max() <= 1e-9 * np.abs(one).max()
    # ls coefficients are ill-conditioned: compare the bias they reach
    ls = correction_tables(["hit@10"], 20000, 100, "ls")[0]
    ref = correction_table("hit@10", 20000, 100, "ls")
    assert table_bias(ls, "hit@10", 20000, 100) <= table_bias(ref, "hit@10", 20000, 100) * 1.001 + 1e-15
    # metrics without a cut-off at a large n: per-metric fallback, same tables
    many = correction_tables(["ap", "hit@10"], 50000, 50, registry.Bv(gamma=0.1))
    assert np.allclose(many[0], correction_table("ap", 50000, 50, registry.Bv(gamma=0.1)).numpy(), rtol=1e-12, atol=0)
    assert correction_tables("ndcg@10", 5000, 20, "none").shape == (1, 21)


def test_mapping_tables_and_interval_means():
    metrics = ["hit@1", "hit@10", "ndcg@10", "ap", "auc"]
    for method, a in [("bound", None), ("linear", None), ("beta", 0.5)]:
        many = mapping_tables(metrics, 1700, 100, method, a)
        one = np.stack([mapping_table(mt, 1700, 100, method, a) for mt in metrics])
        assert np.abs(many - one).max() < 1e-12
    specs = [parse_metric(x) for x in ("hit@3", "ndcg@40", "recall@7", "precision@5", "mrr@10", "ap")]
    edges = np.unique(np.concatenate([[0.0], np.sort(np.random.default_rng(1).random(150)) * 1000, [1000.0]]))
    many = interval_mean_metrics(specs, edges[:-1], edges[1:], 1000)
    one = np.stack([interval_mean_metric(sp, edges[:-1], edges[1:], 1000) for sp in specs])
    assert np.abs(many - one).max() < 1e-13


@pytest.mark.parametrize("method", ["linear", "mes", "gmod", "bv"])
def test_a_cut_off_beyond_the_prefix_table_goes_one_by_one(method):
    """Cut-offs above ``_rank_hist._PREFIX_MAX_K`` are not tabulated over ranks 1..K (precision@2^40 tried to
    allocate 8 TiB and raised numpy's MemoryError): their closed forms give the one-point range's value."""
    from reco_sampled_plugin._rank_hist import _PREFIX_MAX_K

    n = 2**40
    sampled = SampledRanks.from_arrays(torch.tensor([1, 2, 3]), n, 100)
    est = estimate(f"precision@{n}", sampled, method)
    assert est.value == pytest.approx(1.0 / n, rel=1e-9) and est.metric_range == (1.0 / n, 1.0 / n)
    k = _PREFIX_MAX_K + 1  # the first K past the table: the same values as the table's path gives below it
    edges = np.array([0.0, 1.0, 5.5, 1e3, 5e5, 2e6])
    below = interval_mean_metrics([parse_metric(f"ndcg@{k - 1}")], edges[:-1], edges[1:], 4e6)
    above = interval_mean_metrics([parse_metric(f"ndcg@{k}")], edges[:-1], edges[1:], 4e6)
    assert np.abs(above - below).max() < 1e-6  # one rank more in the cut-off: values equal to ~1/log2(K) / K


@pytest.mark.parametrize("method", ["mle", "mes"])
def test_batched_fits_equal_single_fits(wide, method):
    r, n, _ = wide
    draws = draw_sampled_ranks(r[:1500], n[:1500], 50, repeats=4, seed=7)
    hists = [sampled_rank_histogram(d, n[:1500], 50) for d in draws]
    batch = fit_rank_distribution(hists, registry.method_class(method)(max_rel_n_spread=0.2))
    metrics = ["hit@10", "hit@100", "ndcg@50"]
    for h, fit in zip(hists, batch):
        single = fit_rank_distribution(h, registry.method_class(method)(n_bootstrap=0, max_rel_n_spread=0.2))
        assert fit.iterations == single.iterations and fit.converged == single.converged
        assert np.allclose(fit.values(metrics), single.values(metrics), rtol=1e-5, atol=1e-7)
        assert np.allclose(fit.values(metrics), [fit.metric(mt).value for mt in metrics], rtol=1e-12)
        assert "pooled_n" in fit.flags


def test_posterior_stderr_without_bootstrap(wide):
    r, n, sampled = wide
    true = float(metric_values("hit@500", r, n).mean())
    fast = estimate(
        "hit@500",
        SampledRanks.from_arrays(sampled, n, M),
        registry.Mle(n_bootstrap=0, max_rel_n_spread=0.1),
    )
    boot = estimate(
        "hit@500",
        SampledRanks.from_arrays(sampled, n, M),
        registry.Mle(n_bootstrap=16, max_rel_n_spread=0.1),
    )
    assert fast.details["stderr_method"] == "posterior" and boot.details["stderr_method"] == "bootstrap"
    assert math.isfinite(fast.stderr) and fast.stderr > 0
    assert math.isclose(fast.value, boot.value, rel_tol=1e-12)
    # the posterior standard error ignores the uncertainty of P^: not larger than the bootstrap, same order
    assert 0.2 * boot.stderr < fast.stderr < 1.5 * boot.stderr
    assert abs(fast.value - true) < 5 * boot.stderr + 0.01
