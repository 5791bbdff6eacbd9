"""Gauss quadrature for the discrete uniform measure, and the sampling laws at real ranks."""

import mpmath
import numpy as np
import pytest
import scipy.stats as st
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from _profiles import examples

from reco_sampled_plugin.quadrature import composite_rule, gauss_discrete_uniform, gauss_rule, pmf_at_ranks
from reco_sampled_plugin.sampling_laws import sampled_rank_pmf


def _exact_power_mean(big_n: int, d: int) -> float:
    """mean over x = 0..N-1 of (x/(N-1))^d, by Faulhaber (Bernoulli polynomials) in 80-digit arithmetic."""
    with mpmath.workdps(80):
        s = (mpmath.bernpoly(d + 1, big_n) - mpmath.bernpoly(d + 1, 0)) / (d + 1)
        return float(s / big_n / mpmath.mpf(big_n - 1) ** d)


@pytest.mark.parametrize("big_n,k", [(50, 10), (1000, 30), (10**5, 60), (10**8, 40), (128, 113), (20_000, 282)])
def test_gauss_rule_exact_on_monomials(big_n, k):
    t, w = gauss_discrete_uniform(big_n, k)
    assert np.all(w > 0) and abs(w.sum() - 1) < 1e-14
    assert np.all(np.diff(t) > 0) and t[0] >= 0 and t[-1] <= 1
    for d in sorted({0, 1, 2, 7, k, 2 * k - 2, 2 * k - 1}):
        want = _exact_power_mean(big_n, d)
        got = float(np.sum(w * t**d))
        assert abs(got - want) <= 1e-12 * want, (d, got, want)


def test_gauss_rule_not_exact_beyond_its_degree():
    # a K-node rule integrates degree 2K exactly only by accident: the check above can fail
    big_n, k = 1000, 3
    t, w = gauss_discrete_uniform(big_n, k)
    want = _exact_power_mean(big_n, 2 * k)
    assert abs(float(np.sum(w * t ** (2 * k))) - want) > 1e-6 * want


def test_christoffel_and_eigenvector_weights_agree_at_large_n():
    from scipy.linalg import eigh_tridiagonal

    big_n, k = 10**8, 1002
    t, w = gauss_discrete_uniform(big_n, k)
    kk = np.arange(1, k)
    beta = (1 - (kk / big_n) ** 2) * (big_n / (big_n - 1)) ** 2 * kk * kk / (4 * (4 * kk * kk - 1))
    ev, vecs = eigh_tridiagonal(np.full(k, 0.5), np.sqrt(beta))
    assert np.abs(t - ev).max() < 1e-14
    assert np.abs(w - vecs[0] ** 2).max() < 1e-11 * w.max()


@given(lo=hs.integers(1, 500), size=hs.integers(1, 3000), k=hs.integers(1, 40))
@settings(max_examples=examples(40), deadline=None)
def test_gauss_rule_on_ranks_sums_polynomials(lo, size, k):
    hi = lo + size - 1
    r, w = gauss_rule(lo, hi, k)
    x = np.arange(lo, hi + 1, dtype=np.float64)
    assert abs(w.sum() - size) < 1e-10 * size
    deg = 2 * k - 1
    # a polynomial with roots inside the range, scaled to O(1)
    roots = np.linspace(lo, hi, min(deg, 6))
    scale = max(hi - lo, 1)

    def f(v):
        return np.prod([(v - z) / scale for z in roots], axis=0) if len(roots) <= deg else np.ones_like(v)

    want = f(x).sum()
    got = (w * f(r)).sum()
    assert abs(got - want) <= 1e-10 * max(np.abs(f(x)).sum(), 1.0)


@pytest.mark.parametrize("law", ["binomial", "hypergeometric"])
@pytest.mark.parametrize("n,m", [(500, 20), (40, 39), (10_000, 99)])
def test_pmf_at_integer_ranks_matches_scipy(law, n, m):
    r = np.arange(1, n + 1, dtype=np.float64)
    if n > 1000:  # scipy's hypergeom is slow: the ends and a stride of the middle
        r = np.unique(np.concatenate([r[:60], r[::97], r[-60:]]))
    got = pmf_at_ranks(r, n, m, law)
    j = np.arange(m + 1)
    if law == "binomial":
        want = st.binom(m, ((r - 1) / (n - 1))[:, None]).pmf(j)
    else:
        want = st.hypergeom(n - 1, (r - 1)[:, None].astype(int), m).pmf(j)
    assert np.abs(got - want).max() < 1e-12


@pytest.mark.parametrize("law", ["binomial", "hypergeometric"])
def test_pmf_at_real_ranks_is_the_polynomial(law):
    # Lagrange interpolation through m + 1 integer ranks must reproduce the value at a real rank
    n, m = 60, 6
    r_int = np.array([1.0, 10, 20, 30, 40, 50, 60])
    p_int = pmf_at_ranks(r_int, n, m, law)
    x = np.array([1.3, 22.5, 44.25, 59.7])
    lag = np.ones((x.size, r_int.size))
    for a in range(r_int.size):
        for b in range(r_int.size):
            if a != b:
                lag[:, a] *= (x - r_int[b]) / (r_int[a] - r_int[b])
    want = lag @ p_int
    got = pmf_at_ranks(x, n, m, law)
    assert np.abs(got - want).max() < 1e-9 * max(1.0, np.abs(want).max())
    assert np.allclose(got.sum(axis=1), 1.0, atol=1e-9)  # Vandermonde's identity holds for real r


@pytest.mark.parametrize("law", ["binomial", "hypergeometric"])
def test_quadrature_gram_matrix_matches_brute_force(law):
    n, m = 10_000, 100
    p_full = sampled_rank_pmf(torch.arange(1, n + 1), n, m, law).numpy()
    gram = p_full.T @ p_full / n
    r, w = gauss_rule(1, n, m + 2)
    p_q = pmf_at_ranks(r, n, m, law)
    gram_q = (p_q * (w / n)[:, None]).T @ p_q
    assert np.abs(gram_q - gram).max() < 1e-12 * np.abs(gram).max()


@pytest.mark.parametrize("law", ["binomial", "hypergeometric"])
@pytest.mark.parametrize("fn", [lambda r: 1.0 / r, lambda r: 1.0 / np.log2(r + 1)])
def test_composite_rule_error_on_smooth_integrands(law, fn):
    """Measured error of the tail rule for AP/RR (1/r) and NDCG (1/log2(r+1)): < 1e-10 relative."""
    n, m = 200_000, 50
    r, w = composite_rule(1, n, m + 13)
    assert r.size < n / 20
    x = np.arange(1, n + 1, dtype=np.float64)
    want = np.zeros(m + 1)
    for s in range(0, n, 50_000):
        want += fn(x[s : s + 50_000]) @ pmf_at_ranks(x[s : s + 50_000], n, m, law)
    got = (w * fn(r)) @ pmf_at_ranks(r, n, m, law)
    assert np.abs(got - want).max() < 1e-10 * np.abs(want).max()
