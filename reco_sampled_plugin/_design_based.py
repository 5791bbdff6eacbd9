"""Design-based estimates: a keyed random share of the positives ranked exactly, and the difference estimator.

Every model-based estimator rests on a model of the rank distribution; where the sampled data cannot resolve the
top, the model's bias is the error, and no interval built from the sampled ranks alone can promise to cover it.
A small random share of exact ranks can (survey sampling's difference, or regression, estimator; Sarndal,
Swensson & Wretman, *Model Assisted Survey Sampling*, 1992, ch. 6; restated for model predictions as
prediction-powered inference, Angelopoulos et al., Science 2023, and PPI++, Angelopoulos, Duchi & Zrnic, 2023).

Notation: N positives i (frequency weights w_i, W = sum_i w_i), y_i = M(R_i) the metric at the exact rank, f_i a
prediction of y_i from positive i's own sampled data and the fit (below), S the exact share: positive i is in S with
probability pi_i > 0, independently of the others and of everything sampled (Poisson sampling: a keyed uniform
u_i < pi_i, ``design.ExactShare``). The estimate of the users' metric theta = sum_i w_i y_i / W is::

    theta^ = ( lambda sum_i w_i f_i + sum_{i in S} w_i (y_i - lambda f_i) / pi_i ) / W                    (1)

the model's mean plus the Horvitz-Thompson (1952) mean of the residuals y - lambda f over the share. Given the
sampled data, f and pi are fixed and only S is random, so E[theta^ | sampled data] = theta for every fixed lambda
and *whatever the model*: the model only sets the variance. Under Poisson sampling that variance is
sum_i (1 - pi_i) (w_i e_i)^2 / pi_i / W^2 with e_i = y_i - lambda f_i, and its unbiased estimator (the
Horvitz-Thompson variance estimator specialised to Poisson sampling, Sarndal et al. 1992, ch. 3; exact for this
design, no with-replacement or Hajek approximation) is::

    V^ = sum_{i in S} (1 - pi_i) (w_i e_i / pi_i)^2 / W^2                                                   (2)

The 95% interval is theta^ +- 1.96 sqrt(V^), clipped to the metric's range. lambda: ``coef="one"`` (default,
:data:`COEF`) lambda = 1, exactly unbiased; or ``coef="tuned"``, PPI++'s choice that minimises that variance, its
sums estimated on the share (Horvitz-Thompson) and clipped to [0, 1]::

    lambda^ = sum_{i in S} a_i y_i f_i / sum_{i in S} a_i f_i^2,   a_i = (1 - pi_i) w_i^2 / pi_i^2          (3)

Tuning on the same share adds a bias of order 1/|S| (as in PPI++) and a spread (2) does not see; it pays where the
share holds many exact positives of both outcomes and the model is poor (lambda^ well below 1). On a share's 2-4
hits it under-covered (HR@10, 61 exact positives of a 4% hit rate: bias -0.0025 +- 0.0005, coverage 0.907 +- 0.010;
lambda = 1: +0.0001 +- 0.0004, 0.976) and on the goal grid it was never more than 0.02 (of ``gmod``'s width)
narrower than lambda = 1 (BENCHMARKS.md, "Design-based estimates"): hence the default.

V^ is unbiased, but on a small share of a rare hit it is correlated with theta^ (a share that drew few hits has both
a low estimate and a low V^: the Wald interval under-covers, as for a binomial proportion). The standard error is
therefore sqrt(max(V^, V~)), with V~ the model's forecast of (2) at the same positives, which reads their
predictions but not their y::

    V~ = sum_{i in S} a_i (E^[M(R)^2 | data_i] - (2 lambda - lambda^2) f_i^2) / W^2                         (4)

(E^[M^2] from the fit's cells, exact for cut-off metrics; the Bhatia-Davis bound f (hi) under popularity designs).
Both terms are unbiased for their targets; the larger is never smaller than the design-based V^, so the interval
keeps its validity whatever the model; on shares of 60-100 exact positives it covered 0.92-1.00 where (2) alone
covered 0.80-0.95 (BENCHMARKS.md, "Design-based estimates").

The prediction f_i = E^[M(R) | r~_i, n_i, m_i] is the posterior mean under the fit ``auto`` would use (``gmod``
where the design resolves the top, ``mes`` elsewhere; ``pl_fit``'s per-positive posterior under popularity
designs), fitted on *all* positives' sampled ranks. It depends on positive i's sampled data and on the fit only, never
on which positives the share chose (the choice is an independent keyed draw), so (1) stays unbiased; the fit may
even be poor (a popularity tilt it cannot see, a top it cannot resolve): the interval still holds, only wider.

Paired differences (:func:`paired_difference_by_design`): two recommenders evaluated with the same share key on
the same positives share S and pi (a uniform share: always), so (1)-(3) apply to d_i = y_i^A - y_i^B with
f_i = f_i^A - f_i^B.

Active share (``ExactShare(choice="active")``; Zrnic & Candes, "Active statistical inference", ICML 2024):
pi_i = min(1, max(floor, c s_i)) with s_i = sqrt((f_i - lo)(hi - f_i)), the Bhatia-Davis bound on the posterior
standard deviation of M(R) in [lo, hi] given the positive's sampled data (equal to it for hit rates; positives
resolved deep in the ranking get the floor, those in the first bin the most), c set so the mean of pi is the share.

Layers: the share's data and its keyed choice given pi are ``_share.py`` (below the draws and the fits); this module
holds the fit's side (the predictions, pi of an active share: :class:`ShareTable`, :func:`share_inclusion`,
:class:`KeyedInclusion`, the estimator), above the fits and below the draws, which call :func:`draw_share` once
phase 1 is drawn.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import torch

from . import registry
from ._share import _host, carries_share, check_inclusion, choose_share, share_weights

if TYPE_CHECKING:
    from ._estimate import Estimate
    from .design import ExactShare
    from .metric_names import MetricSpec
    from ._sampled import SampledRanks
    from ._types import TensorLike

__all__ = ["difference_estimate", "inclusion_probabilities", "predictions", "share_inclusion", "ShareTable",
           "KeyedInclusion", "draw_share", "estimate_design_based", "paired_difference_by_design",
           "estimate_by_design", "COEFS", "COEF", "FEW_EXACT"]

#: The choices of lambda in (1) (1, or the PPI++ variance-optimal value (3) clipped to [0, 1]) and the default: the
#: ``coef`` option of ``diff`` in the registry's table (``registry.DIFF_COEFS`` / ``DIFF_COEF``, the one place they are set).
COEFS, COEF = registry.DIFF_COEFS, registry.DIFF_COEF

#: ``details["variance"]``: the larger of the Poisson-sampling Horvitz-Thompson estimator (2) and the model's forecast (4)
VARIANCE = "max(poisson_ht, model)"

#: Fewer exact positives than this: the normal interval of (2) is rough (flag ``few_exact``).
FEW_EXACT = 30


# ---------------------------------------------------------------------------------------------- the estimator
def difference_estimate(y: np.ndarray, f: np.ndarray, pi: np.ndarray, chosen: np.ndarray, w: np.ndarray | None = None,
                        coef: str = COEF, f2: np.ndarray | None = None) -> tuple[float, float, float]:
    """(theta^, standard error, lambda) of eq. (1)-(4) (module docstring) for N positives: ``y`` (N,) metric values
    (read where ``chosen`` only), ``f`` (N,) predictions, ``pi`` (N,) inclusion probabilities in (0, 1], ``chosen``
    (N,) bool, ``w`` (N,) frequency weights (None: 1), ``f2`` (N,) the model's E[M(R)^2 | data] (None: the standard
    error is sqrt(V^) of eq. 2 alone): :func:`share_estimate` of their sums."""
    w = np.ones(len(f)) if w is None else np.asarray(w, dtype=np.float64)
    return share_estimate(float(w @ f), float(w.sum()), y[chosen], f[chosen], pi[chosen], w[chosen], coef,
                          census=not bool((pi < 1.0).any()), f2=None if f2 is None else f2[chosen])


def share_estimate(model_sum: float, total: float, y: np.ndarray, f: np.ndarray, pi: np.ndarray, w: np.ndarray,
                   coef: str = COEF, census: bool = False, f2: np.ndarray | None = None) -> tuple[float, float, float]:
    """(theta^, standard error, lambda) of eq. (1)-(4) from ``model_sum`` = sum_i w_i f_i over all positives,
    ``total`` = W and the chosen positives' ``y``, ``f``, ``pi``, ``w`` (and ``f2``, their model's E[M^2 | data]:
    the standard error is then sqrt(max(V^, V~)), eq. 4). Standard error inf with fewer than two chosen positives of
    probability below 1 (no spread to measure) unless ``census`` (every positive chosen with probability 1: 0)."""
    a = (1.0 - pi) * (w / pi) ** 2
    lam = 1.0
    den = float((a * f * f).sum())
    if coef == "tuned" and den > 0:
        lam = min(max(float((a * y * f).sum()) / den, 0.0), 1.0)
    e = w * (y - lam * f) / pi
    value = (lam * model_sum + float(e.sum())) / total
    if int(np.count_nonzero(pi < 1.0)) < 2 and not census:
        return value, math.inf, lam
    var = float(((1.0 - pi) * e * e).sum())
    if f2 is not None:  # eq. (4): the model's forecast of (2), read at the same positives but not at their y
        var = max(var, float((a * np.maximum(f2 - (2.0 * lam - lam * lam) * f * f, 0.0)).sum()))
    return value, math.sqrt(var) / total, lam


def inclusion_probabilities(share: ExactShare, f: np.ndarray, bounds: tuple[float, float],
                            counts: np.ndarray | None = None) -> np.ndarray:
    """pi per positive (module docstring): ``share.share`` each for a uniform share; for an active one
    min(1, max(floor, c s)) with s the Bhatia-Davis spread of ``f`` within ``bounds`` and c found by bisection so the
    mean is the share (a uniform share where every spread is 0). The means read the distinct spreads and how many
    positives have each, so pi is a function of the multiset of spreads: the same bits in any order of the positives,
    or from a table of them (``counts``: ``f`` holds cells, each standing for that many positives;
    :class:`ShareTable`)."""
    n = len(f)
    if share.choice == "uniform" or n == 0:
        return np.full(n, share.share)
    lo, hi = bounds
    s, at = np.unique(np.sqrt(np.maximum((f - lo) * (hi - f), 0.0)), return_inverse=True)
    if not float(s.max(initial=0.0)) > 0:
        return np.full(n, share.share)
    c_w = np.bincount(at.reshape(-1), None if counts is None else np.asarray(counts, dtype=np.float64),
                      len(s)).astype(np.float64)  # positives per distinct spread: whole numbers, summed exactly
    total = float(c_w.sum())
    floor = float(share.floor)  # type: ignore[arg-type]  # filled in by ExactShare
    spread = s > 0
    if share.share >= float((c_w * np.where(spread, 1.0, floor)).sum()) / total:  # c s >= 1 for all: raise the rest
        rest = (share.share * total - float(c_w[spread].sum())) / max(float(c_w[~spread].sum()), 1.0)
        return np.where(spread, 1.0, min(max(rest, floor), 1.0))[at]
    scale = 1.0 / float(s.max())
    lo_c, hi_c = math.log(floor), math.log(float(s.max()) / float(s[spread].min()))  # mean <= share <= mean
    for _ in range(100):  # bisection on log c: the mean of pi is non-decreasing in c
        mid = 0.5 * (lo_c + hi_c)
        if float((c_w * np.clip(math.exp(mid) * scale * s, floor, 1.0)).sum()) / total < share.share:
            lo_c = mid
        else:
            hi_c = mid
    return np.clip(math.exp(hi_c) * scale * s, floor, 1.0)[at]


# ---------------------------------------------------------------------------------------------- predictions
#: what :func:`model_fit` and :func:`_posterior_means` computed inside this thread's :func:`reusing_fits` block,
#: by the content of their inputs, least recently used first (None outside one)
_REUSED: contextvars.ContextVar[OrderedDict | None] = contextvars.ContextVar("design_based_reused", default=None)

#: entries a :func:`reusing_fits` block keeps (a replicate's fit and predictions, the few dense likelihoods its
#: groups share with the next replicates'): the least recently used beyond it are dropped
REUSED_MAX = 16


@contextlib.contextmanager
def reusing_fits() -> Iterator[None]:
    """Inside this block (this thread), :func:`model_fit` returns the fit it made before of equal counts (groups,
    counts, exactness, design, options, metric), and :func:`_posterior_means` its results and each group's dense
    likelihood for equal inputs: an active share's pi (:func:`share_inclusion`) and then the estimate of the same
    draw with its share fit and predict once, and draws on the same (n, m) groups and grid share the likelihoods.
    The same bits as without (deterministic functions of those inputs); at most :data:`REUSED_MAX` entries, all
    dropped on exit (the planner holds one block per share design)."""
    token = _REUSED.set(OrderedDict())
    try:
        yield
    finally:
        _REUSED.reset(token)


def _reused(key: tuple, make: Callable[[], Any]) -> Any:
    """``make()``, or inside :func:`reusing_fits` what it returned before under ``key``."""
    kept = _REUSED.get()
    if kept is None:
        return make()
    if key in kept:
        kept.move_to_end(key)
        return kept[key]
    value = kept[key] = make()
    while len(kept) > REUSED_MAX:
        kept.popitem(last=False)
    return value


def _counts_key(hist: Any) -> tuple:
    """The content of a histogram's counts (what a fit reads; not its share rows), as a hashable key."""
    return (hist.n_items.astype(np.int64).tobytes(), hist.n_samples.astype(np.int64).tobytes(),
            np.asarray(hist.exact, dtype=bool).tobytes(), hist.flat_counts.tobytes(), repr(hist.design))


