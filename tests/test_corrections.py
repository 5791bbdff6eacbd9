"""Correction tables (Krichene & Rendle section 5) against brute force with the explicit A matrix,
closed forms and the paper's running example."""

import functools

import numpy as np
import pytest
import scipy.optimize
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from _profiles import examples
from numpy.polynomial import legendre

from reco_sampled_plugin.corrections import (
    _stacked,
    _table,
    clear_correction_cache,
    correction_from_options,
    correction_table,
    stacked_tables,
    design_rule,
    expected_corrected,
    table_bias,
)
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.metrics import metric_curve, metric_values
from reco_sampled_plugin.priors import BetaPrior, CallablePrior, UniformPrior, as_prior
from reco_sampled_plugin.quadrature import pmf_at_ranks
from reco_sampled_plugin.sampling_laws import sampled_rank_pmf
from reco_sampled_plugin import SampledRanks
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.registry import Bv, RankEstimate, method_class

LAWS = ["binomial", "hypergeometric"]
TABLE1 = {
    "A": [100, 100, 100, 100, 100],
    "B": [40, 40, 8437, 9266, 4482],
    "C": [212, 2, 743, 5342, 1548],
}


@functools.lru_cache(maxsize=16)
def _pmf(n, m, law):
    return sampled_rank_pmf(torch.arange(1, n + 1), n, m, law).numpy()


def brute(metric, n, m, law, p=None):
    """Explicit A (n x (m+1)) from sampling_laws (an implementation independent of quadrature.py)."""
    pmf = _pmf(n, m, law)
    p = np.full(n, 1.0 / n) if p is None else np.asarray(p, dtype=np.float64)
    mv = metric_curve(metric, n).numpy()
    gram = pmf.T @ (p[:, None] * pmf)
    h = pmf.T @ (p * mv)
    c = p @ pmf
    return pmf, p, mv, gram, h, c


def brute_bv(metric, n, m, law, gamma, p=None):
    return bv_solve(brute(metric, n, m, law, p), gamma)


def bv_solve(system, gamma):
    """eq. 25 solved on ``brute``'s enumerated system (one system serves every gamma)."""
    _, _, _, gram, h, c = system
    if gamma == 1:
        return h / c
    return np.linalg.solve((1 - gamma) * gram + gamma * np.diag(c), h)


def brute_bias(x, pmf, p, mv):
    return float(p @ (pmf @ x - mv) ** 2)


def _design(m, law):
    """The fixed-m design of the law ``law``."""
    return SamplingDesign(m, replacement=law == "binomial")


def rel(a, b):
    return np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max()


# ---------------------------------------------------------------- brute-force agreement


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("metric", ["recall@10", "ndcg@10", "precision@5", "ap", "ndcg", "rr@20", "auc"])
@pytest.mark.parametrize("n,m", [(300, 50), (20_000, 100)])
def test_bv_matches_brute_force(law, metric, n, m):
    system = brute(metric, n, m, law)
    for gamma in (1.0, 0.1, 0.01, 0.001):
        got = correction_table(metric, n, _design(m, law), Bv(gamma=gamma)).numpy()
        want = bv_solve(system, gamma)
        assert rel(got, want) < 1e-9, (gamma, rel(got, want))


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize(
    "prior",
    [
        BetaPrior(0.5),
        BetaPrior(2.0),
        CallablePrior(lambda r, n: np.exp(-r / 3000.0)),
        ("beta", 0.3),
    ],
    ids=["beta0.5", "beta2", "callable", "tuple-beta0.3"],
)
def test_non_uniform_priors_match_brute_force(law, prior):
    """Composite-rule path (n > 4 (m + 2)): measured relative error < 1e-9 against enumeration."""
    n, m = 20_000, 50
    p = as_prior(prior).weights(n)
    for metric in ("ndcg@10", "ap", "auc"):
        system = brute(metric, n, m, law, p)
        for gamma in (1.0, 0.1, 0.01):
            got = correction_table(metric, n, _design(m, law), Bv(gamma=gamma, prior=prior)).numpy()
            want = bv_solve(system, gamma)
            assert rel(got, want) < 1e-9, (metric, gamma, rel(got, want))


