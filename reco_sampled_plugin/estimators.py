"""One entry point for every estimator of a global metric from sampled ranks: ``estimate(metric, sample, method)``.

``sample`` carries its design and candidate counts: a :class:`~reco_sampled_plugin.ranking.SampledRanks` (from a
draw, or ``SampledRanks.from_arrays(ranks, n_items, n_samples, design)`` for ranks drawn elsewhere) or a
:class:`~reco_sampled_plugin._rank_hist.RankHistogram` (the adapters' mergeable state, its ``design`` the law and
adaptive stages). ``method`` is a registered name or the estimator's options object (``Bv(gamma=0.2)``,
``Mes(n_bootstrap=0)``, ``Gmod(max_rel_n_spread=0.1)``: the classes of :mod:`~reco_sampled_plugin.registry`, each
option checked at construction). ``estimate`` works on the sampled-rank histogram (built once, any device,
per-positive n and m allowed) and returns the value with its standard error. The methods are the registry's (every
list of methods is derived from it, and ``estimate`` dispatches through each entry's compute function); the
built-in ones:

==================  =======================================================================================
method              estimator
==================  =======================================================================================
``auto``            the default: ``gmod`` where the design resolves the top, ``mes`` elsewhere; ``hh`` / ``pl_fit``
                    under popularity designs
``linear``          Li et al. eq. 9 mapping, interpolated between mapped points (``mapping.py``)
``bound``           Li et al. eq. 13
``beta``            Li et al. eq. 16-17 with the given ``a`` (a = 1: eq. 18)
``beta_fit``        Li et al. eq. 19: a fitted on these sampled ranks
``mle``             rank distribution by EM, then sum_R P^(R) M(R) (``rank_distribution.py``)
``mes``             maximum-entropy-regularised rank distribution
``gmod``            g-modelling: log P(R) a penalised B-spline in log R
``none``            the uncorrected sampled metric            (correction tables, ``corrections.py``)
``rank_estimate``   Krichene & Rendle eq. 20
``ls``, ``cls``     minimal-bias least squares, monotone constrained least squares (eq. 21-23)
``bv``              bias-variance trade-off (eq. 24-25) with ``gamma`` and ``prior``
``bv_mle``          ``bv`` with the prior p(r) estimated by ``mle`` on the same sampled ranks
``hh``              Hansen-Hurwitz AUC (and mean rank): uniform and popularity designs (``popularity.py``)
``pl_fit``          every metric under popularity sampling: a Plackett-Luce model of the items above each positive
``diff``            the difference estimator on an exact share (``SamplingDesign(m, exact_share=...)``): ``auto``'s
                    choice whenever a sample carries one (``_design_based.py``); its interval holds by design
==================  =======================================================================================

Standard errors: for table methods (mapping and corrections) the sample standard deviation of the
per-positive table values over sqrt(#positives); for the fitted methods a multinomial bootstrap of the
histogram (see ``rank_distribution``), or with ``n_bootstrap=0`` the cheap posterior standard error
(sd of the per-positive posterior means; ignores the uncertainty of the fitted distribution). ``bv_mle`` ignores
the uncertainty of its estimated prior. Fitted rank distributions of the last few histograms are kept: estimating
several metrics from one histogram with one method object fits once (fits are deterministic: the bootstrap is
seeded).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from ._rank_hist import RankHistogram, pool_by_n
from ._checks import check_without_replacement
from . import registry
from ._adaptive_law import adaptive_cost, check_adaptive_histogram
from ._auto import auto_choice
from .design import AdaptiveDesign, SamplingDesign
from ._estimate import Estimate, in_range
from .identification import Identification, TopShape, resolution, top_sensitive
from .metric_names import MetricSpec, parse_metric
from .metrics import metric_bounds
from ._sampled import SampledRanks
from ._types import TensorLike

__all__ = ["ESTIMATORS", "METHOD_OPTIONS", "estimate"]

def __getattr__(name: str) -> Any:
    # live views of the registry (an estimator registered later appears in them)
    if name == "ESTIMATORS":
        return registry.names()
    if name == "METHOD_OPTIONS":
        return registry.method_options()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")




def _result(value: float, stderr: float | None, n: float, details: dict, flags: Iterable[str],
            bounds: tuple[float, float] | None = None, identification: Identification | None = None) -> Estimate:
    """Package the estimate; ``bounds`` (lo, hi): the metric's range, a value outside it is flagged
    ``outside_metric_range`` (e.g. ``ls``, whose minimal-bias table has huge alternating entries);
    ``identification``: where the metric depends on the unresolved top, what widens the interval (flagged
    ``top_unresolved``)."""
    if not math.isfinite(value):
        raise ValueError(f"estimate: the estimator produced a non-finite value ({value}); details: {details}")
    if stderr is None:
        raise ValueError("estimate: no standard error available (n_bootstrap < 2); ask for n_bootstrap >= 2")
    se = float(stderr)
    flags = tuple(flags)
    if math.isnan(se) or float(n) <= 1.0:  # one instance (total weight <= 1): no spread to measure
        se = math.inf
        flags += ("few_instances",) if "few_instances" not in flags else ()
    value, flags, details = in_range(float(value), flags, details, bounds)  # the point is in the metric's range
    if identification is not None and "top_unresolved" not in flags:
        flags += ("top_unresolved",)
    details["flags"] = tuple(flags)
    if identification is not None:
        details["interval"] = "identified"
    metric_range = None if bounds is None else (float(bounds[0]), float(bounds[1]))
    return Estimate(float(value), se, float(n), details, tuple(flags), identification, metric_range,
                    _shift_bounds(details))


def _shift_bounds(details: Mapping[str, Any]) -> tuple[float, float] | None:
    """How far the estimate may be shifted each way (down, up), which ``Estimate.interval``'s bias-aware ends
    cover: ``gmod``'s twin gap, or a correction table's plug-in bias (``corrections.plug_in_bias``; its sign is
    estimated, so both ways)."""
    twin = details.get("twin_gap")
    if twin is not None:
        return (float(twin[0]), float(twin[1]))
    bias = details.get("table_bias")
    return None if bias is None else (abs(float(bias)), abs(float(bias)))


def _with_adaptive(result: Estimate, hist: RankHistogram, design: AdaptiveDesign, top_shape: TopShape | None,
                   spec: MetricSpec | None = None) -> Estimate:
    """The estimate of adaptive ranks: the identified interval under the stopping law, the cost in
    ``details["adaptive"]``, ``cap_reached`` where positives still rank first at the cap and the metric depends
    on the top there. With exact groups (``exact_at_cap``) ``top_unresolved`` follows from the known ranks
    (``identification.top_sensitive``, an exact group resolved to single ranks), not from the fit's flag, which
    reads an exact group's resolution as (n - 1)/n + 1."""
    ident = result.identification
    if ident is not None:
        ident = Identification(ident.spec, ident.hist, ident.sampling, top_shape, adaptive=design)
    cost = adaptive_cost(hist, design)
    flags = tuple(result.flags)
    if hist.has_exact and spec is not None and not top_sensitive(spec, hist):
        flags = tuple(f for f in flags if f != "top_unresolved")
    if ident is not None and cost.share_first_at_cap > 0 and "cap_reached" not in flags:
        flags += ("cap_reached",)
    details = dict(result.details)
    details["adaptive"] = cost.as_dict()
    details["flags"] = flags
    return dataclasses.replace(result, details=details, flags=flags, identification=ident)