def predictions(spec: MetricSpec, sampled: SampledRanks, weights: TensorLike | None = None,
                fit_options: dict | None = None) -> tuple[np.ndarray, str]:
    """f_i = E^[M(R) | positive i's sampled data] for every positive (``ranks > 0``, row-major), and the name of
    the fit: ``pl_fit``'s posterior means under a popularity design, else the posterior means under the
    rank-distribution fit ``auto`` would run (:func:`model_fit`; ``fit_options``: its options)."""
    design = sampled.design
    if design is not None and design.popularity is not None:
        from .popularity import pl_fit

        _, _, means = pl_fit(sampled, weights).estimate(spec)
        return np.asarray(means, dtype=np.float64), "pl_fit"
    fit, name, law = model_fit(spec, sampled.histogram(weights, exact=False).without_empty_groups(), fit_options,
                               design)
    valid = sampled.ranks > 0
    m = sampled.sizes()
    m_all = m[valid] if isinstance(m, torch.Tensor) else torch.full((int(valid.sum()),), int(m))
    return _posterior_means(spec, fit, _host(sampled.candidates()[valid]), _host(m_all),
                            _host(sampled.ranks[valid]), law), name


def model_fit(spec: MetricSpec, hist: Any, fit_options: dict | None = None, design: Any = None
              ) -> tuple[Any, str, str]:
    """(fit, its method's name, law) of the rank-distribution fit ``auto`` would run on ``hist`` (a uniform-law
    RankHistogram drawn under ``design``, default its own: ``gmod`` where the design resolves the top, else ``mes``),
    without bootstrap: the predictions need its posterior means only. Inside :func:`reusing_fits`: the fit made
    before of equal counts, options and design."""
    from ._auto import auto_choice
    from .rank_distribution import fit_rank_distribution

    design = hist.design if design is None else design

    def make() -> tuple[Any, str, str]:
        chosen, _ = auto_choice(spec, registry.Auto(**(fit_options or {})), hist, design, fit=True)
        method = registry.method_class(chosen.name)(**{**chosen.given(), "n_bootstrap": 0})
        law = "binomial" if design is None or design.adaptive_max is not None else design.law
        return fit_rank_distribution(hist, method, sampling=law), chosen.name, law

    options = tuple(sorted((k, repr(v)) for k, v in (fit_options or {}).items()))
    return _reused(("fit", str(spec), options, repr(design), _counts_key(hist)), make)


