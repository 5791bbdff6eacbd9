"""Mapping functions of Li et al. (KDD 2020) and the mapping-based estimators."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples
from scipy import special

from reco_sampled_plugin._rank_hist import (
    _group_ids,
    RankHistogram,
    _bincount_histogram,
    cumulative_metric,
    interval_mean_metric,
    sampled_rank_histogram,
)
from reco_sampled_plugin.mapping import (
    dataset_beta,
    fit_beta,
    mapped_points,
    mapping,
    mapping_estimate,
    mapping_table,
    sampled_hit_rate_curve,
)
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.metrics import metric_curve
from reco_sampled_plugin.simulate import simulate_sampled_ranks

# ------------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("n,m", [(3706, 99), (10_000, 100), (1682, 50), (100_000_000, 10_000)])
def test_closed_forms(n, m):
    k = np.arange(1, m + 2, dtype=np.float64)
    big_n, small_n = n, m + 1  # Li et al.'s N and n
    np.testing.assert_allclose(mapping(k, n, m, "linear"), (k - 1) * (big_n - 1) / (small_n - 1) + 1, rtol=1e-14)
    bound = np.clip(np.floor((k - 0.5) * (big_n - 1) / (small_n - 1) + 0.5), 1, big_n)
    np.testing.assert_array_equal(mapping(k, n, m, "bound"), bound)
    np.testing.assert_allclose(mapping(k, n, m, "beta", a=1.0), k * (big_n - 1) / small_n + 1, rtol=1e-9)


def test_beta_matches_direct_recurrence():
    """Eq. 16-17 evaluated directly (no logs) at a size where that is still accurate."""
    big_n, m, a = 1000, 20, 0.5
    n = m + 1
    f = [(big_n - 1) * (a * special.beta(a, n)) ** (1 / a) + 1]
    for k in range(1, n):
        step = a * (big_n - 1) ** a * special.comb(n - 1, k) * special.beta(a + k, n - k)
        f.append((step + (f[-1] - 1) ** a) ** (1 / a) + 1)
    np.testing.assert_allclose(mapping(np.arange(1, n + 1), big_n, m, "beta", a=a), f, rtol=1e-10)


@pytest.mark.parametrize("a", [0.05, 0.2, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("n,m", [(3706, 99), (100_000_000, 10_000)])
def test_lemma_3_1_and_finiteness(a, n, m):
    f = mapping(np.arange(1, m + 2), n, m, "beta", a=a)
    assert np.all(np.isfinite(f))
    assert np.all(np.diff(f) > 0)
    assert f[0] > 1
    assert f[-1] == pytest.approx(n, rel=1e-8)  # Lemma 3.1: f(n) = N for every a


@settings(max_examples=examples(40), deadline=None)
@given(
    n=st.integers(200, 10**8),
    m=st.integers(1, 400),
    a1=st.floats(0.02, 5.0),
    ratio=st.floats(1.01, 4.0),
)
def test_monotone_in_a(n, m, a1, ratio):
    """Remedy #3: f(k; a) increases with a (strictly for k <= m; equal at k = m + 1)."""
    k = np.arange(1, m + 1)
    lo = mapping(k, n, m, "beta", a=a1)
    hi = mapping(k, n, m, "beta", a=a1 * ratio)
    assert np.all(hi >= lo * (1 - 1e-12))
    assert hi[0] > lo[0]


def test_mapping_input_errors():
    with pytest.raises(ValueError, match="k"):
        mapping(0, 100, 10)
    with pytest.raises(ValueError, match="k"):
        mapping(12, 100, 10)
    with pytest.raises(ValueError, match="method"):
        mapping(1, 100, 10, "spline")
    with pytest.raises(ValueError, match="a"):
        mapping(1, 100, 10, "beta")
    with pytest.raises(ValueError, match="a"):
        mapping(1, 100, 10, "beta", a=-1.0)
    with pytest.raises(ValueError, match="beta_fit"):
        mapping(1, 100, 10, "beta_fit")
    assert isinstance(mapping(3, 100, 10, "linear"), float)


