"""Top-K metrics under popularity sampling: a rank-distribution fit whose likelihood reads each drawn item's
popularity (estimator ``pl_fit``; docs/popularity.md, "Top-K metrics: pl_fit").

The law (docs/popularity.md, "The law, and what a draw keeps"): a positive with exact rank R and the set A of the
R - 1 drawable items scored above it; each drawn item j beats it iff j is in A. The sampled rank only gives q~(A);
which *items* beat says more, but what A holds at a given R depends on the recommender. The model (the stated
assumption):

    **A is popularity-tilted as in a Plackett-Luce ranking with weights w^beta**: given |A| = R - 1, item j of the
    row's drawable candidates is in A independently with probability pi_j(R) = 1 - exp(-lambda w_j^beta), lambda
    solving sum_j pi_j(R) = R - 1 (the exponential-clocks form of Plackett-Luce, a fixed horizon: conditional
    Poisson sampling). beta = 0: A is a uniform random subset (the uniform law); beta > 0: the items above a
    positive are more popular than its candidates on average (popularity-biased recommenders), beta -> infinity:
    the R - 1 most popular; beta < 0: niche-biased. The tilt may change with depth: beta(r) runs linearly in log r
    from beta_top at r = 1 to beta_deep at r = :data:`DEEP_RANK` (constant beyond), both on the grid :data:`BETAS`;
    by default beta_top >= beta_deep (the top is at least as popularity-tilted as the depth), relaxed where the
    draws show a niche top (below).

Given R, the distinct drawn items' memberships are then independent: the likelihood of a positive is
prod_{beating j} pi_j(R) prod_{non-beating j} (1 - pi_j(R)), which under uniform weights is the binomial likelihood
of the uniform design. That leaves |A| random (A empty with probability ~e^-1 at R = 2), so positives with no
beating draw spread from rank 1 onto ranks 2-5: NDCG@10 4-6% low even where the model holds (HR@10 within 1%),
6-11% low on ml-100k at m = 500. The conditional law given |A| = R - 1 multiplies it by the count term
P(|A - D| = R - 1 - b) / P(|A| = R - 1) (D the distinct drawn items, b those beating;
:meth:`PopularityFit._count_subs`, exact in the single-rank cells R <= :data:`COUNT_EXACT_RANK`), **on by default**
(option ``count_term``; ``"off"``: the independent product). Alone it raised a niche-topped recommender's estimates,
already too high; with the niche test's hedge (below) the two biases it exposed are both met (docs/research-notes.md,
"Popularity sampling: pl_fit"; twenty repeats on both data sets: the accuracy goal, the worst recommender's error at
most 1.5x the uniform default's, met in 16 of 16 cells).
Items are grouped into popularity classes (``_popularity.weight_bins``; w^beta of a class is
its items' mean), so a positive is summarised by three count vectors (``PopularityStats.profile``, ``beat_bins``,
``miss_bins``). The prior P(R) on a rank grid shared by the positives is fitted by penalised EM (10 pseudo-positives
spread log-uniformly, the smoothing of ``mes``'s default) for each (beta_top, beta_deep) tried, the pair by maximum
likelihood. The estimate is the mean of the positives' posterior means of the metric under, by default
(``rank_prior="spline"``), a g-modelling prior refitted at the chosen pair: log P(R) a cubic B-spline in
log R with ``gmod``'s basis and penalty (Efron, Biometrika 2016; ``_gspline.G_DF``, ``G_PENALTY``), by
penalised maximum likelihood on the same likelihood (:meth:`PopularityFit.spline_prior`); ``rank_prior="em"`` keeps the
EM prior (the estimator before). Measured on both data sets (docs/research-notes.md, "The prior of the value"): the
worst recommender's error fell in 13 of 16 cells and met the 1.5x goal in 12 (8 before), with the same basis
and penalty as ``gmod`` (not tuned here).

Niche tops: the constrained fit (beta_top >= beta_deep, coordinate ascent from the best constant beta)
and the free fit (coordinate ascent over the whole grid from the constrained optimum) are both made; the one-sided
likelihood-ratio statistic 2 (loglik free - loglik constrained) is tested against :data:`NICHE_LR_CRITICAL` (level
0.001 under the boundary null's 0.5 chi2(0) + 0.5 chi2(1)). Rejected (``niche``): the draws' classes favour a top
less popular than the depth, but on real recommenders the statistic is inflated by misspecification (users differ
in tilt: on ml-100k ItemKNN q = 3, whose top-d mass matches a flat tilt, LR reaches 800 and the free fit errs by
-3..-29%), so neither branch is taken alone: by default (``niche="hedge"``) the value is the harmonic mean
2 a b / (a + b) of the two branches' values a, b, the point with the least worst-case relative error if either
holds (``niche="constrained"``: the constrained fit's). The interval always covers both branches.

Strata (:func:`strata`, :class:`StratifiedFit`; docs/research-notes.md, "Strata by the positive's popularity"): users
differ in what sits above their positives (a niche user's top holds niche items, and a niche positive is more
often such a user's), so one tilt curve misplaces each user's own composition, and a latent tilt per positive is
confounded with its rank. The positive's own popularity is known before the draw: by default the positives are
split at the weighted median of their log weight (:attr:`Units.covariate`) and each half is fitted alone (its own
tilt curve, niche test and rank prior), where each holds :data:`STRATUM_MIN` positives; values, standard errors and
intervals combine by the halves' shares.

Honest intervals: the data do not say how P(R) is shaped where a positive expects less than one beating draw (its
*top zone*, ranks with m pi(R) <= 1, pi(R) = E q~(A)), and few positives there say little about beta_top. The
interval is the hull, over the constrained fit's 95% likelihood set of (beta_top, beta_deep) with every beta_top >=
its beta_deep, and over the free fit's 95% likelihood set (with, where the niche test rejects, every beta_top <= the
free fit's beta_deep: the test gives the direction of the top's tilt, not its size), of the estimates with P inside each positive's top zone replaced by the extremes the shape assumption of
the uniform case allows (``identification.TopShape`` defaults: the density non-increasing there and no steeper than
1/r), widened by z standard errors.
"""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from ._kept import KeepsDerived
from ._rank_hist import interval_mean_metric
from .metric_names import MetricSpec

__all__ = ["Units", "PopularityFit", "StratifiedFit", "fit", "strata", "BETAS", "PRIORS", "STRATA", "COUNT_TERMS"]

#: The grid of beta (the tilt exponent on the weights w, which are count^alpha); beta is chosen by likelihood on it.
BETAS = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)

_CHI2_95_2 = 5.991464547107979  # the 95% quantile of chi-square(2): the likelihood set of (beta_top, beta_deep)

#: The critical value of the one-sided likelihood-ratio test of beta_top >= beta_deep against a niche top
#: (2 (max loglik free - max loglik constrained)): the chi-square(1) quantile at 0.002, i.e. level 0.001 under the
#: boundary null's 0.5 chi2(0) + 0.5 chi2(1) mixture. Chosen on synthetic worlds and ml-100k (docs/research-notes.md,
#: "Niche tops: the test, and the hedge"), not on ml-latest-small (the module docstring, "Niche tops").
NICHE_LR_CRITICAL = 9.549535706083237
#: beta(r) reaches ``beta_deep`` at this rank (linear in log r from r = 1).
DEEP_RANK = 200.0
_EM_ITER = 400
#: With the count term on (``pl_fit``'s option ``count_term``), the likelihood conditions the independent
#: memberships on |A| = R - 1 (:meth:`PopularityFit._count_subs`) exactly in the single-rank cells up to this rank
#: (32: every single-rank cell of :func:`rank_edges`). It removes NDCG@10's low bias where the composition model
#: holds but raises a niche top's estimates (docs/research-notes.md, "The count term").
COUNT_EXACT_RANK = 32
#: ``pl_fit``'s option ``count_term``: ``on`` (the default), conditioned on |A| = R - 1; ``off``, the independent
#: memberships.
COUNT_TERMS = ("on", "off")
_COUNT_SKIP = 40.0
_COUNT_CHUNK = 4  # single-rank cells per truncated product of the count term
_COUNT_BATCH = 1 << 18  # the most coefficients (units x cells x terms) of one product of the count term's betas
_COUNT_GROUP_BYTES = 64 << 20  # the most bytes of the count term's membership probabilities held for its betas at once

