"""Gauss quadrature for sums over exact ranks r = 1..n, and the sampling laws at real ranks.

Why: a correction table needs sums over all n exact ranks of products of two sampling pmfs
P(r~ = i | r) (Krichene & Rendle eq. 21-25). Both laws are polynomials of degree m in r
(docs/corrections.md, "How the sums over n ranks are done"), so those products have degree 2m and a Gauss rule with
K >= m + 1 nodes for the *discrete* uniform measure on {lo, ..., hi} sums them exactly, at O(m^2) cost per node,
whatever n is.

Pieces:

* :func:`gauss_discrete_uniform` -- the rule on the grid t = x / (N - 1), x = 0..N-1 (discrete
  Chebyshev / Gram polynomials). Monic recurrence coefficients alpha_k = 1/2 and
  beta_k = (1 - k^2/N^2) (N/(N-1))^2 k^2 / (4 (4k^2 - 1)) (Gautschi 2004, Table 1.2), stable for
  any N because every factor is O(1). Nodes are the eigenvalues of the Jacobi matrix (Golub-Welsch);
  weights are Christoffel numbers 1 / sum_j q_j(t)^2 from the orthonormal recurrence (O(K^2) time,
  O(K) memory, so K = 1e4 nodes need no K x K eigenvector matrix) when N >= K^2/4, where that
  recurrence is accurate (measured: 5e-13 relative); else from the eigenvectors (K small there).
* :func:`gauss_rule` -- the same on ranks lo..hi, weights summing to the number of points; exact
  for polynomials of degree <= 2K - 1. Enumerates the points themselves when K >= hi - lo + 1.
* :func:`composite_rule` -- for integrands that are smooth but not polynomial (AP, NDCG, RR without
  cut-off; a non-uniform prior): points enumerated exactly up to K, then pieces [a, 2a) each with a
  K-node Gauss rule. With K = m + 1 + e nodes a piece integrates f(r) q(r) (q of degree 2m) with an
  error <= ||f - best poly of degree 2e + 1||_inf * sum |q|; for f = 1/r or 1/log2(r + 1) on [a, 2a]
  the singularity at r <= 0 lies at Bernstein-ellipse parameter rho = 3 + sqrt(8) ~ 5.8, so the
  relative error falls like rho^-(2e+2): e = 12 gives < 1e-13 (measured in tests/test_quadrature.py).
* :func:`power_sums` -- sum_{r=lo}^{hi} r^-s per cell in O(1) memory per cell: 64 terms enumerated, the rest
  by Euler-Maclaurin (three Bernoulli terms; the remainder is below 1e-15 relative for s <= 1 from r = 65 on),
  so a cell of 10^12 ranks costs what a cell of 64 does.
* :func:`pmf_at_ranks` -- P(r~ = i | r) as the degree-m polynomial in r, valid at real r (at
  non-integer nodes the hypergeometric polynomial can be negative; its sign is kept).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.linalg import eigh_tridiagonal, eigvalsh_tridiagonal
from scipy.special import gammaln, xlog1py, xlogy

from ._checks import check_elements

__all__ = [
    "gauss_discrete_uniform",
    "gauss_rule",
    "composite_rule",
    "pmf_at_ranks",
    "power_sums",
    "EXTRA_NODES",
]

# extra nodes beyond m + 1 used on pieces where the integrand is smooth but not polynomial
EXTRA_NODES = 12
# rows of the pmf work matrix per chunk
_CHUNK_ELEMENTS = 1 << 22


@lru_cache(maxsize=256)
def gauss_discrete_uniform(n_points: int, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss rule for the uniform probability measure on t = x/(N-1), x = 0..N-1 (N = ``n_points``).

    Returns ``(t, w)``: ``n_nodes`` ascending nodes in [0, 1] and positive weights summing to 1, such that
    ``sum(w * f(t)) == mean(f(x/(N-1)) over x)`` for every polynomial f of degree <= 2 * n_nodes - 1.
    With ``n_nodes >= n_points`` the grid itself is returned (exact for every f). Arrays are read-only.
    """
    big_n, k_nodes = int(n_points), int(n_nodes)
    if big_n < 1 or k_nodes < 1:
        raise ValueError("n_points and n_nodes must be >= 1")
    if k_nodes >= big_n:
        t = np.arange(big_n, dtype=np.float64) / max(big_n - 1, 1)
        w = np.full(big_n, 1.0 / big_n)
    else:
        k = np.arange(1, k_nodes, dtype=np.float64)
        ratio = big_n / (big_n - 1.0)
        beta = (1.0 - (k / big_n) ** 2) * ratio * ratio * k * k / (4.0 * (4.0 * k * k - 1.0))
        off = np.sqrt(beta)
        if 4 * big_n < k_nodes * k_nodes:
            # the forward recurrence of Gram polynomials loses accuracy for degree > ~2 sqrt(N):
            # take the weights from the eigenvectors instead (O(K^2) memory, K small here; bounded before)
            check_elements(k_nodes * k_nodes, "n_samples", f"the eigenvectors of a {k_nodes}-node Gauss rule")
            t, vecs = eigh_tridiagonal(np.full(k_nodes, 0.5), off)
            w = vecs[0] ** 2
            w /= w.sum()
            t = np.clip(t, 0.0, 1.0)
            t.setflags(write=False)
            w.setflags(write=False)
            return t, w
        t = eigvalsh_tridiagonal(np.full(k_nodes, 0.5), off) if k_nodes > 1 else np.array([0.5])
        t = np.clip(t, 0.0, 1.0)
        # Christoffel numbers: 1 / w(t) = sum_j q_j(t)^2 over the orthonormal polynomials q_0..q_{K-1}
        x = t - 0.5
        q_prev = np.zeros_like(t)
        q = np.ones_like(t)
        total = np.ones_like(t)
        for j in range(k_nodes - 1):  # loop over the degree (K steps of vector work), not over data
            b_prev = off[j - 1] if j > 0 else 0.0
            q_next = (x * q - b_prev * q_prev) / off[j]
            q_prev, q = q, q_next
            total += q * q
        w = 1.0 / total
        w /= w.sum()
    t.setflags(write=False)
    w.setflags(write=False)
    return t, w