def _posterior_means(spec: MetricSpec, fit: Any, n: np.ndarray, m: np.ndarray, r: np.ndarray, law: str,
                     second: bool = False) -> Any:
    """E[M(R) | r~, group] under ``fit`` (a RankDistribution) per positive: each positive read in the fit's group of
    its m whose n is nearest on the log scale (a group's n is a cell edge of the fit: its likelihood is exact on
    the grid), M averaged within each cell (``interval_mean_metric``). ``second``: also E[M(R)^2 | r~, group]
    (:func:`_cell_second_moments`), as a pair. Inside :func:`reusing_fits`: the results and dense likelihoods
    computed before for equal inputs (copies)."""
    ri = np.rint(r).astype(np.int64)
    key = ("means", id(fit), str(spec), law, second, n.astype(np.int64).tobytes(), m.astype(np.int64).tobytes(),
           ri.tobytes())
    fit_and_means = _reused(key, lambda: (fit, _posterior_means_of(spec, fit, n, m, ri, law, second)))
    means = fit_and_means[1]  # the fit is kept with them: its id stays its own while the block lasts
    return (means[0].copy(), means[1].copy()) if second else means.copy()


def _posterior_means_of(spec: MetricSpec, fit: Any, n: np.ndarray, m: np.ndarray, ri: np.ndarray, law: str,
                        second: bool) -> Any:
    """:func:`_posterior_means` computed (``ri``: the sampled ranks as int64)."""
    from ._rank_hist import interval_mean_metric
    from .rank_distribution import dense_likelihood

    hist = fit.histogram
    gn, gm = hist.n_items.astype(np.int64), hist.n_samples.astype(np.int64)
    group = np.full(len(ri), -1, dtype=np.int64)
    for mg in np.unique(m):
        cand = np.flatnonzero((gm == mg) & ~hist.exact)
        if not len(cand):  # pragma: no cover - the fit's histogram holds every positive's m
            raise ValueError(f"sample: no fitted group has m = {mg}")
        sel = m == mg
        dist = np.abs(np.log(n[sel, None].astype(np.float64)) - np.log(gn[cand][None, :].astype(np.float64)))
        group[sel] = cand[np.argmin(dist, axis=1)]
    out, out2 = np.zeros(len(ri)), np.zeros(len(ri))
    for g in np.unique(group):  # one (n, m) group at a time: at most max_groups per m
        sel = group == g
        c_in = int(np.searchsorted(fit.edges, gn[g]))  # cells 0..c_in-1 lie within 1..n_g (n_g is an edge)
        if law == "binomial" and c_in * (int(gm[g]) + 1) > _DENSE_ELEMENTS:  # the observed columns r~ alone
            cols, at = np.unique(ri[sel], return_inverse=True)
            lik = _binomial_columns(fit.edges[:c_in + 1], int(gn[g]), int(gm[g]), cols - 1)
        else:
            dense, inside = _reused(("dense", fit.edges.tobytes(), int(gn[g]), int(gm[g]), law),
                                    lambda: dense_likelihood(fit.edges, gn[g:g + 1], gm[g:g + 1], law))
            lik, at = dense[0, :c_in, :], ri[sel] - 1
        lo, hi = fit.edges[:c_in], fit.edges[1:c_in + 1]
        joint = fit.probs[:c_in, None] * lik  # (C_in, columns)
        den = joint.sum(0)
        for target, cell in ((out, interval_mean_metric(spec, lo, hi, int(gn[g]))),
                             (out2, _cell_second_moments(spec, lo, hi, int(gn[g])) if second else None)):
            if cell is not None:
                post = np.where(den > 0, (cell @ joint) / np.where(den > 0, den, 1.0), cell.mean())
                target[sel] = post[at]
    return (out, out2) if second else out