# ------------------------------------------------------------------------------- histograms
def test_histogram_counts_and_padding():
    ranks = torch.tensor([[1, 3, 0], [2, 3, 3]])
    h = sampled_rank_histogram(ranks, 50, 4)
    assert h.n_groups == 1 and h.n_items[0] == 50 and h.n_samples[0] == 4
    np.testing.assert_array_equal(h.counts[0], [1, 1, 3, 0, 0])
    with pytest.raises(ValueError, match="outside"):
        sampled_rank_histogram(torch.tensor([6]), 50, 4)


@settings(max_examples=examples(25), deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.sampled_from([10, 20]), st.sampled_from([3, 5])), min_size=1, max_size=40))
def test_histogram_is_additive(rows):
    r = torch.tensor([min(x[0], x[2] + 1) for x in rows])
    n = torch.tensor([x[1] for x in rows])
    m = torch.tensor([x[2] for x in rows])
    whole = sampled_rank_histogram(r, n, m)
    half = len(rows) // 2
    parts = sampled_rank_histogram(r[:half], n[:half], m[:half]) if half else None
    rest = sampled_rank_histogram(r[half:], n[half:], m[half:])
    merged = rest if parts is None or parts.n_groups == 0 else parts.merge(rest)
    assert merged.total == whole.total == len(rows)
    # derived views: concatenated counts, counts at r~ = 1, all-at-top
    np.testing.assert_array_equal(whole.flat_counts, np.concatenate(whole.counts))
    np.testing.assert_array_equal(whole.top_counts, [c[0] for c in whole.counts])
    assert whole.all_at_top() == all(c[1:].sum() == 0 for c in whole.counts) == bool((r == 1).all())
    # the unchecked builder the adapters use gives the same histogram
    trusted = _bincount_histogram(r, n, m, None)
    assert trusted.same_groups(whole) and all(np.array_equal(a, b) for a, b in zip(trusted.counts, whole.counts))
    for g in range(whole.n_groups):
        j = int(np.flatnonzero((merged.n_items == whole.n_items[g]) & (merged.n_samples == whole.n_samples[g]))[0])
        np.testing.assert_array_equal(merged.counts[j], whole.counts[g])


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.one_of(st.integers(0, 50), st.integers(0, 10**9)), min_size=1, max_size=60))
def test_group_ids_match_unique(values):
    """Distinct keys and each key's group: the bincount path (small ranges) and the sort path agree with np.unique."""
    key = np.array(values, dtype=np.int64)
    uniq, index = _group_ids(key)
    expect, expect_index = np.unique(key, return_inverse=True)
    np.testing.assert_array_equal(uniq, expect)
    np.testing.assert_array_equal(index, expect_index.reshape(-1))
    np.testing.assert_array_equal(uniq[index], key)


@settings(max_examples=examples(30), deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(2, 5000), st.sampled_from([3, 5, 11]), st.floats(0.0, 3.0)),
                min_size=1, max_size=50))