def _merge_flags(flags: Iterable[str], extra: Iterable[str]) -> tuple:
    return tuple(flags) + tuple(f for f in extra if f not in flags)


def _available(spec: MetricSpec, design: SamplingDesign | None) -> str:
    """What estimates ``spec`` under ``design`` (None: any design), for refusals: the registry's methods, and under
    popularity sampling (where only the uncorrected ``none`` remains, e.g. draws without replacement for a top-K
    metric) which corrected estimators that design takes."""
    ok = registry.names(design=design, metric=spec)
    text = f"for {spec} use one of {ok}"
    if design is not None and design.popularity is not None and not [n for n in ok if registry.get(n).family != "none"]:
        takes = [f"{n} ({', '.join(registry.get(n).metrics or ('every metric',))})" for n in registry.names(design=design)
                 if registry.get(n).family != "none"]
        there = (f"corrected there: {', '.join(takes)}" if takes else "popularity draws without replacement are not "
                 "independent and keep no per-draw statistics, so nothing corrects them: draw with replacement "
                 "(SamplingDesign(m, popularity=w)) for hh and pl_fit")
        text += (f" (the uncorrected sampled metric): no registered estimator corrects {spec} under this "
                 f"popularity design (docs/popularity.md); {there}")
    return text


def _refuse_design(entry: registry.Estimator, spec: MetricSpec, design: SamplingDesign) -> None:
    """A ValueError naming ``method`` where ``entry`` does not take ``design``."""
    if entry.supports(design):
        return
    extra = ""
    if design.adaptive_max is not None and not entry.adaptive:
        extra = (f"; {entry.name!r} assumes one fixed m per positive, adaptive sampling needs a likelihood estimator: "
                 f"one of {registry.names(adaptive=True)}")
    raise ValueError(f"method: {entry.name!r} does not support the design of these ranks ({design.describe()}); "
                     f"{_available(spec, design)}{extra}")