#: cells x (m + 1) (each cell read at up to 8 points) above which :func:`_posterior_means` evaluates the binomial likelihood at the observed sampled ranks
#: only (:func:`_binomial_columns`), not the whole table (an adaptive cap of 12,800 on 50,000 items: 10^8 entries)
_DENSE_ELEMENTS = 1 << 18


def _binomial_columns(edges: np.ndarray, n: int, m: int, j: np.ndarray) -> np.ndarray:
    """P(r~ = j + 1 | cell) of the binomial law (r~ - 1 ~ Binomial(m, (r - 1)/(n - 1))) for the cells of ``edges``
    (C + 1,) and the whole j (K,): each cell's law averaged over its points (``cell_points``), as ``dense_likelihood``
    averages it, at K columns instead of m + 1. (C, K) float64."""
    from scipy.stats import binom

    from ._gspline import cell_points

    pts, wts = cell_points(edges)
    p = (pts.astype(np.float64) - 1.0) / (n - 1.0)
    return np.einsum("cs,csk->ck", wts, binom.pmf(j[None, None, :], m, p[:, :, None]))  # (C, S, K) summed over S


def _cell_second_moments(spec: MetricSpec, lo: np.ndarray, hi: np.ndarray, n: int) -> np.ndarray:
    """Mean of M(r)^2 over the whole ranks r in (lo, hi] of each cell: exact for cut-off metrics (M = 0 beyond K,
    prefix sums over 1..K), the squared cell mean elsewhere (AUC, AP and NDCG without cut-off: smooth in r)."""
    from ._rank_hist import interval_mean_metric, metric_at

    if spec.k is None or spec.kind == "auc":
        return interval_mean_metric(spec, lo, hi, n) ** 2
    k = min(int(spec.k), n)
    prefix = np.concatenate([[0.0], np.cumsum(metric_at(spec, np.arange(1, k + 1, dtype=np.float64), float(n)) ** 2)])
    return (prefix[np.minimum(hi, k)] - prefix[np.minimum(lo, k)]) / (hi - lo)


