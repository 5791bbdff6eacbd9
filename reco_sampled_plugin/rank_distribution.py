"""Global rank distribution estimated from sampled ranks (Jin et al., AAAI 2021; Li et al., AAAI 2023).

The histogram of sampled ranks (m + 1 counts per (n, m) group) is a sufficient statistic for the
distribution P(R) of the exact ranks under the sampling law:

    P(r~ = i) = sum_R P(R) P(r~ = i | R),   P(r~ | R) binomial or hypergeometric (``sampling_laws``).

We estimate P(R) and then any metric at any cut-off as sum_R P^(R) M(R).

Grid (cost independent of n): P(R) is piecewise constant on cells of exact ranks. Cell widths are
max(1, min(delta R, kappa sqrt(R (n - 1)/m))): single ranks at the top (R < 1/delta), geometric growth
(relative width delta) below, and in the tail at most kappa times the spread sqrt(p/m) of the sampled
rank on the p = (R - 1)/(n - 1) scale; a few hundred cells for any n. Every group's n is a cell edge.
P(r~ | cell) averages the law over up to 8 ranks spread evenly through the cell.

Per-instance candidate counts: group g with n_g candidates sees the common P(R) truncated to
1..n_g (P_g(R) = P(R)/Z_g). The EM treats the ranks cut off above n_g as missing data (the classic
EM for truncated samples), so the observed-data likelihood still never decreases. More than
``max_groups`` distinct (n, m) pairs are pooled into quantile bins of n (an approximation, reported).

Estimators:

* ``mle``: maximum likelihood by EM, started from the uniform P(R); stops when the log-likelihood
  gains less than ``tol`` per positive in an iteration (or after ``max_iter``, flagged).
* ``mes``: maximum-entropy-regularised likelihood, our reading of Jin et al.'s MES: maximise
  (1/M) loglik + lam * H(P), H the entropy of P over ranks (maximal for the uniform P), solved with
  scipy's L-BFGS-B over softmax logits. Default lam = MES_LAMBDA / M (MES_LAMBDA = 10, whatever m):
  ten nats of log-likelihood in total buy one nat of entropy. Chosen on synthetic Beta-shaped rank
  distributions (n = 946..1663, m in {50, 100, 500}) and checked on ml-100k (docs/estimators.md); an
  earlier default growing with m, (m + 1)/(2 M), over-smoothed at m = 500 (HR@10 30% low on ml-100k).

Standard errors: bootstrap over the histogram multinomial (M positives resampled with the observed
sampled-rank frequencies), each replicate refitted: ``mle`` reruns the early-stopped EM from the same
uniform start (batched over replicates; warm starts at the fit would stop at once and understate the
spread), ``mes`` is refitted from the fit, every replicate by its own stopping rule in one batched L-BFGS
(``_mes_fit_batched``). They cover sampling noise, not the bias of the grid or of the
unidentified top (see the ``top_unresolved`` flag: below about (n - 1)/(m + 1) the data hardly constrain
the shape of P(R), which then comes from the uniform start or the entropy term).

Entry points: :func:`fit_rank_distribution` (one sample or a sequence of them, batched) with a method object of the
registry (``registry.Mle``, ``Mes``, ``Gmod``: the fit options, checked once at construction); :class:`ReplicateFits`
(many draws of the same positives, prepared once, fitted together); :class:`RankDistribution` (the fit: P(R), its
metrics, priors); :func:`estimate_by_fit` (the registry's compute function of ``mle``, ``mes``, ``gmod``). The fits
of one histogram are kept on it by method object and law (``RankHistogram._derived``), so estimating several metrics
from one sample fits it once.

Adaptive sampling (Li et al., AAAI 2023; ``adaptive.py``): positives ranked first get more samples (doubling m
until they are not first or a cap is reached). Stopping on r~ = 1 multiplies the likelihood of an instance by a
factor that does not depend on R, so the estimators simply take the per-positive final sample sizes.

Exact groups (``exact_at_cap``: positives still first at the cap ranked exactly, ``_rank_hist``): a completed
positive with exact rank R_0 has likelihood P(first at every stage | R) 1[R = R_0] = (1 - p_0)^cap 1[R = R_0]: a
constant times the point mass at R_0, so the stopping factor does not change the fit. Its group (n, m = n - 1) is
read with the law of sampling without replacement at m = n - 1 (r~ = R), whatever the law of the other groups:
on the grid, P(r~ = i | cell c) = 1 / |c| for i in cell c (the identity on single-rank cells). Pooling never
mixes exact and sampled groups (:func:`pool_groups`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from collections.abc import Sequence as _Sequence
from typing import Any, Callable, ClassVar, Iterable, Iterator, Protocol, Sequence, cast, overload

import numpy as np
import torch
from scipy import sparse, special

from ._rank_hist import (
    RankHistogram,
    as_histogram,
    interval_mean_metric,
    interval_mean_metrics,
    pair_groups,
    pool_by_n,
    pool_exact_groups,
)
from ._checks import (MAX_FIT_ELEMENTS, MAX_SAMPLES, MAX_SIZE, check_elements, check_rank_values, check_sampled_support, check_sizes,
                      check_without_replacement, impossible_rank_message)
from ._options import check_metric_names
from . import registry
from ._blas import blas_single
from ._types import TensorLike
from .metric_names import MetricSpec, parse_metric
from ._sampled import SampledRanks
from .sampling_laws import check_law, log_sampled_rank_pmf_unbounded as _log_sampled_rank_pmf
from ._gspline import G_DF, G_PENALTY, cell_points, g_basis as _g_basis, spline_objective as _spline_objective
from ._gspline import softmax as _softmax, spline_penalty, spline_probs, spline_value

__all__ = [
    "RANK_DISTRIBUTION_METHODS",
    "RankDistribution",
    "DistributionEstimate",
    "rank_grid",
    "pool_groups",
    "fit_rank_distribution",
    "ReplicateFits",
]

# a live view of the registry: the rank-distribution methods (an estimator registered later appears)
__getattr__ = registry.module_views(__name__, RANK_DISTRIBUTION_METHODS={"family": "rank_distribution"})


class _FitMethod(Protocol):
    """What the fits read of a rank-distribution method object (``registry.Mle``, ``Mes``, ``Gmod``: a frozen
    ``registry.Method`` whose fields include the fit options, ``registry.fit_option_names()``; a fitter reads its
    own options, such as ``lam`` or ``df``, by name)."""

    entry: ClassVar[registry.Estimator]
    name: str  # the registered name (a property of the method object)
    n_bootstrap: int | None
    seed: int
    tol: float
    max_iter: int
    max_groups: int
    delta: float
    kappa: float
    trace: bool
    max_rel_n_spread: float | None


def _fit_method(method: str | registry.Method) -> _FitMethod:
    """``method`` as the method object of a rank-distribution method (a ValueError naming ``method`` otherwise)."""
    obj = registry.as_method(method)
    if type(obj).entry.family != "rank_distribution":
        raise ValueError(f"method: {obj.name!r} does not fit a rank distribution; use one of "
                         f"{registry.names(family='rank_distribution')}")
    return cast(_FitMethod, obj)


_LIK_FLOOR = 1e-16
_PROB_FLOOR = 1e-250  # smallest mixture probability the MES objective takes the log of (ratios stay < 1e256)
# MES entropy weight per positive: lam = MES_LAMBDA / M (see the module docstring)
MES_LAMBDA = 10.0
_MES_WARM_STEPS = 25  # EM (SQUAREM) cycles that start the MES fit
# likelihood matrices with at most this share of non-zeros are multiplied as sparse matrices (the products
# are memory-bound; sparse kernels are single-threaded and measured faster than dense BLAS there)
_SPARSE_MAX_DENSITY = 0.3


# --------------------------------------------------------------------------------------------- grid
@lru_cache(maxsize=64)
def _grid(n: int, m: int, delta: float, kappa: float) -> np.ndarray:
    edges = [0]
    e = 0
    scale = (n - 1.0) / m
    while e < n:  # one step per cell (a few hundred): not a loop over items
        r = e + 1.0
        w = max(1, int(min(delta * r, kappa * math.sqrt(r * scale))))
        e = min(n, e + w)
        edges.append(e)
    return np.asarray(edges, dtype=np.int64)


def rank_grid(n_items: int, n_samples: int, delta: float = 0.05, kappa: float = 0.25, extra_edges: Sequence[int] | np.ndarray = ()) -> np.ndarray:
    """Cell edges e_0 = 0 < e_1 < ... < e_C = n; cell c holds the exact ranks e_c + 1 .. e_{c+1}."""
    edges = _grid(int(n_items), int(n_samples), float(delta), float(kappa))
    if len(extra_edges):
        edges = np.union1d(edges, np.asarray(extra_edges, dtype=np.int64))
    return edges




# ------------------------------------------------------------------------------------------- model
@dataclass
class _Model:
    """The likelihood on the observed support: only the K (group, r~) columns that hold counts enter the
    likelihood (and every bootstrap draw stays on them), so the cost follows the data, not m_max x groups
    (adaptive sampling: m up to 32 m in a dozen groups, a few hundred occupied columns)."""

    edges: np.ndarray  # (C + 1,)
    n: np.ndarray  # (G,) candidates per group
    m: np.ndarray  # (G,) samples per group
    cols: np.ndarray  # (K, 2) int64: (group, i) of each column, i = r~ - 1
    counts: np.ndarray  # (K,) counts of the fitted histogram on the columns
    lik: np.ndarray  # (C, K): P(r~ = i | cell, group) on the columns; zero for cells above n_g
    inside: np.ndarray  # (G, C) bool: cell within 1..n_g
    pooled: bool  # groups were pooled into bins of n
    # None: derived in __post_init__ (the type is that of the derived arrays)
    onehot: np.ndarray = None  # type: ignore[assignment]  # (K, G) float64: column -> group
    inside_f: np.ndarray = None  # type: ignore[assignment]  # (C, G) float64
    lik_sparse: sparse.csr_matrix | None = None  # lik, sparse when mostly zeros (single-threaded, faster there)
    lik_sparse_t: Any = field(default=None, init=False, repr=False)  # lik_sparse.T (set in __post_init__)
    exact: np.ndarray = None  # type: ignore[assignment]  # (G,) bool: exact groups (point masses at their ranks)

    def __post_init__(self) -> None:
        if self.onehot is None:
            self.onehot = np.zeros((len(self.cols), len(self.n)))
            self.onehot[np.arange(len(self.cols)), self.cols[:, 0]] = 1.0
        if self.inside_f is None:
            self.inside_f = np.ascontiguousarray(self.inside.T.astype(np.float64))
        if self.exact is None:
            self.exact = np.zeros(len(self.n), dtype=bool)
        if self.lik_sparse is None and np.count_nonzero(self.lik) <= _SPARSE_MAX_DENSITY * self.lik.size:
            self.lik_sparse = sparse.csr_matrix(self.lik)
        # its transpose (a CSC view of the same arrays), made once: ``mix`` runs hundreds of times per fit
        self.lik_sparse_t = None if self.lik_sparse is None else self.lik_sparse.T

    @property
    def widths(self) -> np.ndarray:
        return np.diff(self.edges).astype(np.float64)

    def totals(self, counts: np.ndarray) -> np.ndarray:
        """Positives per group for counts (..., K): (..., G)."""
        return counts @ self.onehot

    def mix(self, pi: np.ndarray) -> np.ndarray:
        """P(r~ = i | group) = sum_c pi_c lik[c, k] on the columns, for pi of shape (..., C): (..., K)."""
        flat = pi.reshape(-1, pi.shape[-1])
        out = np.asarray(self.lik_sparse_t @ flat.T).T if self.lik_sparse_t is not None else flat @ self.lik
        return out.reshape(pi.shape[:-1] + (self.lik.shape[1],))

    def back(self, ratio: np.ndarray) -> np.ndarray:
        """sum_k lik[c, k] ratio[..., k]: (..., C)."""
        flat = ratio.reshape(-1, ratio.shape[-1])
        out = np.asarray(self.lik_sparse @ flat.T).T if self.lik_sparse is not None else flat @ self.lik.T
        return out.reshape(ratio.shape[:-1] + (-1,))

    def group_counts(self, counts: np.ndarray) -> tuple:
        """Counts (K,) back to one (m_g + 1,) array per group."""
        sizes = self.m + 1
        starts = np.cumsum(sizes) - sizes
        flat = np.zeros(int(sizes.sum()))
        flat[starts[self.cols[:, 0]] + self.cols[:, 1]] = counts
        return tuple(np.split(flat, starts[1:]))


# more distinct sample sizes than this are pooled onto a geometric grid of m (``_pool_m``); adaptive sampling
# (m, 2m, ..., 32m) and a few samplers stay exact
_MAX_EXACT_M = 8
_M_SPREAD = 0.1


def _m_bin_tops(m: np.ndarray, spread: float = _M_SPREAD) -> np.ndarray:
    """Each m moved to the largest m of its bin: bins over the distinct m (hundreds at most, not positives), a new
    bin where an m exceeds the bin's first by more than the factor 1 + spread (:func:`_pool_m`)."""
    um = np.unique(m)
    edges = [int(um[0])]
    for v in um[1:].tolist():
        if v > edges[-1] * (1.0 + spread):
            edges.append(int(v))
    bin_lo = np.asarray(edges)
    top = np.array([int(um[(um >= lo) & ((um < bin_lo[k + 1]) if k + 1 < len(bin_lo) else True)].max())
                    for k, lo in enumerate(bin_lo)])
    return top[np.searchsorted(bin_lo, m, side="right") - 1]