@pytest.mark.parametrize("law", LAWS)
def test_vector_prior_is_enumerated_exactly(law):
    n, m = 5_000, 40
    rng = np.random.default_rng(0)
    p = rng.gamma(0.3, size=n)
    p /= p.sum()
    got = correction_table("recall@10", n, _design(m, law), Bv(prior=torch.tensor(p))).numpy()
    assert rel(got, brute_bv("recall@10", n, m, law, 0.1, p)) < 1e-10


@pytest.mark.parametrize("law", LAWS)
def test_uniform_prior_rows_are_exact_quadrature(law):
    # the rule for a cut-off metric: enumerated head + Gauss tail, exact for P P' and M P
    n, m = 50_000, 30
    spec = parse_metric("ndcg@10")
    r, w = design_rule(spec, n, m, UniformPrior())
    assert r.size < 100 and abs(w.sum() - 1) < 1e-13
    pmf, p, mv, gram, h, c = brute("ndcg@10", n, m, law)
    pq = pmf_at_ranks(r, n, m, law)
    mq = metric_values("ndcg@10", torch.tensor(np.clip(np.round(r), 1, n)), n).numpy() * (r == np.round(r))
    assert rel((pq * w[:, None]).T @ pq, gram) < 1e-12
    assert rel((w * mq) @ pq, h) < 1e-12


# ---------------------------------------------------------------- the methods' defining properties


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("metric", ["ndcg@10", "ap", "recall@5"])
def test_gamma_one_is_posterior_mean(law, metric):
    """eq. 26: M^(r~) = sum_r p(r | r~) M(r), by Bayes with the explicit joint table."""
    n, m = 2_000, 30
    pmf, p, mv, *_ = brute(metric, n, m, law)
    joint = p[:, None] * pmf  # p(r, r~)
    want = (joint * mv[:, None]).sum(0) / joint.sum(0)
    got = correction_table(metric, n, _design(m, law), Bv(gamma=1.0)).numpy()
    assert rel(got, want) < 1e-12


def _brute_cls(pmf, p, mv):
    sw = np.sqrt(p)
    a = sw[:, None] * pmf
    z = np.cumsum(a, axis=1)
    design = np.hstack([z[:, :-1], z[:, -1:], -z[:, -1:]])
    sol, _ = scipy.optimize.nnls(design, sw * mv, maxiter=10_000)
    d = np.concatenate([sol[:-2], [sol[-2] - sol[-1]]])
    return np.cumsum(d[::-1])[::-1]


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("metric", ["recall@10", "ndcg@10", "ap"])
def test_cls_matches_brute_force_and_is_monotone(law, metric):
    n, m = 3_000, 30
    pmf, p, mv, *_ = brute(metric, n, m, law)
    got = correction_table(metric, n, _design(m, law), "cls").numpy()
    want = _brute_cls(pmf, p, mv)
    assert np.all(np.diff(got) <= 1e-12)
    b_got, b_want = brute_bias(got, pmf, p, mv), brute_bias(want, pmf, p, mv)
    assert b_got <= b_want * (1 + 1e-6) + 1e-15
    # the optimum beats every other monotone table
    for other in ("none", "rank_estimate"):
        x = correction_table(metric, n, _design(m, law), other).numpy()
        assert b_got <= brute_bias(x, pmf, p, mv)
    assert b_got <= brute_bias(correction_table(metric, n, _design(m, law), Bv(gamma=1.0)).numpy(), pmf, p, mv)