# ---------------------------------------------------------------------------------------------- the draw
@dataclasses.dataclass(frozen=True)
class ShareTable:
    """An active exact share's inclusion probabilities as a table of a positive's sampled data: pi of every occupied
    cell (n, m, r~) of the whole sample's histogram (:meth:`of`). pi is a function of the cell and of that histogram
    alone (the fit, the metric's range over the n present, the scale c set so the mean of pi is the share), so this
    table is the one computation of an active share's pi: :func:`share_inclusion` reads the positives of one sample
    in it, the Ray adapter broadcasts it to its actors for pass 2. Its size is the histogram's, whatever the users.

    keys: the groups' sorted keys n * width + m (int64); starts: each group's first cell in ``pi``; pi: float64 per
    cell, r~ = 1..m + 1 of each group in turn (0 where no positive fell); width: the largest m + 1."""

    keys: np.ndarray
    starts: np.ndarray
    pi: np.ndarray
    width: int

    @classmethod
    def of(cls, hist: Any, share: ExactShare, design: Any) -> "ShareTable":
        """The table of the active ``share`` from ``hist``, a RankHistogram of every positive's sampled ranks r~ (no
        exact groups, unweighted counts) drawn under ``design`` (a uniform-law or adaptive SamplingDesign): the fit
        of ``model_fit``, f = E^[M(R) | n, m, r~] per occupied cell, and :func:`inclusion_probabilities` of the cells
        with their counts (the same bits as of the positives one by one: it reads the distinct spreads' counts)."""
        from .metric_names import parse_metric
        from .metrics import metric_bounds

        if share.choice != "active" or hist.has_exact or (design is not None and design.popularity is not None):
            raise ValueError("share: a table is of an active share over sampled ranks of a uniform-law or adaptive "
                             "design (popularity designs' predictions are per positive)")
        spec = parse_metric(share.metric)
        fit, _, law = model_fit(spec, hist.without_empty_groups(), None, design)
        m = hist.n_samples.astype(np.int64)
        n, width = hist.n_items.astype(np.int64), int(m.max()) + 1
        if int(n.max()) >= np.iinfo(np.int64).max // width - 1:  # pragma: no cover - n * m beyond 2**63
            raise ValueError("n_items: too large to key the share's table (n x m above 2**63)")
        counts = hist.flat_counts
        cell = np.flatnonzero(counts > 0)
        group = np.searchsorted(np.cumsum(m + 1), cell, side="right")  # the group of each occupied cell
        starts = np.concatenate([[0], np.cumsum(m + 1)[:-1]])
        f = _posterior_means(spec, fit, n[group], m[group], (cell - starts[group] + 1).astype(np.float64), law)
        pi = np.zeros(len(counts))
        pi[cell] = inclusion_probabilities(share, f, metric_bounds(spec, np.unique(n[group])), counts[cell])
        key = n * width + m
        order = np.argsort(key, kind="stable")
        return cls(key[order], starts[order], pi, width)

    def lookup(self, n: np.ndarray, m: np.ndarray, r: np.ndarray) -> np.ndarray:
        """pi of the positives with candidates ``n``, sample sizes ``m`` and sampled ranks ``r`` (integer arrays of
        one shape); a ValueError where a positive's cell is not in the table (not a positive of its histogram)."""
        n, m, r = (np.asarray(a).astype(np.int64) for a in (n, m, r))
        key = n * self.width + m
        g = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        cell = self.starts[g] + r - 1
        found = np.equal(self.keys[g], key) & (r >= 1) & (r <= m + 1)
        pi = self.pi[np.where(found, cell, 0)]
        if not bool((found & (pi > 0)).all()):
            raise ValueError("inclusion: a positive's sampled data is not in the share's table (its ranks were not "
                             "those the table was built from: the same rows, seed and design are needed)")
        return pi

    def inclusion(self, sampled: SampledRanks) -> np.ndarray:
        """pi of every positive of ``sampled`` (``ranks > 0``, row-major), read by its (n, m, r~): :meth:`lookup`."""
        valid = sampled.ranks > 0
        m = sampled.sizes()
        m_v = _host(m[valid]) if isinstance(m, torch.Tensor) else np.full(int(valid.sum()), int(m))
        return self.lookup(_host(sampled.candidates()[valid]), m_v, _host(sampled.ranks[valid]))