def _sample_histogram(sample: Any, entry: registry.Estimator, weights: TensorLike | None
                      ) -> tuple[RankHistogram, SamplingDesign | None]:
    """The histogram (empty groups dropped) and design of ``sample``: a SampledRanks (its completed positives
    as exact groups for the estimators that read them, else their r~) or a RankHistogram."""
    if isinstance(sample, SampledRanks):
        if sample.design is None:
            raise ValueError("sample: these SampledRanks carry no design; build them with "
                             "SampledRanks.from_arrays(ranks, n_items, n_samples, design)")
        r = sample.ranks
        if r.is_floating_point() and bool((r != torch.round(r)).any()):
            raise ValueError("sample: fractional sampled ranks (ties='average' counts each draw tied with the relevant "
                             "item one half: an expectation over the orders of the ties, not a draw); the estimators "
                             "read whole ranks: rank with ties='random' (a whole rank per relevant item, the same "
                             "expected metric) or 'pessimistic'")
        return sample.histogram(weights, exact=entry.exact_groups).without_empty_groups(), sample.design
    if isinstance(sample, RankHistogram):
        if weights is not None:
            raise ValueError("weights: a RankHistogram holds (weighted) counts already; weight the positives when "
                             "building it, or pass the SampledRanks")
        return sample.without_empty_groups(), sample.design
    raise ValueError(f"sample: expected SampledRanks (SampledRanks.from_arrays(ranks, n_items, n_samples) for "
                     f"plain arrays) or a RankHistogram, got {type(sample).__name__}")


def _refuse_metric(spec: MetricSpec, entry: registry.Estimator, hist: RankHistogram, law: str,
                   design: SamplingDesign | None, popularity: bool) -> None:
    """A ValueError naming ``metric`` where ``entry`` does not estimate ``spec``'s kind."""
    if entry.takes_metric(spec.kind):
        return
    check_without_replacement(hist.n_items, hist.n_samples, law)
    raise ValueError(f"metric: method {entry.name!r} estimates {', '.join(entry.metrics or ())} only; "
                     f"{_available(spec, design if popularity else None)}")


def auc_stderr_floor(hist: RankHistogram, law: str = "binomial") -> float:
    """The least standard error of an AUC estimate from uniform draws (``law``: ``"binomial"``, with replacement, or
    ``"hypergeometric"``, without): the AUC is the chance that a drawn irrelevant item scores below the relevant
    one, and the histogram's sampled groups hold N = sum of m over their positives such draws, K of them below
    (m + 1 - r~ per positive). Of draws all alike (every positive the same AUC p) the sample proportion K / N is
    the unbiased estimate of least variance, p (1 - p) / N (times the finite-population factor
    (n - 1 - m) / (n - 2) without replacement); positives whose AUCs differ add their spread to the variance of
    the mean over positives that the standard errors target. Where every draw fell on one side (every positive at
    r~ = 1, or at m + 1) the positives' own spread is 0 and an interval of width 0 would claim what the draws
    cannot tell: p is taken as Agresti & Coull's p~ = (K + 2) / (N + 4) over N + 4 draws (The American
    Statistician 1998, "Approximate is better than 'exact' for interval estimation of binomial proportions"), the
    interval still centred on the estimate. Exact groups (ranked, not drawn) add nothing; 0 without draws."""
    drawn = ~hist.exact
    if not drawn.any():
        return 0.0
    m = hist.n_samples[drawn].astype(np.float64)
    below = np.concatenate([np.arange(int(mg), -1, -1, dtype=np.float64) for mg in m])  # m + 1 - r~
    flat = np.concatenate([row for row, keep in zip(hist.counts, drawn) if keep])
    k = float(flat @ below)
    totals = hist.totals[drawn]
    n = float(totals @ m)
    if n <= 0:
        return 0.0
    p = (k + 2.0) / (n + 4.0)
    fpc = 1.0
    if law == "hypergeometric":  # draws without replacement from the n - 1 irrelevant candidates of each group
        pool = hist.n_items[drawn].astype(np.float64) - 1.0
        fpc = float(totals @ (m * np.clip((pool - m) / np.maximum(pool - 1.0, 1.0), 0.0, 1.0))) / n
    return math.sqrt(p * (1.0 - p) / (n + 4.0) * fpc)