@given(
    metric=hs.sampled_from(["recall@10", "ndcg@10", "ap", "rr", "precision@3", "ndcg", "auc"]),
    n=hs.integers(60, 10**7),
    m=hs.integers(10, 150),
    law=hs.sampled_from(LAWS),
)
@settings(max_examples=examples(25), deadline=None)
def test_cls_is_monotone_non_increasing(metric, n, m, law):
    n = max(n, m + 2)
    table = correction_table(metric, n, _design(m, law), "cls").numpy()
    assert np.all(np.isfinite(table))
    assert np.all(np.diff(table) <= 1e-12 * max(1.0, np.abs(table).max()))


def _oracle_min_bias(metric, n, m, p):
    """min over degree-m polynomials q of sum_r p(r) (q(r) - M(r))^2 (well-conditioned Legendre basis):
    the exact-arithmetic minimum of eq. 21, since span{P(r~ = i | r)} is all degree <= m polynomials."""
    r = np.arange(1, n + 1, dtype=np.float64)
    v = legendre.legvander(2 * (r - 1) / (n - 1) - 1, m) * np.sqrt(p)[:, None]
    b = metric_curve(metric, n).numpy() * np.sqrt(p)
    q, _ = np.linalg.qr(v)
    res = b - q @ (q.T @ b)
    return float(res @ res)


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("metric", ["recall@10", "ndcg@10", "ap"])
def test_ls_is_minimal_bias_within_float64(law, metric):
    """ls: bias never below the exact minimum, within a factor 2 of it (the rest needs coefficients
    beyond 1e10, see docs), and below bv for every gamma and below cls; coefficients stay bounded."""
    n, m = 5_000, 60
    pmf, p, mv, *_ = brute(metric, n, m, law)
    oracle = _oracle_min_bias(metric, n, m, p)
    ls = correction_table(metric, n, _design(m, law), "ls").numpy()
    b_ls = brute_bias(ls, pmf, p, mv)
    assert oracle * (1 - 1e-9) <= b_ls <= 2 * oracle
    assert np.abs(ls).max() < 1e9
    for gamma in (1e-3, 1e-2, 0.1, 1.0):
        assert b_ls < brute_bias(correction_table(metric, n, _design(m, law), Bv(gamma=gamma)).numpy(), pmf, p, mv)
    assert b_ls < brute_bias(correction_table(metric, n, _design(m, law), "cls").numpy(), pmf, p, mv)
    # fast path (quadrature) and explicit A reach the same bias (coefficients ~1e5 cancel in P @ x: 1e-6)
    assert abs(table_bias(ls, metric, n, _design(m, law)) - b_ls) < 1e-6 * b_ls


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("metric", ["recall@10", "ap", "ndcg@10"])
def test_bv_moves_from_posterior_mean_towards_minimal_bias(law, metric):
    n, m = 5_000, 50
    pmf, p, mv, *_ = brute(metric, n, m, law)
    gammas = [1.0, 0.5, 0.1, 0.03, 0.01, 1e-3, 1e-4]
    biases, variances = [], []
    for g in gammas:
        x = correction_table(metric, n, _design(m, law), Bv(gamma=g)).numpy()
        mean = pmf @ x
        biases.append(float(p @ (mean - mv) ** 2))
        variances.append(float(p @ (pmf @ x**2 - mean**2)))
    assert all(b1 >= b2 * (1 - 1e-9) for b1, b2 in zip(biases, biases[1:]))
    assert all(v1 <= v2 * (1 + 1e-9) for v1, v2 in zip(variances, variances[1:]))
    oracle = _oracle_min_bias(metric, n, m, p)
    assert biases[-1] < 0.75 * biases[0] and biases[-1] >= oracle * (1 - 1e-9)
    # the end of the path: gamma = 0 is the minimal-bias solution
    np.testing.assert_array_equal(
        correction_table(metric, n, _design(m, law), Bv(gamma=0.0)).numpy(), correction_table(metric, n, _design(m, law), "ls").numpy()
    )


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("n", [3_000, 200_000])
def test_auc_recovered_without_bias(law, n):
    m = 50
    ranks = torch.unique(torch.cat([torch.arange(1, 200), torch.linspace(1, n, 500).round().long(), torch.tensor([n])]))
    exact = metric_values("auc", ranks, n)
    for method, kw in [("none", {}), ("rank_estimate", {"rounding": "linear"}), ("ls", {}), ("cls", {})]:
        got = expected_corrected("auc", ranks, n, _design(m, law), method_class(method)(**kw))
        assert torch.abs(got - exact).max() < 1e-9, method


