"""Hansen-Hurwitz estimates under popularity (and uniform) sampling: the rank and the AUC.

The law (docs/popularity.md, "The law, and what a draw keeps"): each of a positive's m draws is
independent, with replacement, from q~, the popularity law renormalised over the row's drawable candidates (its
irrelevant, non-excluded items: RecBole's ``popN`` redraws a draw that hits a used item). With A the drawable items
scored above the positive (|A| = R - 1), r~ - 1 ~ Binomial(m, q~(A)): the sampled rank identifies the popularity mass
above, not the count. Weighting each beating draw by 1/q~ counts it back (Hansen & Hurwitz 1943):

    Y = (1/m) sum_k [j_k in A] / q~_{j_k},   E[Y] = R - 1,   Var[Y] = (1/m) (sum_{j in A} 1/q~_j - (R - 1)^2),

and with z_k the k-th term, (sum z_k^2 - m zbar^2) / (m (m - 1)) estimates Var[Y] without bias. Under uniform q~ =
1/(n - 1), Y = (n - 1)(r~ - 1)/m: Krichene & Rendle's rank estimate (eq. 20), and the AUC below is the sampled AUC.
AUC = (n - R)/(n - 1) is linear in R, so AUC^ = 1 - Y/(n - 1) is unbiased too. Top-K metrics are not linear in R and
a positive with no beating draw says nothing on how the mass above maps to a count: ``pl_fit`` (the end of this
module; its model in ``_popularity_fit``) estimates them under a Plackett-Luce model of the items above a positive,
its interval spanning what that model leaves unidentified.

Registered as the estimator ``hh`` (``registry.py``); ``estimate("auc", sampled, method="hh")`` with the
:class:`~reco_sampled_plugin.ranking.SampledRanks` of a popularity draw (they carry the statistics,
``SampledRanks.popularity_stats``), or with any uniform ranks (bare ranks, a histogram).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from ._checks import check_weights, check_without_replacement
from ._popularity import POP_BINS, PopularityStats, weight_bins
from ._popularity_fit import PopularityFit, StratifiedFit, Units, fit as _fit_units, z_value
from .design import SamplingDesign
from ._estimate import Estimate, EstimatorOutput
from ._kept import same_as_before
from .metric_names import MetricSpec
from ._types import TensorLike

if TYPE_CHECKING:
    from ._rank_hist import RankHistogram
    from .identification import IdentifiedInterval
    from ._sampled import SampledRanks

__all__ = ["HH_METRICS", "ESS_SHARE_FLAG", "RARE_DRAWS", "RARE_SHARE_FLAG", "rare_share", "PopularityDraws", "popularity_draws", "rank_estimates", "mean_rank",
           "estimate_by_hh", "estimate_by_pl_fit", "pl_fit"]

#: The metric kinds ``hh`` estimates: those linear in the exact rank.
HH_METRICS = ("auc",)

#: ``weights_concentrated`` is flagged when the Kish effective sample size of the beating draws' weights 1/q~,
#: (sum w)^2 / sum w^2 over all beating draws, is below this share of their number: a few (tail) items then carry
#: most of the estimate, and its standard error rests on the few positives that drew them.
ESS_SHARE_FLAG = 0.1

#: A popularity class of the design (``_popularity.weight_bins``: items of similar weight) is *rarely drawn* when
#: all the evaluation's draws together (positives x m) are expected to hit it fewer than this many times: the
#: count of its items above a positive then rests on a handful of draws of weight 1/q~ each, or on none.
RARE_DRAWS = 5.0
#: ``weights_concentrated`` is also flagged when rarely drawn classes hold more than this share of the drawable
#: catalogue (``details["rare_share"]``): read from the design's weights, not from the draws, so a design that puts
#: nearly all its mass on a few items is flagged even when no rare item was drawn (then the drawn items alone look
#: even). The AUC can be off by up to that share (the rarely drawn items above the positives, mostly unseen).
RARE_SHARE_FLAG = 0.01


def rare_share(weights: torch.Tensor, draws: float) -> float:
    """The share of the items of weight > 0 that lie in popularity classes (:func:`~reco_sampled_plugin._popularity.
    weight_bins`) which ``draws`` draws from the law w / sum(w) are expected to hit fewer than :data:`RARE_DRAWS`
    times in all: 0 for uniform weights (one class, hit by every draw) once draws >= RARE_DRAWS, near 1 when a few
    items hold nearly all the mass."""
    w = weights.detach().to(torch.float64).cpu()
    cls = weight_bins(w)
    count = torch.zeros(POP_BINS, dtype=torch.float64).scatter_add_(0, cls, (w > 0).double())
    mass = torch.zeros(POP_BINS, dtype=torch.float64).scatter_add_(0, cls, w)
    total = float(mass.sum())
    if total <= 0:
        return 0.0
    rare = (count > 0) & (draws * mass / total < RARE_DRAWS)
    return float(count[rare].sum() / count.sum())


class PopularityDraws:
    """The per-positive inputs of ``hh`` (valid slots only, 1-D float64 numpy arrays): S1, S2, beating draws, n, m,
    frequency weights; from :func:`popularity_draws` (a popularity draw) or from a uniform histogram. ``units``:
    what ``pl_fit`` reads (the popularity classes of the distinct drawn items and of the row's candidates), None
    for a uniform histogram; ``units_of``: instead of ``units``, a function forming them, called when ``units`` is
    first read (``hh`` and the rank estimates never read them)."""

    def __init__(self, s1: np.ndarray, s2: np.ndarray, beating: np.ndarray, n: np.ndarray, m: np.ndarray,
                 w: np.ndarray, units: Units | None = None, rare: float | None = None,
                 units_of: Callable[[], Units] | None = None) -> None:
        self.s1, self.s2, self.beating, self.n, self.m, self.w = s1, s2, beating, n, m, w
        self._units, self._units_of = units, units_of
        self.rare = rare  # rare_share of the design's weights at these draws (None: no design weights known)

    @property
    def units(self) -> Units | None:
        """The units ``pl_fit`` reads (formed by ``units_of`` at the first read, then kept)."""
        if self._units_of is not None:
            self._units, self._units_of = self._units_of(), None
        return self._units


def popularity_draws(sampled: SampledRanks, weights: TensorLike | None = None) -> PopularityDraws:
    """The :class:`PopularityDraws` of popularity-sampled :class:`~reco_sampled_plugin.ranking.SampledRanks`. Their
    ``units`` (formed at their first read) are those returned before for ``sampled`` where equal
    (:func:`_same_units`), with the fits they keep:
    a ``pl_fit`` fit lives as long as the draw it came from (its units; ``sampled`` remembers its last two), at most
    2 per units (``Units._derived_max``; a fit holds about 100 times the units' data). The units' arrays are
    read-only.

    Raises:
        ValueError naming ``sampled_ranks`` when they carry no design or no statistics (bare ranks cannot; draws without
        replacement have none), or ``popularity`` when a drawable candidate of an evaluated row has weight 0 (it
        can never be drawn, so no estimate counts it).
    """
    stats: PopularityStats | None = sampled.popularity_stats
    design = sampled.design
    if design is None:
        raise ValueError("sampled_ranks: these SampledRanks carry no design, so neither the popularity law nor m is "
                         "known; draw them with sampled_ranks(..., SamplingDesign(m, popularity=w)), "
                         "sampled_ranks_from_scorer or evaluate_factors, which keep both")
    if stats is None:
        why = ("draws without replacement are not independent: no Hansen-Hurwitz weights; draw with replacement "
               "(RecBole's popN does)" if not design.replacement else
               "draw them with sampled_ranks(..., SamplingDesign(m, popularity=w)), sampled_ranks_from_scorer or "
               "evaluate_factors, which keep each positive's beating draws' 1/q~ (SampledRanks.popularity_stats)")
        raise ValueError(f"sampled_ranks: these popularity-sampled ranks ({design.describe()}) carry no per-draw "
                         f"weights, and a popularity design cannot be corrected from r~ alone; {why}")
    ranks = sampled.ranks
    valid = ranks > 0
    unreachable = stats.unreachable[valid]
    if bool((unreachable > 0).any()):
        raise ValueError(f"popularity: {int((unreachable > 0).sum())} evaluated positive(s) have drawable "
                         f"candidates of weight 0 (up to {int(unreachable.max())} in a row): they can never be "
                         "drawn, so the count above the positive is not identified; give every candidate a "
                         "weight > 0 (e.g. counts + 1) or exclude such items")
    w = torch.ones_like(ranks, dtype=torch.float64) if weights is None else \
        torch.broadcast_to(check_weights(weights, "weights", like=ranks, device=ranks.device, counts=True), ranks.shape)
    n = sampled.candidates()[valid]

    def host(t: torch.Tensor) -> np.ndarray:
        return t.detach().to(torch.float64).cpu().numpy()

    m = np.full(int(valid.sum()), float(design.n_samples))

    def units_of() -> Units:  # pl_fit's units, formed where they are read (hh does not read them)
        assert stats is not None and design is not None  # checked above
        return _same_units(sampled, _units(stats, valid, design, n, m, w, host))

    assert design.popularity is not None  # a popularity design: statistics are kept for those only
    # a rank file's design carries one placeholder weight (its law is not known): no share then
    rare = rare_share(design.popularity, float(m.sum())) if design.popularity.numel() > 1 else None
    return PopularityDraws(host(stats.inv_q[valid]), host(stats.inv_q2[valid]), host(stats.beating[valid]), host(n),
                           m, host(w[valid]), None, rare, units_of if stats.has_profile else None)


#: Why ``pl_fit`` refuses statistics without class counts (rank files carry S1, S2 only).
_NO_PROFILE = ("sampled_ranks: pl_fit reads each positive's popularity-class counts (PopularityStats.profile, "
               "beat_bins, miss_bins: the drawable candidates and the distinct beating / other drawn items per "
               "class), which these ranks do not carry (a rank file keeps only the Hansen-Hurwitz sums hh_s1, "
               "hh_s2); use hh for AUC, or rank the scores with sampled_ranks(..., SamplingDesign(m, popularity=w)), "
               "sampled_ranks_from_scorer or evaluate_factors, which keep them")


def _units(stats: PopularityStats, valid: torch.Tensor, design: SamplingDesign, n: torch.Tensor, m: np.ndarray,
           w: torch.Tensor, host: Callable[[torch.Tensor], np.ndarray]) -> Units:
    """What ``pl_fit`` reads: the valid positives' class counts and the classes' mean weight and log weight."""
    assert design.popularity is not None and stats.profile is not None and stats.beat_bins is not None \
        and stats.miss_bins is not None  # a popularity draw's statistics with stats.has_profile (the caller's test)
    cls = weight_bins(design.popularity)
    wt = design.popularity.to(torch.float64)
    n_cls = torch.zeros(POP_BINS, dtype=torch.float64).scatter_add_(0, cls.cpu(), (wt > 0).double().cpu())
    sum_w = torch.zeros(POP_BINS, dtype=torch.float64).scatter_add_(0, cls.cpu(), wt.cpu())
    sum_lw = torch.zeros(POP_BINS, dtype=torch.float64).scatter_add_(
        0, cls.cpu(), torch.where(wt > 0, torch.log(torch.where(wt > 0, wt, torch.ones_like(wt))), torch.zeros_like(wt)).cpu())
    occupied = n_cls > 0
    mean_w = host(torch.where(occupied, sum_w / n_cls.clamp_min(1), torch.zeros_like(sum_w)))
    log_v = host(torch.where(occupied, sum_lw / n_cls.clamp_min(1), torch.zeros_like(sum_lw)))
    cov = None
    if stats.positive_weight is not None:
        pw = host(stats.positive_weight[valid].to(torch.float64))
        with np.errstate(divide="ignore"):
            cov = np.where(pw > 0, np.log(np.where(pw > 0, pw, 1.0)), -np.inf)  # a positive of weight 0: the least
    return Units(host(stats.profile[valid]), host(stats.beat_bins[valid]), host(stats.miss_bins[valid]), host(n), m,
                 host(w[valid]), log_v, mean_w, covariate=cov)


def _equal_units(a: Units, b: Units) -> bool:
    """Whether two :class:`~reco_sampled_plugin._popularity_fit.Units` hold the same numbers, bit for bit (the
    arrays' bytes compared in place, without copies of contiguous arrays)."""
    arrays = ("profile", "beat", "miss", "n", "m", "w", "log_v", "mean_w", "covariate")
    return a.distinct == b.distinct and all(
        (x is None and y is None) or (x is not None and y is not None and _same_bits(x, y))
        for x, y in ((getattr(a, k), getattr(b, k)) for k in arrays))


def _same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two arrays have the same dtype, shape and bytes (bitwise, as ``tobytes``: NaNs of one pattern equal,
    -0.0 not 0.0)."""
    if x is y:
        return True
    if x.dtype != y.dtype or x.shape != y.shape:
        return False

    def raw(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # a view where contiguous (the units' arrays are)

    return bool(np.array_equal(raw(x), raw(y)))


def _same_units(sampled: SampledRanks, units: Units) -> Units:
    """``units``, or the equal units (the same numbers, bit for bit) returned before for ``sampled`` (its last two
    are remembered, as its histograms: ``_rank_hist.same_histogram``): the same object, with the ``pl_fit`` fits it
    keeps (``_popularity_fit.fit``), so the metrics estimated from one draw fit once."""
    return same_as_before(sampled, "_units", units, _equal_units)


def _uniform_draws(hist: RankHistogram) -> PopularityDraws:
    """The cells of a uniform histogram as :class:`PopularityDraws` (each (n, m, r~) cell once, its count as the
    weight): under q~ = 1/(n - 1) every beating draw weighs n - 1, so S1 = (n - 1)(r~ - 1), S2 = (n - 1)^2 (r~ - 1)."""
    parts = []
    for n, m, c in zip(hist.n_items, hist.n_samples, hist.counts):
        b = np.arange(len(c), dtype=np.float64)  # r~ - 1
        keep = c > 0
        parts.append((b[keep], np.full(keep.sum(), float(n)), np.full(keep.sum(), float(m)), c[keep]))
    b, n, m, w = (np.concatenate([p[i] for p in parts]) if parts else np.zeros(0) for i in range(4))
    return PopularityDraws((n - 1) * b, (n - 1) ** 2 * b, b, n, m, w)


def _mean_se(v: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Frequency-weighted mean and its standard error (between-positive spread, as ``corrections.table_estimate``)."""
    total = float(w.sum())
    mean = float(w @ v) / total
    ss = float(w @ (v - mean) ** 2)
    return mean, (math.sqrt(ss / (total * (total - 1.0))) if total > 1 else math.inf)


def _within_var(d: PopularityDraws) -> np.ndarray:
    """Per positive, the unbiased estimate of Var[Y | positive] = (S2 - S1^2/m) / (m (m - 1)) (NaN for m = 1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (d.s2 - d.s1 ** 2 / d.m) / (d.m * (d.m - 1))
    return np.where(d.m > 1, np.maximum(v, 0.0), np.nan)


def _summary(d: PopularityDraws) -> dict:
    """Rank estimate, its standard errors, and the Kish effective sample size of the beating draws' weights."""
    y = d.s1 / d.m
    rank, rank_se = _mean_se(1.0 + y, d.w)
    total = float(d.w.sum())
    within = _within_var(d)
    n_beating = float(d.w @ d.beating)
    s1, s2 = float(d.w @ d.s1), float(d.w @ d.s2)
    ess = s1 * s1 / s2 if s2 > 0 else 0.0
    return {
        "mean_rank": rank,
        "mean_rank_stderr": rank_se,
        "mean_rank_stderr_sampling": math.sqrt(float(d.w @ within)) / total if np.all(np.isfinite(within)) else None,
        "beating_draws": n_beating,
        "kish_ess": ess,
        "ess_share": ess / n_beating if n_beating > 0 else None,
    }


def _fixed_m(sampled: object) -> SamplingDesign | None:
    """The design of ``sampled`` (a SampledRanks), refused where the rank estimate is not unbiased: adaptive draws
    (a positive keeps drawing while it ranks first: the stopping rule biases (n - 1)(r~ - 1)/M)."""
    from ._sampled import SampledRanks

    if not isinstance(sampled, SampledRanks):
        raise ValueError(f"sampled: expected the SampledRanks of a draw, got {type(sampled).__name__}")
    if sampled.design is not None and sampled.design.adaptive_max is not None:
        raise ValueError("sampled: adaptive draws stop on the sampled rank, so the Hansen-Hurwitz rank estimate is "
                         "biased there; use a fixed-m design")
    return sampled.design


def rank_estimates(sampled: SampledRanks) -> torch.Tensor:
    """Per positive, the Hansen-Hurwitz rank estimate R^ = 1 + S1/m (float64, shaped like the ranks, 0 in padded
    slots): from the statistics of a popularity draw, or 1 + (n - 1)(r~ - 1)/m for a uniform one."""
    design = _fixed_m(sampled)
    ranks = sampled.ranks
    valid = ranks > 0
    if design is not None and design.popularity is not None:
        popularity_draws(sampled)  # the refusals: statistics present among them
        assert sampled.popularity_stats is not None
        r = 1.0 + sampled.popularity_stats.inv_q / design.n_samples
    else:
        n = sampled.candidates().to(torch.float64)
        r = 1.0 + (n - 1) * (ranks.to(torch.float64) - 1) / torch.as_tensor(sampled.sizes(), dtype=torch.float64)
    return torch.where(valid, r, torch.zeros_like(r, dtype=torch.float64))


def mean_rank(sampled: SampledRanks, weights: TensorLike | None = None) -> Estimate:
    """The mean exact rank of the positives (1 = best; n counts the positive and its drawable candidates),
    estimated by Hansen-Hurwitz, with the between-positive standard error; ``details`` as ``hh``'s."""
    design = _fixed_m(sampled)
    if design is not None and design.popularity is not None:
        d = popularity_draws(sampled, weights)
    else:
        d = _uniform_draws(sampled.histogram(weights))
    s = _summary(d)
    return Estimate(s["mean_rank"], s["mean_rank_stderr"], float(d.w.sum()), {"method": "hh", **s})


def estimate_by_hh(spec: MetricSpec, hist: RankHistogram, *, method: str, sampling: str, options: dict) -> EstimatorOutput:
    """The registry's compute function of ``hh`` (``registry.py``): the AUC by Hansen-Hurwitz. ``options["draws"]``:
    the :class:`PopularityDraws` of a popularity design (``estimators.estimate`` passes them); without it the
    histogram is uniform (binomial or hypergeometric: (n - 1)(r~ - 1)/m is unbiased for R - 1 under both)."""
    if spec.kind not in HH_METRICS:
        raise ValueError(f"metric: 'hh' estimates {', '.join(HH_METRICS)} only (linear in the rank), got {spec}")
    d = options.get("draws")
    design = "popularity" if d is not None else sampling
    if d is None:
        check_without_replacement(hist.n_items, hist.n_samples, sampling)
        d = _uniform_draws(hist)
    auc = 1.0 - (d.s1 / d.m) / (d.n - 1.0)
    value, se = _mean_se(auc, d.w)
    total = float(d.w.sum())
    within = _within_var(d) / (d.n - 1.0) ** 2
    s = _summary(d)
    details = {"method": method, "design": design, "stderr_sampling":
               math.sqrt(float(d.w @ within)) / total if np.all(np.isfinite(within)) else None, **s}
    if d.rare is not None:
        details["rare_share"] = d.rare
    flags: tuple[str, ...] = ()
    if (s["ess_share"] is not None and s["ess_share"] < ESS_SHARE_FLAG) or (d.rare or 0.0) > RARE_SHARE_FLAG:
        flags = ("weights_concentrated",)
    return EstimatorOutput(value, se, total, details, flags)



# --------------------------------------------------------------------------------- pl_fit: top-K metrics
def _uniform_units(hist: RankHistogram) -> Units:
    """The cells of a uniform histogram (with replacement) as :class:`~reco_sampled_plugin._popularity_fit.Units`:
    one popularity class holding the n - 1 candidates, r~ - 1 beating and m - r~ + 1 other draws (the binomial
    likelihood; draws are not made distinct: under the uniform law the count is what is known), the count as the
    weight."""
    parts = []
    for n, m, c in zip(hist.n_items, hist.n_samples, hist.counts):
        b = np.arange(len(c), dtype=np.float64)  # r~ - 1
        keep = c > 0
        k = int(keep.sum())
        parts.append((np.full(k, float(n)), np.full(k, float(m)), b[keep], c[keep]))
    n, m, b, w = (np.concatenate([p[i] for p in parts]) if parts else np.zeros(0) for i in range(4))
    col = lambda x: x.reshape(-1, 1)  # noqa: E731
    return Units(col(n - 1.0), col(b), col(m - b), n, m, w, np.zeros(1), np.ones(1), distinct=False)


def _kept_uniform_units(hist: RankHistogram) -> Units:
    """:func:`_uniform_units` of ``hist``, kept on it (``RankHistogram._derived``), with the fits they keep."""
    return hist._derived("pl_fit_units", lambda: _uniform_units(hist))


def pl_fit(sampled: SampledRanks, weights: TensorLike | None = None,
           strata: str = "positive", count_term: str = "on") -> PopularityFit | StratifiedFit:
    """The fitted model of ``pl_fit`` (module ``_popularity_fit``) on popularity-sampled
    :class:`~reco_sampled_plugin.ranking.SampledRanks` (or uniform ones).

    One fit (:class:`~reco_sampled_plugin._popularity_fit.PopularityFit`): ``.betas``, ``.loglik``, ``.best``
    (index of the chosen beta), ``.curve_set`` (the interval's (top, deep) pairs), ``.estimate(spec)``,
    ``.bounds(spec)``; the niche-top test: ``.niche`` (rejected), ``.niche_lr`` (its statistic), the two branches'
    optima ``.best_constrained`` / ``.best_free`` and curve sets ``.curve_set_constrained`` / ``.curve_set_free``.
    Where ``strata="positive"`` (the default) splits the positives by their own popularity
    (``_popularity_fit.strata``: at least 2 x ``STRATUM_MIN`` positives whose weights the draw kept), a
    :class:`~reco_sampled_plugin._popularity_fit.StratifiedFit`: ``.fits`` (one such fit per stratum), ``.groups``,
    ``.shares``, ``.estimate(spec)``, ``.bounds(spec)``, ``.niche`` (any stratum's). ``strata="none"``: one fit.
    ``count_term``: the likelihood's count term (``_popularity_fit.COUNT_TERMS``), as the estimator's option.
    The fit is kept with ``sampled`` (on its popularity units, or on its histogram for uniform draws): this call again,
    and ``estimate`` of any metric with the same options, fit once. It lives as long as the draw it came from, at
    most 2 per units (``Units._derived_max``; a fit holds about 100 times the units' data); ``.units`` (read-only
    arrays) is a copy of those units that keeps nothing, so a dropped draw frees its fits at once. Refusals as
    :func:`popularity_draws`; adaptive draws refused naming ``sampled``."""
    design = _fixed_m(sampled)
    if design is not None and design.popularity is not None:
        units = popularity_draws(sampled, weights).units
        if units is None:
            raise ValueError(_NO_PROFILE.replace("sampled_ranks:", "sampled:", 1))
        return _fit_units(units, strata, count_term)
    if design is not None and not design.replacement:
        raise ValueError("sampled: pl_fit models draws with replacement; these were drawn without")
    return _fit_units(_kept_uniform_units(sampled.histogram(weights)), strata, count_term)


def _fit_details(f: PopularityFit, spec: MetricSpec, prior: str) -> dict:
    """One fit's tilt and niche test for ``details`` (with both branches' values where the test rejected)."""
    out = {"beta": f.beta_of(), "niche_lr": f.niche_lr, "beta_constrained": f.beta_of(f.best_constrained),
           "beta_free": f.beta_of(f.best_free)}
    if f.niche:
        out["branch_values"] = (f.estimate(spec, f.best_constrained, prior=prior)[0],
                                f.estimate(spec, f.best_free, prior=prior)[0])
    return out


class _TopBounds:
    """The interval of ``pl_fit`` where the top is unresolved: what :class:`~reco_sampled_plugin.Estimate`
    reads from an identification (``interval(level)`` with ``lo``/``hi``, ``metric_range``). The hull (lp_lo, lp_hi)
    is the metric's range over the top shapes and the 95% likelihood set of beta, at every ``level`` (as the uniform
    identified set does not depend on it); only the sampling widening, z(level) x stderr, follows ``level``."""

    def __init__(self, lo: float, hi: float, stderr: float, metric_range: tuple[float, float], details: dict) -> None:
        self.lp_lo, self.lp_hi, self.stderr, self.metric_range, self.details = lo, hi, stderr, metric_range, details

    def interval(self, level: float = 0.95) -> IdentifiedInterval:
        from .identification import IdentifiedInterval

        z = z_value(level)
        lo = max(self.metric_range[0], self.lp_lo - z * self.stderr)
        hi = min(self.metric_range[1], self.lp_hi + z * self.stderr)
        return IdentifiedInterval(lo, hi, self.lp_lo, self.lp_hi, level, (), dict(self.details))


def estimate_by_pl_fit(spec: MetricSpec, hist: RankHistogram, *, method: str, sampling: str, options: dict) -> EstimatorOutput:
    """The registry's compute function of ``pl_fit``: any metric from the fitted model (module ``_popularity_fit``).
    ``options["draws"]``: the :class:`PopularityDraws` of a popularity design; without it a uniform histogram
    (with replacement: the model's one-class binomial likelihood). Under popularity sampling the output carries
    the interval of the unresolved top (``identification``): the hull over the 95% set of beta and the top shapes
    allowed, widened by 1.96 standard errors. ``options["niche"]``: ``"hedge"`` (default: where the niche test
    rejects beta_top >= beta_deep, the harmonic mean of both branches' values) or ``"constrained"`` (the constrained
    fit's value). ``options["rank_prior"]``: ``"spline"`` (default: the g-modelling prior refitted at the chosen tilt) or
    ``"em"`` (the EM prior the tilt was chosen with). ``options["strata"]``: ``"positive"`` (default: the positives
    split in two by their own popularity and fitted apart, where each half holds ``STRATUM_MIN`` positives and the
    draw kept their weights) or ``"none"``. ``options["count_term"]``: ``"on"`` (default: the drawn items'
    memberships conditioned on |A| = R - 1 in the single-rank cells) or ``"off"`` (independent given R). ``details``: ``beta`` (the constrained fit's), ``rank_prior``,
    ``niche_top`` (the test rejected), ``niche_lr``,
    ``beta_constrained``, ``beta_free``, and where it rejected ``branch_values`` (constrained, free); stratified,
    ``beta``, ``niche_lr``, ``beta_constrained`` and ``beta_free`` hold one entry per stratum, ``niche_top`` whether
    any stratum's test rejected, and ``strata`` each stratum's details with its ``share`` of the positives, its
    ``value`` and ``covariate_range`` (log weight of its positives)."""
    from .metrics import metric_bounds

    d = options.get("draws")
    if d is None:
        check_without_replacement(hist.n_items, hist.n_samples, sampling)
        if sampling != "binomial":
            raise ValueError("sampling: pl_fit models draws with replacement (binomial law); use mle or mes for "
                             "draws without replacement")
        units = _kept_uniform_units(hist)
    else:
        units = d.units
        if units is None:
            raise ValueError(_NO_PROFILE)
    f = _fit_units(units, options.get("strata", "positive"), options.get("count_term", "on"))
    prior = options.get("rank_prior", "spline")
    hedge = options.get("niche", "hedge") == "hedge"
    value, se, _ = f.estimate(spec, hedge=hedge, prior=prior)
    details = {"method": method, "design": "popularity" if d is not None else sampling, "loglik": f.loglik,
               "niche_top": f.niche, "rank_prior": prior}
    if isinstance(f, StratifiedFit):
        cov = f.units.covariate
        assert cov is not None  # strata exist only where the positives' weights were kept
        details["strata"] = [dict(_fit_details(g, spec, prior), share=float(sh),
                                  value=g.estimate(spec, hedge=hedge, prior=prior)[0],
                                  covariate_range=(float(cov[rows].min()), float(cov[rows].max())))
                             for g, sh, rows in zip(f.fits, f.shares, f.groups)]
        for k in ("beta", "niche_lr", "beta_constrained", "beta_free"):  # one entry per stratum
            details[k] = tuple(st[k] for st in details["strata"])
    else:
        details.update(_fit_details(f, spec, prior))
    if prior == "spline":
        details["spline_unconverged"] = f.spline_unconverged  # spline fits short of their tolerances (0: none)
    ident = None
    if d is not None:
        lo, hi, extra = f.bounds(spec, prior=prior)
        details.update(extra)
        details["identified"] = (lo, hi)
        if hi - lo > 1e-9 * max(1.0, abs(value)):
            ident = _TopBounds(lo, hi, se, metric_bounds(spec, hist.n_items), details)
    return EstimatorOutput(value, se, float(units.w.sum()), details, (), ident)