def _fixed(spec: MetricSpec, hist: RankHistogram, law: str, method: registry.Method, draws: Any,
           floor: bool = True) -> Estimate:
    """The estimate of a fixed-m histogram (or an adaptive one read by a likelihood): pooling of n, the
    identified interval of the unresolved top, the entry's compute, the packaged result. ``floor``: an AUC's
    stderr at least :func:`auc_stderr_floor` (fixed-m uniform draws; not adaptive or popularity designs)."""
    entry = type(method).entry
    pooled = pool_by_n(hist, method.max_rel_n_spread)
    # popularity estimators read each positive's draws, never the pooled groups: nothing of theirs is pooled
    pool_flag = [] if pooled.same_groups(hist) or draws is not None else ["pooled_n"]
    hist = pooled
    if spec.k is not None and spec.k > int(hist.n_items[hist.totals > 0].min()):
        raise ValueError(
            f"metric: cut-off K = {spec.k} is larger than the catalogue (n_items = {int(hist.n_items.min())})"
        )
    # the metric's range; the plain sampled metric's own over m + 1 candidates (m + 1 > n: draws with replacement)
    bounds = metric_bounds(spec, hist.n_samples + 1 if entry.family == "none" else hist.n_items)
    if method.top_shape is not None and draws is not None:
        raise ValueError("top_shape: popularity-sampled ranks take the estimator's own top shapes (pl_fit: from uniform "
                         "to 1/r inside each positive's top zone, docs/popularity.md); drop top_shape")
    # the uniform law's identified interval; popularity draws: the estimator's own (pl_fit), if any
    ident = Identification(spec, hist, law, method.top_shape) if (entry.family != "none" and draws is None
                                                                   and top_sensitive(spec, hist)) else None
    opts = method.options()
    res = entry.compute_function()(spec, hist, method=entry.name, sampling=law,
                                   options=opts if draws is None else {**opts, "draws": draws})
    registry.check_output(entry.name, res)
    if draws is not None:
        ident = getattr(res, "identification", None)
    # a mapping's interval is its sampling noise alone: its bias (unknown, the rank distribution's) is flagged
    bias_flag = ["interval_omits_bias"] if entry.family == "mapping" else []
    stderr, details = res.stderr, res.details
    if floor and spec.kind == "auc" and draws is None and stderr is not None:
        least = auc_stderr_floor(hist, law)
        if stderr < least:  # the draws' own binomial noise: never an interval narrower than it
            stderr, details = least, {**details, "stderr_floor": least}
    return _result(res.value, stderr, res.n_instances, details,
                   _merge_flags(res.flags, pool_flag + bias_flag), bounds, ident)


def _adaptive(spec: MetricSpec, hist: RankHistogram, method: registry.Method, design: AdaptiveDesign) -> Estimate:
    """The estimate of adaptive ranks: the likelihood's (which ignores the stopping rule) with the design's
    identified interval and cost (:func:`_with_adaptive`)."""
    check_adaptive_histogram(hist, design)
    return _with_adaptive(_fixed(spec, hist, "binomial", method, None, floor=False), hist, design, method.top_shape,
                          spec)