@pytest.mark.parametrize("law", LAWS)
def test_recall_at_10_bv_closer_to_exact_than_uncorrected_for_m_10_to_1000(law):
    """Uniform prior: E_r E[M^(r~) | r] = sum_i c_i M^_i. Every m in 10..100, then every 50th to 1000."""
    n = 10_000
    exact = 10 / n
    spec = parse_metric("recall@10")
    for m in list(range(10, 101)) + list(range(150, 1001, 50)):
        r, w = design_rule(spec, n, m, UniformPrior())
        c = w @ pmf_at_ranks(r, n, m, law)
        corrected = float(c @ correction_table("recall@10", n, _design(m, law), "bv").numpy())
        uncorrected = float(c @ correction_table("recall@10", n, _design(m, law), "none").numpy())
        assert abs(corrected - exact) < abs(uncorrected - exact), m


def test_rank_estimate_closed_forms():
    n, m = 10_000, 99
    i = np.arange(1, m + 2)
    r_hat = 1 + (n - 1) * (i - 1) / m
    floor = correction_table("ndcg@10", n, m, "rank_estimate").numpy()
    np.testing.assert_allclose(floor, metric_values("ndcg@10", torch.tensor(np.floor(r_hat)), n).numpy(), rtol=1e-15)
    lin = correction_table("auc", n, m, RankEstimate(rounding="linear")).numpy()
    np.testing.assert_allclose(lin, (n - r_hat) / (n - 1), rtol=1e-13, atol=1e-15)
    lin_ap = correction_table("ap", n, m, RankEstimate(rounding="linear")).numpy()
    lo = np.floor(r_hat)
    want = (1 / lo) * (1 - (r_hat - lo)) + (1 / np.minimum(lo + 1, n)) * (r_hat - lo)
    np.testing.assert_allclose(lin_ap, want, rtol=1e-13)
    none = correction_table("ndcg@10", n, m, "none").numpy()
    np.testing.assert_allclose(none, metric_values("ndcg@10", torch.tensor(i), m + 1).numpy())


# ---------------------------------------------------------------- the paper's running example


def _expected_means(metric, method, law):
    n, m = 10_000, 99
    out = {}
    for name, ranks in TABLE1.items():
        out[name] = float(expected_corrected(metric, torch.tensor(ranks), n, _design(m, law), method).mean())
    return out


@pytest.mark.parametrize("law", LAWS)
def test_running_example_bv_gamma_0001_puts_c_first(law):
    for metric in ("ap", "ndcg", "recall@10"):
        exact = {k: float(metric_values(metric, torch.tensor(v), 10_000).mean()) for k, v in TABLE1.items()}
        assert max(exact, key=exact.get) == "C"
        sampled = _expected_means(metric, "none", law)
        assert max(sampled, key=sampled.get) != "C", metric
        bv = _expected_means(metric, Bv(gamma=0.001), law)
        assert max(bv, key=bv.get) == "C", (metric, bv)
    # the trade-off: with gamma = 0.1 (more variance penalty, more bias) C is not first for any of them
    for metric in ("ap", "ndcg", "recall@10"):
        bv = _expected_means(metric, Bv(gamma=0.1), law)
        assert max(bv, key=bv.get) != "C", (metric, bv)


# ---------------------------------------------------------------- robustness, caching, errors