def gauss_rule(lo: int, hi: int, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Rule on the ranks lo..hi: real nodes and weights summing to ``hi - lo + 1``.

    ``sum(w * f(nodes)) == sum(f(r) for r in lo..hi)`` for polynomials of degree <= 2 n_nodes - 1;
    the points themselves (weights 1, exact for every f) when ``2 n_nodes >= hi - lo + 1``.
    """
    size = hi - lo + 1
    if size <= 0:
        return np.empty(0), np.empty(0)
    if 2 * n_nodes >= size:  # a rule would save little: enumerate (exact)
        return np.arange(lo, hi + 1, dtype=np.float64), np.ones(size)
    t, w = gauss_discrete_uniform(size, n_nodes)
    return lo + (size - 1.0) * t, w * size


def composite_rule(lo: int, hi: int, n_nodes: int, ratio: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Rule on lo..hi for smooth, non-polynomial integrands: geometric pieces [a, ratio*a), each with a
    ``n_nodes``-point Gauss rule (pieces of at most ``n_nodes`` points are enumerated exactly)."""
    nodes, weights = [], []
    a = lo
    while a <= hi:
        b = min(hi, max(a, int(np.floor(a * ratio)) - 1))
        r, w = gauss_rule(a, b, n_nodes)
        nodes.append(r)
        weights.append(w)
        a = b + 1
    if not nodes:
        return np.empty(0), np.empty(0)
    return np.concatenate(nodes), np.concatenate(weights)


def _log_binom_coef(m: int) -> np.ndarray:
    j = np.arange(m + 1, dtype=np.float64)
    return gammaln(m + 1.0) - gammaln(j + 1.0) - gammaln(m - j + 1.0)


def _pmf_binomial(r: np.ndarray, n: int, m: int) -> np.ndarray:
    t = np.clip((r - 1.0) / (n - 1.0), 0.0, 1.0)[:, None]
    j = np.arange(m + 1, dtype=np.float64)
    # log C(m, j) + xlogy(j, t) + xlog1py(m - j, -t) with one logarithm per rank: scipy's xlogy(x, y) is
    # x * log(y) (0 where x == 0), so j * xlogy(1, t) is the same product bit for bit, several times faster than a
    # logarithm per element (the x == 0 column, where 0 * -inf would be nan, set to scipy's 0); the same sums,
    # exponentials and quotients in place (two (rows, m + 1) arrays instead of six)
    with np.errstate(invalid="ignore"):
        logp = j * xlogy(1.0, t)
        rest = (m - j) * xlog1py(1.0, -t)
    logp[:, 0] = 0.0
    rest[:, m] = 0.0
    np.add(_log_binom_coef(m), logp, out=logp)
    logp += rest
    logp -= logp.max(axis=1, keepdims=True)
    p = np.exp(logp, out=logp)
    p /= p.sum(axis=1, keepdims=True)  # rows sum to 1 exactly in theory; removes gammaln rounding
    return p


def _pmf_hypergeometric(r: np.ndarray, n: int, m: int) -> np.ndarray:
    """C(r-1, j) C(n-r, m-j) / C(n-1, m) as a polynomial in real r, sign kept (log |.| in float64)."""
    i = np.arange(m, dtype=np.float64)
    den = np.log(n - 1.0 - i)  # log(n-1-i), i < m (n - 1 >= m, so > 0)
    rows = r.size
    # f1[:, j] = sum_{i<j} log(|r-1-i| / (n-1-i)), f2 the same of |n-r-i|, n1 / n2 the counts of negative factors;
    # each (rows, m) step in place, the running sums written into the (rows, m + 1) results (the same operations
    # as one array per step, fewer arrays)
    f1, f2 = np.empty((rows, m + 1)), np.empty((rows, m + 1))
    n1, n2 = np.empty((rows, m + 1), dtype=np.int64), np.empty((rows, m + 1), dtype=np.int64)
    for f, nn, d in ((f1, n1, r[:, None] - 1.0 - i), (f2, n2, n - r[:, None] - i)):  # r-1-i, n-r-i
        nn[:, 0] = 0
        np.cumsum(np.signbit(d), axis=1, out=nn[:, 1:])
        np.abs(d, out=d)
        with np.errstate(divide="ignore"):
            np.log(d, out=d)
        d -= den
        f[:, 0] = 0.0
        np.cumsum(d, axis=1, out=f[:, 1:])
    # E[j] = sum_{i<m-j} log((n-1-i)/(n-1-j-i)) = T[m-j] - T[m] + T[j], T[a] = sum_{i<a} log1p(-i/(n-1))
    tt = np.concatenate([[0.0], np.cumsum(np.log1p(-i / (n - 1.0)))])
    j = np.arange(m + 1)
    e = tt[m - j] - tt[m] + tt[j]
    logabs = np.add(_log_binom_coef(m) + e, f1, out=f1)
    logabs += f2[:, ::-1]
    n1 += n2[:, ::-1]
    sign = np.where((n1 % 2) == 1, -1.0, 1.0)
    with np.errstate(over="ignore"):
        return np.multiply(sign, np.exp(logabs, out=logabs), out=logabs)


def pmf_at_ranks(ranks: np.ndarray, n_items: int, n_samples: int, sampling: str) -> np.ndarray:
    """P(r~ = i | r), i = 1..m+1, for real ranks in [1, n] as a (len(ranks), m+1) float64 array.

    The polynomial extension of the law to real r (degree m): equal to the pmf at integer ranks,
    possibly negative (hypergeometric) between them. ``sampling`` must be normalised already.
    """
    r = np.asarray(ranks, dtype=np.float64).reshape(-1)
    fn = _pmf_binomial if sampling == "binomial" else _pmf_hypergeometric
    chunk = max(1, _CHUNK_ELEMENTS // (n_samples + 1))
    if r.size <= chunk:
        return fn(r, n_items, n_samples)
    return np.concatenate([fn(r[s : s + chunk], n_items, n_samples) for s in range(0, r.size, chunk)])


_POWER_HEAD = 64  # terms of a power sum enumerated before Euler-Maclaurin takes over


def power_sums(lo: np.ndarray, hi: np.ndarray, s: float) -> np.ndarray:
    """sum_{r=lo}^{hi} r^-s for whole ranks 1 <= lo (arrays, broadcast; 0 where hi < lo) and s >= 0, without
    enumerating the ranks: the first 64 terms of each cell exactly, the rest a..b by Euler-Maclaurin,
    int_a^b x^-s dx + (f(a) + f(b))/2 + sum_k B_2k/(2k)! (f^(2k-1)(b) - f^(2k-1)(a)), k = 1..3."""
    lo, hi = np.broadcast_arrays(np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64))
    s = float(s)
    r = lo[..., None] + np.arange(_POWER_HEAD)
    head = np.where(r <= hi[..., None], r.astype(np.float64) ** -s, 0.0).sum(-1)
    tail = hi >= lo + _POWER_HEAD
    a = np.where(tail, lo + _POWER_HEAD, 1).astype(np.float64)
    b = np.where(tail, hi, 1).astype(np.float64)
    t, span = 1.0 - s, np.log(b / a)
    integral = a**t * (span if t == 0.0 else np.expm1(t * span) / t)

    def deriv(x: np.ndarray, order: int) -> np.ndarray:  # d^order/dx^order x^-s (odd orders: negative)
        c = -np.prod(s + np.arange(order)) if order else 1.0
        return c * x ** (-s - order)

    em = integral + 0.5 * (deriv(a, 0) + deriv(b, 0))
    for order, coef in ((1, 1.0 / 12.0), (3, -1.0 / 720.0), (5, 1.0 / 30240.0)):
        em = em + coef * (deriv(b, order) - deriv(a, order))
    return head + np.where(tail, em, 0.0)