@dataclasses.dataclass(frozen=True)
class KeyedInclusion:
    """An exact share's inclusion probabilities per positive, keyed by (row key, item): pi of every positive of a
    whole sample, computed once where pi is not a function of a cell (an active share under a popularity design:
    :func:`share_inclusion` on the whole sample, ``pl_fit``'s predictions), read back by the positives when they are
    drawn again on the same keys (the Ray adapter's pass 2, :meth:`inclusion`). Its size is the number of distinct
    positives (16 bytes each), where :class:`ShareTable`'s is the histogram's.

    keys: sorted distinct int64 keys row_key * width + item; pi: float64 per key; width: the items' range (the
    catalogue size: items 0..width - 1)."""

    keys: np.ndarray
    pi: np.ndarray
    width: int

    @classmethod
    def of(cls, row_keys: np.ndarray, items: np.ndarray, pi: np.ndarray, width: int) -> "KeyedInclusion":
        """The table of the positives (N,) with row keys ``row_keys`` (the draws' keys: user ids), ``items`` in
        0..``width`` - 1 and inclusion probabilities ``pi``; a ValueError where one (row key, item) has two
        different pi (two rows with one key held that item with other data: the draws cannot tell them apart)."""
        keys = _positive_keys(row_keys, items, width)
        order = np.argsort(keys, kind="stable")
        keys, pi = keys[order], np.asarray(pi, dtype=np.float64)[order]
        same = keys[1:] == keys[:-1]
        if bool((same & (pi[1:] != pi[:-1])).any()):
            raise ValueError("inclusion: one (row key, item) holds positives of different sampled data (one user id "
                             "on several rows with the same held-out item): key each row by its own id")
        keep = np.concatenate([[True], ~same])
        return cls(keys[keep], pi[keep], int(width))

    def lookup(self, row_keys: np.ndarray, items: np.ndarray) -> np.ndarray:
        """pi of the positives keyed by ``row_keys`` and ``items`` (integer arrays of one shape); a ValueError where
        a positive is not in the table (not a positive of the sample it was built from)."""
        key = _positive_keys(row_keys, items, self.width)
        if key.size == 0:
            return np.zeros(0)
        at = np.minimum(np.searchsorted(self.keys, key), max(len(self.keys) - 1, 0))
        if not len(self.keys) or not bool(np.equal(self.keys[at], key).all()):
            raise ValueError("inclusion: a positive is not in the share's table (its row and item were not among "
                             "those the table was built from: the same rows, seed and design are needed)")
        return self.pi[at]

    def inclusion(self, sampled: SampledRanks, row_keys: torch.Tensor, pos: torch.Tensor) -> np.ndarray:
        """pi of every positive of ``sampled`` (``ranks > 0``, row-major), read by its row's key (``row_keys``
        (B,)) and its item (``pos`` (B, P)): :meth:`lookup`."""
        valid = sampled.ranks > 0
        return self.lookup(_host(row_keys.view(-1, 1).expand(pos.shape)[valid]), _host(pos[valid]))


def _positive_keys(row_keys: np.ndarray, items: np.ndarray, width: int) -> np.ndarray:
    """int64 keys row_key * width + item (one per positive: distinct for distinct (row key, item) with items in
    0..width - 1); a ValueError for an item outside that range or a row key too large to key."""
    r, i = np.asarray(row_keys).astype(np.int64), np.asarray(items).astype(np.int64)
    if i.size and (int(i.min()) < 0 or int(i.max()) >= width):
        raise ValueError(f"items: expected item indices in 0..{width - 1} to key the share's table")
    if r.size and int(np.abs(r).max()) >= np.iinfo(np.int64).max // width - 1:
        raise ValueError("row_keys: ids too large to key the share's table (|id| x n_items above 2**63)")
    return r * width + i


def share_inclusion(sampled: SampledRanks, share: ExactShare) -> np.ndarray:
    """pi of every positive of ``sampled`` (``ranks > 0``, row-major) under ``share``, its design's exact share:
    ``share.share`` each for a uniform share; for an active one (phase 2 of the two-phase design: it reads phase 1's
    sampled ranks) the positives read in the :class:`ShareTable` of ``sampled``'s histogram, or under a popularity
    design :func:`inclusion_probabilities` of ``pl_fit``'s per-positive predictions, fitted on the positives in one
    canonical order (:func:`_canonical_positives`): each positive's pi is the same bits in any order of the
    positives, so any process that holds the whole sample finds it (the Ray adapter's :class:`KeyedInclusion`)."""
    from .metric_names import parse_metric
    from .metrics import metric_bounds

    valid = sampled.ranks > 0
    if share.choice != "active" or not bool(valid.any()):
        return np.full(int(valid.sum()), share.share)
    design = sampled.design
    if design is None or design.popularity is None:
        return ShareTable.of(sampled.histogram(exact=False), share, design).inclusion(sampled)
    spec = parse_metric(share.metric)
    ordered, order = _canonical_positives(sampled)
    f_ordered, _ = predictions(spec, ordered)
    f = np.empty(len(order))
    f[order] = f_ordered
    return inclusion_probabilities(share, f, metric_bounds(spec, sampled.candidates()[valid]))


def _canonical_positives(sampled: SampledRanks) -> tuple[SampledRanks, np.ndarray]:
    """(the positives of popularity-sampled ``sampled`` (``ranks > 0``, row-major) as one 1-D sample sorted by every
    column of their data (r~, n, the :class:`~reco_sampled_plugin._popularity.PopularityStats` fields), order):
    entry k of the sorted sample is positive ``order[k]``. Equal positives are interchangeable, so the sorted sample
    is the same bits whatever the positives' order (pl_fit's sums then are too)."""
    from ._sampled import SampledRanks

    valid = sampled.ranks > 0
    assert sampled.popularity_stats is not None, "share_inclusion: popularity draws with replacement carry statistics"
    st = sampled.popularity_stats.select(valid)
    n = sampled.candidates()[valid]
    scalars = [sampled.ranks[valid], n, st.beating, st.inv_q, st.inv_q2, st.unreachable, st.positive_weight]
    cols = [torch.stack([c.to(torch.float64) for c in scalars if c is not None], 1)]
    cols += [c.to(torch.float64) for c in (st.profile, st.beat_bins, st.miss_bins) if c is not None]
    table = _host(torch.cat(cols, 1))
    order = np.lexsort(table.T[::-1])  # the first column first
    at = torch.as_tensor(order, device=valid.device)
    return SampledRanks(sampled.ranks[valid][at], n[at], None, sampled.design,
                        popularity_stats=st.select(at)), order