@pytest.mark.parametrize("law", LAWS)
def test_no_nan_or_inf_at_extreme_sizes(law):
    for method in ("none", "rank_estimate", "bv", "cls", "ls"):
        for metric in ("recall@10", "auc"):
            t = correction_table(metric, 10**8, _design(1000, law), method)
            assert t.shape == (1001,) and t.dtype == torch.float64 and torch.isfinite(t).all()
    t = correction_table("ndcg@10", 10**8, _design(10**4, law), "none")
    assert torch.isfinite(t).all()
    t = correction_table("ndcg@10", 10**8, _design(10**4, law), RankEstimate(rounding="linear"))
    assert torch.isfinite(t).all()
    t = correction_table("ap", 10**8, _design(200, law), "bv")
    assert torch.isfinite(t).all()
    # small n: every sampled rank is reachable or filled, never 0/0
    t = correction_table("recall@1", 2, 50, Bv(gamma=1.0))
    assert torch.isfinite(t).all()


@pytest.mark.slow
def test_no_nan_posterior_mean_m_10000():
    t = correction_table("ndcg@10", 10**8, 10**4, Bv(gamma=1.0))
    assert t.shape == (10_001,) and torch.isfinite(t).all()
    assert torch.all(t[:-1] >= t[1:] - 1e-15)  # posterior mean of a monotone metric is monotone


def test_tables_are_cached_and_fresh_tensors():
    _table.cache_clear()
    a = correction_table("ndcg@10", 12_345, 50, Bv(gamma=0.1))
    b = correction_table("ndcg@10", 12_345, 50, Bv(gamma=0.1))
    assert _table.cache_info().hits == 1
    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    a[0] = 42.0  # mutating a returned tensor does not touch the cache
    assert correction_table("ndcg@10", 12_345, 50, Bv(gamma=0.1))[0] != 42.0


@pytest.mark.parametrize("prior", [None, ("beta", 2.0), np.full(300, 1 / 300)])
def test_stacked_tables_are_the_groups_tables_and_cached_whole(prior):
    """What the estimators dot with a histogram: every (n, m) group's table in group order; cached as one
    entry (a repeated evaluation has the same groups), a vector prior too (its Prior object hashes by content)."""
    clear_correction_cache()
    n, m = np.array([300, 300, 300]), np.array([10, 20, 5])
    if prior is None or isinstance(prior, tuple):
        n = np.array([300, 451, 1000])
    args = (parse_metric("recall@5"), n, m, correction_from_options("bv", "binomial", {"gamma": 0.1, "prior": prior}))
    out = stacked_tables(*args)
    expected = np.concatenate([correction_table("recall@5", int(a), int(b), Bv(gamma=0.1, prior=prior)).numpy()
                               for a, b in zip(n, m)])
    np.testing.assert_array_equal(out, expected)
    assert not out.flags.writeable
    again = stacked_tables(parse_metric("recall@5"), n, m, correction_from_options("bv", "binomial", {"prior": prior}))
    assert again is out and _stacked.cache_info().hits == 1
    clear_correction_cache()
    assert _stacked.cache_info().currsize == 0 and _table.cache_info().currsize == 0


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(n_items=100, n_samples=SamplingDesign(100, replacement=False)), "n_samples"),
        (dict(n_items=100, n_samples=SamplingDesign(150, replacement=False)), "n_samples"),
        (dict(n_samples=SamplingDesign(20, adaptive_max=80)), "n_samples"),
        (dict(n_samples=SamplingDesign(20, popularity=torch.ones(100))), "n_samples"),
        (dict(gamma=-0.1), "gamma"),
        (dict(gamma=1.5), "gamma"),
        (dict(gamma=float("nan")), "gamma"),
        (dict(method="magic"), "method"),
        (dict(method="bv_mle"), "method"),
        (dict(method=method_class("mes")(n_bootstrap=0)), "method"),
        (dict(method=Bv(max_rel_n_spread=0.1)), "method"),
        (dict(prior=np.full(99, 1 / 99)), "prior"),
        (dict(prior=np.r_[-0.1, np.full(99, 1.1 / 99)]), "prior"),
        (dict(prior=np.full(100, 0.02)), "prior"),
        (dict(prior=lambda r, n: -r), "prior"),
        (dict(prior=("beta", -1.0)), "prior"),
        (dict(n_items=1), "n_items"),
        (dict(n_samples=0), "n_samples"),
        (dict(metric="ndcg@500"), "metric"),
        (dict(metric="foo@3"), "metric"),
    ],
)
def test_bad_input_names_the_argument(kwargs, name):
    args = dict(metric="ndcg@10", n_items=100, n_samples=20, method="bv")
    args.update({k: v for k, v in kwargs.items() if k not in ("gamma", "prior")})
    options = {k: v for k, v in kwargs.items() if k in ("gamma", "prior")}
    with pytest.raises(ValueError, match=name):
        correction_table(**{**args, "method": Bv(**options) if options else args["method"]})


