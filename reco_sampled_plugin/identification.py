"""Honest intervals where the sampled data cannot resolve the top: partial identification by linear programming.

One sampled rank covers about b = (n - 1)/(m + 1) + 1 exact ranks (the *resolution*). For a cut-off K < b the
histogram of sampled ranks does not say how the rank distribution P(R) is shaped inside the first sampled bin,
so the metric is only *partially identified*: every P(R) that reproduces the histogram (within sampling noise)
and obeys a shape assumption is equally consistent with the data, and the interval must span their metrics.

The shape assumption (:class:`TopShape`, stated in docs/estimators.md, "Honest intervals where the top is
unresolved"), on the per-rank density p(r) = P(R = r):

* **monotone top**: p(r) is non-increasing over the first ``monotone_widths`` resolution widths and over twice
  the cut-off (ranks 1 .. max(monotone_widths * b, 2 K)): a recommender's relevant items are at least as likely
  at rank r as at rank r + 1 near the top of its list;
* **bounded steepness**: r^gamma p(r) is non-decreasing over the first ``decay_widths`` resolution widths, i.e. the
  density falls no faster than r^-gamma there (gamma = 1: no more concentrated than a log-uniform law).

Uniform and r^-gamma tops are the extremes it allows; the within-bin shares HR@10 / HR@b of ten real recommender/data
pairs (ml-100k 0.61-0.76, ml-latest-small 0.14-0.23 at m = 100; the same page) lie between them. A spike at rank 1 (a
recommender that gets many items exactly right, HR@1 much larger than HR@2 - HR@1) breaks the assumption.

The interval at level 1 - alpha (:func:`identified_interval`) is built in three steps:

1. **Data band**: the pooled cumulative shares of sampled ranks, F(i) = P(r~ <= i) at checkpoints
   i = 1, 2, 3, 5, 9, 17, ... < m + 1 (per distinct m), each within a Wilson score band at the Bonferroni level
   alpha / (2 J) (J checkpoints): a simultaneous 1 - alpha confidence set for what the histogram shows.
2. **Linear programs** over P on the rank grid of ``rank_distribution`` (single ranks at the top): minimise and
   maximise the metric sum_g (N_g / N) sum_R P_g(R) M(R) subject to the band and the shape constraints. Groups with
   fewer candidates n_g see P truncated to 1..n_g; the truncation masses Z_g = P(R <= n_g) are held at a maximum
   likelihood fit's values (they depend on the far tail only), which makes every constraint linear.
3. **Which users**: the exact metric of the evaluated users is a finite-sample draw, not P's expectation: which of
   the users inside the top bin sit above K is not identified at all. The LP bounds are widened by
   z * sqrt(M(1) * bound / N) (an upper bound on the standard deviation of that allocation), z at 1 - alpha / 2.

Where the LP is infeasible, the data contradict the assumption: the steepness constraint, then monotonicity are
dropped (flag ``shape_rejected``). Sampling laws: with and without replacement, per-group n and m fixed by the
design, or adaptive sampling declared with ``adaptive=`` (then the band uses the stopping law of ``adaptive.py``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import numpy as np
from scipy import special

from ._blas import blas_single
from ._checks import check_int, check_without_replacement
from ._kept import keep
from ._options import check_nonnegative_float
from ._rank_hist import RankHistogram, as_histogram, interval_mean_metric
from ._adaptive_law import check_adaptive_histogram, stage_event_cdf
from .design import AdaptiveDesign, coerce_adaptive
from .metric_names import MetricSpec, parse_metric
from .metrics import metric_bounds
from .quadrature import power_sums
from .sampling_laws import check_law

if TYPE_CHECKING:
    from .design import SamplingDesign
    from ._types import TensorLike


_T = TypeVar("_T")

__all__ = ["TopShape", "IdentifiedInterval", "Identification", "identified_interval", "top_kind", "top_sensitive", "resolution"]

# metrics whose per-rank weight falls inside the first sampled bin (1/r, 1/log2(r + 1)): the bin's shape matters
# for them at every cut-off
_TOP_KINDS = ("ap", "trunc_ap", "rr", "ndcg")


@dataclass(frozen=True)
class TopShape:
    """The shape assumption behind the identified intervals (see the module docstring).

    Attributes:
        gamma: steepest allowed fall of the density at the top, p(r) proportional to r^-gamma (1: log-uniform).
        decay_widths: the steepness bound holds over ranks 1 .. decay_widths * b.
        monotone_widths: the density is non-increasing over ranks 1 .. max(monotone_widths * b, 2 K).
    """

    gamma: float = 1.0
    decay_widths: float = 1.0
    monotone_widths: float = 2.0

    def __post_init__(self) -> None:
        for name in ("gamma", "decay_widths", "monotone_widths"):
            v = getattr(self, name)
            try:  # a real number, not a str or bool (the one float check of the package)
                object.__setattr__(self, name, check_nonnegative_float(v, name))
            except ValueError:
                raise ValueError(f"shape: {name} must be a finite number >= 0, got {v!r}") from None


@dataclass(frozen=True)
class IdentifiedInterval:
    """Bounds of a metric over the rank distributions consistent with the data and the shape assumption.

    Attributes:
        lo, hi: the interval (LP bounds widened for the allocation of users, clipped to the metric's range).
        lp_lo, lp_hi: the LP bounds alone (expected metric under the extreme distributions).
        level: confidence level of the data band.
        flags: ``shape_rejected`` (the data contradict the assumption; constraints were dropped),
            ``identification_failed`` (no LP solution: the interval is the metric's whole range),
            ``several_m`` (groups with different m and no adaptive design declared: the band takes each m as
            fixed by the design).
    """

    lo: float
    hi: float
    lp_lo: float
    lp_hi: float
    level: float
    flags: tuple[str, ...] = ()
    details: dict = field(default_factory=dict)


def resolution(hist: RankHistogram) -> np.ndarray:
    """Exact ranks covered by one sampled rank per group: (n - 1)/(m + 1) + 1; 1 for an exact group (its counts
    are exact ranks: ``RankHistogram.exact``)."""
    return np.where(hist.exact, 1.0, (hist.n_items - 1.0) / (hist.n_samples + 1.0) + 1.0)


def top_kind(spec: MetricSpec) -> bool:
    """Whether the metric's weight changes from rank to rank at the top (AP, RR, NDCG, with or without cut-off), so
    that it depends on the shape inside a first sampled bin of two or more ranks."""
    return spec.kind in _TOP_KINDS


def top_sensitive(spec: MetricSpec, hist: RankHistogram) -> bool:
    """Whether the metric depends on the shape of P(R) inside the first sampled bin of a group with positives
    at r~ = 1: a cut-off below its resolution b, or a metric whose weight changes inside the bin (AP, RR, NDCG,
    with or without cut-off) where the bin spans two or more ranks (b >= 2)."""
    occupied = hist.top_counts > 0
    if not np.any(occupied):
        return False
    b = resolution(hist)[occupied]
    if top_kind(spec) and np.any(b >= 2.0):
        return True
    return spec.k is not None and bool(np.any(spec.k < b))


def _checkpoints(m: int) -> np.ndarray:
    """1, 2, 3, 5, 9, 17, ... (i -> 2 i - 1) up to m (cumulative shares at m + 1 are 1 by definition)."""
    pts = [1, 2, 3]
    while 2 * pts[-1] - 1 <= m:
        pts.append(2 * pts[-1] - 1)
    return np.asarray([p for p in pts if p <= m], dtype=np.int64)


def _wilson(p: np.ndarray, n: float, z: float) -> tuple[np.ndarray, np.ndarray]:
    """Wilson's interval of proportions ``p`` of ``n`` (weighted) instances; [0, 1] where n is below 1e-150 (its
    square underflows; the interval tends to [0, 1] as n -> 0 anyway)."""
    if not n > 1e-150:
        return np.zeros_like(p, dtype=np.float64), np.ones_like(p, dtype=np.float64)
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2.0 * n)) / denom
    half = z * np.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n)) / denom
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


@dataclass
class _Program:
    """The LP of one histogram, law and shape at one level (the metric enters only the objective)."""

    edges: np.ndarray
    inside: np.ndarray  # (G, C) bool
    weights: np.ndarray  # (G,) N_g / N / Z_g
    n_items: np.ndarray
    a_ub: np.ndarray
    b_ub: np.ndarray
    a_eq: np.ndarray
    b_eq: np.ndarray
    total: float
    flags: tuple[str, ...]


def _shape_rows(edges: np.ndarray, zone_end: int, gamma: float | None) -> np.ndarray:
    """Rows of A P <= 0 for cells inside ranks 1..zone_end: monotone density (gamma None) or r^gamma p(r)
    non-decreasing (cell means of r^-gamma as the reference shape)."""
    c_zone = int(np.searchsorted(edges, zone_end, side="right")) - 1  # cells fully inside 1..zone_end
    if c_zone < 2:
        return np.zeros((0, len(edges) - 1))
    widths = np.diff(edges[: c_zone + 1]).astype(np.float64)
    rows = np.zeros((c_zone - 1, len(edges) - 1))
    idx = np.arange(c_zone - 1)
    # density d_c = P_c / w_c; monotone: d_{c+1} <= d_c; the steepness bound: d_c / ref_c <= d_{c+1} / ref_{c+1},
    # written as rho_c d_c - d_{c+1} <= 0 with rho_c = ref_{c+1} / ref_c in (0, 1]
    if gamma is None:
        rows[idx, idx + 1] = 1.0 / widths[1:]
        rows[idx, idx] = -1.0 / widths[:-1]
    else:
        # cell c holds ranks edges[c] + 1 .. edges[c + 1]: its sum of r^-gamma in closed form (no array of n ranks)
        ref = power_sums(edges[:c_zone] + 1, edges[1 : c_zone + 1], gamma) / widths
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = ref[1:] / ref[:-1]
        # cell means below float64's range (a steep gamma far from the top): the bound there taken as 0 (d_{c+1} >=
        # 0), weaker than the assumption, so the interval only widens (it was a division by 0, then linprog's error)
        rho = np.where(np.isfinite(rho), rho, 0.0)
        rows[idx, idx] = rho / widths[:-1]
        rows[idx, idx + 1] = -1.0 / widths[1:]
    scale = np.abs(rows).max(axis=1, keepdims=True)
    return rows / scale


#: what one histogram keeps of its identification (programs, LP solutions, identified intervals: :func:`_memo`), in
#: one table among what it keeps (``RankHistogram._derived``); the least recently used entry goes first
KEPT_MAX = 64


def _memo(hist: RankHistogram, key: tuple, build: Callable[[], _T]) -> _T:
    """``build()`` kept on ``hist`` under ``key`` (the programs, LP solutions and identified intervals of that
    histogram: the estimators of one evaluation share them, e.g. a corrected and a rank-distribution Recall@10 of
    the same ranks); at most :data:`KEPT_MAX` of them, which go with the histogram. Equal histograms built
    separately (the same ranks histogrammed twice, a histogram and its ``with_design`` copies) do not share them:
    each builds its own."""
    return keep(hist._derived("identification", OrderedDict), key, build, KEPT_MAX)


def _program_key(law: str, shape: TopShape, level: float, relax: int, max_groups: int, cutoff: int = 0,
                 adaptive: AdaptiveDesign | None = None) -> tuple:
    return ("program", law, shape, level, relax, max_groups, cutoff, adaptive)


def _program(hist: RankHistogram, law: str, shape: TopShape, level: float, relax: int, max_groups: int,
             cutoff: int = 0, adaptive: AdaptiveDesign | None = None) -> _Program:
    key = _program_key(law, shape, level, relax, max_groups, cutoff, adaptive)
    return _memo(hist, key, lambda: _build_program(hist, law, shape, level, relax, max_groups, cutoff, adaptive))


def _build_program(hist: RankHistogram, law: str, shape: TopShape, level: float, relax: int, max_groups: int,
                   cutoff: int = 0, adaptive: AdaptiveDesign | None = None) -> _Program:
    from . import registry
    from .rank_distribution import fit_rank_distribution, model_grid, pool_groups

    pooled, _ = pool_groups(hist, max_groups)
    check_without_replacement(pooled.n_items, pooled.n_samples, law)
    occupied = pooled.totals > 0
    if adaptive is not None and np.any(pooled.top_counts > 0):  # the top is resolved down to the cap's bin
        occupied = pooled.top_counts > 0
    b = float(resolution(pooled)[occupied].max())
    mono_end = min(int(math.ceil(max(shape.monotone_widths * b, 2 * cutoff))), int(pooled.n_items.min()))
    decay_end = int(math.ceil(shape.decay_widths * b))
    # adaptive: the band groups positives by n alone (their final m depends on R)
    n_class, n_tot = _n_classes(hist, max_groups) if adaptive is not None else (np.zeros(0, np.int64), None)
    edges = model_grid(np.concatenate([pooled.n_items, n_class]), pooled.n_samples,
                       extra_edges=(mono_end, decay_end))
    n_items, n_samples = pooled.n_items, pooled.n_samples
    G, C = len(n_items), len(edges) - 1
    inside = np.arange(C)[None, :] < np.searchsorted(edges, n_items)[:, None]  # cell within 1..n_g
    totals = pooled.totals.astype(np.float64)
    total = float(totals.sum())
    n_max = int(n_items.max())
    # truncation masses from a maximum-likelihood fit (they depend on the far tail only)
    fit_cum = None
    if not (np.all(n_items == n_max) and np.all(n_class == n_max)):
        fit = fit_rank_distribution(pooled, registry.Mle(n_bootstrap=0, max_groups=max_groups, tol=1e-5), sampling=law)
        fit_cum = (fit.edges.astype(np.float64), np.concatenate([[0.0], np.cumsum(fit.probs)]))

    def mass(ns: np.ndarray) -> np.ndarray:
        if fit_cum is None:
            return np.ones(len(ns))
        return np.maximum(np.interp(ns.astype(np.float64), *fit_cum), 1e-12)

    z_g = mass(n_items)
    weights = totals / total / z_g
    if adaptive is None:
        a_data, lo_b, hi_b = _fixed_band(pooled, edges, inside, z_g, law, level)
    else:
        assert n_tot is not None  # computed for an adaptive design
        a_data, lo_b, hi_b = _adaptive_band(pooled, edges, n_class, n_tot, mass(n_class), adaptive, level)
    a_ub = [a_data, -a_data]
    b_ub = [np.asarray(hi_b), -np.asarray(lo_b)]
    if relax < 2:
        mono = _shape_rows(edges, mono_end, None)
        a_ub.append(mono)
        b_ub.append(np.zeros(len(mono)))
    if relax < 1 and shape.gamma > 0:
        dec = _shape_rows(edges, decay_end, float(shape.gamma))
        a_ub.append(dec)
        b_ub.append(np.zeros(len(dec)))
    a_eq = [np.ones((1, C))]
    b_eq = [1.0]
    for g in range(G):
        if n_items[g] < n_max:
            a_eq.append(inside[g][None, :].astype(np.float64))
            b_eq.append(float(z_g[g]))
    flags = ("shape_rejected",) if relax else ()
    return _Program(edges, inside, weights, n_items, np.concatenate(a_ub), np.concatenate(b_ub), np.concatenate(a_eq),
                    np.asarray(b_eq), total, flags)


def _fixed_band(pooled: RankHistogram, edges: np.ndarray, inside: np.ndarray, z_g: np.ndarray, law: str,
                level: float) -> tuple[np.ndarray, list, list]:
    """Band rows for designs with m fixed per group: per distinct m, the cumulative pooled shares at the
    checkpoints, simultaneous by Bonferroni. Returns (rows (J, C), lower, upper)."""
    n_items, n_samples = pooled.n_items, pooled.n_samples
    totals = pooled.totals.astype(np.float64)
    C = len(edges) - 1
    classes = np.unique(n_samples[totals > 0])
    cps = [_checkpoints(int(mv)) for mv in classes]
    n_checks = max(1, sum(len(c) for c in cps))
    z_band = NormalDist().inv_cdf(1.0 - (1.0 - level) / (2.0 * n_checks))
    rows, lo_b, hi_b = [], [], []
    for mv, pts in zip(classes, cps):
        sel = np.flatnonzero(n_samples == mv)
        n_cls = float(totals[sel].sum())
        if n_cls <= 0:
            continue
        cdf = np.stack([_cell_cdf_cached(edges.astype(np.int64).tobytes(), int(n_items[g]), int(mv), pts.astype(np.int64).tobytes(), law)
                        for g in sel])  # (G_m, C, J)
        for j, i in enumerate(pts):
            expected = np.einsum("g,gc->c", totals[sel] / n_cls / z_g[sel], cdf[:, :, j] * inside[sel])
            share = float(sum(pooled.counts[g][:i].sum() for g in sel)) / n_cls
            lo, hi = _wilson(np.array([share]), n_cls, z_band)
            rows.append(expected)
            lo_b.append(float(lo[0]))
            hi_b.append(float(hi[0]))
    return np.asarray(rows).reshape(-1, C), lo_b, hi_b


def _n_classes(hist: RankHistogram, max_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidate counts of the positives whatever their final m: (representative n, positives) per class, at
    most ``max_groups`` classes (count-weighted median n of quantile bins, as ``pool_groups``)."""
    from .rank_distribution import pool_groups

    ns, inv = np.unique(hist.n_items, return_inverse=True)
    tot = np.bincount(inv, weights=hist.totals, minlength=len(ns))
    keep = tot > 0
    ns, tot = ns[keep], tot[keep]
    collapsed = RankHistogram(ns, np.ones(len(ns), np.int64), tuple(np.array([t, 0.0]) for t in tot))
    pooled, _ = pool_groups(collapsed, max_groups)
    return pooled.n_items, pooled.totals.astype(np.float64)


def _adaptive_band(pooled: RankHistogram, edges: np.ndarray, n_class: np.ndarray, n_tot: np.ndarray,
                   z_class: np.ndarray, design: AdaptiveDesign, level: float) -> tuple[np.ndarray, list, list]:
    """Band rows for adaptive sampling: shares of the nested events E(s, i) (``_adaptive_law.stage_event_cdf``) at
    checkpoints i of each stage's new draws, over every positive, simultaneous by Bonferroni."""
    from .rank_distribution import cell_points

    stages = design.stages
    news = np.diff(np.concatenate([[0], stages]))
    cps = [_checkpoints(int(v)) for v in news]
    n_checks = max(1, sum(len(c) for c in cps))
    z_band = NormalDist().inv_cdf(1.0 - (1.0 - level) / (2.0 * n_checks))
    total = float(n_tot.sum())
    C = len(edges) - 1
    pts, wts = cell_points(edges)
    totals = pooled.totals.astype(np.float64)
    m_g = pooled.n_samples
    rows, lo_b, hi_b = [], [], []
    for s, (size, chk) in enumerate(zip(stages, cps)):
        expected = np.zeros((len(chk), C))
        for n_c, w_c, z_c in zip(n_class, n_tot / total, z_class):  # a few n classes
            c_in = int(np.searchsorted(edges, int(n_c)))
            p = (pts[:c_in].astype(np.float64) - 1.0) / (float(n_c) - 1.0)
            cdf = stage_event_cdf(p, design, s, chk)  # (c_in, S, J)
            expected[:, :c_in] += (w_c / z_c) * np.einsum("cs,csj->jc", wts[:c_in], cdf)
        beyond = float(totals[m_g > size].sum())
        here = np.flatnonzero(m_g == size)
        for j, i in enumerate(chk):
            share = (beyond + float(sum(pooled.counts[g][:i].sum() for g in here))) / total
            lo, hi = _wilson(np.array([share]), total, z_band)
            rows.append(expected[j])
            lo_b.append(float(lo[0]))
            hi_b.append(float(hi[0]))
    return np.asarray(rows).reshape(-1, C), lo_b, hi_b


@lru_cache(maxsize=256)
def _cell_cdf_cached(edges: bytes, n: int, m: int, checkpoints: bytes, law: str) -> np.ndarray:
    """:func:`_cell_cdf` kept for the next evaluation of the same users (an epoch of a training run has the same
    candidate counts, so the same pooled groups and grid, as the last one: only the counts change). Read-only."""
    out = _cell_cdf(np.frombuffer(edges, dtype=np.int64), n, m, np.frombuffer(checkpoints, dtype=np.int64), law)
    out.flags.writeable = False
    return out
#: largest population n - 1 handed to scipy's hypergeometric cdf (its cost grows with n: 0.2 s a call at 1e9)
_SCIPY_HYPERGEOM_MAX = 1 << 24


def _hypergeom_cdf(pts: np.ndarray, n: int, m: int, k: np.ndarray) -> np.ndarray:
    """P(j <= k | r) of the hypergeometric law (j irrelevant samples above rank r) for whole ranks ``pts`` (...)
    and counts ``k`` (J,): (..., J), from the law's log pmf (sampling_laws) summed in chunks of 2^22 values,
    so the cost is O(len(pts) m) whatever n is."""
    import torch

    from .sampling_laws import log_sampled_rank_pmf_unbounded

    flat = pts.reshape(-1).astype(np.float64)
    out = np.empty((flat.size, len(k)))
    step = max(1, (1 << 22) // (m + 1))
    for s in range(0, flat.size, step):  # chunks of the work matrix, not a loop over data
        logp = log_sampled_rank_pmf_unbounded(torch.from_numpy(flat[s : s + step]), n, m, "hypergeometric").numpy()
        out[s : s + step] = np.minimum(np.cumsum(np.exp(logp), axis=-1)[:, k], 1.0)
    return out.reshape(pts.shape + (len(k),))


def _cell_cdf(edges: np.ndarray, n: int, m: int, checkpoints: np.ndarray, law: str) -> np.ndarray:
    """P(r~ <= i | cell) for the checkpoints i (C, J), zero for cells above n: each cell's law averaged over the
    ranks of ``rank_distribution.cell_points``, as the fits do; the binomial cdf is the regularised incomplete
    beta (``special.bdtr``), so no (m + 1)-wide rows are built."""
    from .rank_distribution import cell_points

    pts, wts = cell_points(edges)
    c_in = int(np.searchsorted(edges, n))
    # each distinct rank once: cells narrower than SUBPOINTS repeat their ranks (~40% of the points at the top)
    ranks, where = np.unique(pts[:c_in], return_inverse=True)
    r = ranks.astype(np.float64)[:, None]  # (U, 1)
    k = checkpoints.astype(np.float64) - 1.0  # r~ <= i  <=>  j <= i - 1
    if law == "binomial":
        cdf = special.bdtr(k, m, np.clip((r - 1.0) / (n - 1.0), 0.0, 1.0))
    elif n - 1 <= _SCIPY_HYPERGEOM_MAX:
        from scipy import stats  # imported here: scipy.stats costs ~0.4 s at import, and only this law needs it

        cdf = stats.hypergeom.cdf(k, n - 1, r - 1.0, m)
    else:  # scipy's cdf costs time growing with n (minutes at n = 2^40): cumulative sums of the exact law instead
        cdf = _hypergeom_cdf(ranks, n, m, checkpoints - 1)
    out = np.zeros((len(edges) - 1, len(checkpoints)))
    out[:c_in] = np.einsum("cs,csj->cj", wts[:c_in], cdf[where.reshape(c_in, -1)])
    return out


def _objective(spec: MetricSpec, prog: _Program) -> np.ndarray:
    c = np.zeros(len(prog.edges) - 1)
    for g, n_g in enumerate(prog.n_items):
        c_in = int(np.count_nonzero(prog.inside[g]))
        if prog.weights[g] == 0:
            continue
        c[:c_in] += prog.weights[g] * interval_mean_metric(spec, prog.edges[:c_in], prog.edges[1 : c_in + 1], int(n_g))
    return c


def _solve(c: np.ndarray, prog: _Program, sense: float) -> Any:
    from scipy import optimize  # imported when the first LP is solved (0.1-0.2 s of every import otherwise)

    # first without presolve: these programs are small and dense (tens of rows, ~150 cells), and HiGHS's presolve
    # took 40% of each solve's time (the same status and optimum to 1e-7 on 48 programs checked); a solve that does
    # not succeed so is repeated with it before the program is called infeasible
    kwargs: dict[str, Any] = dict(A_ub=prog.a_ub, b_ub=prog.b_ub, A_eq=prog.a_eq, b_eq=prog.b_eq, bounds=(0.0, 1.0),
                                  method="highs")
    res = optimize.linprog(sense * c, options={"presolve": False}, **kwargs)
    if res.status != 0:
        res = optimize.linprog(sense * c, **kwargs)
    return res


@blas_single  # the program and its LPs are small: one BLAS thread (_blas)
def identified_interval(
    metric: str | MetricSpec,
    sampled_ranks: TensorLike | RankHistogram,
    n_items: TensorLike | None = None,
    n_samples: TensorLike | None = None,
    level: float = 0.95,
    *,
    sampling: str = "binomial",
    weights: TensorLike | None = None,
    shape: TopShape | None = None,
    max_groups: int = 16,
    adaptive: AdaptiveDesign | SamplingDesign | tuple[int, int | None] | None = None,
) -> IdentifiedInterval:
    """The interval of a global metric over every rank distribution that fits the sampled ranks and the
    shape assumption (module docstring), at confidence ``level``.

    Args:
        metric: metric name or spec.
        sampled_ranks: sampled ranks (0 = padding) or a :class:`RankHistogram`; ``n_items``, ``n_samples``,
            ``weights`` as in :func:`~reco_sampled_plugin.estimators.estimate`.
        level: in (0, 1).
        sampling: ``"binomial"`` or ``"hypergeometric"``.
        shape: the :class:`TopShape` assumption (default: monotone over 2 b, no steeper than 1/r over b).
        adaptive: an :class:`~reco_sampled_plugin.adaptive.AdaptiveDesign` (or (m, adaptive_max)) when the ranks
            come from adaptive sampling (``n_samples`` then holds each positive's final m): the band then uses the
            stopping law (``_adaptive_law.stage_event_cdf``), and the top is resolved down to the cap's bin.

    Raises:
        ValueError: bad level, law, shape, empty histogram, cut-off above n.
    """
    spec = parse_metric(metric)
    if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
        raise ValueError(f"level: must lie in (0, 1), got {level!r}")
    shape = TopShape() if shape is None else shape
    if not isinstance(shape, TopShape):
        raise ValueError(f"shape: expected a TopShape, got {type(shape).__name__}")
    law = check_law(sampling)
    max_groups = check_int(max_groups, "max_groups", minimum=1)
    hist = as_histogram(sampled_ranks, n_items, n_samples, weights)
    hist.check_nonempty(weights)
    hist = hist.without_empty_groups()
    if hist.has_exact:
        raise ValueError("sampled_ranks: the histogram has exact groups (exact_at_cap); the identified interval "
                         "reads sampled ranks only (with every positive first at the cap completed, the top is "
                         "resolved and no interval needs widening)")
    design = coerce_adaptive(adaptive)
    if design is not None:
        if law != "binomial":
            raise ValueError("sampling: adaptive sampling draws with replacement (binomial law)")
        check_adaptive_histogram(hist, design)
    several_m = design is None and len(np.unique(hist.n_samples)) > 1
    if spec.k is not None and spec.k > int(hist.n_items.min()):
        raise ValueError(f"metric: cut-off K = {spec.k} is larger than the catalogue (n_items = {int(hist.n_items.min())})")
    lo_range, hi_range = _metric_range(spec, hist)
    flags: tuple[str, ...] = ()
    lp_lo = lp_hi = math.nan
    for relax in range(3):
        args = (hist, law, shape, float(level), relax, int(max_groups), int(spec.k or 0), design)
        prog = _program(*args)
        c = _objective(spec, prog)
        # one LP per (program, objective, sense): metrics with the same per-rank objective on the same data
        # (Hit@K and leave-one-out Recall@K) share the solutions instead of solving the same LP again
        lp_key = ("lp",) + _program_key(*args[1:]) + (c.tobytes(),)
        r_lo = _memo(hist, lp_key + (1.0,), lambda: _solve(c, prog, 1.0))
        r_hi = _memo(hist, lp_key + (-1.0,), lambda: _solve(c, prog, -1.0))
        if r_lo.status == 0 and r_hi.status == 0:
            lp_lo, lp_hi = float(c @ r_lo.x), float(c @ r_hi.x)
            flags = prog.flags
            break
    else:
        flags = ("identification_failed",) + (("several_m",) if several_m else ())
        return IdentifiedInterval(lo_range, hi_range, lo_range, hi_range, float(level), flags)
    lp_lo, lp_hi = max(lp_lo, lo_range), min(max(lp_hi, lp_lo), hi_range)
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    top = float(_top_value(spec, hist))
    total = max(prog.total, 1.0)
    lo = lp_lo - z * math.sqrt(top * max(lp_lo - lo_range, 0.0) / total)
    hi = lp_hi + z * math.sqrt(top * max(lp_hi - lo_range, 0.0) / total)
    lo, hi = max(lo, lo_range), min(hi, hi_range)
    if several_m:
        flags += ("several_m",)
    details = {"resolution": resolution(hist).tolist(), "shape": shape, "n_cells": len(prog.edges) - 1}
    if design is not None:
        details["adaptive"] = design
    return IdentifiedInterval(lo, hi, lp_lo, lp_hi, float(level), flags, details)


def _metric_range(spec: MetricSpec, hist: RankHistogram) -> tuple[float, float]:
    return metric_bounds(spec, hist.n_items)


def _top_value(spec: MetricSpec, hist: RankHistogram) -> float:
    """M(1) - min M: the largest change of one instance's metric (the allocation's per-user spread bound)."""
    lo, hi = _metric_range(spec, hist)
    return hi - lo


class Identification:
    """What an :class:`~reco_sampled_plugin.Estimate` needs to widen its interval: the histogram, metric,
    law and shape; identified intervals are computed on first use per level and kept (picklable)."""

    def __init__(self, spec: MetricSpec, hist: RankHistogram, sampling: str, shape: TopShape | None = None,
                 adaptive: AdaptiveDesign | None = None) -> None:
        self.spec = spec
        self.hist = hist
        self.sampling = check_law(sampling)
        self.shape = TopShape() if shape is None else shape
        self.adaptive = adaptive
        self.metric_range = _metric_range(spec, hist)
        self._cache: dict = {}

    def interval(self, level: float = 0.95) -> IdentifiedInterval:
        key = float(level)
        if key not in self._cache:
            shared = ("interval", self.spec, self.sampling, self.shape, key, self.adaptive)
            self._cache[key] = _memo(self.hist, shared, lambda: identified_interval(
                self.spec, self.hist, level=key, sampling=self.sampling, shape=self.shape, adaptive=self.adaptive))
        return self._cache[key]

    def __repr__(self) -> str:
        return f"Identification({self.spec}, shape={self.shape})"