def draw_share(sampled: SampledRanks, row_keys: torch.Tensor, pos: torch.Tensor,
               rank_rows: Callable[[torch.Tensor], torch.Tensor]) -> SampledRanks:
    """``sampled`` with the exact share of its design (``design.exact_share``; itself where there is none): pi from
    :func:`share_inclusion` (an active share fits the model on ``sampled`` first), the keyed choice and the ranking
    of the chosen positives by ``_share.choose_share`` (``row_keys``, ``pos``, ``rank_rows`` as there)."""
    share = None if sampled.design is None else sampled.design.exact_share
    if share is None:
        return sampled
    return choose_share(sampled, row_keys, pos, rank_rows, share_inclusion(sampled, share))


# ---------------------------------------------------------------------------------------------- entry points
def _exact_values(spec: MetricSpec, sampled: SampledRanks) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(y, pi, chosen, n) per positive (row-major): y = M(R) where chosen (0 elsewhere)."""
    from ._rank_hist import metric_at

    valid = sampled.ranks > 0
    assert sampled.share_ranks is not None and sampled.inclusion is not None
    e = _host(sampled.share_ranks[valid]).astype(np.float64)
    pi = _host(sampled.inclusion[valid]).astype(np.float64)
    n = _host(sampled.candidates()[valid]).astype(np.float64)
    chosen = e > 0
    y = np.zeros(len(e))
    if chosen.any():
        y[chosen] = metric_at(spec, e[chosen], n[chosen])
    return y, pi, chosen, n


def _fit_options(method: Any) -> tuple[dict, str]:
    """The fit options ``method`` gives (for the predictions' fit) and its ``coef`` (auto: :data:`COEF`)."""
    given = dict(method.given())
    coef = given.pop("coef", COEF)
    names = set(registry.fit_option_names()) | set(registry.COMMON_OPTIONS)
    return {k: v for k, v in given.items() if k in names}, coef


def estimate_design_based(spec: MetricSpec, sample: Any, method: Any, weights: TensorLike | None,
                          model_estimate: Callable[[Any], Estimate]) -> Estimate:
    """``estimate``'s path for ``diff`` (and ``auto`` on a sample with an exact share): eq. (1)-(3) on the share, from
    the histogram and its share rows (``RankHistogram.share``: what merges across batches and processes), or from
    the positives' ``pl_fit`` predictions under a popularity design; without a share, ``auto``'s model-based
    estimate flagged ``no_exact_share``: ``model_estimate(registry.Auto(...))``, the estimate of ``sample`` by that
    method (``estimators.estimate`` passes it: it sits above this module)."""
    from ._sampled import SampledRanks

    fit_opts, coef = _fit_options(method)
    if not carries_share(sample):
        est = model_estimate(registry.Auto(**fit_opts))
        marked = est.flags + ("no_exact_share",)
        return dataclasses.replace(est, flags=marked, details={**est.details, "flags": marked, "design_based": False})
    design = sample.design
    if design is not None and not registry.get("diff").supports(design):  # pragma: no cover - every share design
        raise ValueError(f"method: 'diff' does not support the design of these ranks ({design.describe()})")
    if isinstance(sample, SampledRanks):
        # from_arrays and the draws check pi; a SampledRanks built by hand does not (1e-300 weighs 1e300 in eq. 2)
        assert sample.inclusion is not None  # carries_share
        check_inclusion(sample.inclusion[sample.ranks > 0])
        if design is not None and design.popularity is not None:
            return _popularity_share(spec, sample, weights, fit_opts, coef)
        hist = sample.histogram(weights)
    elif weights is not None:
        raise ValueError("weights: a RankHistogram holds (weighted) counts already; weight the positives when "
                         "building it, or pass the SampledRanks")
    else:
        hist = sample
    return _histogram_share(spec, hist.without_empty_groups(), fit_opts, coef, design)


def _histogram_share(spec: MetricSpec, hist: Any, fit_opts: dict, coef: str, design: Any) -> Estimate:
    """Eq. (1)-(3) from a histogram with share rows: sum_i w_i f_i over its (group, r~) cells, the residuals over
    the rows, f from :func:`model_fit` (the same function of (n, m, r~) as :func:`predictions`)."""
    from ._rank_hist import metric_at

    rows = hist.share
    hist.check_nonempty()
    n_min = int(hist.n_items.min())
    if spec.k is not None and spec.k > n_min:
        raise ValueError(f"metric: cut-off K = {spec.k} is larger than the catalogue (n_items = {n_min})")
    fit, model, law = model_fit(spec, hist, fit_opts, design)
    sizes = hist.n_samples + 1
    cell_n = np.repeat(hist.n_items, sizes)
    cell_m = np.repeat(hist.n_samples, sizes)
    cell_r = np.arange(len(hist.flat_counts)) - np.repeat(hist._starts, sizes) + 1
    occupied = hist.flat_counts > 0
    counts = hist.flat_counts[occupied]
    f_cells = _posterior_means(spec, fit, cell_n[occupied], cell_m[occupied], cell_r[occupied], law)
    f_rows, f2_rows = _posterior_means(spec, fit, rows.n, rows.m, rows.sampled, law, second=True)
    y = metric_at(spec, rows.exact, rows.n.astype(np.float64)) if len(rows.n) else np.zeros(0)
    model_sum = float(counts @ f_cells)
    value, se, lam = share_estimate(model_sum, hist.total, y, f_rows, rows.inclusion, rows.weight, coef, rows.census,
                                    f2_rows)
    share = None if design is None else design.exact_share
    return _packaged(spec, value, se, hist.total, hist.n_items, len(rows.n),
                     {"model": model, "model_value": model_sum / hist.total, "lambda": lam, "coef": coef,
                      "share": share})


def _popularity_share(spec: MetricSpec, sample: SampledRanks, weights: TensorLike | None, fit_opts: dict,
                      coef: str) -> Estimate:
    """Eq. (1)-(3) on popularity-sampled ranks: the positives' ``pl_fit`` posterior means as f."""
    y, pi, chosen, n = _exact_values(spec, sample)
    if spec.k is not None and spec.k > int(n.min(initial=spec.k)):
        raise ValueError(f"metric: cut-off K = {spec.k} is larger than the catalogue (n_items = {int(n.min())})")
    f, model = predictions(spec, sample, weights, fit_opts)
    w = share_weights(sample, weights)
    from .metrics import metric_bounds

    lo, hi = metric_bounds(spec, n.astype(np.int64))  # E[M^2] <= lo^2 + (hi + lo)(f - lo) (Bhatia-Davis)
    value, se, lam = difference_estimate(y, f, pi, chosen, w, coef, lo * lo + (hi + lo) * (f - lo))
    total = float(len(f) if w is None else w.sum())
    return _packaged(spec, value, se, total, n.astype(np.int64), int(chosen.sum()),
                     {"model": model, "model_value": float(np.average(f, weights=w)), "lambda": lam, "coef": coef,
                      "share": sample.design.exact_share if sample.design is not None else None,
                      "mean_inclusion": float(pi.mean())})


def _packaged(spec: MetricSpec, value: float, se: float, total: float, n: np.ndarray, k: int, extra: dict) -> Estimate:
    """The :class:`~reco_sampled_plugin._estimate.Estimate` of the difference estimator: flags ``few_exact`` and
    ``outside_metric_range``, the metric's range, the variance estimator's name."""
    from ._estimate import Estimate, in_range
    from .metrics import metric_bounds

    bounds = metric_bounds(spec, n)
    # a raw value outside the metric's range (a model far off on a small share): the range's nearest end, flagged,
    # the raw value in details["unclipped_value"], as every estimator's
    value, flags, details = in_range(value, ("few_exact",) if k < FEW_EXACT else (),
                                     {"method": "diff", **extra, "n_exact": k, "variance": VARIANCE}, bounds)
    details["flags"] = flags
    return Estimate(value, se, total, details, flags, None, (float(bounds[0]), float(bounds[1])))


def paired_difference_by_design(metric: str | MetricSpec, a: SampledRanks, b: SampledRanks, *, coef: str = COEF,
                                weights: TensorLike | None = None) -> Estimate:
    """theta_A - theta_B of two recommenders by (1)-(3) on d = y^A - y^B with f = f^A - f^B (standard error sqrt(V^):
    the model gives no joint law of the two ranks for eq. 4): both samples must hold
    the same positives (shape) with the same exact share (the same chosen positives and pi: one share key; a uniform
    share always, an active one when both drew with the same pi). A ValueError naming ``b`` otherwise."""
    from ._estimate import Estimate
    from ._options import check_choice
    from .metric_names import parse_metric

    spec = parse_metric(metric)
    coef = check_choice(coef, COEFS, "coef")
    for name, s in (("a", a), ("b", b)):
        if getattr(s, "share_ranks", None) is None:
            raise ValueError(f"{name}: expected SampledRanks with an exact share (SamplingDesign(m, exact_share=...))")
    ya, pa, ca, _ = _exact_values(spec, a)
    yb, pb, cb, _ = _exact_values(spec, b)
    if ya.shape != yb.shape or a.ranks.shape != b.ranks.shape or not np.array_equal(ca, cb) or not np.allclose(pa, pb):
        raise ValueError("b: not the same exact share as a (the same positives, chosen with the same inclusion "
                         "probabilities); draw both with one ExactShare (a uniform share, or one seed and pi)")
    fa, ma = predictions(spec, a, weights)
    fb, _ = predictions(spec, b, weights)
    w = share_weights(a, weights)
    value, se, lam = difference_estimate(ya - yb, fa - fb, pa, ca, w, coef)
    big_w = float(len(fa) if w is None else w.sum())
    k = int(ca.sum())
    flags = ("few_exact",) if k < FEW_EXACT else ()
    details = {"method": "diff", "model": ma, "lambda": lam, "coef": coef, "n_exact": k, "variance": "poisson_ht",
               "flags": flags}
    return Estimate(value, se, big_w, details, flags)


def estimate_by_design(spec: MetricSpec, hist: Any, *, method: str, sampling: str, options: dict) -> Any:
    """The registry's compute function of ``diff`` on a bare histogram (which carries no exact share): ``auto``'s
    (``estimate`` routes SampledRanks through :func:`estimate_design_based`)."""
    from ._auto import estimate_auto

    opts = {k: v for k, v in options.items() if k != "coef"}
    res = estimate_auto(spec, hist, method="auto", sampling=sampling, options=opts)
    return res._replace(flags=tuple(res.flags) + ("no_exact_share",)) if hasattr(res, "_replace") else res