def test_device_argument_and_dtype():
    t = correction_table("recall@10", 1000, 20, device="cpu")
    assert t.device.type == "cpu" and t.dtype == torch.float64


def test_ls_variance_is_flagged_not_hidden():
    """Plain least squares (minimal bias, eq. 21 without constraint) has a table of huge alternating entries
    at n >> m: its raw estimate can leave the metric's range. estimate() says so and reports the range's nearest end
    (the raw value in details); cls and bv stay inside."""
    from reco_sampled_plugin import estimate
    from reco_sampled_plugin.simulate import simulate_sampled_ranks

    rng = np.random.default_rng(0)
    n = 1600
    r = np.clip(np.ceil(rng.beta(0.4, 3.0, size=3000) * n).astype(np.int64), 1, n)
    sampled = simulate_sampled_ranks(torch.as_tensor(r), n, 100, generator=torch.Generator().manual_seed(1))
    table = correction_table("hit@10", n, 100, "ls").numpy()
    assert np.abs(table).max() > 100  # the minimal-bias solution itself, not a numerical accident
    ls = estimate("hit@10", SampledRanks.from_arrays(sampled, n, 100), "ls")
    raw = ls.details["unclipped_value"]
    assert not 0.0 <= raw <= 1.0 and "outside_metric_range" in ls.flags
    assert ls.value == min(max(raw, 0.0), 1.0)  # the point at the range's nearest end, inside its interval
    lo, hi = ls.interval()
    assert lo <= ls.value <= hi
    for method in ("cls", "bv"):
        res = estimate("hit@10", SampledRanks.from_arrays(sampled, n, 100), method)
        assert 0.0 <= res.value <= 1.0 and "outside_metric_range" not in res.flags


def test_a_point_on_its_range_by_rounding_is_not_flagged_outside_it():
    """A value a few ulps past an end of the metric's range is on it: precision@3 of 3 items (the one-point range
    1/3, computed as 0.33333333333333337) and a linear NDCG at its least value are not flagged
    ``outside_metric_range`` (they were), the point moved onto the end; a raw value beyond rounding still is."""
    from reco_sampled_plugin import SampledRanks, estimate
    from reco_sampled_plugin._estimate import in_range

    g = torch.Generator().manual_seed(0)
    e = estimate("precision@3", SampledRanks.from_arrays(torch.randint(1, 22, (200,), generator=g), 3, 20), "gmod")
    assert e.value == e.metric_range[0] == e.metric_range[1] and "outside_metric_range" not in e.flags
    e = estimate("ndcg", SampledRanks.from_arrays(torch.full((10,), 101), 100, 100), "linear")
    assert e.value == e.metric_range[0] and "outside_metric_range" not in e.flags
    third = 1.0 / 3.0
    tiny = 1.0 / 2**40  # precision@2^40: a one-point range of 9.1e-13, its tolerance 9.1e-25, not 1e-12
    for raw, flagged, bounds in ((third + 4e-17, False, (third, third)), (third + 1e-9, True, (third, third)),
                                 (-1e-13, False, (0.0, 1.0)), (-1e-6, True, (0.0, 1.0)),
                                 (tiny * (1 + 1e-15), False, (tiny, tiny)), (1.9e-12, True, (tiny, tiny))):
        value, flags, details = in_range(raw, (), {}, bounds)
        assert value == min(max(raw, bounds[0]), bounds[1])
        assert ("outside_metric_range" in flags) == flagged == ("unclipped_value" in details), raw