#: Pseudo-positives of the prior's smoothing towards a log-uniform law in the rank (the ``mes`` default's 10 / N).
PSEUDO_COUNT = 10.0
#: The priors an estimate may use at a fitted (beta_top, beta_deep): ``spline`` (default), the g-modelling prior of
#: :meth:`PopularityFit.spline_prior`; ``em``, the penalised-EM prior the pair was chosen with.
PRIORS = ("spline", "em")
_EM_TOL = 1e-8
#: How ``pl_fit`` stratifies the positives (:func:`strata`): ``positive``, in two halves by the popularity of the
#: positive itself, each fitted alone (its own tilt curve, niche test and rank prior); ``none``, one fit of all.
STRATA = ("positive", "none")
#: The least weight (positives) of a stratum: fewer positives than twice this are fitted as one.
STRATUM_MIN = 200.0


@dataclass(frozen=True)
class Units(KeepsDerived):
    """The fit's data: one row per unit (a positive, or a cell of a uniform histogram with its count as weight).
    Its fits are kept on it (:func:`fit`; ``_kept.KeepsDerived``), left out of its pickles and copies: at most
    ``_derived_max`` = 2 (a fit holds about 100 times the units' data), living as long as the units. Its arrays are
    made read-only (so a kept fit cannot go stale).

    profile: (N, C) drawable candidates per popularity class; beat, miss: (N, C) distinct drawn items per class that
    beat the unit's positive or not; n: (N,) candidates (the positive and its drawable items); m: (N,) draws;
    w: (N,) frequency weights; log_v: (C,) mean log weight of each class (log w, any common offset); mean_w: (C,)
    mean weight of each class (the mass of the top zone); uniform: one class (beta has no effect).
    """

    profile: np.ndarray
    beat: np.ndarray
    miss: np.ndarray
    n: np.ndarray
    m: np.ndarray
    w: np.ndarray
    log_v: np.ndarray
    mean_w: np.ndarray
    #: beat / miss count distinct drawn items (a popularity draw), not draws (a uniform histogram: False, the
    #: binomial of the draws is exact and the likelihood takes no count term)
    distinct: bool = True
    #: (N,) log popularity weight of each unit's positive (``PopularityStats.positive_weight``), or None (not
    #: carried): the covariate of :func:`strata` (known before the draw, so the strata are fixed by the design)
    covariate: np.ndarray | None = None
    #: the most fits one units keeps (what the process-wide cache held before fits were kept on their units)
    _derived_max = 2

    def __post_init__(self) -> None:
        for a in (self.profile, self.beat, self.miss, self.n, self.m, self.w, self.log_v, self.mean_w, self.covariate):
            if a is not None:
                a.setflags(write=False)

    def select(self, rows: np.ndarray) -> "Units":
        """The units of ``rows`` (an index array), with the classes' weights unchanged."""
        cov = None if self.covariate is None else self.covariate[rows]
        return Units(self.profile[rows], self.beat[rows], self.miss[rows], self.n[rows], self.m[rows], self.w[rows],
                     self.log_v, self.mean_w, self.distinct, cov)

    @property
    def uniform(self) -> bool:
        return bool(np.count_nonzero(self.profile.sum(0) > 0) <= 1)


def rank_edges(n_max: int) -> np.ndarray:
    """Cell edges e_0 = 0 < ... < e_C = n_max of the shared rank grid (cell c: ranks e_c + 1 .. e_{c+1}): single
    ranks up to 32 (every top-K cut-off users ask for), then steps of 4% (about 130 cells for 10,000 items)."""
    edges = [0]
    e = 0
    while e < n_max:  # one step per cell (a few hundred at most)
        r = e + 1
        e = min(n_max, e + (1 if r <= 32 else max(1, int(0.04 * r))))
        edges.append(e)
    return np.asarray(edges, dtype=np.int64)


def _tilted(log_v: np.ndarray, beta: float) -> np.ndarray:
    """The classes' tilted weights v^beta (``log_v``: log v), up to a common factor (lambda absorbs it): the largest
    is 1 for beta >= 0; for beta < 0 the smallest class's would be v_max^|beta| / v_min^|beta|, kept at most e^300
    (weights spanning more than e^150 at beta = -2 would overflow float64 and leave no lambda to solve)."""
    x = beta * (log_v - log_v.max())
    return np.exp(x - max(0.0, float(x.max()) - 300.0))


def _solve_lambda(profile: np.ndarray, v: np.ndarray, k: np.ndarray, points: int = 400) -> np.ndarray:
    """lambda >= 0 with sum_c profile_c (1 - exp(-lambda v_c)) = k, for every unit (rows) and target k (columns):
    (N, K). The left side, increasing in t = log lambda, is tabulated on ``points`` values of t spanning every
    reachable k, and inverted by one flattened ``searchsorted`` (rows offset so they never mix), t interpolated
    linearly in log k. k <= 0 gives 0; k at or above the reachable count gives inf. Memoised on the inputs (the
    profiles do not change between fits of one evaluation)."""
    key = (profile.shape, hash(profile.tobytes()), v.tobytes(), k.tobytes(), points)
    hit = _LAMBDA_CACHE.get(key)
    if hit is not None:
        return hit
    n_units = profile.shape[0]
    pos = v > 0
    # vmin at least 1e-300: the grid's top exp(t) = 40 / vmin stays finite (tilted weights below it, of weights spanning
    # more than e^40 tilted by beta = 16 or e^300 by beta = -2, are classes hardly ever drawn)
    vmax, vmin = float(v.max()), max(float(v[pos].min()), 1e-300)
    t = np.linspace(math.log(1e-4 / (vmax * max(float(profile.sum(1).max()), 1.0))), math.log(40.0 / vmin), points)
    with np.errstate(over="ignore"):  # lambda v beyond float64 at the grid's top: the membership is certain (1)
        table = profile @ (-np.expm1(-np.exp(t)[:, None] * v[None, :])).T  # (N, T), increasing along T
    reach = profile @ pos.astype(np.float64)
    logk = np.log(np.maximum(k, 1e-300))
    ltab = np.log(np.maximum(table, 1e-300))
    span = float(max(np.abs(ltab).max(), np.abs(logk).max())) * 2.0 + 10.0
    off = np.arange(n_units)[:, None] * span
    flat = (ltab + off).ravel()
    flat = np.maximum.accumulate(flat)  # exact ties of a saturated row stay sorted
    j = np.searchsorted(flat, (logk[None, :] + off).ravel()).reshape(n_units, -1) - np.arange(n_units)[:, None] * points
    j = np.clip(j, 1, points - 1)
    rows = np.arange(n_units)[:, None]
    y0, y1 = ltab[rows, j - 1], ltab[rows, j]
    frac = np.clip((logk[None, :] - y0) / np.maximum(y1 - y0, 1e-300), 0.0, 1.0)
    lam = np.exp(t[j - 1] + frac * (t[j] - t[j - 1]))
    lam = np.where(k[None, :] <= 0, 0.0, lam)
    lam = np.where(k[None, :] >= reach[:, None] - 1e-9, np.inf, lam)
    lam.setflags(write=False)
    with _CACHE_LOCK:
        _LAMBDA_CACHE[key] = lam
        # the newest always kept; older ones dropped beyond 64 entries or _LAMBDA_CACHE_BYTES in all
        while len(_LAMBDA_CACHE) > 1 and (len(_LAMBDA_CACHE) > 64
                                          or sum(a.nbytes for a in _LAMBDA_CACHE.values()) > _LAMBDA_CACHE_BYTES):
            _LAMBDA_CACHE.pop(next(iter(_LAMBDA_CACHE)))
    return lam