def _quantile_bins(n: np.ndarray, m: np.ndarray, totals: np.ndarray,
                   max_groups: int) -> Iterator[tuple[int, np.ndarray, int]]:
    """:func:`pool_groups`' quantile bins of n: per sample size m, the groups (n ascending) cut into
    ``max_groups // (distinct m)`` bins of equal positive counts; yields (m, the bin's group indices in ascending n,
    the bin's count-weighted median n: one of its groups' n, so valid for either law (no floor at m + 1: with
    replacement m may exceed n - 1, e.g. adaptive stages beyond the catalogue))."""
    sizes = np.unique(m)
    bins = max(1, max_groups // len(sizes))
    for mval in sizes:  # one pass per sample size (a few), vectorised over the groups of that size
        idx = np.flatnonzero(m == mval)
        order = idx[np.argsort(n[idx], kind="stable")]
        tot = totals[order]
        cum = np.cumsum(tot) / tot.sum()
        label = np.minimum((cum * bins - 1e-12).astype(np.int64), bins - 1)
        for b in np.unique(label):
            sel = label == b
            w, ns = tot[sel], n[order[sel]]  # ns ascending
            half = np.searchsorted(np.cumsum(w), 0.5 * w.sum()) if w.sum() > 0 else 0
            yield int(mval), order[sel], int(ns[min(half, len(ns) - 1)])


def _pool_m(hist: RankHistogram, spread: float = _M_SPREAD) -> RankHistogram:
    """Many distinct m (e.g. m proportional to each user's n): groups whose m lie within a factor 1 + spread
    are moved to the largest m' of their bin, with n' - 1 = (n - 1) m' / m so that the expected number of
    sampled items above a positive, m (R - 1)/(n - 1), is unchanged for every R (the binomial laws then agree
    up to O(1/m) at the top, and in variance by at most the spread deep in the list). Counts keep their r~
    (r~ <= m + 1 <= m' + 1). Exact for the top; the approximation is flagged ``pooled_n`` by the callers."""
    m_new = _m_bin_tops(hist.n_samples, spread)
    n_new = 1 + np.rint((hist.n_items - 1.0) * m_new / hist.n_samples).astype(np.int64)
    n_out, m_out, gid = pair_groups(n_new, m_new)
    offsets = np.concatenate([[0], np.cumsum(m_out + 1)])
    sizes = hist.n_samples + 1
    starts = np.cumsum(sizes) - sizes
    counts = hist.flat_counts
    nz = np.flatnonzero(counts)  # occupied entries only (at most one per positive), not sum(m + 1)
    owner = np.searchsorted(starts, nz, side="right") - 1
    pos = nz - starts[owner]  # r~ - 1 within its group
    flat = np.bincount(offsets[gid[owner]] + pos, weights=counts[nz], minlength=int(offsets[-1]))
    return RankHistogram(n_out, m_out, tuple(np.split(flat, offsets[1:-1])))


def pool_groups(hist: RankHistogram, max_groups: int, max_rel_n_spread: float | None = None) -> tuple[RankHistogram, bool]:
    """Fewer (n, m) groups for the likelihood: onto a geometric grid of n (``max_rel_n_spread``, see
    :func:`~reco_sampled_plugin._rank_hist.pool_by_n`), or else, beyond ``max_groups`` groups, into
    quantile bins of n (count-weighted median n per bin). More than ``_MAX_EXACT_M`` distinct m are first
    pooled onto a geometric grid of m (:func:`_pool_m`). Exact groups (``RankHistogram.exact``) are pooled among
    themselves (:func:`~reco_sampled_plugin._rank_hist.pool_exact_groups`: same grid of n, or at most
    ``max_groups`` bins), never with a sampled group. Returns (histogram, whether it changed)."""
    if hist.has_exact:
        exact = hist.exact_part()
        pooled_exact = pool_exact_groups(exact, max_groups=max_groups, n_grid_nodes=max_rel_n_spread)
        sampled = hist.sampled_part()
        if sampled.n_groups == 0:
            return pooled_exact, not pooled_exact.same_groups(exact)
        pooled_sampled, changed = pool_groups(sampled, max_groups, max_rel_n_spread)
        return pooled_sampled.concat(pooled_exact), changed or not pooled_exact.same_groups(exact)
    m_pooled = len(np.unique(hist.n_samples)) > _MAX_EXACT_M
    if m_pooled:
        hist = _pool_m(hist)
    if max_rel_n_spread is not None:
        pooled = pool_by_n(hist, max_rel_n_spread)
        return pooled, m_pooled or not pooled.same_groups(hist)
    if hist.n_groups <= max_groups:
        return hist, m_pooled
    reps: dict[tuple[int, int], np.ndarray] = {}
    for mval, members, rep in _quantile_bins(hist.n_items, hist.n_samples, hist.totals, max_groups):
        key = (rep, mval)
        c = np.stack([hist.counts[g] for g in members]).sum(axis=0)
        reps[key] = reps[key] + c if key in reps else c
    keys = sorted(reps)
    pooled = RankHistogram(
        np.array([k[0] for k in keys], dtype=np.int64),
        np.array([k[1] for k in keys], dtype=np.int64),
        tuple(reps[k] for k in keys),
    )
    return pooled, True


def model_grid(n_items: Sequence[int] | np.ndarray, n_samples: Sequence[int] | np.ndarray, delta: float = 0.05, kappa: float = 0.25,
               extra_edges: Sequence[int] | np.ndarray = ()) -> np.ndarray:
    """The cell edges of a fit over groups (n_g, m_g): :func:`rank_grid` of the largest n and m, with every
    n_g and the ``extra_edges`` (whole ranks below n_max) as edges."""
    n_arr = np.asarray(n_items, dtype=np.int64)
    n_max = int(n_arr.max())
    extra = np.asarray([e for e in extra_edges if 0 < e < n_max], dtype=np.int64)
    return rank_grid(n_max, int(max(n_samples)), delta, kappa, extra_edges=np.concatenate([n_arr, extra]))


def dense_likelihood(edges: np.ndarray, n_items: Sequence[int] | np.ndarray, n_samples: Sequence[int] | np.ndarray, law: str) -> tuple[np.ndarray, np.ndarray]:
    """P(r~ = i | cell, group) for every i (G, C, m_max + 1) and the inside mask (G, C): each cell's law
    averaged over up to 8 ranks spread through it (``cell_points``)."""
    pts, wts = cell_points(edges)
    G, C = len(n_items), len(edges) - 1
    m_max = int(max(n_samples))
    lik = np.zeros((G, C, m_max + 1))
    inside = np.zeros((G, C), dtype=bool)
    for g in range(G):  # one pass per (n, m) group
        n_g, m_g = int(n_items[g]), int(n_samples[g])
        c_in = int(np.searchsorted(edges, n_g))  # cells 0..c_in-1 lie within 1..n_g (n_g is an edge)
        inside[g, :c_in] = True
        logp = _log_sampled_rank_pmf(torch.from_numpy(pts[:c_in].astype(np.float64)), n_g, m_g, law).numpy()
        lik[g, :c_in, : m_g + 1] = np.einsum("cs,csi->ci", wts[:c_in], np.exp(logp))
    return lik, inside


def _binomial_logpmf(logp: np.ndarray, log1mp: np.ndarray, j: np.ndarray, m: int) -> np.ndarray:
    """log Binomial(j; m, p) from log p and log(1 - p), elementwise over their broadcast with whole j in 0..m
    (0 log 0 = 0 at p = 0 and p = 1). log j! from a table of 0..m (the same values as ``gammaln`` per element), the
    products only where their factor is non-zero, sums in place: the same numbers as the direct formula, with fewer
    passes over the (pairs, points) arrays (the likelihood's build is a fixed cost of every fit)."""
    k = np.asarray(j).astype(np.int64)
    jf = k.astype(np.float64)
    log_fact = special.gammaln(np.arange(m + 1, dtype=np.float64) + 1.0)  # log j!, j = 0..m
    log_c = math.lgamma(m + 1.0) - log_fact[k] - log_fact[m - k]
    shape = np.broadcast_shapes(jf.shape, np.shape(logp), np.shape(log1mp))
    out = np.zeros(shape)
    np.multiply(jf, logp, out=out, where=jf > 0)  # j log p, 0 where j = 0 (also at p = 0)
    out += log_c
    tail = np.zeros(shape)
    rest = m - jf
    np.multiply(rest, log1mp, out=tail, where=rest > 0)  # (m - j) log(1 - p), 0 where j = m
    out += tail
    return out


# Bernstein's inequality, P(X - m p >= t) <= exp(-t^2 / (2 (v + t / 3))) with v = m p (1 - p) (and the same below
# the mean), puts every binomial probability farther than t(v) = (L + sqrt(L^2 + 18 L v)) / 3, L = ln(1e18), from
# its mean m p below 1e-18: such
# (cell, column) pairs are below the likelihood's floor 1e-16 whatever the cell's 8 points, so they are not computed
_BAND_LOG = math.log(1e18)


def _binomial_band(pts: np.ndarray, wts: np.ndarray, n: int, m: int, i: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cell-averaged binomial likelihood on the (cell, column) pairs that can reach 1e-18: (cell index (P,),
    column position in ``i`` (P,), value (P,)) for cells with points ``pts`` (c, S), weights ``wts`` and successes
    ``i`` (K,). The cost follows the pairs within Bernstein's band of each cell (``_BAND_LOG``), not c x K."""
    p = (pts.astype(np.float64) - 1.0) / (n - 1.0)  # (c, S)
    v = m * (p * (1.0 - p)).max(-1)
    t = (_BAND_LOG + np.sqrt(_BAND_LOG**2 + 18.0 * _BAND_LOG * v)) / 3.0
    lo, hi = m * p.min(-1) - t, m * p.max(-1) + t
    order = np.argsort(i, kind="stable")
    js = i[order]
    first = np.searchsorted(js, lo, side="left")
    counts = np.searchsorted(js, hi, side="right") - first
    cell = np.repeat(np.arange(len(p)), counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    col = order[np.repeat(first, counts) + offsets]
    with np.errstate(divide="ignore"):
        logp, log1mp = np.log(p), np.log1p(-p)  # once per rank, gathered per pair
    logp = _binomial_logpmf(logp[cell], log1mp[cell], i[col][:, None], m)  # (P, S)
    return cell, col, np.einsum("ps,ps->p", wts[cell], np.exp(logp, out=logp))


@lru_cache(maxsize=32)
def _likelihood(n_items: tuple, n_samples: tuple, law: str, delta: float, kappa: float, extra_edges: tuple = (),
                support: tuple = (), exact: tuple = ()) -> _Model:
    """Grid edges, P(r~ | cell, group) on the ``support`` columns (flat keys g (m_max + 1) + i) and the inside
    mask for groups (n_g, m_g). Depends on sizes and support only, not on the counts, so it is cached (repeated
    fits on new draws of the same users reuse it). ``extra_edges``: more cell edges, e.g. shape-zone bounds.
    ``exact``: (G,) bools, True for an exact group (module docstring), read with the point mass at its rank
    (1 / cell width), not with ``law``; the grid follows the sampled groups' m (all exact: the largest n - 1)."""
    n_arr = np.asarray(n_items, dtype=np.int64)
    m_arr = np.asarray(n_samples, dtype=np.int64)
    m_max = int(m_arr.max())
    ex = np.asarray(exact, dtype=bool) if len(exact) else np.zeros(len(n_arr), dtype=bool)
    edges = model_grid(n_arr, m_arr[~ex] if (~ex).any() else m_arr, delta, kappa, extra_edges)
    keys = np.asarray(support, dtype=np.int64)
    cols = np.stack([keys // (m_max + 1), keys % (m_max + 1)], axis=1) if len(keys) else np.zeros((0, 2), np.int64)
    G, C = len(n_items), len(edges) - 1
    check_elements(C * len(cols), "n_samples", f"the likelihood P(r~ | cell) of {C:,} rank cells x {len(cols):,} "
                   "observed sampled ranks", MAX_FIT_ELEMENTS)
    lik = np.zeros((C, len(cols)))
    inside = np.zeros((G, C), dtype=bool)
    pts, wts = cell_points(edges)
    for g in range(G):  # one pass per (n, m) group
        n_g, m_g = int(n_arr[g]), int(m_arr[g])
        c_in = int(np.searchsorted(edges, n_g))  # cells 0..c_in-1 lie within 1..n_g (n_g is an edge)
        inside[g, :c_in] = True
        sel = np.flatnonzero(cols[:, 0] == g)
        if not len(sel):
            continue
        if ex[g]:  # r~ = R: the column's rank R = i + 1 in its cell c, P(R | cell) = 1 / |c|
            c = np.searchsorted(edges, cols[sel, 1] + 1, side="left") - 1
            lik[c, sel] = 1.0 / np.diff(edges)[c]
        elif law == "binomial":
            cell, col, val = _binomial_band(pts[:c_in], wts[:c_in], n_g, m_g, cols[sel, 1])
            lik[cell, sel[col]] = val
        else:  # the ratio recurrence needs whole rows (hypergeometric designs have few, moderate m)
            full = _log_sampled_rank_pmf(torch.from_numpy(pts[:c_in].astype(np.float64)), n_g, m_g, law).numpy()
            lik[:c_in, sel] = np.einsum("cs,csk->ck", wts[:c_in], np.exp(full[..., cols[sel, 1]]))
    # drop probabilities below 1e-16 (each row sums to 1): every mixture probability changes by less than
    # 1e-16 absolute (observed ones are >= ~1e-8, so < 1e-8 relative), no subnormal numbers slow the
    # matmuls, and the likelihood matrix becomes sparse (~20% non-zeros at m = 500)
    lik[lik < _LIK_FLOOR] = 0.0
    model = _Model(edges, n_arr, m_arr, cols, np.zeros(len(cols)), lik, inside, False)
    for arr in (edges, lik, inside, cols, model.onehot, model.inside_f):
        arr.setflags(write=False)
    return model


def _occupied(hist: RankHistogram) -> tuple[np.ndarray, np.ndarray]:
    """(group, r~ - 1) of the histogram's non-zero counts, from its flat layout (no loop over groups)."""
    nz = np.flatnonzero(hist.flat_counts)
    g = np.searchsorted(hist._starts, nz, side="right") - 1
    return g, nz - hist._starts[g]


def _support(hists: Iterable[RankHistogram], m_max: int) -> tuple:
    """Flat keys g (m_max + 1) + i of the columns occupied in any of the histograms (same groups)."""
    keys = [g * (m_max + 1) + i for g, i in map(_occupied, hists)]
    return tuple(np.unique(np.concatenate(keys)).tolist())


def _flat_counts(model: _Model, hist: RankHistogram) -> np.ndarray:
    """A histogram with the model's groups as counts on the model's columns (K,)."""
    return np.asarray(hist.flat_counts[hist._starts[model.cols[:, 0]] + model.cols[:, 1]], dtype=np.float64)


def _build_model(
    hist: RankHistogram, sampling: str, max_groups: int, delta: float, kappa: float, max_rel_n_spread: float | None = None,
    extra_edges: tuple = (), others: Sequence[RankHistogram] = (),
) -> _Model:
    """The model of ``hist`` (pooled), its counts on the columns; ``others``: more pooled histograms with the
    same groups whose columns must be in the support (batched fits)."""
    law = check_law(sampling)
    hist, pooled = pool_groups(hist, max_groups, max_rel_n_spread)
    check_without_replacement(hist.n_items, hist.n_samples, law)
    m_max = int(hist.n_samples.max())
    base = _likelihood(
        tuple(int(v) for v in hist.n_items), tuple(int(v) for v in hist.n_samples), law, float(delta), float(kappa),
        tuple(int(e) for e in extra_edges), _support((hist,) + tuple(others), m_max),
        tuple(bool(v) for v in hist.exact) if hist.has_exact else (),
    )
    model = _Model(base.edges, hist.n_items.copy(), hist.n_samples.copy(), base.cols, np.zeros(len(base.cols)),
                   base.lik, base.inside, pooled, base.onehot, base.inside_f, base.lik_sparse, hist.exact.copy())
    model.counts = _flat_counts(model, hist)
    possible = np.asarray((model.lik > 0).sum(axis=0)).reshape(-1) > 0  # some rank can produce the column's r~
    if np.any((model.counts > 0) & ~possible):
        g, i = model.cols[np.flatnonzero((model.counts > 0) & ~possible)[0]]
        raise ValueError(impossible_rank_message(int(i) + 1, int(model.n[g]), int(model.m[g]), law))
    return model


def _loglik(model: _Model, pi: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
    """Observed-data log-likelihood for pi of shape (..., C); counts (..., K)."""
    counts = model.counts if counts is None else counts
    prob = model.mix(pi)
    z = pi @ model.inside_f
    with np.errstate(divide="ignore"):
        term = np.where(counts > 0, counts * np.log(np.where(counts > 0, prob, 1.0)), 0.0)
    return term.sum(axis=-1) - (model.totals(counts) * np.log(z)).sum(-1)


def _em_step(model: _Model, pi: np.ndarray, counts: np.ndarray, totals_g: np.ndarray, has: np.ndarray) -> np.ndarray:
    """One EM update of the truncated mixture (observed counts plus the phantom ranks above each n_g)."""
    prob = model.mix(pi)
    ratio = np.where(has, counts / np.where(has, prob, 1.0), 0.0)
    expected = pi * model.back(ratio)
    z = pi @ model.inside_f
    phantom = pi * ((totals_g / z) @ (1.0 - model.inside_f.T))
    new = expected + phantom
    return new / new.sum(-1, keepdims=True)


def _em_batched(model: _Model, pi0: np.ndarray, counts: np.ndarray, tol: float, max_iter: int,
                trace: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """EM accelerated by SQUAREM (Varadhan & Roland 2008, scheme S3) with a monotone safeguard, for a batch.

    pi0 (B, C), counts (B, K). Each cycle takes two EM steps, extrapolates, and keeps the
    extrapolated point only where it does not lower the log-likelihood (else the plain two-step EM point), so
    the log-likelihood never decreases. Each problem stops on its own when a cycle gains less than ``tol`` per
    positive (it is then frozen, so a batched fit equals the single fits); the remaining ones share one matmul
    per EM product. Returns pi (B, C), EM steps (B,), converged (B,), trace of the summed log-likelihood.
    """
    pi = np.array(pi0, dtype=np.float64)
    batch = pi.shape[0]
    totals_all = model.totals(counts)
    total_all = totals_all.sum(-1)
    has_all = counts > 0
    ll_prev = _loglik(model, pi, counts)
    lls = [float(np.sum(ll_prev))] if trace else []
    steps = np.zeros(batch, dtype=np.int64)
    converged = np.zeros(batch, dtype=bool)
    active = np.arange(batch)
    while active.size and int(steps[active[0]]) < max_iter:  # cycles; each vectorised over the active batch
        p0, cnt, tg, has = pi[active], counts[active], totals_all[active], has_all[active]
        p1 = _em_step(model, p0, cnt, tg, has)
        p2 = _em_step(model, p1, cnt, tg, has)
        r = p1 - p0
        v = p2 - p1 - r
        rn = np.sqrt(np.sum(r * r, -1, keepdims=True))
        vn = np.sqrt(np.sum(v * v, -1, keepdims=True))
        alpha = np.minimum(-1.0, -rn / np.maximum(vn, 1e-300))
        ext = p0 - 2.0 * alpha * r + alpha * alpha * v
        ext = np.maximum(ext, 1e-300 * p0)  # stay inside the simplex (and off exact zeros of the support)
        ext = ext / ext.sum(-1, keepdims=True)
        ext = _em_step(model, ext, cnt, tg, has)
        steps[active] += 3
        ll_ext = _loglik(model, ext, cnt)
        ll_p2 = _loglik(model, p2, cnt)
        take = ll_ext >= ll_p2
        new = np.where(take[:, None], ext, p2)
        ll = np.where(take, ll_ext, ll_p2)
        gain = (ll - ll_prev[active]) / total_all[active]
        pi[active], ll_prev[active] = new, ll
        if trace:
            lls.append(float(np.sum(ll_prev)))
        done = gain < tol
        converged[active[done]] = True
        active = active[~done]
    return pi, steps, converged, lls


def _em(model: _Model, pi0: np.ndarray, counts: np.ndarray, tol: float, max_iter: int,
        trace: bool = False) -> tuple[np.ndarray, int, bool, list[float]]:
    """:func:`_em_batched` for pi0 (..., C) and counts (..., K); returns pi (..., C), the largest
    step count, whether every problem converged, and the trace."""
    lead = np.broadcast_shapes(pi0.shape[:-1], counts.shape[:-1])
    b = int(np.prod(lead)) if lead else 1
    pi_b = np.broadcast_to(pi0, lead + pi0.shape[-1:]).reshape(b, -1)
    cnt_b = np.broadcast_to(counts, lead + counts.shape[-1:]).reshape((b,) + counts.shape[-1:])
    pi, steps, conv, lls = _em_batched(model, pi_b, cnt_b, tol, max_iter, trace)
    return pi.reshape(lead + pi0.shape[-1:]), int(steps.max()), bool(conv.all()), lls


def _mes_lambda(total: float | np.ndarray, lam: float | None) -> np.ndarray:
    """The MES entropy weight: ``MES_LAMBDA`` / M by default (M positives, scalar or per histogram)."""
    lam_used = MES_LAMBDA / np.asarray(total, dtype=np.float64) if lam is None else np.full(np.shape(total), float(lam))
    if not np.all(np.isfinite(lam_used)) or np.any(lam_used < 0):
        raise ValueError(f"lam: must be a finite number >= 0, got {lam}")
    return lam_used


def _mes_start(model: _Model, pi0: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Starting point of the MES fit: a short EM run (``_MES_WARM_STEPS`` SQUAREM cycles) from the uniform
    pi0, mixed 9:1 with pi0. From the uniform start itself L-BFGS-B can push the logits of the top cells so
    far down in its first line searches that their softmax gradient vanishes (seen with lam = 10/M:
    NDCG@20 ~ 1e-40 "converged"); the objective is concave in pi, so any interior start reaches the optimum."""
    pi, _, _, _ = _em(model, pi0, counts, 1e-6, _MES_WARM_STEPS)
    return 0.9 * pi + 0.1 * pi0


def _reference_measure(edges: np.ndarray, beta: float) -> np.ndarray:
    """nu_c = sum of r^-beta over the ranks of cell c (beta = 0: the cell widths): the base measure of the
    entropy, whose maximiser spreads each cell's mass like r^-beta (beta = 1: uniform in log r)."""
    if beta == 0.0:
        return np.diff(edges).astype(np.float64)
    lo = edges[:-1].astype(np.float64)
    hi = edges[1:].astype(np.float64)
    head = np.arange(1, 65, dtype=np.float64) ** (-beta)  # exact sums over ranks 1..64, the integral beyond
    cum = np.concatenate([[0.0], np.cumsum(head)])

    def partial(x: np.ndarray) -> np.ndarray:  # sum_{r=1}^{x} r^-beta
        x = np.asarray(x)
        small = np.minimum(x, 64.0).astype(np.int64)
        if beta == 1.0:
            tail = np.log((x + 0.5) / 64.5)
        else:
            tail = ((x + 0.5) ** (1.0 - beta) - 64.5 ** (1.0 - beta)) / (1.0 - beta)
        return cum[small] + np.where(x > 64, tail, 0.0)

    return np.maximum(partial(hi) - partial(lo), 1e-300)


def _truncated_loglik(model: _Model, pi: np.ndarray, counts: np.ndarray, totals_g: np.ndarray, has: np.ndarray,
                      inside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The observed-data log-likelihood of cell probabilities ``pi`` (..., C) (each group's P truncated to its n)
    and its gradient in pi (..., C), for counts (..., K) (``has``: counts > 0) and their group totals (..., G): one
    problem or a batch. Floors: far out in a line search the softmax can underflow to exact zeros on every cell that
    explains an observed column (log 0, 0 / 0): the value then stays finite and steep instead of NaN."""
    prob = model.mix(pi)
    zg = np.maximum(pi @ inside.T, _PROB_FLOOR)
    safe = np.where(has, np.maximum(prob, _PROB_FLOOR), 1.0)
    ll = np.where(has, counts * np.log(safe), 0.0).sum(-1) - (totals_g * np.log(zg)).sum(-1)
    dll = model.back(np.where(has, counts / safe, 0.0)) - (totals_g / zg) @ inside
    return ll, dll


def _mes_fit(model: _Model, counts: np.ndarray, lam: float, pi0: np.ndarray, tol: float, max_iter: int, trace: bool = False,
             beta: float = 0.0) -> tuple[np.ndarray, Any, list[float]]:
    """Maximise loglik/M + lam * H(P) over softmax logits with L-BFGS-B; returns pi, result, objective trace.
    H is the entropy relative to the base measure r^-beta (``_reference_measure``; beta = 0: uniform over ranks)."""
    widths = _reference_measure(model.edges, beta)
    logw = np.log(widths)
    inside = model.inside.astype(np.float64)
    total = counts.sum()
    totals_g = model.totals(counts)
    has = counts > 0

    def unpack(theta: np.ndarray) -> np.ndarray:
        return _softmax(theta + logw)

    scale = max(float(lam), 1.0)

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        pi = unpack(theta)
        ll_arr, dll = _truncated_loglik(model, pi, counts, totals_g, has, inside)
        ll = float(ll_arr)
        per_rank = np.maximum(pi / widths, 1e-300)
        ent = -float(np.dot(pi, np.log(per_rank)))
        f = -ll / total - lam * ent
        grad_pi = -dll / total + lam * (np.log(per_rank) + 1.0)
        grad = pi * (grad_pi - np.dot(pi, grad_pi))
        # divided by max(lam, 1): the same minimiser, unchanged for the default lam (10 / M < 1), and for a huge
        # entropy weight (lam = 1e300, finite, accepted) a gradient the line search and y . y can still handle
        return f / scale, grad / scale

    values = []
    theta0 = np.log(np.maximum(pi0, 1e-300)) - logw
    from scipy import optimize  # imported when first needed: 0.1-0.2 s a plan or batched fit never pays

    res = optimize.minimize(
        objective,
        theta0,
        jac=True,
        method="L-BFGS-B",
        callback=(lambda xk: values.append(objective(xk)[0])) if trace else None,
        options={"maxiter": max_iter, "ftol": tol, "gtol": 1e-12, "maxcor": 20},
    )
    return unpack(res.x), res, values


def _mes_objective(
    model: _Model, counts: np.ndarray, lam: np.ndarray, beta: float,
) -> tuple[Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]], np.ndarray]:
    """The MES objective of :func:`_mes_fit` for a batch, divided by max(lam, 1): f(theta) (B,) and its gradient
    (B, C) at logits theta (B, C) of B problems (counts (B, K), entropy weights lam (B,)) on one model."""
    widths = _reference_measure(model.edges, beta)
    logw = np.log(widths)
    inside = model.inside.astype(np.float64)
    total = counts.sum(-1)
    totals_g = model.totals(counts)
    has = counts > 0

    def evaluate(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """f (R,), gradient (R, C), pi (R, C) of the problems ``rows`` at their logits theta (R, C)."""
        tot, lm = total[rows], lam[rows]
        pi = _softmax(theta + logw)
        ll, dll = _truncated_loglik(model, pi, counts[rows], totals_g[rows], has[rows], inside)
        log_per_rank = np.log(np.maximum(pi / widths, 1e-300))
        ent = -(pi * log_per_rank).sum(-1)
        f = -ll / tot - lm * ent
        grad_pi = -dll / tot[:, None] + lm[:, None] * (log_per_rank + 1.0)
        grad = pi * (grad_pi - (pi * grad_pi).sum(-1, keepdims=True))
        scale = np.maximum(lm, 1.0)  # see _mes_fit
        return f / scale, grad / scale[:, None], pi

    return evaluate, logw


def _lbfgs_direction(g: np.ndarray, S: np.ndarray, Y: np.ndarray, age: np.ndarray, newest: int, sy: np.ndarray,
                     yy: np.ndarray) -> np.ndarray:
    """-H g for a batch, H the L-BFGS inverse Hessian in the compact form of Byrd, Nocedal & Schnabel (1994,
    eq. 3.1): g (A, C); pairs S, Y (A, M, C) in a ring shared by the batch, ``age`` (A, M) each slot's insertion
    count (-1: empty or dropped, its vectors zero), ``newest`` the slot written last; ``sy`` and ``yy`` (A, M, M)
    the products s_i . y_j and y_i . y_j, kept up to date by the caller (one row and column per new pair). R
    (upper triangular in the pairs' order) is s_i . y_j for pairs i not younger than j; an empty slot gets a unit
    diagonal, so the systems stay regular whatever the order of the slots."""
    memory = S.shape[1]
    valid = age >= 0
    older = (age[:, :, None] <= age[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    R = np.where(older, sy, 0.0) + np.where(valid, 0.0, 1.0)[:, :, None] * np.eye(memory)
    D = np.where(valid, np.diagonal(sy, axis1=1, axis2=2), 0.0)
    has = valid[:, newest]
    s_n, y_n = S[:, newest], Y[:, newest]
    y2 = (y_n * y_n).sum(-1)
    gamma = np.where(has, (s_n * y_n).sum(-1) / np.where(y2 > 0, y2, 1.0),
                     1.0 / np.maximum(np.abs(g).sum(-1), 1e-300))[:, None]  # no pair: an L1-normalised gradient
    a = (S @ g[..., None])[..., 0]
    b = (Y @ g[..., None])[..., 0]
    u = np.linalg.solve(R, a[..., None])[..., 0]  # R^-1 S^T g
    rhs = D * u + gamma * (np.einsum("bij,bj->bi", yy, u) - b)
    top = np.linalg.solve(R.transpose(0, 2, 1), rhs[..., None])[..., 0]
    return -(gamma * g + (top[:, None, :] @ S)[:, 0] - gamma * (u[:, None, :] @ Y)[:, 0])


def _mes_fit_batched(model: _Model, counts: np.ndarray, lam: np.ndarray, pi0: np.ndarray, tol: float,
                     max_iter: int, beta: float = 0.0, memory: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_mes_fit` for B problems at once (:func:`_lbfgs_batched`, stopped by L-BFGS-B's own rules: relative
    decrease of the objective at most ``tol``, or largest gradient entry at most 1e-12): the B fits cost one batched
    objective evaluation per iteration instead of B scipy runs. Returns pi (B, C), iterations (B,), converged (B,)."""
    evaluate, logw = _mes_objective(model, counts, np.asarray(lam, dtype=np.float64), beta)
    theta = np.log(np.maximum(pi0, 1e-300)) - logw
    return _lbfgs_batched(evaluate, theta, tol, 1e-12, max_iter, memory)


def _lbfgs_batched(evaluate: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
                   theta: np.ndarray, ftol: float, gtol: float, max_iter: int,
                   memory: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimise B problems at once from ``theta`` (B, D): L-BFGS (compact form, ``memory`` pairs) with a
    backtracking Armijo line search from the unit step, vectorised over the problems, each stopped by L-BFGS-B's
    own rules (relative decrease of the objective at most ``ftol``, or largest gradient entry at most ``gtol``)
    and then dropped from the working arrays. ``evaluate(theta (A, D), rows (A,))`` gives the objectives (A,),
    gradients (A, D) and the outputs (A, C) of problems ``rows``. Returns outputs (B, C) at the end, iterations
    (B,), converged (B,)."""
    theta = np.array(theta, dtype=np.float64)
    batch, cells = theta.shape
    idx = np.arange(batch)  # the problems still running (rows of the working arrays below)
    f, g, pi_w = evaluate(theta, idx)
    pi_out = pi_w.copy()
    iters = np.zeros(batch, dtype=np.int64)
    converged = np.zeros(batch, dtype=bool)
    S = np.zeros((batch, memory, cells))
    Y = np.zeros((batch, memory, cells))
    age = np.full((batch, memory), -1, dtype=np.int64)
    sy = np.zeros((batch, memory, memory))  # s_i . y_j
    yy = np.zeros((batch, memory, memory))  # y_i . y_j
    running = np.abs(g).max(-1) > gtol
    converged[~running] = True
    it = 0
    while True:
        if not running.all():  # compact the working arrays to the problems still running
            idx, theta, f, g, pi_w, S, Y, age, sy, yy = (x[running] for x in (idx, theta, f, g, pi_w, S, Y, age, sy, yy))
        if not idx.size or it >= max_iter:
            break
        slot = it % memory
        d = _lbfgs_direction(g, S, Y, age, (it - 1) % memory, sy, yy)
        slope = (d * g).sum(-1)
        bad = ~(slope < 0)  # not a descent direction (rounding): forget the pairs, step along the gradient
        if np.any(bad):
            age[bad] = -1
            S[bad] = 0.0
            Y[bad] = 0.0
            sy[bad] = 0.0
            yy[bad] = 0.0
            d[bad] = -g[bad] / np.maximum(np.abs(g[bad]).sum(-1, keepdims=True), 1e-300)
            slope[bad] = (d[bad] * g[bad]).sum(-1)
        step = np.ones(idx.size)
        f_new, g_new, pi_new = f.copy(), g.copy(), pi_w.copy()
        searching = np.arange(idx.size)
        for _ in range(40):  # backtracking, vectorised over the problems still searching
            fs, gs, ps = evaluate(theta[searching] + step[searching, None] * d[searching], idx[searching])
            ok = fs <= f[searching] + 1e-4 * step[searching] * slope[searching]
            hit = searching[ok]
            f_new[hit], g_new[hit], pi_new[hit] = fs[ok], gs[ok], ps[ok]
            searching = searching[~ok]
            if not searching.size:
                break
            step[searching] *= 0.5
        moved = np.ones(idx.size, dtype=bool)
        moved[searching] = False  # no decrease found along d
        s_new = np.where(moved[:, None], step[:, None] * d, 0.0)
        y_new = g_new - g
        curv = (s_new * y_new).sum(-1)
        keep = moved & (curv > 1e-12 * (y_new * y_new).sum(-1))  # curvature: only pairs keeping H positive definite
        S[:, slot] = np.where(keep[:, None], s_new, 0.0)
        Y[:, slot] = np.where(keep[:, None], y_new, 0.0)
        age[:, slot] = np.where(keep, it, -1)
        sy[:, slot, :] = (Y @ S[:, slot, :, None])[..., 0]  # s_new . y_j
        sy[:, :, slot] = (S @ Y[:, slot, :, None])[..., 0]  # s_i . y_new
        yy[:, slot, :] = (Y @ Y[:, slot, :, None])[..., 0]
        yy[:, :, slot] = yy[:, slot, :]
        rel = (f - f_new) / np.maximum(np.maximum(np.abs(f), np.abs(f_new)), 1.0)
        theta += s_new
        f, g, pi_w = f_new, g_new, pi_new
        iters[idx] += 1
        it += 1
        done = moved & ((rel <= ftol) | (np.abs(g).max(-1) <= gtol))
        # a line search that finds no decrease: at the optimum to rounding where the slope is below ftol
        done |= ~moved & (np.abs(slope) <= ftol * np.maximum(np.abs(f), 1.0))
        converged[idx[done]] = True
        running = ~(done | ~moved)
        pi_out[idx] = pi_w
    return pi_out, iters, converged


# ------------------------------------------------------------------------------------------ fitters
# a fitter's result: (pi (C,), iterations, converged, objective trace, details) for one histogram, and
# (pi (B, C), iterations (B,), converged (B,), details per histogram) for a batch
_Fit = tuple[np.ndarray, int, bool, tuple[float, ...], dict]
_BatchFit = tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]


class EMFitter:
    """``mle``: the NPMLE on the grid by EM (SQUAREM-accelerated), stopped by ``tol`` per positive.

    Bootstrap replicates repeat the whole procedure from the same uniform start and stopping rule: the EM stops
    well before the NPMLE (which overfits), so its result depends on where it starts, and replicates
    warm-started at the fit would stop at once and understate the spread."""

    default_bootstrap = 32
    target = "population"  # what RankDistribution.metric estimates for the registry (``estimate_by_fit``)

    def fit(self, model: _Model, pi0: np.ndarray, counts: np.ndarray, method: _FitMethod) -> _Fit:
        """(pi, iterations, converged, objective trace, details) of one histogram's counts; ``method`` the options."""
        pi, iters, converged, lls = _em(model, pi0, counts, method.tol, method.max_iter, method.trace)
        return pi, iters, converged, tuple(float(v) for v in lls), {}

    def fit_batch(self, model: _Model, pi0: np.ndarray, counts: np.ndarray, method: _FitMethod) -> _BatchFit:
        """(pi (B, K), iterations (B,), converged (B,), details per histogram) of B histograms' counts."""
        pi, steps, conv, _ = _em_batched(model, pi0, counts, method.tol, method.max_iter)
        return pi, steps, conv, [{} for _ in range(len(counts))]

    def fit_many(self, model: _Model, pi0: np.ndarray, counts: np.ndarray, method: _FitMethod) -> _BatchFit:
        """:meth:`fit_batch` (already one batched EM, equal to the single fits)."""
        return self.fit_batch(model, pi0, counts, method)

    def bootstrap(self, model: _Model, draws: np.ndarray, pi: np.ndarray, pi0: np.ndarray, method: _FitMethod,
                  details: dict) -> np.ndarray:
        start = np.broadcast_to(pi0, (len(draws), len(pi)))
        return _em(model, start, draws, method.tol, method.max_iter)[0]


class MESFitter:
    """``mes``: log-likelihood per positive plus ``lam`` times the entropy (relative to r^-beta), maximised by
    L-BFGS-B from a short EM warm start (batches of histograms: one run each, equal to the single fits). Bootstrap
    replicates are fitted by :func:`_mes_fit_batched`, each warm-started at the fit and stopped by its own rule: a joint run minimising the
    summed objective stops when the sum settles, with the replicates still near the warm start (bootstrap spread
    1.5-2.7x too small, measured)."""

    default_bootstrap = 16
    target = "population"

    def fit(self, model: _Model, pi0: np.ndarray, counts: np.ndarray, method: _FitMethod) -> _Fit:
        lam = float(_mes_lambda(counts.sum(), getattr(method, "lam", None)))
        start = _mes_start(model, pi0, counts)
        pi, res, values = _mes_fit(model, counts, lam, start, method.tol, method.max_iter, method.trace,
                                   getattr(method, "beta", 0.0))
        return pi, int(res.nit), bool(res.success), tuple(float(v) for v in values), {"lam": lam}

    def fit_batch(self, model: _Model, pi0: np.ndarray, counts: np.ndarray, method: _FitMethod) -> _BatchFit:
        # one L-BFGS-B run per histogram, as a single fit (the planner forecasts what estimate() gives: the
        # batched solver stops within the same tolerance but not at the same point, measured up to ~0.1 sd)
        lam = _mes_lambda(counts.sum(axis=1), getattr(method, "lam", None))
        start = _mes_start(model, pi0, counts)
        fits = [_mes_fit(model, counts[b], float(lam[b]), start[b], method.tol, method.max_iter,
                         beta=getattr(method, "beta", 0.0)) for b in range(len(counts))]
        pi = np.stack([f[0] for f in fits])
        iters = np.array([int(f[1].nit) for f in fits])
        conv = np.array([bool(f[1].success) for f in fits])
        return pi, iters, conv, [{"lam": float(lam[b])} for b in range(len(counts))]

    def fit_many(self, model: _Model, pi0: np.ndarray, counts: np.ndarray, method: _FitMethod) -> _BatchFit:
        """B histograms' fits in one batched L-BFGS (:func:`_mes_fit_batched`, from the same EM warm start as
        :meth:`fit`), each stopped by its own rule: within the tolerance of the single fits, not at their point."""
        lam = _mes_lambda(counts.sum(axis=1), getattr(method, "lam", None))
        start = _mes_start(model, pi0, counts)
        pi, iters, conv = _mes_fit_batched(model, counts, lam, start, method.tol, method.max_iter,
                                           getattr(method, "beta", 0.0))
        return pi, iters, conv, [{"lam": float(lam[b])} for b in range(len(counts))]

    def bootstrap(self, model: _Model, draws: np.ndarray, pi: np.ndarray, pi0: np.ndarray, method: _FitMethod,
                  details: dict) -> np.ndarray:
        start = np.broadcast_to(pi, (len(draws), len(pi)))
        lam = np.full(len(draws), details["lam"])
        return _mes_fit_batched(model, draws, lam, start, method.tol, method.max_iter, getattr(method, "beta", 0.0))[0]


def _g_objective(
    model: _Model, counts: np.ndarray, basis: np.ndarray, penalty: float,
) -> tuple[Callable[[np.ndarray], tuple[float, np.ndarray]], Callable[[np.ndarray], np.ndarray]]:
    """``gmod``'s :func:`_spline_objective`: the truncated binomial likelihood of the histogram's groups."""
    inside = model.inside.astype(np.float64)
    totals_g = model.totals(counts)
    has = counts > 0
    def loglik(pi: np.ndarray) -> tuple[float, np.ndarray]:
        ll, dll = _truncated_loglik(model, pi, counts, totals_g, has, inside)
        return float(ll), dll

    return _spline_objective(np.log(model.widths), basis, penalty, counts.sum(), loglik)


def _g_objective_batched(
    model: _Model, counts: np.ndarray, basis: np.ndarray, penalty: float,
) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """:func:`_g_objective` for B problems (counts (B, K)) on one model, for :func:`_lbfgs_batched`:
    ``evaluate(alpha (A, df), rows (A,))`` gives f (A,), its gradient (A, df) and [pi, alpha] (A, C + df)."""
    logw = np.log(model.widths)
    inside = model.inside.astype(np.float64)
    total = counts.sum(-1)
    totals_g = model.totals(counts)
    has = counts > 0
    pen = spline_penalty(basis.shape[1], penalty)

    def evaluate(alpha: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pi = spline_probs(logw, basis, alpha)
        ll, dll = _truncated_loglik(model, pi, counts[rows], totals_g[rows], has[rows], inside)
        f, grad = spline_value(alpha, pi, ll, dll, total[rows], basis, pen)
        return f, grad, np.concatenate([pi, alpha], axis=1)

    return evaluate


def _g_fit(model: _Model, counts: np.ndarray, df: int, penalty: float, alpha0: np.ndarray | None, tol: float, max_iter: int,
           trace: bool = False) -> tuple[np.ndarray, Any, list[float]]:
    basis = _g_basis(model.edges, df)
    objective, pi_of = _g_objective(model, counts, basis, penalty)
    values: list[float] = []
    start = np.zeros(basis.shape[1]) if alpha0 is None else alpha0
    from scipy import optimize  # imported when first needed (as above)

    res = optimize.minimize(objective, start, jac=True, method="L-BFGS-B",
                            callback=(lambda a: values.append(objective(a)[0])) if trace else None,
                            options={"maxiter": max_iter, "ftol": tol * 1e-3, "gtol": 1e-9})
    return pi_of(res.x), res, values


class GModelFitter:
    """``gmod``: Efron's g-modelling (Biometrika 2016, "Empirical Bayes deconvolution estimates"), log P(R) a cubic
    B-spline in log R with ``df`` coefficients, maximum penalised likelihood (squared second differences of the
    coefficients times ``penalty``) by L-BFGS-B from the uniform distribution over ranks. Smooth on the log-rank
    scale, which the data identify where the design resolves the top (adaptive sampling, K above the resolution);
    elsewhere the shape inside the first sampled bin is the basis's, not the data's (``top_unresolved``).
    Bootstrap replicates are refitted from the fit's coefficients, each by its own stopping rule. Its estimate is
    the users' metric (``RankDistribution.metric(target="users")``): each positive's posterior mean under the
    fitted prior, which uses every positive's own r~ (nearer the oracle than the population value). Its standard
    error adds a model term: half the difference to the users' value under ``mes`` fitted to the same data
    (``reference``), because the bootstrap cannot see the smoothness assumption's own bias (an irregular top: coverage 0.65 without it on
    ml-100k, m = 500, docs/estimators.md)."""

    default_bootstrap = 16
    target = "users"
    #: a second, differently regularised fit of the same data (``RankDistribution.reference``): the spread of the
    #: users' value between the two priors is the model term of the standard error (see ``metric``)
    reference = "mes"

    @staticmethod
    def _shape(method: _FitMethod) -> tuple[int, float]:
        """(df, penalty) of ``method`` (``G_DF``, ``G_PENALTY`` where it has none or None)."""
        df, penalty = getattr(method, "df", None), getattr(method, "penalty", None)
        return G_DF if df is None else df, G_PENALTY if penalty is None else penalty

    def _fit(self, model: _Model, counts: np.ndarray, method: _FitMethod, trace: bool) -> _Fit:
        df, penalty = self._shape(method)
        pi, res, values = _g_fit(model, counts, df, penalty, None, method.tol, method.max_iter, trace)
        return pi, int(res.nit), bool(res.success), tuple(float(v) for v in values), {
            "df": df, "penalty": penalty, "alpha": tuple(float(a) for a in res.x)}

    def fit(self, model: _Model, pi0: np.ndarray, counts: np.ndarray, method: _FitMethod) -> _Fit:
        return self._fit(model, counts, method, method.trace)

    def fit_batch(self, model: _Model, pi0: np.ndarray, counts: np.ndarray, method: _FitMethod) -> _BatchFit:
        fits = [self._fit(model, counts[b], method, False) for b in range(len(counts))]
        return (np.stack([f[0] for f in fits]), np.array([f[1] for f in fits]), np.array([f[2] for f in fits]),
                [f[4] for f in fits])

    def fit_many(self, model: _Model, pi0: np.ndarray, counts: np.ndarray, method: _FitMethod) -> _BatchFit:
        """B histograms' fits in one batched L-BFGS (:func:`_lbfgs_batched` on :func:`_g_objective_batched`, from
        alpha = 0 as :meth:`fit`, L-BFGS-B's ftol = tol / 1000 and gtol = 1e-9), each stopped by its own rule."""
        df, penalty = self._shape(method)
        basis = _g_basis(model.edges, df)
        evaluate = _g_objective_batched(model, counts, basis, penalty)
        alpha0 = np.zeros((len(counts), basis.shape[1]))
        out, iters, conv = _lbfgs_batched(evaluate, alpha0, method.tol * 1e-3, 1e-9, method.max_iter, 10)
        pi, alpha = out[:, :-basis.shape[1]], out[:, -basis.shape[1]:]
        return pi, iters, conv, [{"df": df, "penalty": penalty, "alpha": tuple(float(a) for a in a_b)}
                                 for a_b in alpha]

    def bootstrap(self, model: _Model, draws: np.ndarray, pi: np.ndarray, pi0: np.ndarray, method: _FitMethod,
                  details: dict) -> np.ndarray:
        alpha = np.asarray(details["alpha"])
        df, penalty = self._shape(method)
        return np.stack([_g_fit(model, d, df, penalty, alpha, method.tol, method.max_iter)[0]
                         for d in draws]) if len(draws) else np.zeros((0, len(pi)))


#: the fitters the registry's rank-distribution entries name (``registry.Estimator.fitter``)
EM_FITTER = EMFitter()
MES_FITTER = MESFitter()
G_FITTER = GModelFitter()


#: how far a twin of the data may be (``RankDistribution.twin_gap``): summed squared Hellinger distances of the
#: moved positives' laws; total variation at most sqrt(1 - (1 - TWIN_H2)^2) = 0.199 (Le Cam)
TWIN_H2 = 0.02


def _move_h2(law: str, n: int, m: int, r: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """Squared Hellinger distance H^2 = 1 - sum sqrt(P(r~ | r) P(r~ | r2)) between a positive's sampled-rank laws at
    exact ranks r and r2 (arrays of whole ranks in 1..n), m draws: 1 - BC^m, BC = sqrt(p q) + sqrt((1 - p)(1 - q))
    the Bhattacharyya coefficient of one draw (p = (r - 1)/(n - 1)), for the binomial law; for the hypergeometric
    one the laws' square roots at the distinct ranks, multiplied out (memory: distinct ranks x (m + 1)). Finite even
    where one law misses an outcome of the other (a rank moved past draws without replacement: KL is infinite
    there, the laws may still nearly agree)."""
    if law == "binomial":
        p, q = (r - 1.0) / (n - 1.0), (r2 - 1.0) / (n - 1.0)
        bc = np.sqrt(p * q) + np.sqrt((1.0 - p) * (1.0 - q))
        with np.errstate(divide="ignore"):
            return -np.expm1(m * np.log(np.minimum(bc, 1.0)))
    ranks, inverse = np.unique(np.concatenate([r, r2]), return_inverse=True)
    root = np.exp(0.5 * _log_sampled_rank_pmf(torch.from_numpy(ranks), n, m, law).numpy())
    bc = root @ root.T
    return np.maximum(1.0 - bc[inverse[: len(r)], inverse[len(r) :]], 0.0)


#: at most this many consecutive exact ranks carry ``twin_gap``'s moves (bounds its memory: ranks x ranks and
#: ranks x (m + 1) float64 per group for the hypergeometric law, 20 MB at m = 10^4)
TWIN_MAX_RANKS = 256


def _twin_ranks(spec: MetricSpec, n: int, b: float) -> tuple[int, int]:
    """The exact ranks first..last (1-based, within 1..n) between which ``twin_gap`` moves positives: up to
    2 (K + 1) for a cut-off metric (a move across K from twice as deep costs a positive at least (sqrt 2 - 1)^2 K /
    (2 b) >= 4 budgets where K >= b; the last ``TWIN_MAX_RANKS`` of them for a large K), the first 2 b + 20 for a
    metric whose weight changes at every rank (MRR, AP, NDCG without cut-off), at most ``TWIN_MAX_RANKS`` ranks in
    both cases."""
    last = 2 * (spec.k + 1) if spec.k is not None else int(math.ceil(2.0 * b)) + 20
    last = min(int(n), last)
    if spec.k is None:
        last = min(last, TWIN_MAX_RANKS)
    return max(1, last - TWIN_MAX_RANKS + 1), last


def _pareto_moves(gain: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The moves (row i: from rank i of the window, column j: to rank j; positive gain) that no nearer move of the
    same source beats, as (rows, cols), rows ascending: the others never carry an optimum of :func:`_twin_lp`. A
    move's cost grows with its distance on either side of the source (the laws of r~ are ordered in R: binomial and
    hypergeometric have monotone likelihood ratios), so a target is kept where its gain beats every nearer target's
    on its side: running maxima outward from the diagonal, no costs needed."""
    col = np.arange(gain.shape[1])[None, :]
    src = np.arange(gain.shape[0])[:, None]
    g = np.where(gain > 0, gain, -np.inf)
    best_left = np.maximum.accumulate(np.where(col < src, g, -np.inf)[:, ::-1], axis=1)[:, ::-1]
    best_right = np.maximum.accumulate(np.where(col > src, g, -np.inf), axis=1)
    nearer = np.full_like(g, -np.inf)
    nearer[:, :-1] = np.where(col[:, :-1] < src, best_left[:, 1:], -np.inf)
    nearer[:, 1:] = np.where(col[:, 1:] > src, best_right[:, :-1], nearer[:, 1:])
    rows, cols = np.nonzero(g > np.maximum(nearer, 0.0))
    return rows, cols


def _twin_lp(rows: np.ndarray, g: np.ndarray, c: np.ndarray, count: np.ndarray, budget: float, steps: int = 50) -> float:
    """max sum_k g_k x_k subject to sum_k c_k x_k <= budget, sum over a row's moves of x_k <= count[row], x >= 0 (each
    source's positives moved at most once): the linear program of the twin gap over flat moves (``rows``
    ascending, gains ``g`` > 0, costs ``c``), solved on its Lagrangian. For a price lambda each source takes its
    move of largest g - lambda c (if positive); the spend falls with lambda, and the optimum mixes the two
    solutions that bracket the budget (bisection on log lambda; both optimal at the breakpoint, so their mix is
    the LP's). Every 10 steps the moves worth less than the lower price (g / c <= lambda) are dropped: the
    bisection never prices below it again, so they are never taken."""
    keep = np.isfinite(c) & (count[rows] > 0)
    if not np.any(keep):
        return 0.0
    ratio = g[keep] / np.maximum(c[keep], 1e-300)
    lo, hi = math.log(float(ratio.min())) - 1.0, math.log(float(ratio.max())) + 1.0
    g_hi = c_hi = 0.0
    g_lo = c_lo = math.inf
    for step in range(steps + 1):
        if step % 10 == 0:  # (re)group the moves left by source
            rows, g, c = rows[keep], g[keep], np.maximum(c[keep], 1e-300)
            starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
            cnt, sizes, idx = count[rows[starts]], np.diff(np.r_[starts, len(g)]), np.arange(len(g))
        lam = math.exp(lo if step == 0 else 0.5 * (lo + hi))
        v = g - lam * c  # each source's best move at this price (the first of equal ones)
        top = np.maximum.reduceat(v, starts)
        best = np.minimum.reduceat(np.where(v == np.repeat(top, sizes), idx, len(g)), starts)
        take = top > 0
        gain, spend = float(np.sum((cnt * g[best])[take])), float(np.sum((cnt * c[best])[take]))
        if step == 0 and spend <= budget:  # every worthwhile move fits the budget
            return gain
        if spend > budget:
            lo, g_lo, c_lo = math.log(lam), gain, spend
        else:
            hi, g_hi, c_hi = math.log(lam), gain, spend
        keep = g > math.exp(lo) * c
    return g_hi + (g_lo - g_hi) * (budget - c_hi) / (c_lo - c_hi)


# ------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class DistributionEstimate:
    """A metric computed from an estimated rank distribution.

    Attributes:
        value: sum_R P^(R) M(R) averaged over the (n, m) groups by their share of positives.
        stderr: bootstrap standard error (nan-free; ``math.inf`` where the value is not identified,
            ``None`` when no bootstrap was run).
        n_instances: number (total weight) of positives.
        details: method, iterations, convergence, metric, resolution per group.
        flags: ``"top_unresolved"`` (cut-off below the resolution (n - 1)/(m + 1) + 1 of a group with
            positives at r~ = 1: their exact ranks may lie anywhere below it),
            ``"all_at_top"`` (every positive at r~ = 1; stderr inf), ``"not_converged"``, ``"pooled_n"``.
    """

    value: float
    stderr: float | None
    n_instances: float
    details: dict = field(default_factory=dict)
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class RankDistribution:
    """Estimated P(R), piecewise constant on the cells (edges[c], edges[c+1]].

    Attributes:
        edges: (C + 1,) int64 cell edges on the exact-rank scale (edges[-1] = largest n).
        probs: (C,) float64 probability of each cell (sums to 1).
        method: ``"mle"`` or ``"mes"``.
        loglik: observed-data log-likelihood of the fit.
        iterations: EM iterations or L-BFGS-B iterations.
        converged: whether the stopping rule was met.
        bootstrap: (B, C) refitted cell probabilities (empty when ``n_bootstrap=0``).
        histogram: the (possibly pooled) histogram the fit used.
        flags: ``"not_converged"``, ``"pooled_n"``, ``"all_at_top"``.
        loglik_trace: per-iteration log-likelihoods (EM) or objectives (MES) when ``trace=True``.
        reference: cell probabilities of a second fit of the same data by a differently regularised method
            (``gmod``: ``mes``, ``details["reference_method"]``), or None.
    """

    edges: np.ndarray
    probs: np.ndarray
    method: str
    loglik: float
    iterations: int
    converged: bool
    bootstrap: np.ndarray
    histogram: RankHistogram
    flags: tuple[str, ...] = ()
    loglik_trace: tuple[float, ...] = ()
    details: dict = field(default_factory=dict)
    lik: np.ndarray | None = field(default=None, repr=False)  # (C, K) P(r~ | cell, group) on occupied columns
    lik_cols: np.ndarray | None = field(default=None, repr=False)  # (K, 2) (group, r~ - 1) of those columns
    reference: np.ndarray | None = field(default=None, repr=False)  # (C,) a second fit's probs (the fitter's
    # ``reference`` method on the same data): the model term of the users' standard error

    @property
    def n_items(self) -> int:
        return int(self.edges[-1])

    def pmf(self, r: TensorLike) -> np.ndarray:
        """P^(R = r) for whole ranks r in 1..n (uniform within each cell); a fractional rank is refused, not
        truncated into its neighbour's cell."""
        r = check_rank_values(r, "r", whole=True).cpu().numpy().astype(np.int64)
        if r.size and (r.min() < 1 or r.max() > self.n_items):
            raise ValueError(f"r: ranks must lie in 1..{self.n_items}")
        c = np.searchsorted(self.edges, r, side="left") - 1
        return self.probs[c] / np.diff(self.edges)[c]

    def cdf(self, k: TensorLike) -> np.ndarray:
        """P^(R <= k), i.e. the estimated HR@k of the largest group (whole k in 0..n)."""
        k = np.asarray(k, dtype=np.float64)
        cum = np.concatenate([[0.0], np.cumsum(self.probs)])
        return np.interp(k, self.edges.astype(np.float64), cum)

    def prior(self, n_items: int | None = None) -> np.ndarray:
        """The distribution as a prior vector p(r), r = 1..n, renormalised over 1..n.

        For n below the fitted range the distribution is truncated; for n above it (a user with more
        candidates than the largest fitted group, e.g. after pooling groups) the last cell's per-rank
        probability is carried on to ranks ``self.n_items + 1 .. n``: the tail of a rank distribution is
        flat near the end of the catalogue, and the extension only reaches as far as the pooling spread.
        A ValueError names ``n_items`` when the vector would exceed ``_checks.MAX_ELEMENTS`` (2^27) values:
        :meth:`as_prior` serves any n.
        """
        from .priors import prior_ranks  # n checked as a size and against the one bound on arrays of length n

        p = self._pmf_extended(prior_ranks(self.n_items if n_items is None else n_items))
        return p / p.sum()

    def _pmf_extended(self, r: np.ndarray) -> np.ndarray:
        """:meth:`pmf` for ranks in 1..n_items, the last cell's per-rank probability beyond."""
        r = np.asarray(r, dtype=np.int64)
        out = np.full(r.shape, self.probs[-1] / float(self.edges[-1] - self.edges[-2]))
        inside = r <= self.n_items
        out[inside] = self.pmf(r[inside])
        return out

    def as_prior(self) -> Callable[..., np.ndarray]:
        """Callable ``fn(r, n=None)`` -> weights P^(R = r) (real r rounded to the nearest rank, at least 1):
        the callable-prior interface of ``priors.py`` (which normalises over 1..n). Beyond the fitted range
        the weights extend as in :meth:`prior`."""

        def fn(r: TensorLike, n: int | None = None) -> np.ndarray:
            rr = np.maximum(np.rint(np.asarray(r, dtype=np.float64)), 1).astype(np.int64)
            if n is not None:
                rr = np.minimum(rr, int(n))
            return self._pmf_extended(rr)

        return fn

    def _metrics_from_probs(self, specs: tuple, probs: np.ndarray) -> np.ndarray:
        """sum_R P(R) M(R), each group's P truncated to its n, averaged over the groups by their positives:
        (..., len(specs)) for probs (..., C) (the fit, or bootstrap replicates)."""
        hist = self.histogram
        totals = hist.totals
        value = np.zeros(probs.shape[:-1] + (len(specs),))
        for g in range(hist.n_groups):  # per (n, m) group, at most max_groups
            if totals[g] == 0:
                continue
            n_g = int(hist.n_items[g])
            c_in = int(np.searchsorted(self.edges, n_g))
            means = interval_mean_metrics(specs, self.edges[:c_in], self.edges[1 : c_in + 1], n_g)  # (S, C_in)
            p = probs[..., :c_in]
            value = value + totals[g] * (p @ means.T) / p.sum(-1, keepdims=True)
        return value / totals.sum()

    def _metric_from_probs(self, spec: MetricSpec, probs: np.ndarray) -> np.ndarray:
        return self._metrics_from_probs((spec,), probs)[..., 0]

    def _posterior_stderr(self, spec: MetricSpec, means_by_group: list) -> float:
        """sd of the per-positive posterior means E^[M(R) | r~, n_g] over sqrt(M) (their mean is the
        estimate at an exact EM fixed point); ignores the uncertainty of P^ itself. Computed on the occupied
        (group, r~) columns of the likelihood (``lik`` (C, K), ``lik_cols`` (K, 2))."""
        hist = self.histogram
        total = hist.total
        cols = self.lik_cols
        assert cols is not None and self.lik is not None  # kept by every fit of this module
        C = len(self.probs)
        means = np.zeros((C, hist.n_groups))
        for g, mg in enumerate(means_by_group):
            if mg is not None:
                means[: len(mg), g] = mg
        joint = self.probs[:, None] * self.lik  # (C, K)
        den = joint.sum(0)
        num = np.einsum("ck,ck->k", means[:, cols[:, 0]], joint)
        v = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
        w = hist.flat_counts[hist._starts[cols[:, 0]] + cols[:, 1]]
        mean = float(np.dot(w, v)) / total
        ss = float(np.dot(w, (v - mean) ** 2))
        return math.sqrt(ss / (total * (total - 1.0))) if total > 1 else math.inf

    def _users_values(self, spec: MetricSpec, probs: np.ndarray) -> tuple[np.ndarray, float]:
        """The users' metric under the prior ``probs`` (..., C): the mean over positives of their posterior means
        E[M(R) | r~, n_g, m_g] (the finite-population target, whose exact value is the metric of these users),
        and the posterior variance of that mean under ``self.probs``, sum of the positives' posterior variances
        over M^2 (cell means of M stand for the cell's ranks). On the occupied (group, r~) columns."""
        hist = self.histogram
        cols = self.lik_cols
        assert cols is not None and self.lik is not None  # kept by every fit of this module
        means = np.zeros((len(self.probs), hist.n_groups))
        for g, (n, t, c) in enumerate(zip(hist.n_items, hist.totals,
                                          np.searchsorted(self.edges, hist.n_items).astype(np.int64))):
            if t > 0:
                means[:c, g] = interval_mean_metric(spec, self.edges[:c], self.edges[1 : c + 1], int(n))
        mk = means[:, cols[:, 0]]  # (C, K)
        lik = np.asarray(self.lik)
        w = hist.flat_counts[hist._starts[cols[:, 0]] + cols[:, 1]]
        total = hist.total

        def moments(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            den = p @ lik
            ok = den > 0
            safe = np.where(ok, den, 1.0)
            return np.where(ok, (p @ (lik * mk)) / safe, 0.0), np.where(ok, (p @ (lik * mk * mk)) / safe, 0.0)

        v, _ = moments(probs)
        v1, v2 = moments(self.probs)
        var = float(np.dot(w / total, np.maximum(v2 - v1 * v1, 0.0))) / total  # not total**2: underflows below 1e-154
        return (v * w).sum(-1) / total, var

    def twin_gap(self, spec: MetricSpec, budget: float = TWIN_H2) -> tuple[float, float]:
        """How far the users' metric can move, down and up, in a *twin* of the data that the draws barely tell
        apart: some positives moved to other exact ranks (R -> R', any R' of :func:`_twin_ranks`' window), their
        laws' squared Hellinger distances summing to at most ``budget``.

        The positives come from the fitted prior: per candidate count n and rank R, the posterior expected number
        of positives, sum over the occupied columns of count x P(R | r~). Moving one of them from R to R' costs the
        squared Hellinger distance of its sampled rank's two laws (:func:`_move_h2`; m the group's, averaged over
        the groups of that n by their share of the positives at R: an adaptive design's stages, read from where
        the posterior puts each stage's positives, so no design is needed) and changes the users' metric by
        (M(R') - M(R)) / #positives. Per direction the largest change within ``budget``, each positive moved at
        most once, fractionally (a linear program, :func:`_twin_lp`). Exact groups (``exact_at_cap``) do not move.
        Moves of one rank alone leave out what matters where ranks are fine against the positives' density (a
        cut-off K near a coarse resolution: about one positive per rank at K), where a twin moves positives from
        several ranks past K at once.

        Why an interval should span it: if an interval covers the users' metric with probability 1 - alpha in
        both the data's world and a twin within total variation t, it contains the twin's value with probability
        at least 1 - alpha - t in the data's world (Le Cam's two-point argument, docs/estimators.md). Positives
        are independent, so the twin's Hellinger affinity is the product of theirs and t <= sqrt(1 - (1 -
        budget)^2): 0.2 at the default ``TWIN_H2`` = 0.02 (about 0.08 nats of KL for moves the draws see; unlike
        KL it stays finite for a rank moved past draws without replacement). Returns (down, up) >= 0 in metric
        units."""
        hist = self.histogram
        cols = self.lik_cols
        if cols is None or self.lik is None or budget <= 0:
            return 0.0, 0.0
        lik = np.asarray(self.lik)
        w = hist.flat_counts[hist._starts[cols[:, 0]] + cols[:, 1]]
        den = self.probs @ lik
        ratio = np.where(den > 0, w / np.where(den > 0, den, 1.0), 0.0)
        onehot = np.zeros((len(cols), hist.n_groups))
        onehot[np.arange(len(cols)), cols[:, 0]] = 1.0
        expected = self.probs[:, None] * ((lik * ratio) @ onehot)  # (C, G) posterior expected positives
        widths = np.diff(self.edges).astype(np.float64)
        movable = (hist.totals > 0) & ~hist.exact
        law = check_law(self.details.get("sampling", "binomial"))
        moves: dict[float, list] = {-1.0: [], 1.0: []}  # per direction: (rows, gains, costs) of each n
        amounts: list[np.ndarray] = []
        offset = 0
        pareto: dict[tuple[float, bytes], tuple[np.ndarray, np.ndarray]] = {}  # candidate counts with equal windows
        for n in np.unique(hist.n_items[movable]):
            groups = np.flatnonzero(movable & (hist.n_items == n))
            b = float(np.max((n - 1.0) / (hist.n_samples[groups] + 1.0))) + 1.0
            first, last = _twin_ranks(spec, min(int(n), int(self.edges[-1])), b)
            r = np.arange(first, last + 1, dtype=np.float64)
            cell = np.searchsorted(self.edges, r, side="left") - 1
            per_group = expected[cell][:, groups] / widths[cell, None]  # (ranks, groups)
            count = per_group.sum(1)
            # each group's share of the positives at rank R (an adaptive design's stages: where those positives
            # stopped), which weighs the groups' information about a move
            share = per_group / np.where(count > 0, count, 1.0)[:, None]
            value = interval_mean_metric(spec, r - 1.0, r, float(n))
            change = (value[None, :] - value[:, None]) / hist.total  # (from rank i, to rank j)
            for sign in moves:
                key = (sign, change.tobytes())
                i, j = pareto[key] = pareto[key] if key in pareto else _pareto_moves(sign * change)
                h2 = sum(share[i, k] * _move_h2(law, int(n), int(hist.n_samples[g]), r[i], r[j])
                         for k, g in enumerate(groups))
                moves[sign].append((i + offset, sign * change[i, j], np.asarray(h2, dtype=np.float64)))
            amounts.append(count)
            offset += len(r)
        if not amounts:
            return 0.0, 0.0
        amount = np.concatenate(amounts)
        gaps = []
        for sign in (-1.0, 1.0):
            rows, gain, cost = (np.concatenate(x) for x in zip(*moves[sign]))
            gaps.append(_twin_lp(rows, gain, cost, amount, budget))
        return gaps[0], gaps[1]

    def metric(self, metric: str | MetricSpec, stderr: str = "auto", target: str = "population") -> DistributionEstimate:
        """Estimate sum_R P^(R) M(R) (each group's P^ truncated to its n) with a standard error; or, with
        ``target="users"``, the metric of these users: the mean of their posterior means under P^ (each positive's
        r~ read through the likelihood), the population value then in ``details["population_value"]``.

        ``stderr``: ``"bootstrap"`` (the refitted replicates; None when there are none), ``"posterior"`` (sd of
        the per-positive posterior means of M over sqrt(#positives): cheap, ignores the uncertainty of P^ and
        so is smaller than the bootstrap where the data hardly constrain P^), or ``"auto"`` (bootstrap when
        replicates exist, else posterior). For ``target="users"`` the bootstrap's spread of the users' value is
        combined with the posterior variance of the users' exact ranks (what the data leave open about them) and,
        where the fit has a ``reference`` prior, the model term: the spread (standard deviation, ddof = 0) of the
        users' value over the two priors, half their difference (what the prior's regularisation adds, which no
        bootstrap of the same fit sees); the three parts are in ``details["stderr_parts"]``.
        """
        spec = parse_metric(metric)
        if not isinstance(stderr, str) or stderr not in ("auto", "bootstrap", "posterior"):
            raise ValueError(f"stderr: use 'auto', 'bootstrap' or 'posterior', got {stderr!r}")
        if not isinstance(target, str) or target not in ("population", "users"):
            raise ValueError(f"target: use 'population' or 'users', got {target!r}")
        hist = self.histogram
        if spec.k is not None and spec.k > int(hist.n_items[hist.totals > 0].min()):
            raise ValueError(
                f"metric: cut-off K = {spec.k} is larger than the catalogue of some positives "
                f"(n_items = {int(hist.n_items.min())})"
            )
        value = float(self._metric_from_probs(spec, self.probs))
        population = value
        users = target == "users" and self.lik is not None
        if users:
            fp, post_var = self._users_values(spec, self.probs)
            value = float(fp)
        se = None
        kind = "bootstrap" if stderr == "bootstrap" or (stderr == "auto" and self.bootstrap.shape[0] >= 2) else "posterior"
        parts = None
        if users and (kind == "posterior" or self.bootstrap.shape[0] >= 2):
            boot_var = float(np.var(self._users_values(spec, self.bootstrap)[0], ddof=1)) if kind == "bootstrap" else 0.0
            # the spread (sd, ddof = 0) of the users' value over the two priors: half their difference
            model_term = 0.0 if self.reference is None else 0.5 * abs(
                float(self._users_values(spec, self.reference)[0]) - value)
            se = math.sqrt(boot_var + post_var + model_term**2)
            parts = {"bootstrap": math.sqrt(boot_var), "posterior": math.sqrt(post_var), "model": model_term}
        elif kind == "bootstrap" and self.bootstrap.shape[0] >= 2:
            boot = self._metric_from_probs(spec, self.bootstrap)
            se = float(np.std(boot, ddof=1))
        elif kind == "posterior" and self.lik is not None:
            means = [
                interval_mean_metric(spec, self.edges[:c], self.edges[1 : c + 1], int(n))
                if t > 0 else None
                for n, t, c in zip(
                    hist.n_items, hist.totals, np.searchsorted(self.edges, hist.n_items).astype(np.int64)
                )
            ]
            se = self._posterior_stderr(spec, means)
        flags = [f for f in self.flags if f in ("not_converged", "pooled_n")]
        # exact groups (exact_at_cap: their counts are exact ranks) resolve every rank
        resolution = np.where(hist.exact, 1.0, (hist.n_items - 1.0) / (hist.n_samples + 1.0) + 1.0)
        occupied = hist.top_counts > 0  # groups with positives at r~ = 1
        if spec.k is not None and np.any(spec.k < resolution[occupied]):
            flags.append("top_unresolved")
            if "all_at_top" in self.flags:
                flags.append("all_at_top")
                se = math.inf
        details = {
            "method": self.method,
            "metric": str(spec),
            "iterations": self.iterations,
            "converged": self.converged,
            "resolution": resolution.tolist(),
            "n_bootstrap": int(self.bootstrap.shape[0]),
            "n_cells": int(len(self.probs)),
            "stderr_method": kind if se is not None else None,
        }
        if users:
            details["target"] = "users"
            details["population_value"] = population
            if parts is not None:
                details["stderr_parts"] = parts
            if self.reference is not None:  # gmod: the smooth prior's centre; its twins widen the interval
                details["twin_gap"] = self.twin_gap(spec)
        return DistributionEstimate(value, se, hist.total, details, tuple(flags))

    def metrics(self, metrics: Iterable[str | MetricSpec], stderr: str = "auto") -> dict[str, DistributionEstimate]:
        """:meth:`metric` for several metrics from this one fit: ``{str(spec): DistributionEstimate}``.

        Cut-off metrics share one prefix-sum table (``interval_mean_metrics``), so K = 1..50 of two metrics
        cost little more than one."""
        specs = list(check_metric_names(metrics))  # one str: one metric
        return {str(sp): self.metric(sp, stderr=stderr) for sp in specs}

    def values(self, metrics: Iterable[str | MetricSpec], target: str = "population") -> np.ndarray:
        """Point estimates only (no standard errors, no flags) for several metrics: float64 (len(metrics),);
        ``target`` as in :meth:`metric` (``"users"`` needs the likelihood: every fit of this module keeps it)."""
        specs = check_metric_names(metrics)
        if not isinstance(target, str) or target not in ("population", "users"):
            raise ValueError(f"target: use 'population' or 'users', got {target!r}")
        hist = self.histogram
        for spec in specs:
            if spec.k is not None and spec.k > int(hist.n_items[hist.totals > 0].min()):
                raise ValueError(f"metric: cut-off K = {spec.k} is larger than the catalogue of some positives")
        if target == "users" and self.lik is not None:
            return np.array([self._users_values(spec, self.probs)[0] for spec in specs], dtype=np.float64)
        return self._metrics_from_probs(specs, self.probs)


# ---------------------------------------------------------------------------------------------- the fit
def _sample_histogram(sample: Any, method: _FitMethod, sampling: str | None) -> tuple[RankHistogram, str]:
    """The histogram of ``sample`` (its groups of total count 0 dropped; refused when empty) and the law of its
    draws: its design's (binomial without one), or ``sampling`` where given (refused when the design says otherwise).
    A SampledRanks gives its histogram with exact groups where the method reads them (``exact_groups``)."""
    if isinstance(sample, SampledRanks):
        design = sample.design
        if design is None:
            raise ValueError("sample: these SampledRanks carry no design; build them with "
                             "SampledRanks.from_arrays(ranks, n_items, n_samples, design)")
        if design.popularity is not None:
            raise ValueError("sample: popularity-sampled ranks need the draws' weights, which a rank-distribution fit "
                             "does not read; estimate them with pl_fit (estimate(metric, sampled, 'pl_fit'))")
        hist = sample.histogram(exact=type(method).entry.exact_groups)
    elif isinstance(sample, RankHistogram):
        hist, design = sample, sample.design
    else:
        raise ValueError(f"sample: expected a RankHistogram or SampledRanks (or a sequence of them), got "
                         f"{type(sample).__name__}")
    law = "binomial" if design is None else design.law
    if sampling is not None:
        given = check_law(sampling)
        if design is not None and given != law:
            raise ValueError(f"sampling: {given!r} contradicts the sample's design ({design.describe()}: {law})")
        law = given
    hist = as_histogram(hist)
    hist.check_nonempty()
    return hist, law


@overload
def fit_rank_distribution(sample: RankHistogram | SampledRanks, method: str | registry.Method = ..., *,
                          sampling: str | None = ...) -> RankDistribution: ...
@overload
def fit_rank_distribution(sample: Sequence[RankHistogram | SampledRanks], method: str | registry.Method = ..., *,
                          sampling: str | None = ...) -> list[RankDistribution]: ...
@blas_single  # small dense algebra: one BLAS thread (_blas)
def fit_rank_distribution(sample: Any, method: str | registry.Method = "mle", *,
                          sampling: str | None = None) -> RankDistribution | list[RankDistribution]:
    """Estimate the distribution of exact ranks from sampled ranks (``mle`` by EM, ``mes`` or ``gmod``).

    Args:
        sample: a :class:`~reco_sampled_plugin._rank_hist.RankHistogram` or the
            :class:`~reco_sampled_plugin.ranking.SampledRanks` of a draw (their histogram: weighted positives are a
            histogram, ``sampled.histogram(weights)``), or a list of them (fitted together: below).
        method: a rank-distribution method's name (``"mle"``, ``"mes"``, ``"gmod"``) or its options object, checked
            at construction (``registry.Mle(tol=1e-6)``, ``registry.Mes(lam=0.5, n_bootstrap=0)``,
            ``registry.Gmod(df=8)``): the fit options ``n_bootstrap`` (multinomial bootstrap replicates for
            standard errors; None: 32 for mle, 16 for mes and gmod; 0: none), ``seed`` (of the bootstrap), ``tol``
            (EM stops when an iteration gains less than ``tol`` log-likelihood per positive; L-BFGS-B's ``ftol``),
            ``max_iter`` (reaching it sets ``converged=False`` and the ``not_converged`` flag), ``max_groups``
            (distinct (n, m) pairs beyond which n is pooled into quantile bins), ``delta``, ``kappa`` (the grid:
            module docstring), ``trace`` (the per-iteration log-likelihood (EM) or objective in ``loglik_trace``);
            ``mes``: ``lam`` (entropy weight; None: ``MES_LAMBDA`` / M) and ``beta`` (the entropy's base measure
            r^-beta: 0 uniform over ranks, 1 uniform in log r; docs/estimators.md: beta > 0 is worse on both data
            sets); ``gmod``: ``df`` (B-spline coefficients of log P(R) on the log-rank scale, at least 4) and
            ``penalty`` (weight of their squared second differences); and ``max_rel_n_spread``: instead of quantile
            bins, the groups moved onto a geometric grid of n (``_rank_hist.pool_by_n``, flagged ``pooled_n``).
            ``top_shape`` is not read (the identified interval is ``estimate``'s).
        sampling: the law of the draws, ``"binomial"`` (with replacement) or ``"hypergeometric"``; None (default):
            the sample's design's (binomial without one). Given, it must agree with a design.

    Returns:
        :class:`RankDistribution`. The fit is kept on the histogram (``RankHistogram._derived``) by method object
        and law: the same one comes back for an equal method (``estimate`` of several metrics fits once).

    A list of samples (e.g. the repeats of a sampling experiment) gives a list of fits without bootstrap or
    ``reference`` (``n_bootstrap`` must be None or 0, ``trace`` False): when every (pooled) histogram has the same
    (n, m) groups the likelihood is built once and the fits are batched (``mle``: one batched EM in which each
    problem stops on its own rule, equal to the single fits up to rounding; ``mes``, ``gmod``: one L-BFGS-B per
    histogram on the shared likelihood), otherwise they are fitted one by one. Standard errors:
    ``RankDistribution.metric`` with ``stderr="posterior"``.

    Raises:
        ValueError: a method that does not fit a rank distribution, an empty histogram, an unknown law or one the
            design contradicts, m > n - 1 without replacement, SampledRanks without a design or under a popularity
            design, samples of different laws in one list.
    """
    fit = _fit_method(method)
    if isinstance(sample, (RankHistogram, SampledRanks)):
        hist, law = _sample_histogram(sample, fit, sampling)
        return hist._derived(("fit", fit, law), lambda: _fit(hist, fit, law))
    if not isinstance(sample, _Sequence):
        _sample_histogram(sample, fit, sampling)  # names what was given
    pairs = [_sample_histogram(one, fit, sampling) for one in sample]
    laws = sorted({law for _, law in pairs})
    if len(laws) > 1:
        raise ValueError(f"sample: the histograms were drawn under different laws {laws}; fit each law's apart")
    return _fit_batch([hist for hist, _ in pairs], fit, laws[0]) if pairs else []


def _fit(hist: RankHistogram, method: _FitMethod, law: str, batched: bool = False) -> RankDistribution:
    """The fit of one non-empty histogram under ``law``: ``method``'s fitter from the uniform P(R), its bootstrap and,
    where the fitter names a ``reference`` method, that method's fit of the same data; ``batched``: neither (the
    one-by-one fits of a list)."""
    model = _build_model(hist, law, method.max_groups, method.delta, method.kappa, method.max_rel_n_spread)
    widths = model.widths
    pi0 = widths / widths.sum()  # uniform over ranks
    flags: list[str] = (["pooled_n"] if model.pooled else []) + (["all_at_top"] if hist.all_at_top() else [])
    fitter = type(method).entry.fitter_object()
    pi, iters, converged, traced, fit_details = fitter.fit(model, pi0, model.counts, method)
    if not converged:
        flags.append("not_converged")
    replicates = 0 if batched else fitter.default_bootstrap if method.n_bootstrap is None else method.n_bootstrap
    boot = _bootstrap(fitter, model, pi, pi0, method, fit_details, replicates)
    details = {"sampling": law, "n_cells": len(pi), **fit_details}
    ref_method = None if batched else getattr(fitter, "reference", None)
    reference = None
    if ref_method is not None:  # the same data fitted under the other regularisation
        ref = registry.method_class(ref_method)(tol=method.tol, max_iter=method.max_iter)
        reference = type(ref).entry.fitter_object().fit(model, pi0, model.counts, ref)[0]
        details["reference_method"] = ref_method
    return RankDistribution(
        edges=model.edges, probs=pi, method=method.name, loglik=float(_loglik(model, pi)), iterations=int(iters),
        converged=bool(converged), bootstrap=boot,
        histogram=RankHistogram(model.n, model.m, model.group_counts(model.counts), model.exact),
        flags=tuple(flags), loglik_trace=traced, details=details, lik=model.lik, lik_cols=model.cols,
        reference=reference,
    )


def _bootstrap(fitter: Any, model: _Model, pi: np.ndarray, pi0: np.ndarray, method: _FitMethod, details: dict,
               replicates: int) -> np.ndarray:
    """(B, C) refits of ``replicates`` multinomial redraws of the model's counts (M positives at the observed
    sampled-rank frequencies, generator seeded by ``method.seed``); none for fewer than 2 positives (no spread)."""
    flat = model.counts
    total = flat.sum()
    if replicates <= 0 or round(total) < 2:
        return np.zeros((0, len(pi)))
    check_elements(replicates * len(flat), "n_bootstrap", "the bootstrap's redrawn counts (replicates x cells)")
    rng = np.random.default_rng(method.seed)
    draws = rng.multinomial(int(round(total)), flat / total, size=replicates).astype(np.float64)
    return fitter.bootstrap(model, draws, pi, pi0, method, details)


def _fit_batch(hists: list[RankHistogram], method: _FitMethod, law: str) -> list[RankDistribution]:
    """:func:`fit_rank_distribution` of a list of non-empty histograms (its docstring): one likelihood and one batched
    solve when their pooled groups agree, else one fit each; no bootstrap, no reference."""
    for name, value in (("n_bootstrap", method.n_bootstrap), ("trace", method.trace)):
        if value:
            raise ValueError(f"{name}: the fits of a list of samples run no bootstrap and keep no trace (got "
                             f"{name}={value!r}); fit each sample alone for them")
    pooled = [pool_groups(h, method.max_groups, method.max_rel_n_spread) for h in hists]
    keys = {(tuple(p.n_items.tolist()), tuple(p.n_samples.tolist()), tuple(p.exact.tolist())) for p, _ in pooled}
    if len(keys) != 1:  # different group structures: no shared likelihood
        return [_fit(h, method, law, batched=True) for h in hists]
    model = _build_model(hists[0], law, method.max_groups, method.delta, method.kappa, method.max_rel_n_spread,
                         others=[p for p, _ in pooled[1:]])
    counts = np.stack([_flat_counts(model, p) for p, _ in pooled])  # (B, K) on the union of occupied columns
    widths = model.widths
    pi0 = np.broadcast_to(widths / widths.sum(), (len(hists), len(widths)))
    fits = type(method).entry.fitter_object().fit_batch(model, pi0, counts, method)
    return _batch_distributions(model, counts, fits, method.name, law, [was for _, was in pooled],
                                [h.all_at_top() for h in hists])


def _batch_distributions(model: _Model, counts: np.ndarray, fits: _BatchFit, method: str, law: str,
                         pooled: Sequence[bool], at_top: Sequence[bool]) -> list[RankDistribution]:
    """The distributions of a batched fit of B histograms' counts (B, K) on one model (no bootstrap, no reference):
    flags ``pooled_n``, ``all_at_top`` and ``not_converged`` per histogram as the single fits'."""
    pi, iters, conv, fit_details = fits
    lls = _loglik(model, pi, counts)
    widths = model.widths
    out = []
    for b in range(len(counts)):
        flags = (["pooled_n"] if pooled[b] else []) + (["all_at_top"] if at_top[b] else []) + \
            ([] if conv[b] else ["not_converged"])
        hist = RankHistogram(model.n, model.m, model.group_counts(counts[b]), model.exact)
        details = {"sampling": law, "n_cells": len(widths), "batched": len(counts), **fit_details[b]}
        out.append(RankDistribution(
            edges=model.edges, probs=pi[b], method=method, loglik=float(lls[b]), iterations=int(iters[b]),
            converged=bool(conv[b]), bootstrap=np.zeros((0, len(widths))), histogram=hist, flags=tuple(flags),
            details=details, lik=model.lik, lik_cols=model.cols,
        ))
    return out


# ------------------------------------------------------------------- replicate draws of the same users, fitted at once
def _pool_map(n: np.ndarray, m: np.ndarray, totals: np.ndarray,
              max_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """:func:`pool_groups` (quantile bins, no grid of n, no exact groups) as a map of the groups: groups (n, m)
    with totals (G,) -> (pooled n (P,), pooled m (P,), each group's pooled index (G,), pooled at all). Pooling the
    histogram whose groups these are gives the same groups, and each pooled group's counts are the sum of its
    groups' counts (r~ kept), so the map carries any histogram on these groups onto the pooled ones."""
    changed = False
    n = np.asarray(n, dtype=np.int64)
    m = np.asarray(m, dtype=np.int64)
    if len(np.unique(m)) > _MAX_EXACT_M:  # _pool_m's geometric bins of m, as a map
        changed = True
        m_new = _m_bin_tops(m)
        n = 1 + np.rint((n - 1.0) * m_new / m).astype(np.int64)
        m = m_new
    n1, m1, gid = pair_groups(n, m)
    if len(n1) <= max_groups:
        return n1, m1, gid, changed
    t1 = np.bincount(gid, weights=np.asarray(totals, dtype=np.float64), minlength=len(n1))
    rep_n, rep_m = np.empty(len(n1), dtype=np.int64), np.empty(len(n1), dtype=np.int64)
    for mval, members, rep in _quantile_bins(n1, m1, t1, max_groups):  # pool_groups' quantile bins
        rep_n[members], rep_m[members] = rep, mval
    n2, m2, gid2 = pair_groups(rep_n, rep_m)
    return n2, m2, gid2[gid], True


class ReplicateFits:
    """R replicate draws of the sampled ranks of the same positives (a simulation's or a planner's Monte Carlo
    repeats), prepared once and fitted together: one histogram pass over all draws, one pooling of the (n, m)
    groups, one likelihood, and one batched solver for any subset of the draws (:meth:`fit`).

    Against :func:`fit_rank_distribution` of their histograms (which pools each draw on its own and, when the draws'
    pooled groups differ, e.g. the final sizes of adaptive sampling, fits them one by one, each with its own
    likelihood): the groups are pooled once, on the sum of the draws (quantile bins of n as :func:`pool_groups`,
    each bin's median n over all draws instead of one draw's: a representative n within the bin either way), and
    ``mes`` and ``gmod`` are solved by one batched L-BFGS in which each draw stops on its own rule (the rule of
    the single fits, ``tol``; within that tolerance of them, not at their point). ``mle`` is the batched EM of
    both. Without pooling (at most ``max_groups`` groups, at most 8 distinct m) the likelihood is the single
    fits'. Draws with or without replacement; any registered fitter (one without ``fit_many`` runs its
    ``fit_batch``). Not for exact groups (``exact_at_cap``) or a grid of n (``max_rel_n_spread``): use
    :func:`fit_rank_distribution` of a list of histograms there.

    Args:
        sampled_ranks: (R, U) sampled ranks r~ in 1..m + 1 (no padding): R draws of U positives.
        n_items: n, an int or (U,) or (R, U) per-positive candidate counts.
        n_samples: m, an int or (U,) or (R, U) per-positive sample sizes (adaptive: each positive's final m).
        method: a rank-distribution method's name (``mle``, ``mes``, ``gmod``) or its options object, as
            :func:`fit_rank_distribution` (``max_groups``, ``delta``, ``kappa``, ``tol``, ``max_iter`` and the
            method's own options are read; ``n_bootstrap`` must be None or 0, ``trace`` False,
            ``max_rel_n_spread`` None).
        sampling: ``"binomial"`` (with replacement) or ``"hypergeometric"``.

    Raises:
        ValueError: a rank outside 1..m + 1, a non-2-D ``sampled_ranks`` or an empty one, sizes that do not
            broadcast, an unknown method or law, an option these fits do not read (named).
    """

    def __init__(self, sampled_ranks: TensorLike, n_items: TensorLike, n_samples: TensorLike,
                 method: str | registry.Method = "mes", *, sampling: str = "binomial") -> None:
        self.method = _fit_method(method)
        for name, value in (("n_bootstrap", self.method.n_bootstrap), ("trace", self.method.trace),
                            ("max_rel_n_spread", self.method.max_rel_n_spread)):
            if value:
                raise ValueError(f"{name}: replicate fits run no bootstrap, keep no trace and pool no grid of n (got "
                                 f"{name}={value!r}); fit_rank_distribution of each histogram has them")
        self.law = check_law(sampling)
        r = check_rank_values(sampled_ranks, "sampled_ranks", whole=True)
        if r.dim() != 2 or r.numel() == 0:
            raise ValueError(f"sampled_ranks: expected (R draws, U positives), not empty, got shape {tuple(r.shape)}")
        reps, users = r.shape
        r_t = r.detach().cpu().to(torch.int64)
        sizes = []
        for name, x, low in (("n_items", n_items, 2), ("n_samples", n_samples, 1)):
            t = check_sizes(x, name, low, maximum=MAX_SAMPLES if name == "n_samples" else MAX_SIZE)
            t = torch.as_tensor(t, dtype=torch.int64).cpu()
            try:
                sizes.append(torch.broadcast_to(t, (reps, users)).reshape(-1).numpy())
            except RuntimeError:
                raise ValueError(f"{name}: shape {tuple(t.shape)} does not broadcast to the draws' "
                                 f"({reps}, {users})") from None
        n_np, m_np = sizes
        r_np = r_t.reshape(-1).numpy()
        bad = (r_np < 1) | (r_np > m_np + 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"sampled_ranks: must lie in 1..m + 1 (no padding), got {int(r_np[i])} with "
                             f"m = {int(m_np[i])}")
        check_sampled_support(r_t.reshape(-1), n_np, m_np)
        law = self.law
        check_without_replacement(n_np, m_np, law)
        # the raw (n, m) groups of all draws together, and their totals (the sum of the draws' histograms)
        raw_n, raw_m, raw_id = pair_groups(n_np.astype(np.int64), m_np.astype(np.int64))
        n_out, m_out, to_pooled, self.pooled = _pool_map(raw_n, raw_m, np.bincount(raw_id, minlength=len(raw_n)),
                                                         self.method.max_groups)
        group = to_pooled[raw_id]  # (R U,) each positive's pooled group
        check_without_replacement(n_out, m_out, law)
        m_max = int(m_out.max())
        support, col = np.unique(group * (m_max + 1) + (r_np - 1), return_inverse=True)
        base = _likelihood(tuple(int(v) for v in n_out), tuple(int(v) for v in m_out), law, float(self.method.delta),
                           float(self.method.kappa), (), tuple(support.tolist()), ())
        self.model = _Model(base.edges, n_out, m_out, base.cols, np.zeros(len(base.cols)), base.lik, base.inside,
                            self.pooled, base.onehot, base.inside_f, base.lik_sparse, np.zeros(len(n_out), dtype=bool))
        possible = np.asarray((self.model.lik > 0).sum(axis=0)).reshape(-1) > 0
        if not possible.all():
            g, i = self.model.cols[np.flatnonzero(~possible)[0]]
            raise ValueError(impossible_rank_message(int(i) + 1, int(n_out[g]), int(m_out[g]), law))
        k = len(support)
        draw = np.repeat(np.arange(reps), users)
        #: (R, K) each draw's counts on the model's columns
        self.counts = np.bincount(draw * k + col.reshape(-1), minlength=reps * k).astype(np.float64).reshape(reps, k)

    def fit(self, rows: Sequence[int] | None = None) -> list[RankDistribution]:
        """The fits of draws ``rows`` (default all), in their order: one batched solve (no bootstrap, no
        ``reference``; flags ``pooled_n``, ``all_at_top``, ``not_converged`` as the single fits').

        Raises:
            ValueError: ``rows`` not a 1-D sequence of whole numbers in 0..R - 1.
        """
        reps = len(self.counts)
        if rows is None:
            rows_arr = np.arange(reps)
        else:
            raw = np.asarray(rows)
            if raw.ndim != 1 or (raw.size and (raw.dtype.kind not in "iu" or raw.min() < 0 or raw.max() >= reps)):
                raise ValueError(f"rows: expected a 1-D sequence of draw indices in 0..{reps - 1}, got {rows!r}")
            rows_arr = raw.astype(np.int64)
        if not rows_arr.size:
            return []
        model, counts = self.model, self.counts[rows_arr]
        widths = model.widths
        pi0 = np.broadcast_to(widths / widths.sum(), (len(rows_arr), len(widths)))
        fitter = type(self.method).entry.fitter_object()
        solve = getattr(fitter, "fit_many", fitter.fit_batch)
        at_top = counts[:, model.cols[:, 1] != 0].sum(axis=1) == 0
        return _batch_distributions(model, counts, solve(model, pi0, counts, self.method), self.method.name, self.law,
                                    [self.pooled] * len(rows_arr), at_top)


# --------------------------------------------------------------------------- the registry's compute function
def estimate_by_fit(spec: MetricSpec, hist: RankHistogram, *, method: str, sampling: str, options: dict) -> DistributionEstimate:
    """The registry's compute function of the rank-distribution family: the expectation of the metric under the
    distribution fitted by :func:`fit_rank_distribution` (kept on ``hist``: several metrics of one histogram fit it
    once), with its bootstrap (or posterior) standard error."""
    fit_method = registry.method_class(method)(**options)
    target = type(fit_method).entry.fitter_object().target
    return fit_rank_distribution(hist, fit_method, sampling=sampling).metric(spec, target=target)