@pytest.mark.parametrize("law", LAWS)
def test_bv_cholesky_equals_the_stacked_least_squares(law, monkeypatch):
    """eq. 25 from its normal equations (Cholesky, the default) and as the stacked least squares (pivoted QR,
    forced by an unreachable ratio) give the same tables, and both agree with the enumerated system."""
    import reco_sampled_plugin.corrections as corr

    cases = [("recall@10", 300, 50, 0.1), ("ndcg@10", 20_000, 100, 0.01), ("ap", 5_000, 500, 0.5),
             ("auc", 1_000, 20, 0.99)]
    chol = {}
    for metric, n, m, gamma in cases:
        p, w, mv = corr._weighted_system(parse_metric(metric), n, m, law, as_prior(None, n))
        assert corr._bv_normal(p, w, mv, w @ p, gamma) is not None  # these go through the normal equations
        chol[metric] = correction_table(metric, n, _design(m, law), Bv(gamma=gamma)).numpy()
    corr.clear_correction_cache()
    monkeypatch.setattr(corr, "BV_MIN_RCOND", np.inf)  # every bv table by the stacked QR
    for metric, n, m, gamma in cases:
        qr = correction_table(metric, n, _design(m, law), Bv(gamma=gamma)).numpy()
        assert rel(chol[metric], qr) < 1e-11, (metric, rel(chol[metric], qr))
        if n <= 5_000:
            assert rel(qr, brute_bv(metric, n, m, law, gamma)) < 1e-9
    corr.clear_correction_cache()


@pytest.mark.parametrize("metric,n,m,gamma,prior", [
    ("recall@10", 30, 500, 0.01, ("beta", 2.0)),  # m far above n with replacement, a Beta prior
    ("ndcg@10", 2_000, 30, 1e-13, None),  # a tiny gamma: the normal equations would lose 1e-4 of the table
])
def test_bv_ill_conditioned_normal_equations_fall_back_to_the_stacked_least_squares(metric, n, m, gamma, prior):
    """LAPACK's condition estimate refuses the normal equations; the table (by the stacked QR) still minimises eq. 25's
    objective x' ((1 - gamma) A'A + gamma diag(c)) x - 2 A'b . x of the enumerated system to 1e-9 of its minimum
    (the coefficients themselves are ill-determined there: the system's condition exceeds 1e5)."""
    import reco_sampled_plugin.corrections as corr

    pri = as_prior(prior, n)
    p, w, mv = corr._weighted_system(parse_metric(metric), n, m, "binomial", pri)
    assert corr._bv_normal(p, w, mv, w @ p, gamma) is None
    got = correction_table(metric, n, m, Bv(gamma=gamma, prior=prior)).numpy()
    _, _, _, gram, h, c = brute(metric, n, m, "binomial", pri.weights(n))
    normal = (1 - gamma) * gram + gamma * np.diag(c)
    want = np.linalg.lstsq(normal, h, rcond=None)[0]

    def objective(x):
        return float(x @ normal @ x - 2 * h @ x)

    # the terms cancel (coefficients up to ~1e3): rounding is relative to their magnitudes, not to the objective
    scale = float(np.abs(want) @ np.abs(normal) @ np.abs(want) + 2 * np.abs(h) @ np.abs(want))
    assert objective(got) <= objective(want) + 1e-9 * scale, (objective(got), objective(want), scale)


@settings(max_examples=examples(40), deadline=None)
@given(n=hs.integers(30, 3000), m=hs.integers(5, 120), gamma=hs.sampled_from([1e-9, 1e-4, 0.01, 0.1, 0.5, 0.99]),
       concentration=hs.floats(0.0, 12.0), seed=hs.integers(0, 2**16))