_LAMBDA_CACHE: dict = {}
#: the most bytes the lambda tables of past fits keep alive between evaluations (one fit's beta grid fits in it at
#: a few thousand positives; larger evaluations recompute what falls out)
_LAMBDA_CACHE_BYTES = 64 << 20
_CACHE_LOCK = threading.Lock()


class PopularityFit:
    """The fitted model of one set of :class:`Units` (see the module docstring).

    beta may change with depth: beta(r) runs linearly in log r from ``beta_top`` at r = 1 to ``beta_deep`` at
    r = :data:`DEEP_RANK` and stays there beyond (cells take the nearest value of :data:`BETAS`). The pair is chosen
    by maximum likelihood, by coordinate ascent over the grid from the best constant beta. ``curves``: every pair
    tried, with its log-likelihood (``loglik``), prior over the cells and per-cell beta index."""

    def __init__(self, units: Units, edges: np.ndarray, count_rank: int = COUNT_EXACT_RANK) -> None:
        """``count_rank``: the count term in the single-rank cells up to this rank (:data:`COUNT_EXACT_RANK`, the
        default: ``count_term="on"``; 0: off)."""
        self.units, self.edges, self.count_rank = units, edges, int(count_rank)
        lo, hi = edges[:-1], edges[1:]
        self.r_mid = np.sqrt((lo + 1.0) * hi)  # the cell's representative rank (geometric middle)
        self.allowed = lo[None, :] < units.n[:, None]  # cells a unit's positive can occupy
        self.betas = np.asarray((0.0,) if units.uniform else BETAS)
        harmonic = np.log((hi + 0.5) / (lo + 0.5))  # ~ sum of 1/r over each cell's ranks: log-uniform per rank
        self._base = harmonic / harmonic.sum()
        self._lam: list[np.ndarray | None] = [None] * len(self.betas)
        self.tables = self._log_likelihoods()  # (betas, N, cells)
        self._zone: dict[int, np.ndarray] = {}
        self._spline: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        # estimate()'s results per (metric, pair, prior): the hedge, the branch values and the interval's hull ask
        # for the same pairs again
        self._estimates: dict[tuple[MetricSpec, tuple[int, int], str], tuple[float, float, np.ndarray]] = {}
        self._cell_metric: dict[MetricSpec, np.ndarray] = {}
        #: spline fits (:meth:`spline_prior`) that stopped short of their tolerances (iteration cap or line search)
        self.spline_unconverged = 0
        pos = np.clip(np.log(self.r_mid) / math.log(DEEP_RANK), 0.0, 1.0)
        self._frac = pos
        self.curves: dict[tuple[int, int], tuple[float, np.ndarray, np.ndarray]] = {}
        nb = len(self.betas)
        prior = None
        for i in range(nb):  # constant beta first
            prior = self._try(i, i, prior)
        best = self._ascent(max(self.curves, key=lambda k: self.curves[k][0]), constrained=True)
        for i in range(best[1], nb):  # every top tilt the assumption allows at the fitted depth's
            self._try(i, best[1], self.curves[best][1])
        self.best_constrained = best
        top = self.curves[best][0]
        # the constrained branch's curves: its 95% likelihood set, and every top tilt >= the depth's (not identified
        # where few positives have beating draws near the top)
        con = {k for k, c in self.curves.items() if k[0] >= k[1] and 2.0 * (top - c[0]) <= _CHI2_95_2}
        self.curve_set_constrained = sorted(con | {(i, best[1]) for i in range(best[1], nb)})
        # the free branch (beta_top < beta_deep allowed: a niche top), and the one-sided likelihood-ratio test of
        # the constraint (module docstring, "Niche tops")
        free = self._ascent(best, constrained=False)
        self.best_free = free
        ftop = self.curves[free][0]
        # against the best constrained curve evaluated so far: the free ascent may visit constrained pairs the
        # constrained ascent did not, and a gain there is no evidence of a niche top
        ctop = max(c[0] for k, c in self.curves.items() if k[0] >= k[1])
        self.niche_lr = max(0.0, 2.0 * (ftop - max(top, ctop)))
        self.niche = bool(free[0] < free[1] and self.niche_lr > NICHE_LR_CRITICAL)
        self.best = best
        free_set = {k for k, c in self.curves.items() if 2.0 * (ftop - c[0]) <= _CHI2_95_2}
        if self.niche:  # every top tilt up to the depth's: the test identifies the direction, not the size
            for i in range(free[1] + 1):
                self._try(i, free[1], self.curves[free][1])
            free_set |= {(i, free[1]) for i in range(free[1] + 1)}
        self.curve_set_free = sorted(free_set)
        # the interval's curves: both branches, always (the constrained set, and the free fit's 95% likelihood set)
        self.curve_set = sorted(set(self.curve_set_constrained) | free_set)

    def _ascent(self, best: tuple[int, int], constrained: bool) -> tuple[int, int]:
        """Coordinate ascent over (top, deep) on the grid from ``best``, two rounds; ``constrained``: the top at
        least as tilted as the depth (beta_top >= beta_deep)."""
        nb = len(self.betas)
        for _ in range(2):
            for i in range(best[1] if constrained else 0, nb):
                self._try(i, best[1], self.curves[best][1])
            best = self._argmax(constrained)
            for j in range(best[0] + 1 if constrained else nb):
                self._try(best[0], j, self.curves[best][1])
            best = self._argmax(constrained)
        return best

    def _argmax(self, constrained: bool) -> tuple[int, int]:
        keys = [k for k in self.curves if k[0] >= k[1]] if constrained else list(self.curves)
        return max(keys, key=lambda k: self.curves[k][0])

    def _cell_beta(self, i: int, j: int) -> np.ndarray:
        b = self.betas[i] + (self.betas[j] - self.betas[i]) * self._frac
        return np.abs(self.betas[None, :] - b[:, None]).argmin(1)

    def _try(self, i: int, j: int, start: np.ndarray | None) -> np.ndarray:
        if (i, j) in self.curves:
            return self.curves[(i, j)][1]
        idx = self._cell_beta(i, j)
        logl = self._assemble(idx)
        prior, ll = _em(logl, self.units.w, self._base, start)
        self.curves[(i, j)] = (ll, prior, idx)
        return prior

    def _assemble(self, idx: np.ndarray) -> np.ndarray:
        return self.tables[idx, :, np.arange(len(idx))].T

    @property
    def loglik(self) -> float:
        return self.curves[self.best][0]

    def beta_of(self, key: tuple[int, int] | None = None) -> tuple[float, float]:
        i, j = self.best if key is None else key
        return float(self.betas[i]), float(self.betas[j])

    def _log_likelihoods(self) -> np.ndarray:
        """(betas, N, cells) log-likelihood of each unit's memberships at each cell's rank, at every beta: the
        independent product (:meth:`_independent`), plus the count term where it is on (:meth:`_count_subs`, all
        betas together, in the single-rank cells). Written into one (betas, N, cells) array as each beta's product
        is formed, the count term added in place: peak memory one set of tables (plus the lambdas kept for
        :meth:`zone_cells` and the count term's (N, exact cells) parts)."""
        lams, vs = [], []
        tables: np.ndarray | None = None
        for b in range(len(self.betas)):
            lam, v, logl = self._independent(b)
            if tables is None:
                tables = np.empty((len(self.betas),) + logl.shape)
            tables[b] = logl
            lams.append(lam)
            vs.append(v)
        assert tables is not None  # at least one beta (the grid)
        if self.count_rank > 0 and self.units.distinct:
            exact, subs = self._count_subs(lams, vs, list(tables))
            rest = np.setdiff1d(np.arange(tables.shape[2]), exact)
            for table, sub in zip(tables, subs):  # logl + term, the term 0 outside the exact cells
                table[:, exact] += sub
                table[:, rest] += 0.0
        tables[:, ~self.allowed] = -np.inf
        return tables

    def _independent(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lambda (N, cells), tilted class weights v, the independent memberships' log-likelihood (N, cells)) at
        the b-th beta (lambda kept for :meth:`zone_cells`)."""
        u = self.units
        v = _tilted(u.log_v, float(self.betas[b]))
        k = np.clip(self.r_mid - 1.0, 0.0, None)
        lam = _solve_lambda(u.profile, v, k)  # (N, cells)
        self._lam[b] = lam
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            miss = -lam * (u.miss @ v)[:, None]  # sum over non-beating items of log (1 - pi_j) = -lambda v_j
            miss = np.where(np.isnan(miss), -np.inf, miss)  # lambda = inf with no miss: 0 * inf
            miss = np.where((u.miss @ v)[:, None] == 0, 0.0, miss)
            rows, cls = np.nonzero(u.beat > 0)  # row-major: rows sorted, so each unit's pairs are one run
            x = lam[rows, :] * v[cls][:, None]  # (pairs, cells)
            term = u.beat[rows, cls][:, None] * np.log(-np.expm1(-x))
            beat = np.zeros_like(lam)
            if len(rows):
                first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
                beat[rows[first]] = np.add.reduceat(term, first, axis=0)
        return lam, v, np.nan_to_num(beat + miss, nan=-np.inf)

    def _count_subs(self, lams: list[np.ndarray], vs: list[np.ndarray],
                    logls: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """The single-rank cells ``exact`` (R <= ``count_rank``; indices of cells) and, per beta (the lists' entries:
        lambda (N, cells), the tilted class weights v, the independent product (N, cells)), the (N, len(exact))
        log P(|A - D| = R - 1 - b) - log P(|A| = R - 1) under the independent
        memberships: the conditioning on |A| = R - 1 (conditional Poisson sampling) that the product over the drawn
        items D leaves out (b: the distinct beating draws). Without it a positive at R = 2 has A empty with
        probability about e^-1, so no beating draw is read as rank 2 or 3 about as readily as rank 1 (the top's mass
        spread too flat: NDCG low, HR nearly unbiased). Exact (Poisson-binomial over the classes, truncated
        polynomials) in the single-rank cells R <= ``count_rank``, nothing beyond (a local normal approximation
        there was tried: mixed results).
        Units whose exact cells lie :data:`_COUNT_SKIP` log-units below their best cell there (in the independent
        product) keep it unchanged (the term is at most a few log-units: their posterior mass there stays nil).
        The betas are evaluated together, as columns of one polynomial product per chunk of cells (fewer, larger
        array operations; :func:`_log_count_pmf` works element by element, so each unit's term at each beta is bit
        for bit the one it gets alone): in groups whose probabilities fit :data:`_COUNT_GROUP_BYTES`, each product
        of at most :data:`_COUNT_BATCH` coefficients."""
        u = self.units
        lo, hi = self.edges[:-1], self.edges[1:]
        b = np.round(u.beat.sum(1))
        drawn = u.beat + u.miss
        undrawn = np.maximum(u.profile - drawn, 0.0)
        exact = np.flatnonzero((hi - lo == 1) & (hi <= self.count_rank))
        if not len(exact):
            return exact, [np.zeros((len(b), 0)) for _ in lams]
        k = (hi[exact] - 1).astype(np.int64)  # R - 1 of each single-rank cell
        kmax = int(k.max())
        subs, near_rows = [], []
        for logl in logls:  # the betas
            with np.errstate(invalid="ignore"):
                near = np.where(self.allowed[:, exact], logl[:, exact], -np.inf).max(1) \
                    >= np.where(self.allowed, logl, -np.inf).max(1) - _COUNT_SKIP
            sub = np.zeros((len(b), len(exact)))
            sub[b > kmax] = -np.inf  # more beating draws than R - 1 in every such cell
            subs.append(sub)
            near_rows.append(np.flatnonzero((b <= kmax) & near))
        # the betas in groups whose probabilities (units x exact cells x classes per beta) fit _COUNT_GROUP_BYTES
        size = max(1, _COUNT_GROUP_BYTES // max(1, 8 * len(b) * len(exact) * u.profile.shape[1]))
        for g0 in range(0, len(lams), size):
            group = range(g0, min(len(lams), g0 + size))
            rows = np.unique(np.concatenate([near_rows[i] for i in group]))  # units taking the term at some beta
            if not len(rows):
                continue
            # the memberships' probabilities at each beta of the group: (rows, exact cells, betas, C)
            pes = np.empty((len(rows), len(exact), len(group), u.profile.shape[1]))
            for col, i in enumerate(group):
                with np.errstate(over="ignore", invalid="ignore"):
                    pe = -np.expm1(-lams[i][rows][:, exact, None] * vs[i][None, None, :])
                pes[:, :, col] = np.where(np.isnan(pe), 1.0, pe)
            prof, und = np.round(u.profile[rows]), np.round(undrawn[rows])
            first, inv = _distinct_rows(prof, pes)
            ids = inv
            need = k[None, :] - b[rows, None].astype(np.int64)
            tops = [np.empty(need.shape) for _ in group]
            bottoms = [np.empty(need.shape) for _ in group]
            # cells in chunks, each truncated at its own largest R - 1 (the coefficients below are the same):
            # the products cost (R - 1)^2, not kmax^2, per cell
            for c0 in range(0, len(exact), _COUNT_CHUNK):
                sl = slice(c0, c0 + _COUNT_CHUNK)
                width = len(exact[sl])
                kc = int(k[sl].max())
                # the numerator only of the units with a cell of the chunk that can hold their beating draws
                # (b <= R - 1; the others' is nil there), in one product with the denominators' distinct rows
                # (each row's coefficients are its own: the same bits as in products of their own)
                live = np.flatnonzero(b[rows] <= kc)
                both_rows = np.concatenate([first, live])
                counts = np.concatenate([prof[first], und[live]])
                ids_both = np.concatenate([ids[first], ids[live]])
                nd = need[live][:, sl]
                # the coefficient each row reads: t = R - 1 of the cell (denominators), R - 1 - b (numerators)
                at_cell = np.concatenate([np.broadcast_to(k[sl], (len(first), width)), np.clip(nd, 0, kc)])
                step = max(1, _COUNT_BATCH // max(1, len(both_rows) * width * (kc + 1)))
                for b0 in range(0, len(group), step):  # the group's betas, in batches of bounded size
                    batch = range(b0, min(len(group), b0 + step))
                    # columns (cell, beta) of the chunk's cells and the batch's betas
                    pb = pes[both_rows, sl, b0:b0 + len(batch)].reshape(len(both_rows), width * len(batch), -1)
                    both = _log_count_pmf(counts, pb, kc, groups=ids_both,
                                          at=np.repeat(at_cell, len(batch), axis=1))
                    both = both.reshape(len(both_rows), width, len(batch))
                    for col in batch:
                        part = both[:, :, col - b0]
                        tops[col][:, sl] = -np.inf
                        tops[col][live, sl] = np.where(nd >= 0, part[len(first):], -np.inf)
                        bottoms[col][:, sl] = part[:len(first)][inv]
            for col, i in enumerate(group):  # each beta's units near their best
                at = np.searchsorted(rows, near_rows[i])
                with np.errstate(invalid="ignore"):  # -inf - -inf where bottom is not finite: masked
                    subs[i][near_rows[i]] = np.where(np.isfinite(bottoms[col][at]),
                                                     tops[col][at] - bottoms[col][at], 0.0)
        return exact, subs

    def zone_cells(self, b: int) -> np.ndarray:
        """(N,) at the b-th beta, the number of leading cells of each unit where it expects at most one beating draw,
        m pi(R) <= 1 with pi = E q~(A) the expected mass above (a prefix: pi grows with R). Evaluated in blocks of
        cells until every unit has left its zone (the top zone is short; the deep cells are never needed); kept
        once computed."""
        if b in self._zone:
            return self._zone[b]
        u = self.units
        v = _tilted(u.log_v, float(self.betas[b]))
        lam = self._lam[b]
        assert lam is not None, "zone_cells after the likelihood at that beta"  # _independent(b) fills it
        mass_w = u.profile * u.mean_w
        total = np.maximum(mass_w.sum(1), 1e-300)
        n_units, n_cells = lam.shape
        length = np.zeros(n_units, dtype=np.int64)
        open_ = np.ones(n_units, dtype=bool)
        start = 0
        while start < n_cells and open_.any():  # blocks of cells, a handful at most
            stop = min(n_cells, start + 16)
            rows = np.flatnonzero(open_)
            with np.errstate(over="ignore", invalid="ignore"):
                mass = np.einsum("nc,nkc->nk", mass_w[rows], -np.expm1(-lam[rows, start:stop, None] * v))
            pi = np.clip(np.where(np.isfinite(mass), mass, total[rows, None]) / total[rows, None], 0.0, 1.0)
            inside = u.m[rows, None] * pi <= 1.0
            run = np.cumprod(inside, axis=1).sum(1)  # leading cells inside the zone in this block
            length[rows] += run
            open_[rows] = run == stop - start
            start = stop
        self._zone[b] = length
        return length

    # ------------------------------------------------------------------------------------------- the metric
    def cell_metric(self, spec: MetricSpec) -> np.ndarray:
        """(N, cells) the metric averaged over each cell's ranks, cut at the unit's n (0 where not allowed); kept
        per metric (read-only: every estimate and bound of the fit reads the same table)."""
        hit = self._cell_metric.get(spec)
        if hit is None:
            hit = self._cell_metric[spec] = self._cell_metric_table(spec)
        return hit

    def _cell_metric_table(self, spec: MetricSpec) -> np.ndarray:
        u = self.units
        lo = np.broadcast_to(self.edges[:-1][None, :].astype(np.float64), self.allowed.shape)
        hi = np.minimum(self.edges[1:][None, :], u.n[:, None]).astype(np.float64)
        out = np.zeros(self.allowed.shape)
        ok = self.allowed
        nn = np.broadcast_to(u.n[:, None].astype(np.float64), ok.shape)
        out[ok] = interval_mean_metric(spec, lo[ok], hi[ok], nn[ok])
        out.flags.writeable = False
        return out

    def spline_prior(self, key: tuple[int, int]) -> np.ndarray:
        """(cells,) the g-modelling prior at the pair ``key``: P(cell) proportional to width x exp(B alpha), B the
        cubic B-spline basis of ``gmod`` at each cell's log mean rank (``_gspline.g_basis``, ``G_DF``
        coefficients), alpha maximising the truncated log-likelihood sum_i w_i log(sum_c P_c L_ic / sum_{c allowed
        for i} P_c) - ``G_PENALTY`` |D2 alpha|^2 (each positive's prior conditioned on R <= its n, as ``gmod``'s
        likelihood; the objective divided by sum w, and L-BFGS-B's tolerances, as ``gmod``'s), from the best pair's
        alpha (or alpha = 0, uniform per rank). Cached per pair (with ``G_DF`` and ``G_PENALTY`` as they were at the
        first call); a fit that stops short of its tolerances is counted in :attr:`spline_unconverged`."""
        hit = self._spline.get(key)
        if hit is not None:
            return hit[0]
        start = None
        if key != self.best:  # neighbouring pairs' priors differ little: start from the best pair's
            self.spline_prior(self.best)
            start = self._spline[self.best][1]
        prior, alpha, ok = self._fit_spline(key, start)
        self._spline[key] = (prior, alpha)
        if not ok:
            self.spline_unconverged += 1
        return prior

    def _fit_spline(self, key: tuple[int, int], start: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, bool]:
        """(prior, alpha, converged) of :meth:`spline_prior` at ``key`` from ``start`` (None: alpha = 0)."""
        from scipy.optimize import minimize

        from ._gspline import G_DF, G_PENALTY, g_basis, spline_objective

        logl = self._assemble(self.curves[key][2])
        mx = logl.max(1, keepdims=True)
        ok = np.isfinite(mx[:, 0])
        lik = np.exp(logl[ok] - mx[ok])
        allowed = self.allowed[ok].astype(np.float64)
        wk = self.units.w[ok]

        def loglik(p: np.ndarray) -> tuple[float, np.ndarray]:
            mix = np.maximum(lik @ p, 1e-300)
            inside = np.maximum(allowed @ p, 1e-300)  # P(R <= n_i): the truncation of each positive's prior
            return (float(wk @ np.log(mix)) - float(wk @ np.log(inside)),
                    (wk / mix) @ lik - (wk / inside) @ allowed)

        objective, prior_of = spline_objective(np.log(np.diff(self.edges).astype(np.float64)),
                                                g_basis(self.edges, G_DF), G_PENALTY,
                                                max(float(wk.sum()), 1e-300), loglik)
        x0 = np.zeros(G_DF) if start is None else start
        res = minimize(objective, x0, jac=True, method="L-BFGS-B",
                       options={"maxiter": 5000, "ftol": 1e-10, "gtol": 1e-9})
        return prior_of(res.x), res.x, bool(res.success)

    def _posterior(self, key: tuple[int, int], prior: str = "em") -> np.ndarray:
        _, p, idx = self.curves[key]
        if prior == "spline":
            p = self.spline_prior(key)
        return _rows_posterior(self._assemble(idx), p[None, :])

    def estimate(self, spec: MetricSpec, b: tuple[int, int] | None = None, hedge: bool = True,
                 prior: str = "spline") -> tuple[float, float, np.ndarray]:
        """(value, standard error, per-unit posterior means) at beta index ``b``, under ``prior`` (one of
        :data:`PRIORS`); by default the constrained fit's (``best``), but with ``hedge`` (the default) where the
        niche test rejects the constraint the hedge of the two branches: the harmonic mean 2 a b / (a + b) of the constrained
        (a) and free (b) values, which minimises the worst relative error over the two (standard error: the larger;
        per-unit means: the matching mixture). The standard error is the model's spread of the metric over units,
        sqrt(sum w (var_i + (mean_i - value)^2)) / sum w (its total variance: covers the units' exact mean and the
        population's)."""
        if prior not in PRIORS:
            raise ValueError(f"prior: one of {PRIORS}, not {prior!r}")
        if b is None and hedge and self.niche:
            va, sa, ma = self.estimate(spec, self.best_constrained, prior=prior)
            vb, sb, mb = self.estimate(spec, self.best_free, prior=prior)
            value = 2.0 * va * vb / (va + vb) if va + vb > 0 else 0.0
            t = (vb - value) / (vb - va) if vb != va else 1.0
            return value, max(sa, sb), t * ma + (1.0 - t) * mb
        b = self.best if b is None else b
        hit = self._estimates.get((spec, b, prior))
        if hit is not None:
            return hit[0], hit[1], hit[2].copy()
        post = self._posterior(b, prior)
        cm = self.cell_metric(spec)
        mean = (post * cm).sum(1)
        var = np.maximum((post * cm * cm).sum(1) - mean ** 2, 0.0)
        w = self.units.w
        tot = float(w.sum())
        value = float(w @ mean) / tot
        se = math.sqrt(float(w @ (var + (mean - value) ** 2))) / tot
        self._estimates[(spec, b, prior)] = (value, se, mean.copy())
        return value, se, mean

    def top_zone(self, key: tuple[int, int]) -> np.ndarray:
        """(N, cells) bool: the cells of each unit where it expects at most one beating draw (m pi(R) <= 1)."""
        idx = self.curves[key][2]
        lengths = np.zeros((len(self.betas), len(self.units.w)), dtype=np.int64)
        for b in np.unique(idx):  # the few betas of the key's cells
            lengths[b] = self.zone_cells(int(b))
        return (np.arange(len(idx))[None, :] < lengths[idx].T) & self.allowed

    def bounds(self, spec: MetricSpec, keys: list[tuple[int, int]] | None = None,
               prior: str = "spline") -> tuple[float, float, dict]:
        """The hull, over ``keys`` (default :attr:`curve_set`: the 95% likelihood set of (beta_top, beta_deep) of the
        branch the niche test picks, or of both), of the estimates with P inside each unit's top zone replaced by the
        flattest (uniform per rank) and the steepest (1/r) shape allowed (around the EM prior), and the fitted ones:
        under the EM prior and, with ``prior="spline"``, under the spline prior too (the value lies in the hull)."""
        if prior not in PRIORS:
            raise ValueError(f"prior: one of {PRIORS}, not {prior!r}")
        fitted = ("em", "spline") if prior == "spline" else ("em",)
        w = self.units.w
        tot = float(w.sum())
        cm = self.cell_metric(spec)
        lo_e, hi_e = self.edges[:-1], self.edges[1:]
        width = (hi_e - lo_e).astype(np.float64)
        harmonic = np.log((hi_e + 0.5) / (lo_e + 0.5))  # ~ sum of 1/r over the cell's ranks
        lo, hi = math.inf, -math.inf
        zone_end = []
        keys = self.curve_set if keys is None else keys
        for key in keys:
            _, em_prior, idx = self.curves[key]
            logl = self._assemble(idx)
            zone = self.top_zone(key)
            zone_end.append(float(w @ np.where(zone, hi_e[None, :], 0).max(1)) / tot)
            mass = (zone * em_prior[None, :]).sum(1, keepdims=True)
            for shape in (width, harmonic):
                sh = zone * shape[None, :]
                alt = np.where(zone, mass * sh / np.maximum(sh.sum(1, keepdims=True), 1e-300), em_prior[None, :])
                post = _rows_posterior(logl, alt)
                v = float(w @ (post * cm).sum(1)) / tot
                lo, hi = min(lo, v), max(hi, v)
            for p in fitted:
                v = self.estimate(spec, key, prior=p)[0]
                lo, hi = min(lo, v), max(hi, v)
        details = {"beta_set": [self.beta_of(k) for k in keys], "mean_top_zone_end": max(zone_end)}
        return lo, hi, details


def _distinct_rows(prof: np.ndarray, pes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows whose count term's denominator is computed, ``first`` (indices into the rows), and the one each row
    reads, ``inv`` (indices into ``first``). The denominator is a function of a unit's profile and probabilities alone:
    computed once per distinct row (the same bytes, the same bits) and shared by the units that hold it (without
    exclusions nearly every unit: the catalogue's profile but the positive's class); those rows share each class's
    polynomial in the numerators' products too. Found by the profile ``prof`` (rows, C) (one profile, one lambda row),
    each row's probabilities ``pes`` (rows, ...) at every beta checked to be its profile's first's bytes (a row that
    is not: a group of its own)."""
    pk = np.ascontiguousarray(prof)
    _, first, inv = np.unique(pk.view(np.dtype((np.void, pk.itemsize * pk.shape[1]))).ravel(),
                              return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    bits = pes.reshape(len(prof), -1).view(np.uint64)
    odd = np.flatnonzero((bits != bits[first][inv]).any(1))
    if len(odd):
        inv = inv.copy()
        inv[odd] = len(first) + np.arange(len(odd))
        first = np.concatenate([first, odd])
    return first, inv


def _log_count_pmf(counts: np.ndarray, p: np.ndarray, kmax: int, groups: np.ndarray | None = None,
                   at: np.ndarray | None = None) -> np.ndarray:
    """(N, X, kmax + 1) log P(S = t), t = 0..kmax, S the sum over classes c of Binomial(counts_c, p_c): counts (N, C)
    integers, p (N, X, C). The classes' truncated pmfs multiplied as polynomials, each step rescaled by its largest
    coefficient (the scale kept in logs). A class's pmf up to its factor (1 - p)^n is C(n, t) o^t, o = p / (1 - p):
    log C(n, t) + t log o (p = 0: o^t is 1 at t = 0 only; p = 1: all of the class's items count, so only t = n is
    possible). Worked with t as the leading axis, so that each step of the product, new[t] += acc[s] poly[t - s]
    for s = 0..kmax in turn, is one contiguous multiply-add over (N, X) (the coefficients summed in increasing s,
    each product rounded before its sum). ``groups``: optional ids of the rows of ``p`` (equal ids: the same bytes),
    spares finding them (the result is the same either way: each unit's coefficients are its own). ``at``: optional
    (N, X) integers in 0..kmax; then only log P(S = at) is returned, (N, X) (the same values: the log taken of the
    coefficients asked for alone)."""
    from scipy.special import gammaln

    n_units, n_x, n_cls = p.shape
    t = np.arange(kmax + 1, dtype=np.float64)[:, None, None]  # (kmax + 1, 1, 1)
    ti = np.arange(kmax + 1, dtype=np.int64)[:, None, None]
    # log j! for j = 0..max count (the counts are whole numbers): the same gammaln values, evaluated once
    log_fact = gammaln(np.arange(int(counts.max(initial=0.0)) + 1, dtype=np.float64) + 1.0)
    log_fact_t = log_fact[:kmax + 1] if kmax < len(log_fact) else gammaln(t[:, 0, 0] + 1.0)
    log_fact_t = log_fact_t[:, None, None]
    acc = np.zeros((kmax + 1, n_units, n_x))
    acc[0] = 1.0
    new = np.empty_like(acc)
    prod = np.empty_like(acc)
    scale = np.zeros((n_units, n_x))
    degree = 0  # acc[t] = 0 for t > degree
    # a class's polynomial is a function of the unit's count and probabilities alone (element by element): formed
    # once per distinct (probability row, count), and gathered for the units that hold it (rows of p repeat: the
    # units of one catalogue profile share their lambdas). ``groups``: ids of rows known to be the same bytes (else
    # found here)
    pu, pairs = p, None
    if n_units > 1 and p.size:
        if groups is None:
            pk = np.ascontiguousarray(p.reshape(n_units, -1))
            _, p_first, p_inv = np.unique(pk.view(np.dtype((np.void, pk.itemsize * pk.shape[1]))).ravel(),
                                          return_index=True, return_inverse=True)
        else:
            _, p_first, p_inv = np.unique(groups, return_index=True, return_inverse=True)
        if len(p_first) < n_units:  # else every row distinct: so is every (row, count) pair, nothing to share
            p_inv = p_inv.reshape(-1)
            pu, pairs = p[p_first], _distinct_pairs(p_inv, len(p_first), counts)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lp, l1p = np.log(pu), np.log1p(-pu)
        logo = np.clip(lp - l1p, -1e300, 1e300)  # p = 0 / 1: -inf / +inf kept finite (t log o stays defined)
        for c in range(n_cls):  # the popularity classes (16)
            nc = np.ascontiguousarray(counts[:, c], dtype=np.float64)
            if not np.any(nc > 0):
                continue
            inv = None
            n, pr = nc[None, :, None], slice(None)  # (1, U, 1): the distinct pairs' counts; their rows of pu
            if pairs is not None:
                first, inv = pairs[c]
                n, pr = nc[first][None, :, None], p_inv[first]
            n_max = int(nc.max())
            h = min(kmax, n_max) + 1  # rows t > n_max are nil for every unit (log C(n, t) = -inf): never formed
            rest = n - t[:h]
            ni = n.astype(np.int64)
            logc = np.where(rest >= 0, log_fact[ni] - log_fact_t[:h] - log_fact[np.clip(ni - ti[:h], 0, None)],
                            -np.inf)  # (h, U, 1): log C(n, t), -inf beyond n
            pc = pu[pr, :, c]  # (U, X)
            lpmf = t[:h] * logo[pr, :, c][None]
            lpmf += logc  # (h, U, X): log C(n, t) + t log o, in place (the same sums)
            mx = lpmf.max(0)
            lpmf -= mx
            poly = np.exp(lpmf, out=lpmf)
            certain = (pc >= 1.0) & (n[0] > kmax)
            if certain.any():  # certain items beyond the truncation: no t <= kmax is possible
                poly[:, certain] = 0.0
            if inv is not None:
                poly = np.take(poly, inv, axis=1)  # (h, N, X)
            # log of the largest coefficient of the true pmf: the factor (1 - p)^n back (p = 1: the point mass at n)
            mx = np.where(pc >= 1.0, 0.0, mx + n[0] * l1p[pr, :, c])
            if inv is not None:
                mx = mx[inv]
            _times_truncated(acc, poly, degree, new, prod)
            degree = min(kmax, degree + n_max)
            top = new.max(0)
            top = np.where(top > 0, top, 1.0)
            np.divide(new, top, out=acc)
            scale = scale + np.where(np.isfinite(mx), mx, 0.0) + np.log(top)
        if at is not None:
            return np.log(acc[at, np.arange(n_units)[:, None], np.arange(n_x)[None, :]]) + scale
        return np.moveaxis(np.log(acc) + scale, 0, -1)


def _times_truncated(acc: np.ndarray, poly: np.ndarray, degree: int, new: np.ndarray, prod: np.ndarray) -> None:
    """One step of :func:`_log_count_pmf`'s polynomial product truncated at kmax (``acc``, ``new``, ``prod``: (kmax +
    1, N, X); ``poly``: (h, N, X), its coefficients beyond the class's largest count left out; ``acc`` zero beyond
    ``degree``): new[t] = sum_{s <= t} acc[s] poly[t - s], s increasing; the terms known to be zero left out. One
    multiply-add per s, or per d = t - s in decreasing d (the same terms of each t in the same order), whichever
    takes fewer steps. The first step's products are written into ``new`` as they are (each is the first term of its
    coefficient, and 0 + x is x: the products are never -0), the rest of ``new`` set to 0, in place of zeroing all
    of it and adding."""
    kmax, h = acc.shape[0] - 1, poly.shape[0]
    if degree < h:
        np.multiply(acc[0], poly[:h], out=new[:h])  # s = 0: width min(kmax + 1, h) = h
        new[h:] = 0.0
        for s in range(1, degree + 1):  # the coefficients (at most COUNT_EXACT_RANK), not data
            width = min(kmax + 1 - s, h)
            np.multiply(acc[s], poly[:width], out=prod[:width])
            np.add(new[s:s + width], prod[:width], out=new[s:s + width])
    else:
        length = min(degree + 1, kmax + 2 - h)  # d = h - 1
        np.multiply(acc[:length], poly[h - 1], out=new[h - 1:h - 1 + length])
        new[:h - 1] = 0.0
        new[h - 1 + length:] = 0.0
        for d in range(h - 2, -1, -1):
            length = min(degree + 1, kmax + 1 - d)
            np.multiply(acc[:length], poly[d], out=prod[:length])
            np.add(new[d:d + length], prod[:length], out=new[d:d + length])


def _distinct_pairs(rows: np.ndarray, n_rows: int, counts: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per class c (columns of ``counts``, (N, C) floats), (first, inverse) of the distinct pairs (rows[i],
    counts[i, c]), in increasing (row, count): ``rows`` integer ids in [0, n_rows); ``first`` one index of each
    distinct pair, ``inverse`` each unit's pair among them. Whole counts (those of the fit: rounded class counts)
    are paired by value, any other counts by their bit patterns; one sort of N keys per class (no table over the
    grid of rows and counts, whose size grows with both)."""
    n_units, n_cls = counts.shape
    whole = counts.astype(np.int64)
    by_value = whole.min(initial=0) >= 0 and np.array_equal(whole, counts)
    out = []
    for c in range(n_cls):  # the popularity classes (16), not data
        if by_value:
            bits, top = whole[:, c], int(whole[:, c].max(initial=0))
        if not by_value or (top + 1) * max(n_rows, 1) >= 1 << 62:  # the key rows * (top + 1) + bits within int64
            _, bits = np.unique(np.ascontiguousarray(counts[:, c], dtype=np.float64).view(np.int64)
                                if not by_value else bits, return_inverse=True)
            bits = bits.reshape(-1)
            top = int(bits.max(initial=0))
        _, first, inv = np.unique(rows * (top + 1) + bits, return_index=True, return_inverse=True)
        out.append((first, inv.reshape(-1)))
    return out