def estimate(
    metric: str | MetricSpec,
    sample: SampledRanks | RankHistogram,
    method: str | registry.Method = registry.DEFAULT_ESTIMATOR,
    *,
    weights: TensorLike | None = None,
) -> Estimate:
    """Estimate a global (full-catalogue) metric from sampled ranks, with a standard error.

    Args:
        metric: metric name (``"hit@10"``, ``"ndcg@10"``, ``"ap"``, ``"auc"``, ...).
        sample: a :class:`~reco_sampled_plugin.ranking.SampledRanks` (from a draw, which carries its design,
            candidate counts and sizes, popularity statistics and exact ranks; or
            ``SampledRanks.from_arrays(ranks, n_items, n_samples, design)`` for ranks drawn elsewhere), or a
            :class:`~reco_sampled_plugin._rank_hist.RankHistogram` (the adapters' mergeable state; its ``design``
            gives the law and any adaptive stages).
        method: a registered estimator's name (``registry.names()``; the module docstring) or its options
            object (``Bv(gamma=0.2)``, ``Mes(n_bootstrap=0)``, ``Gmod(df=8)``, ``Auto(seed=1)``: the classes of
            :mod:`~reco_sampled_plugin.registry`, each option checked at construction). Default ``auto``
            (``registry.AUTO_CHOICES``): ``gmod`` where the design resolves the top, ``mes`` elsewhere, ``none``
            (the sampled AUC: unbiased) for AUC at a fixed m, ``hh`` (AUC) / ``pl_fit`` under popularity designs,
            ``diff`` on a sample with an exact share (``details["auto"]`` says which and why).
        weights: optional per-positive frequency weights (a SampledRanks only): their sum is the number of
            instances that standard errors (and bootstraps) assume, so scale them to it (e.g. 1/|T_u| per
            positive: one per user); a total of at most 1 gives stderr inf, flagged ``few_instances``.

    Returns:
        :class:`~reco_sampled_plugin.Estimate` (value, stderr, n_instances, details, flags). Where the
        metric depends on the shape of the rank distribution inside the first sampled bin (a cut-off below the
        resolution b = (n - 1)/(m + 1) + 1, or AP/RR/NDCG once b >= 2; flag ``top_unresolved``),
        ``interval(level)`` also spans every value the data allow under the method's ``top_shape``
        (``identification.py``); the ``none`` method (the sampled metric itself) keeps its sampling interval.
        Adaptive designs: ``details["adaptive"]`` reports the cost, ``cap_reached`` flags a metric still
        depending on the top at the cap.

    Raises:
        ValueError: unknown method, empty histogram, cut-off K above n, invalid sizes, a design or metric the
            method does not take.
    """
    spec = parse_metric(metric)
    method = registry.as_method(method)
    entry = type(method).entry
    shared = getattr(sample, "share_ranks", None) is not None or getattr(sample, "share", None) is not None
    if entry.family == "design_based" or (entry.family == "auto" and shared):
        from ._design_based import estimate_design_based  # an exact share: the difference estimator (its module)

        result = estimate_design_based(spec, sample, method, weights,
                                       lambda auto: estimate(spec, sample, auto, weights=weights))
        if entry.family == "auto":
            auto_details = {"method": "diff", "reason": "the sample carries an exact share"}
            result = dataclasses.replace(result, details={**result.details, "auto": auto_details})
        return result
    hist, design = _sample_histogram(sample, entry, weights)
    if design is not None and not entry.supports(design):  # the data's own checks first, as every method makes them
        hist.check_nonempty(weights)
        check_without_replacement(hist.n_items, hist.n_samples, design.law)
        _refuse_design(entry, spec, design)
    popularity = design is not None and design.popularity is not None
    # popularity: the law-free ``none`` or a method that reads the draws' weights (``hh``), never a binomial table
    law = "binomial" if design is None or popularity else design.law
    hist.check_nonempty(weights)
    if hist.has_exact and not entry.exact_groups:  # it would read an exact rank R as a sampled rank among n - 1
        hist = hist.completed_as_sampled()  # the completed positives at r~ = 1 among the cap's draws
    hist.check_support(law)  # every method: an r~ the design cannot produce is refused, not estimated from
    auto = None
    if entry.family == "auto":  # the registry's choice for this design and metric, run under its own name
        method, auto = auto_choice(spec, method, hist, design)
        entry = type(method).entry
    _refuse_metric(spec, entry, hist, law, design, popularity)
    adaptive = None if design is None else design.adaptive
    if adaptive is not None and law != "binomial":  # pragma: no cover - SamplingDesign refuses it
        raise ValueError("sampling: adaptive sampling draws with replacement (binomial law)")
    if adaptive is not None:
        result = _adaptive(spec, hist, method, adaptive)
    else:
        draws = None
        if popularity and entry.family != "none":
            from .popularity import popularity_draws

            draws = popularity_draws(sample, weights)  # type: ignore[arg-type]  # a SampledRanks under popularity
        result = _fixed(spec, hist, law, method, draws, floor=not popularity)
    if entry.family == "none" and not (spec.kind == "auc" and adaptive is None and not popularity):
        # the plain sampled metric: an estimate of the full-catalogue one only for AUC at a fixed uniform m
        flags = result.flags + ("uncorrected",)
        result = dataclasses.replace(result, flags=flags, details={**result.details, "flags": flags})
    if auto is not None:
        result = dataclasses.replace(result, details={**result.details, "auto": auto})
    return result