def test_bv_diagonal_bound_on_the_reciprocal_condition(n, m, gamma, concentration, seed):
    """The diagonal test that refuses the normal equations before forming them is a true bound: for the positive
    definite N = (1 - gamma) A'A + gamma diag(c), the 1-norm reciprocal condition (from the exact inverse) is at most
    min N_ii / max N_ii, so a system refused by it would fail ``BV_MIN_RCOND`` anyway. Priors from flat to sharply
    concentrated (a few ranks carrying almost all the mass, as ``bv_mle``'s fitted priors do)."""
    import reco_sampled_plugin.corrections as corr

    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(n, 10.0 ** (-concentration / 3.0)))
    p, w, mv = corr._weighted_system(parse_metric("ndcg@10"), n, m, "binomial", as_prior(weights, n))
    c = w @ p
    normal = (1 - gamma) * (p.T @ (w[:, None] * p)) + gamma * np.diag(np.clip(c, 0.0, None))
    diag = np.diag(normal)
    bound = diag.min() / diag.max()
    with np.errstate(all="ignore"):
        try:
            inv = np.linalg.inv(normal)
        except np.linalg.LinAlgError:  # numerically singular: the reciprocal condition is 0
            inv = None
    if inv is not None and np.all(np.isfinite(inv)):
        rcond = 1.0 / (np.abs(normal).sum(0).max() * np.abs(inv).sum(0).max())
        assert rcond <= bound * (1 + 1e-6) + 1e-15, (rcond, bound)
    if bound < corr.BV_MIN_RCOND:  # refused by the diagonal: the stacked least squares solves it
        assert corr._bv_normal(p, w, mv, c, gamma) is None


def test_bv_mle_tables_refused_by_the_diagonal_equal_the_stacked_least_squares(monkeypatch):
    """``bv_mle``'s fitted prior leaves sampled ranks almost unreachable: its tables skip the normal equations by the
    diagonal test, and equal the tables of the stacked QR forced for every system (the same path, bit for bit)."""
    import reco_sampled_plugin.corrections as corr
    from reco_sampled_plugin.estimators import estimate
    from reco_sampled_plugin.simulate import draw_sampled_ranks

    gen = np.random.default_rng(3)
    n = 1500 + np.arange(2000) % 40
    exact = 1 + np.floor((n - 1) * gen.beta(0.4, 3.0, 2000)).astype(np.int64)
    sampled = draw_sampled_ranks(torch.from_numpy(exact), torch.as_tensor(n), 100, repeats=1, seed=1)[0]
    refused = []
    real = corr._bv_normal

    def spy(p, w, mv, c, gamma):
        cc = np.clip(c, 0.0, None)
        d = (1 - gamma) * np.einsum("r,rk,rk->k", w, p, p) + gamma * cc
        refused.append(d.min() < corr.BV_MIN_RCOND * d.max())
        return real(p, w, mv, c, gamma)

    monkeypatch.setattr(corr, "_bv_normal", spy)
    corr.clear_correction_cache()
    got = [estimate(k, SampledRanks.from_arrays(sampled, n, 100), "bv_mle").value for k in ("ndcg@10", "recall@10")]
    assert sum(refused) >= len(refused) // 2 > 0  # most of its tables are refused before the product
    corr.clear_correction_cache()
    monkeypatch.setattr(corr, "BV_MIN_RCOND", np.inf)
    want = [estimate(k, SampledRanks.from_arrays(sampled, n, 100), "bv_mle").value for k in ("ndcg@10", "recall@10")]
    corr.clear_correction_cache()
    assert got == want


@pytest.mark.parametrize("name", ["sampled", "uncorrected", "rank", "minimal_bias", "constrained_ls", "bias_variance", "BV"])
def test_only_registry_names_name_a_correction(name):
    with pytest.raises(ValueError, match=r"^method: unknown correction .*; use one of \('none', 'rank_estimate', 'ls', "
                                         r"'cls', 'bv'\)"):
        correction_table("hit@10", 100, 10, name)
