"""One entry point for every estimator of a global metric from sampled ranks.

``estimate(metric, sampled)`` (a :class:`~reco_sampled_plugin.ranking.SampledRanks` that carries its design
and candidate counts) or ``estimate(metric, sampled_ranks, n_items, n_samples, method=...)`` works on the
sampled-rank histogram (built once, any device, per-positive n and m allowed) and returns the value with its
standard error. The methods are the estimator registry's (``registry.py``: every list of methods is derived
from it, and ``estimate`` dispatches through each entry's compute function); the built-in ones:

==================  =======================================================================================
method              estimator
==================  =======================================================================================
``linear``          Li et al. eq. 9 mapping, interpolated between mapped points (``mapping.py``)
``bound``           Li et al. eq. 13
``beta``            Li et al. eq. 16-17 with the given ``a`` (a = 1: eq. 18)
``beta_fit``        Li et al. eq. 19: a fitted on these sampled ranks
``mle``             rank distribution by EM, then sum_R P^(R) M(R) (``rank_distribution.py``)
``mes``             maximum-entropy-regularised rank distribution
``none``            the uncorrected sampled metric            (correction tables, ``corrections.py``)
``rank_estimate``   Krichene & Rendle eq. 20
``ls``, ``cls``     minimal-bias least squares, monotone constrained least squares (eq. 21-23)
``bv``              bias-variance trade-off (eq. 24-25) with ``gamma`` and ``prior``
``bv_mle``          ``bv`` with the prior p(r) estimated by ``mle`` on the same sampled ranks
``hh``              Hansen-Hurwitz AUC (and mean rank): uniform and popularity designs (``popularity.py``)
``pl_fit``          every metric under popularity sampling: a Plackett-Luce model of the items above each positive
==================  =======================================================================================

Standard errors: for table methods (mapping and corrections) the sample standard deviation of the
per-positive table values over sqrt(#positives); for ``mle``/``mes`` a multinomial bootstrap of the
histogram (see ``rank_distribution``), or with ``n_bootstrap=0`` the cheap posterior standard error
(sd of the per-positive posterior means; ignores the uncertainty of the fitted distribution). ``bv_mle`` ignores the uncertainty of its estimated prior.
The correction methods need ``reco_sampled_plugin.corrections`` (imported lazily).
Fitted rank distributions (``mle``, ``mes``, the prior of ``bv_mle``) of the last few histograms are kept:
estimating several metrics from one histogram with one method and options fits once (fits are
deterministic: the bootstrap is seeded).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Iterable, Mapping

import numpy as np

from ._rank_hist import RankHistogram, as_histogram, pool_by_n
from ._checks import check_without_replacement
from ._options import check_law, check_options
from . import registry
from .adaptive import adaptive_cost, check_adaptive_histogram
from .design import AdaptiveDesign, SamplingDesign, coerce_adaptive
from ._estimate import Estimate, EstimatorOutput, range_flags
from .identification import Identification, TopShape, resolution, top_sensitive
from .metric_names import MetricSpec, parse_metric
from .metrics import metric_bounds
from .ranking import SampledRanks
from ._types import TensorLike
from .priors import PriorLike
from .rank_distribution import FIT_CACHE as _FITS  # noqa: F401  (``estimators._FITS.clear()`` refits, as before)

__all__ = ["ESTIMATORS", "METHOD_OPTIONS", "estimate", "EstimatorResult", "check_estimator_options"]

# keyword arguments of ``estimate`` itself that every method takes
_COMMON_OPTIONS = ("max_rel_n_spread", "top_shape")


def __getattr__(name: str) -> Any:
    # live views of the registry (an estimator registered later appears in them)
    if name == "ESTIMATORS":
        return registry.names()
    if name == "METHOD_OPTIONS":
        return registry.method_options()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _named(entry: registry.Estimator) -> tuple[str, ...]:
    return tuple(o.name for o in entry.options if o.named)


def _refuse_unused(entry: registry.Estimator, named: dict) -> None:
    """Raise a ValueError naming the first of ``estimate``'s named options (a, gamma, prior, rounding) that was
    given (not None) although the method does not use it."""
    all_named = sorted({o.name for e in registry.entries() for o in e.options if o.named})
    for key, value in named.items():
        if value is not None and key not in entry.option_names:
            takes = _named(entry)
            users = [e.name for e in registry.entries() if key in e.option_names]
            raise ValueError(
                f"{key}: method {entry.name!r} does not use it (it takes {', '.join(takes) or 'none of ' + ', '.join(all_named)}"
                f"; {key} is an option of {', '.join(users)})"
            )


def _check_values(entry: registry.Estimator, opts: dict) -> dict:
    """Every option's value validated by its registry kind (a ValueError naming it); returns them normalised,
    a named option given as None (or not given) replaced by its default."""
    out = {}
    for k, v in opts.items():
        o = entry.option(k)
        if o is None:
            out[k] = v
        elif v is None and o.named:
            out[k] = o.default
        else:
            out[k] = o.check(v)
    return out


def check_estimator_options(method: str, options: Mapping[str, Any], where: str | None = None) -> dict:
    """Validate the keyword arguments ``options`` of ``estimate(..., method=method, **options)`` without data
    (e.g. when a metric class is constructed, long before its first ``compute``): every key must be one the
    method uses (its registry entry's options, plus ``max_rel_n_spread`` and ``top_shape``) and every value
    valid. Raises a ValueError naming the option; returns the options as a dict."""
    entry = registry.get(method)
    where = where or f"estimate(method={method!r})"
    opts = check_options(options, entry.option_names + _COMMON_OPTIONS, where)
    _check_values(entry, {k: v for k, v in opts.items() if k not in _COMMON_OPTIONS})
    if "max_rel_n_spread" in opts:
        from ._rank_hist import check_spread

        check_spread(opts["max_rel_n_spread"])
    if opts.get("top_shape") is not None and not isinstance(opts["top_shape"], TopShape):
        raise ValueError(f"top_shape: expected an identification.TopShape, got {type(opts['top_shape']).__name__}")
    return opts


#: the former name of :class:`~reco_sampled_plugin.Estimate` (kept so that old imports work): ``estimate``
#: returns an ``Estimate``, the one result type of the package
EstimatorResult = Estimate


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
    flags = range_flags(float(value), flags, bounds)
    if identification is not None and "top_unresolved" not in flags:
        flags += ("top_unresolved",)
    details = dict(details)
    details["flags"] = tuple(flags)
    if identification is not None:
        details["interval"] = "identified"
    metric_range = None if bounds is None else (float(bounds[0]), float(bounds[1]))
    twin = details.get("twin_gap")
    return Estimate(float(value), se, float(n), details, tuple(flags), identification, metric_range,
                    None if twin is None else (float(twin[0]), float(twin[1])))


def auto_method(spec: MetricSpec, hist: RankHistogram, design: AdaptiveDesign | None) -> tuple[str, str]:
    """What ``method="auto"`` runs on ``hist`` (``registry.AUTO_CHOICES``) and why: the ``resolved`` choice for an
    adaptive design or where every group with positives at r~ = 1 has its resolution b = (n - 1)/(m + 1) + 1 at
    most the metric's cut-off K; the ``unresolved`` one otherwise (a metric without cut-off counts as resolved
    only when no positive ranks first). Popularity-sampled ranks never reach here: ``estimate`` runs
    ``registry.popularity_auto`` on their SampledRanks (``hh`` for AUC, ``pl_fit`` otherwise)."""
    if design is not None:
        return registry.AUTO_CHOICES["resolved"], "adaptive design"
    occupied = hist.top_counts > 0
    if not np.any(occupied):
        return registry.AUTO_CHOICES["resolved"], "no positive ranked first"
    b = float(np.max(resolution(hist)[occupied]))
    if spec.k is not None and spec.k >= b:
        return registry.AUTO_CHOICES["resolved"], f"cut-off K = {spec.k} >= resolution b = {b:.3g}"
    why = f"cut-off K = {spec.k} < resolution b = {b:.3g}" if spec.k is not None else "no cut-off"
    return registry.AUTO_CHOICES["unresolved"], why


def estimate_auto(spec: MetricSpec, hist: RankHistogram, *, method: str, sampling: str, options: dict) -> EstimatorOutput:
    """The registry's compute function of ``auto`` on a bare histogram (fixed m per group): the chosen method's."""
    chosen, _ = auto_method(spec, hist, None)
    entry = registry.get(chosen)
    return entry.compute_function()(spec, hist, method=chosen, sampling=sampling, options=options)


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
        text += (f" (the uncorrected sampled metric): no registered estimator corrects {spec} under this "
                 f"popularity design (docs/popularity.md); corrected there: {', '.join(takes)}")
    return text


def _from_sampled(sampled: SampledRanks, n_items: Any, n_samples: Any, weights: TensorLike | None, sampling: str | None,
                  adaptive: Any, entry: registry.Estimator,
                  spec: MetricSpec) -> tuple[RankHistogram, str, AdaptiveDesign | None]:
    """The histogram, law and adaptive design of a :class:`SampledRanks` (which carries all three)."""
    if n_items is not None or n_samples is not None:
        name = "n_items" if n_items is not None else "n_samples"
        raise ValueError(f"{name}: the SampledRanks carry their candidate counts and sample sizes; drop {name}")
    design = sampled.design
    if design is None:
        raise ValueError("sampled_ranks: these SampledRanks carry no design; pass n_items and n_samples")
    if not entry.supports(design):
        raise ValueError(f"method: {entry.name!r} does not support the design of these ranks ({design.describe()}); "
                         f"{_available(spec, design)}")
    # popularity: the law-free ``none`` or a method that reads the draws' weights (``hh``), never a binomial table
    law = "binomial" if design.law == "popularity" else design.law
    if sampling is not None and check_law(sampling) != law:
        raise ValueError(f"sampling: {sampling!r} contradicts the design of these ranks ({design.describe()})")
    if adaptive is not None and coerce_adaptive(adaptive) != design.adaptive:
        raise ValueError(f"adaptive: contradicts the design of these ranks ({design.describe()})")
    # completed positives (exact_at_cap): exact groups for the estimators that read them, else their r~
    return sampled.histogram(weights, exact=entry.exact_groups), law, design.adaptive


def estimate(
    metric: str | MetricSpec,
    sampled_ranks: TensorLike | RankHistogram | SampledRanks,
    n_items: TensorLike | None = None,
    n_samples: TensorLike | None = None,
    method: str = registry.DEFAULT_ESTIMATOR,
    *,
    sampling: str | None = None,
    weights: TensorLike | None = None,
    a: float | None = None,
    gamma: float | None = None,
    prior: PriorLike = None,
    rounding: str | None = None,
    max_rel_n_spread: float | None = None,
    top_shape: TopShape | None = None,
    adaptive: SamplingDesign | AdaptiveDesign | tuple[int, int | None] | None = None,
    **options: Any,
) -> Estimate:
    """Estimate a global (full-catalogue) metric from sampled ranks, with a standard error.

    Args:
        metric: metric name (``"hit@10"``, ``"ndcg@10"``, ``"ap"``, ``"auc"``, ...).
        sampled_ranks: a :class:`~reco_sampled_plugin.ranking.SampledRanks` from a draw (it carries its design,
            candidate counts and sizes: nothing else is needed), or sampled ranks r~ in 1..m+1 (any shape,
            tensor or array, 0 = padding), or a :class:`~reco_sampled_plugin._rank_hist.RankHistogram`.
        n_items: n, candidates per instance (int or per-positive values); not with a SampledRanks.
        n_samples: m, sampled irrelevant items (int or per-positive values, e.g. from adaptive sampling); not
            with a SampledRanks.
        method: a registered estimator (``registry.names()``, see the module docstring); default ``auto``
            (``registry.DEFAULT_ESTIMATOR``: ``gmod`` where the design resolves the top, ``mes`` elsewhere, ``hh`` /
            ``pl_fit`` under popularity designs)
            (``registry.DEFAULT_ESTIMATOR``), the most accurate rank-distribution estimator on ml-100k
            (docs/estimators.md). Popularity-sampled ranks: ``hh`` (Hansen-Hurwitz, AUC) and ``pl_fit`` (every
            metric, under a Plackett-Luce model of the items above each positive; its interval spans the top's
            unidentified tilts) from the SampledRanks of the draw, which carry each positive's beating draws' 1/q~
            and popularity classes (bare ranks cannot: refused; docs/popularity.md).
        sampling: ``"binomial"`` (with replacement, the default) or ``"hypergeometric"`` (rank-distribution and
            correction methods; the mapping functions assume neither). With a SampledRanks: its design's law
            (a contradicting value is refused).
        weights: optional per-positive frequency weights: their sum is the number of instances that
            standard errors (and bootstraps) assume, so scale them to it (e.g. 1/|T_u| per positive: one
            per user); a total of at most 1 gives stderr inf, flagged ``few_instances``.
        a: Beta shape for ``beta`` (required there; a = 1 is eq. 18), the starting value for ``beta_fit``.
        gamma, prior, rounding: the corrections' options: ``gamma`` for ``bv`` and ``bv_mle`` (default 0.1),
            ``prior`` for ``ls``, ``cls`` and ``bv`` (default uniform), ``rounding`` for ``rank_estimate``
            (default ``"floor"``). None means the default; a value given to a method that does not use it is
            a ValueError (it would otherwise be ignored silently), as is any other option the method does
            not take (its registry entry's options, :data:`METHOD_OPTIONS`).
        max_rel_n_spread: None (every distinct candidate count n gets its own table or likelihood) or s > 0:
            counts are moved onto a geometric grid of n (consecutive nodes within a factor 1 + s), each
            group split between its two neighbouring nodes linearly in 1/(n - 1) (``_rank_hist.pool_by_n``);
            far fewer tables, error measured in docs/estimators.md (s = 0.1 on ml-100k: < 1e-2 relative, < 2e-3 absolute).
            Flagged ``pooled_n`` when it changed the groups.
        top_shape: the shape assumption of the identified interval (``identification.TopShape``; default:
            density non-increasing over the first max(2 b, 2 K) ranks, no steeper than 1/r over the first b).
        adaptive: the design when bare ranks come from adaptive sampling (``n_samples`` then holds each
            positive's final m): a :class:`~reco_sampled_plugin.design.SamplingDesign` with ``adaptive_max``,
            an :class:`~reco_sampled_plugin.design.AdaptiveDesign` or ``(m, adaptive_max)`` (a SampledRanks
            carries it). Only methods whose registry entry takes adaptive designs (``mes``, ``mle``, ``none``:
            the likelihood ignores the stopping rule; fixed-m tables do not) accept it; the sizes are checked
            against the design, ``details["adaptive"]`` reports the cost (mean and largest m per positive, share
            at the cap, share still first there) and ``cap_reached`` flags a metric that still depends on the
            top at the cap's resolution.
        **options: the method's other options (its registry entry): for ``mle``, ``mes``, ``bv_mle`` those of
            :func:`~reco_sampled_plugin.rank_distribution.estimate_rank_distribution` (``n_bootstrap``, ``tol``,
            ``max_iter``, ``lam``, ``seed``...). ``n_bootstrap=0`` skips the bootstrap: the standard error is
            then the cheap posterior one (``RankDistribution.metric(stderr="posterior")``,
            ``details["stderr_method"]``).

    Returns:
        :class:`~reco_sampled_plugin.Estimate` (value, stderr, n_instances, details, flags). Where the metric depends on the
        shape of the rank distribution inside the first sampled bin (a cut-off below the resolution
        b = (n - 1)/(m + 1) + 1, or AP/RR/NDCG once b >= 2; flag ``top_unresolved``), ``interval(level)``
        also spans every value the data allow under ``top_shape`` (``identification.py``); the ``none``
        method (the sampled metric itself, not an estimate of the global one) keeps its sampling interval.

    Raises:
        ValueError: unknown method, empty histogram, cut-off K above n, invalid sizes, a design the method does
            not support, or options that the method does not take.
    """
    spec = parse_metric(metric)
    entry = registry.get(method)
    # every option before any work: an unknown one is named (not a TypeError deep inside), an invalid value
    # (tol=nan, gamma=nan, an unknown sampling law that a mapping would ignore) is a ValueError naming it
    named = {"a": a, "gamma": gamma, "prior": prior, "rounding": rounding}
    _refuse_unused(entry, named)
    if options:
        check_options(options, tuple(k for k in entry.option_names if k not in named), f"estimate(method={method!r})")
    opts = _check_values(entry, {**{o.name: named.get(o.name) for o in entry.options if o.named}, **options})
    # the registry's defaults of options not given (None defaults stay with the compute function)
    opts.update({o.name: o.default for o in entry.options if o.name not in opts and o.default is not None})
    draws = None
    if isinstance(sampled_ranks, SampledRanks):
        hist, sampling, design = _from_sampled(sampled_ranks, n_items, n_samples, weights, sampling, adaptive, entry,
                                               spec)
        hist = hist.without_empty_groups()
        # hh for AUC, pl_fit otherwise
        if sampled_ranks.design.popularity is not None and entry.family == "auto":  # type: ignore[union-attr]  # draws carry their design
            method = registry.popularity_auto(spec, sampled_ranks.design)
            # auto's fit options (validated above) reach the choice where it takes them; the others fit nothing
            # there (hh is closed-form, pl_fit has its own fit): reported, and warned about (configs shared across
            # designs pass them, so they are not refused)
            takes = registry.get(method).option_names
            result = estimate(spec, sampled_ranks, method=method, weights=weights, max_rel_n_spread=max_rel_n_spread,
                              top_shape=top_shape, **{k: v for k, v in options.items() if k in takes})
            why = f"popularity design: {method} is the first of AUTO_CHOICES['popularity'] that estimates {spec.kind}"
            unused = sorted(k for k in options if k not in takes)
            if unused:
                warnings.warn(f"auto runs {method} on popularity-sampled ranks, which takes no {', '.join(unused)}: "
                              f"ignored (its standard error is {method}'s own)", UserWarning, stacklevel=2)
            auto = {"method": method, "reason": why, "options_unused": unused}
            return dataclasses.replace(result, details={**result.details, "auto": auto})
        if sampled_ranks.design.popularity is not None and entry.family != "none":  # type: ignore[union-attr]  # draws carry their design
            from .popularity import popularity_draws

            draws = popularity_draws(sampled_ranks, weights)  # each positive's beating draws' 1/q~ (or a refusal)
    else:
        if isinstance(sampling, str) and sampling.lower() == "popularity":
            raise ValueError("sampled_ranks: bare ranks (or a histogram) cannot carry what popularity-sampled ranks "
                             "need, each positive's beating draws' 1/q~; pass the SampledRanks of the draw "
                             "(sampled_ranks(..., popularity=w), sampled_ranks_from_scorer), never ranks alone")
        sampling = check_law("binomial" if sampling is None else sampling)
        if isinstance(adaptive, SamplingDesign) and adaptive.adaptive_max is None:
            raise ValueError("adaptive: the design is not adaptive (no adaptive_max)")
        design = coerce_adaptive(adaptive)
        hist = as_histogram(sampled_ranks, n_items, n_samples, weights)
    if entry.fits_distribution:
        from .rank_distribution import check_fit_options

        takes = entry.option_names if entry.family == "rank_distribution" else registry.fit_option_names()
        fit = {k: v for k, v in options.items() if k in takes}
        check_fit_options("mle" if entry.family != "rank_distribution" else method, sampling, **fit)
    hist.check_nonempty(weights)
    if hist.has_exact and not entry.exact_groups:  # it would read an exact rank R as a sampled rank among n - 1
        raise ValueError(f"sampled_ranks: the histogram has exact groups (exact_at_cap), which method {method!r} "
                         f"cannot read; use one of {[e.name for e in registry.entries() if e.exact_groups]}, or "
                         "the SampledRanks themselves (estimate(metric, sampled) gives other methods the sampled "
                         "ranks)")
    hist.check_support(sampling)  # every method: an r~ the design cannot produce is refused, not estimated from
    if entry.family == "auto":  # the registry's choice for this design and metric, run under its own name
        method, why = auto_method(spec, hist, design)
        result = estimate(spec, hist, method=method, sampling=sampling, max_rel_n_spread=max_rel_n_spread,
                          top_shape=top_shape, adaptive=design, **options)
        details = {**result.details, "auto": {"method": method, "reason": why}}
        return dataclasses.replace(result, details=details)
    if not entry.takes_metric(spec.kind):  # after the data's own checks, which every method makes alike
        check_without_replacement(hist.n_items, hist.n_samples, sampling)
        design_of = sampled_ranks.design if isinstance(sampled_ranks, SampledRanks) else None
        raise ValueError(f"metric: method {method!r} estimates {', '.join(entry.metrics or ())} only; "
                         f"{_available(spec, design_of)}")
    if design is not None:
        if not entry.adaptive:
            raise ValueError(
                f"method {method!r} assumes one fixed m per positive; adaptive sampling needs a likelihood "
                f"estimator: one of {registry.names(adaptive=True)}"
            )
        if sampling != "binomial":
            raise ValueError("sampling: adaptive sampling draws with replacement (binomial law)")
        check_adaptive_histogram(hist, design)
        result = estimate(spec, hist, method=method, sampling=sampling, max_rel_n_spread=max_rel_n_spread,
                          top_shape=top_shape, **options)
        return _with_adaptive(result, hist, design, top_shape, spec)
    pooled = pool_by_n(hist, max_rel_n_spread)
    # popularity estimators read each positive's draws, never the pooled groups: nothing of theirs is pooled
    pool_flag = [] if pooled.same_groups(hist) or draws is not None else ["pooled_n"]
    hist = pooled
    if spec.k is not None and spec.k > int(hist.n_items[hist.totals > 0].min()):
        raise ValueError(
            f"metric: cut-off K = {spec.k} is larger than the catalogue (n_items = {int(hist.n_items.min())})"
        )
    bounds = metric_bounds(spec, hist.n_items)
    if top_shape is not None and not isinstance(top_shape, TopShape):
        raise ValueError(f"top_shape: expected an identification.TopShape, got {type(top_shape).__name__}")
    if top_shape is not None and draws is not None:
        raise ValueError("top_shape: popularity-sampled ranks take the estimator's own top shapes (pl_fit: from uniform "
                         "to 1/r inside each positive's top zone, docs/popularity.md); drop top_shape")
    # the uniform law's identified interval; popularity draws: the estimator's own (pl_fit), if any
    ident = Identification(spec, hist, sampling, top_shape) if (entry.family != "none" and draws is None
                                                                 and top_sensitive(spec, hist)) else None
    res = entry.compute_function()(spec, hist, method=method, sampling=sampling,
                                   options=opts if draws is None else {**opts, "draws": draws})
    if draws is not None:
        ident = getattr(res, "identification", None)
    return _result(res.value, res.stderr, res.n_instances, res.details, _merge_flags(res.flags, pool_flag), bounds,
                   ident)