def test_trusted_histogram_matches_brute_force(rows):
    """The unchecked builder, weighted, with several sample sizes: the counts a loop over positives adds up,
    the same read-only views as a checked histogram of those counts."""
    r = np.array([min(x[0], x[2] + 1) for x in rows])
    n, m, w = (np.array([x[i] for x in rows]) for i in (1, 2, 3))
    expect: dict[tuple[int, int], np.ndarray] = {}
    for ri, ni, mi, wi in zip(r, n, m, w):
        expect.setdefault((int(ni), int(mi)), np.zeros(int(mi) + 1))[ri - 1] += wi
    hist = _bincount_histogram(torch.from_numpy(r), n, torch.from_numpy(m), w)
    keys = sorted(expect)
    checked = RankHistogram(np.array([k[0] for k in keys]), np.array([k[1] for k in keys]), tuple(expect[k] for k in keys))
    assert hist.same_groups(checked)
    for got, want in zip(hist.counts, checked.counts):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(hist.flat_counts, checked.flat_counts, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(hist.totals, checked.totals, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(hist.top_counts, [c[0] for c in hist.counts])
    assert not hist.flat_counts.flags.writeable and not hist.counts[0].flags.writeable
    # the uncorrected sampled metric: the weighted mean of M(r~) over m + 1 candidates, positive by positive
    if w.sum() > 0:
        closed_forms = {"recall@3": (r <= 3) * 1.0, "ndcg@5": (r <= 5) / np.log2(r + 1.0), "mrr": 1.0 / r, "auc": (m + 1.0 - r) / m}
        for name, values in closed_forms.items():
            assert hist.sampled_metric(parse_metric(name)) == pytest.approx(float(values @ w / w.sum()), rel=1e-12, abs=1e-14)


def test_trusted_histogram_refuses_what_the_checked_one_refuses():
    """A group without an irrelevant candidate (n = 1), or m = 0, raises as the validating constructor does;
    no key gives no group."""
    with pytest.raises(ValueError, match="n_items: need at least 2 candidates, got 1"):
        _bincount_histogram(np.array([1, 2]), np.array([1, 5]), np.array([3, 3]), None)
    with pytest.raises(ValueError, match="n_samples: must be >= 1"):
        _bincount_histogram(np.array([1, 1]), np.array([4, 5]), np.array([2, 0]), None)
    uniq, index = _group_ids(np.zeros(0, np.int64))
    assert uniq.shape == index.shape == (0,)


@pytest.mark.parametrize("name", ["ndcg", "ndcg@30", "ap", "rr@5", "auc", "recall@7", "precision@7", "hit@9000"])
def test_cumulative_metric_matches_enumeration(name):
    spec = parse_metric(name)
    n = 20_000
    c = np.concatenate([[0.0], np.cumsum(metric_curve(spec, n).numpy())])
    j = np.array([0, 1, 5, 17, 8191, 8192, 8193, 9000, 12345, 19999, 20000])
    np.testing.assert_allclose(cumulative_metric(spec, j, n), c[j], rtol=1e-13, atol=1e-12)
    # interval means over whole-number bounds are plain averages of M
    lo, hi = np.array([0, 10, 8000]), np.array([3, 11, 9000])
    expect = [(c[b] - c[a]) / (b - a) for a, b in zip(lo, hi)]
    np.testing.assert_allclose(interval_mean_metric(spec, lo, hi, n), expect, rtol=1e-12)


# ------------------------------------------------------------------------------- estimation
def _simulated(n=50_000, m=99, users=20_000, seed=0, a=0.4):
    rng = np.random.default_rng(seed)
    exact = 1 + np.floor(rng.random(users) ** (1 / a) * (n - 1)).astype(np.int64)
    gen = torch.Generator().manual_seed(seed)
    return exact, simulate_sampled_ranks(torch.as_tensor(exact), n, m, generator=gen)


def test_shr_curve_and_mapped_points():
    n, m = 50_000, 99
    exact, sampled = _simulated(n, m)
    shr, se = sampled_hit_rate_curve(sampled, n, m)
    expect = np.array([(sampled.numpy() <= k).mean() for k in range(1, m + 2)])
    np.testing.assert_allclose(shr, expect, rtol=1e-14)
    np.testing.assert_allclose(se, np.sqrt(expect * (1 - expect) / len(exact)), rtol=1e-12)
    pts = mapped_points(sampled, n, m, "bound")
    np.testing.assert_array_equal(pts.f, mapping(np.arange(1, m + 2), n, m, "bound"))
    # mapped points are where the interpolated estimate reproduces SHR@k exactly
    for k in (1, 5, 10, 50):
        est = mapping_estimate(f"hit@{int(pts.f[k - 1])}", sampled, n, m, "bound")
        assert est.value == pytest.approx(shr[k - 1], abs=1e-12)


def test_interpolation_between_mapped_points_is_linear():
    n, m = 10_000, 50
    _, sampled = _simulated(n, m, users=5000)
    f = mapping(np.arange(1, m + 2), n, m, "linear")
    shr, _ = sampled_hit_rate_curve(sampled, n, m)
    k = 7
    K = int(np.floor(0.3 * f[k - 1] + 0.7 * f[k]))
    t = (K - f[k - 1]) / (f[k] - f[k - 1])
    est = mapping_estimate(f"hit@{K}", sampled, n, m, "linear")
    assert est.value == pytest.approx((1 - t) * shr[k - 1] + t * shr[k], abs=1e-12)


def test_mapping_estimate_tracks_global_hit_rate():
    """With a Beta(a, 1) rank distribution, beta@a maps SHR to HR closely (the paper's model)."""
    n, m, a = 50_000, 99, 0.4
    exact, sampled = _simulated(n, m, a=a)
    for K in (2000, 10_000):
        true = float((exact <= K).mean())
        est = mapping_estimate(f"hit@{K}", sampled, n, m, "beta", a=a)
        assert abs(est.value - true) < 4 * est.stderr + 0.01
        assert est.flags == ()


@pytest.mark.parametrize("method", ["bound", "linear", "beta"])
def test_mapping_estimate_over_groups_is_the_weighted_table_mean(method):
    """Several (n, m) groups: the estimate is sum_g sum_i h_gi T_g[i] / total with each group's own table
    (the stacked, cached tables change nothing), its stderr the per-positive sample sd over sqrt(total)."""
    g = torch.Generator().manual_seed(5)
    n = torch.tensor([60, 61, 200, 200, 5000]).repeat(40)
    m = torch.tensor([9, 9, 9, 20, 20]).repeat(40)
    r = (torch.rand(200, generator=g) * (m + 1).to(torch.float32)).floor().to(torch.int64) + 1
    for _ in range(2):  # the second call reads the cached stacked tables
        est = mapping_estimate("ndcg@5", r, n, m, method, a=0.7 if method == "beta" else None)
        values = np.array([mapping_table("ndcg@5", int(a), int(b), method, 0.7 if method == "beta" else None)[int(k) - 1]
                           for a, b, k in zip(n, m, r)])
        assert est.value == pytest.approx(values.mean(), rel=1e-12)
        assert est.stderr == pytest.approx(values.std(ddof=1) / math.sqrt(values.size), rel=1e-9)


def test_fit_beta_fixed_point():
    n, m = 100_000, 99
    fits = {}
    for a in (0.3, 1.0):
        _, sampled = _simulated(n, m, users=30_000, a=a, seed=2)
        f1 = fit_beta(sampled, n, m, a0=1.0)
        f2 = fit_beta(sampled, n, m, a0=0.5)
        assert f1.converged and f2.converged and f1.iterations < 30
        assert f1.history[0] == 1.0 and f2.history[0] == 0.5
        assert f1.a == pytest.approx(f2.a, rel=1e-8)
        fits[a] = f1.a
    assert fits[1.0] == pytest.approx(1.0, abs=0.1)
    assert fits[0.3] < fits[1.0]
    # per-positive n does not change the fixed point (eq. 19 does not involve n)
    h = sampled_rank_histogram(torch.tensor([1, 2, 5, 9]), torch.tensor([1000, 2000, 1000, 5000]), 20)
    h1 = sampled_rank_histogram(torch.tensor([1, 2, 5, 9]), 3000, 20)
    assert fit_beta(h).a == pytest.approx(fit_beta(h1).a, rel=1e-12)


def test_fit_beta_failures_are_explicit():
    with pytest.raises(ValueError, match="last sampled rank"):
        fit_beta(torch.full((10,), 11), 1000, 10)
    with pytest.raises(ValueError, match="empty"):
        fit_beta(torch.zeros(5, dtype=torch.int64), 1000, 10)
    res = fit_beta(torch.tensor([1, 2, 3, 11]), 1000, 10, max_iter=1)
    assert not res.converged and res.iterations == 1 and len(res.history) == 2
    est = mapping_estimate("hit@500", torch.tensor([1, 2, 3, 11]), 1000, 10, "beta_fit")
    assert math.isfinite(est.value)


def test_dataset_beta_spread():
    n, m = 100_000, 99
    models = {f"rec{a}": _simulated(n, m, users=10_000, a=a, seed=int(10 * a))[1] for a in (0.35, 0.4, 0.45)}
    res = dataset_beta(models, n, m)
    vals = np.array(list(res.per_model.values()))
    assert res.spread == pytest.approx(vals.max() - vals.min())
    assert res.a == pytest.approx(vals.mean())
    assert 0 < res.spread < 0.5 and all(f.converged for f in res.fits.values())
    with pytest.raises(ValueError):
        dataset_beta({}, n, m)


def test_bad_input_of_estimates():
    with pytest.raises(ValueError, match="empty"):
        mapping_estimate("hit@10", torch.zeros(3, dtype=torch.int64), 100, 10)
    with pytest.raises(ValueError, match="larger than the catalogue"):
        mapping_estimate("hit@101", torch.tensor([1, 2]), 100, 10)
    with pytest.raises(ValueError, match="strictly increasing"):
        mapping_table("hit@1", 5, 10, "bound")
    top = mapping_estimate("hit@5", torch.ones(100, dtype=torch.int64), 10_000, 99, "bound")
    assert "top_unresolved" in top.flags and "all_at_top" in top.flags
    assert top.stderr == math.inf and math.isfinite(top.value)
    ok = mapping_estimate("hit@500", torch.ones(100, dtype=torch.int64), 10_000, 99, "bound")
    assert ok.flags == () and ok.value == 1.0


def test_per_positive_sizes_use_their_own_tables():
    r = torch.tensor([1, 2, 3, 1])
    n = torch.tensor([1000, 1000, 4000, 4000])
    est = mapping_estimate("ndcg@100", r, n, 10, "linear")
    t1 = mapping_table("ndcg@100", 1000, 10, "linear")
    t4 = mapping_table("ndcg@100", 4000, 10, "linear")
    assert est.value == pytest.approx((t1[0] + t1[1] + t4[2] + t4[0]) / 4, rel=1e-12)
    assert RankHistogram(np.array([10]), np.array([2]), (np.array([1.0, 0, 2]),)).total == 3


def test_beta_fit_that_runs_off_the_shape_range_maps_at_its_bound():
    """Ranks piled on the last two bins have no interior maximum: the fit runs off towards a -> infinity (not
    converged); the estimate maps at the bound of BETA_SHAPE_RANGE (the method beta at a = 1e6), not an error."""
    import reco_sampled_plugin as rsp
    from reco_sampled_plugin import registry
    from reco_sampled_plugin._options import BETA_SHAPE_RANGE
    from reco_sampled_plugin.mapping import fit_beta

    m, n = 100, 1000
    r = torch.tensor([m] * 2 + [m + 1] * 98)
    fit = fit_beta(r, n, m)
    assert not fit.converged and fit.a > BETA_SHAPE_RANGE[1]
    sample = rsp.SampledRanks(r, torch.full_like(r, n), None, rsp.SamplingDesign(m))
    for metric in ("ndcg@10", "hit@100"):
        got = rsp.estimate(metric, sample, "beta_fit").value
        at_bound = rsp.estimate(metric, sample, registry.method_class("beta")(a=BETA_SHAPE_RANGE[1])).value
        assert math.isfinite(got) and got == at_bound