def _rows_posterior(logl: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Posterior per unit with a per-unit prior (N, cells)."""
    with np.errstate(divide="ignore"):
        lp = logl + np.log(np.maximum(prior, 0.0))
    # the same values as the out-of-place steps (non-finite to -inf, less the row's finite maximum, exp, over the
    # row's sum), each written over ``lp``: no further (N, cells) array per call
    np.copyto(lp, -np.inf, where=~np.isfinite(lp))
    mx = lp.max(1, keepdims=True)
    np.subtract(lp, np.where(np.isfinite(mx), mx, 0.0), out=lp)
    e = np.exp(lp, out=lp)
    return np.divide(e, np.maximum(e.sum(1, keepdims=True), 1e-300), out=e)


def _em(logl: np.ndarray, w: np.ndarray, base: np.ndarray, start: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """The prior over cells by penalised EM (``_EM_ITER`` steps at most, from ``start`` or the base measure): the
    MAP estimate under a Dirichlet prior of :data:`PSEUDO_COUNT` pseudo-positives spread as ``base`` (log-uniform in
    the rank), the smoothing ``mes`` gets from its entropy weight 10 / #positives; and its log-likelihood
    sum_i w_i log sum_c P_c L_ic."""
    mx = logl.max(1, keepdims=True)
    ok = np.isfinite(mx[:, 0])
    lik = np.exp(logl[ok] - mx[ok])
    wk = w[ok]
    p = base.copy() if start is None else 0.9 * start + 0.1 * base
    tot = float(wk.sum())
    prev = -math.inf
    smooth, norm = PSEUDO_COUNT * base, tot + PSEUDO_COUNT  # the same values each step: formed once
    # each step's unit-length vectors written into two buffers (the same operations, none allocated per step)
    mix, tmp = np.empty(len(wk)), np.empty(len(wk))
    for _ in range(_EM_ITER):  # iterations of the fit, not a loop over data
        np.matmul(lik, p, out=mix)
        np.maximum(mix, 1e-300, out=mix)
        ll = float(wk @ np.log(mix, out=tmp))
        step = np.divide(wk, mix, out=tmp) @ lik
        np.multiply(p, step, out=step)  # p * ((wk / mix) @ lik) + smooth, over norm
        step += smooth
        step /= norm
        p = step
        if ll - prev < _EM_TOL * tot:
            break
        prev = ll
    mix = lik @ p
    with np.errstate(over="ignore"):  # units beyond float64 (weights spanning e^300): the fit's ll is -inf
        ll = float(wk @ np.log(np.maximum(mix, 1e-300))) + float(wk @ mx[ok, 0]) - (math.inf if not ok.all() else 0.0)
    return p, ll


def strata(units: Units, how: str = "positive") -> list[np.ndarray] | None:
    """The rows of each stratum, or None (one fit of all): ``how="positive"`` splits the units at the weighted
    median of :attr:`Units.covariate` (the log popularity of each unit's positive; tied values kept together, on
    the side that balances the halves better). None with ``how="none"``, without a covariate, under uniform weights
    (beta has no effect), or where a half would weigh less than :data:`STRATUM_MIN` positives."""
    if how not in STRATA:
        raise ValueError(f"strata: one of {STRATA}, not {how!r}")
    x = units.covariate
    if how == "none" or x is None or units.uniform:
        return None
    w = units.w
    tot = float(w.sum())
    if tot < 2.0 * STRATUM_MIN:
        return None
    order = np.argsort(x, kind="stable")
    at = min(int(np.searchsorted(np.cumsum(w[order]), 0.5 * tot)), len(x) - 1)
    cut = x[order][at]
    low = min((x < cut, x <= cut), key=lambda b: abs(float(w[b].sum()) - 0.5 * tot))
    if min(float(w[low].sum()), float(w[~low].sum())) < STRATUM_MIN:
        return None
    return [np.flatnonzero(low), np.flatnonzero(~low)]


class StratifiedFit:
    """``pl_fit`` on strata of the positives (:func:`strata`): one :class:`PopularityFit` per stratum (``fits``, on
    the rows ``groups``, of weight share ``shares``), each with its own tilt curve, niche test and rank prior. Why
    (docs/research-notes.md, "Strata by the positive's popularity"): users differ in the popularity of the items above
    their positives, and a niche positive's neighbours are niche too; one curve for all misplaces each user's own
    composition, and a latent per-positive tilt is confounded with the rank, while the positive's own popularity is
    known before the draw. Values, bounds and the standard error combine over the strata by their shares."""

    def __init__(self, units: Units, groups: list[np.ndarray], edges: np.ndarray,
                 count_rank: int = COUNT_EXACT_RANK) -> None:
        self.units, self.groups, self.edges = units, groups, edges
        self.fits = [PopularityFit(units.select(g), edges, count_rank) for g in groups]
        tot = float(units.w.sum())
        self.shares = np.array([float(units.w[g].sum()) / tot for g in groups])

    @property
    def niche(self) -> bool:
        """Whether any stratum's niche test rejected beta_top >= beta_deep."""
        return any(f.niche for f in self.fits)

    @property
    def spline_unconverged(self) -> int:
        return sum(f.spline_unconverged for f in self.fits)

    @property
    def loglik(self) -> float:
        return sum(f.loglik for f in self.fits)

    def estimate(self, spec: MetricSpec, hedge: bool = True, prior: str = "spline") -> tuple[float, float, np.ndarray]:
        """(value, standard error, per-unit posterior means): the strata's :meth:`PopularityFit.estimate` combined
        by their shares; the standard error is the pooled fit's total-variance form (within the strata, and the
        strata's values around the whole's)."""
        parts = [f.estimate(spec, hedge=hedge, prior=prior) for f in self.fits]
        v = np.array([p[0] for p in parts])
        value = float(self.shares @ v)
        var = float(sum((sh * p[1]) ** 2 for sh, p in zip(self.shares, parts)))
        var += float(self.shares @ (v - value) ** 2) / float(self.units.w.sum())
        means = np.empty(len(self.units.w))
        for g, p in zip(self.groups, parts):
            means[g] = p[2]
        return value, math.sqrt(var), means

    def bounds(self, spec: MetricSpec, prior: str = "spline") -> tuple[float, float, dict]:
        """Each stratum's hull (:meth:`PopularityFit.bounds`) combined by the shares: every stratum may sit at
        either end of its own."""
        parts = [f.bounds(spec, prior=prior) for f in self.fits]
        lo = float(self.shares @ np.array([p[0] for p in parts]))
        hi = float(self.shares @ np.array([p[1] for p in parts]))
        return lo, hi, {"beta_set": [p[2]["beta_set"] for p in parts],
                        "mean_top_zone_end": max(p[2]["mean_top_zone_end"] for p in parts)}


def fit(units: Units, how: str = "positive", count_term: str = "on") -> PopularityFit | StratifiedFit:
    """Fit the model of the module docstring to ``units``, on the strata of ``how`` (:func:`strata`; one
    :class:`PopularityFit` where they are None), with the count term ``count_term`` (one of :data:`COUNT_TERMS`).
    The fit is kept on ``units`` (``Units._derived``, by ``how``, the count term and :data:`STRATUM_MIN`; at most 2
    per units): the metrics estimated from one draw, whose units ``popularity.popularity_draws`` returns again for
    equal statistics, fit once. The fit holds a shallow copy of ``units`` (the same read-only arrays, nothing kept),
    not ``units`` itself, so the two make no reference cycle: the fit is freed with the units that keep it."""
    if count_term not in COUNT_TERMS:
        raise ValueError(f"count_term: one of {COUNT_TERMS}, not {count_term!r}")
    count_rank = COUNT_EXACT_RANK if count_term == "on" else 0
    return units._derived(("fit", how, count_rank, STRATUM_MIN), lambda: _fit(copy.copy(units), how, count_rank))


def _fit(units: Units, how: str, count_rank: int) -> PopularityFit | StratifiedFit:
    edges = rank_edges(int(units.n.max()))
    groups = strata(units, how)
    return PopularityFit(units, edges, count_rank) if groups is None \
        else StratifiedFit(units, groups, edges, count_rank)


def z_value(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2.0)
