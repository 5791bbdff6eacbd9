"""One entry point for every estimator of a global metric from sampled ranks.

``estimate(metric, sampled_ranks, n_items, n_samples, method=...)`` works on the sampled-rank
histogram (built once, any device, per-positive n and m allowed) and returns the value with its
standard error:

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
import threading
from collections import OrderedDict
from functools import lru_cache

import numpy as np

import torch

from ._rank_hist import RankHistogram, as_histogram, pool_by_n
from .adaptive import ADAPTIVE_METHODS, AdaptiveDesign, adaptive_cost, check_adaptive_histogram
from .estimate import Estimate
from .identification import Identification, TopShape, _design, top_sensitive
from .mapping import MAPPING_METHODS, mapping_estimate
from .metric_names import parse_metric
from .metrics import _metric_from_float_ranks
from ._options import check_choice, check_fraction, check_law, check_options
from .rank_distribution import RANK_DISTRIBUTION_METHODS, check_fit_options, estimate_rank_distribution

__all__ = ["ESTIMATORS", "METHOD_OPTIONS", "estimate", "EstimatorResult", "check_estimator_options"]

CORRECTION_METHODS = ("none", "rank_estimate", "ls", "cls", "bv")
ESTIMATORS = MAPPING_METHODS + RANK_DISTRIBUTION_METHODS + CORRECTION_METHODS + ("bv_mle",)
# the options of the rank-distribution fit (``estimate_rank_distribution``) that ``estimate`` passes on
_FIT_OPTIONS = ("n_bootstrap", "seed", "tol", "max_iter", "max_groups", "delta", "kappa", "trace")
# the keyword arguments each method uses besides the data, ``sampling``, ``weights`` and ``adaptive``:
# ``estimate(**options)`` refuses any other extra option, naming it and listing these
METHOD_OPTIONS = {
    "linear": (),
    "bound": (),
    "beta": ("a",),
    "beta_fit": ("a",),
    "mle": _FIT_OPTIONS,
    "mes": _FIT_OPTIONS + ("lam", "beta"),
    "none": (),
    "rank_estimate": ("rounding",),
    "ls": ("prior",),
    "cls": ("prior",),
    "bv": ("gamma", "prior"),
    "bv_mle": ("gamma",) + _FIT_OPTIONS,  # the fit options of the mle prior
}
# keyword arguments of ``estimate`` itself that every method takes
_COMMON_OPTIONS = ("max_rel_n_spread", "top_shape")
_NAMED_OPTIONS = ("a", "gamma", "prior", "rounding")


def _refuse_unused(method: str, named: dict) -> None:
    """Raise a ValueError naming the first of ``estimate``'s named options (a, gamma, prior, rounding) that was
    given (not None) although ``method`` does not use it."""
    for key, value in named.items():
        if value is not None and key not in METHOD_OPTIONS[method]:
            takes = [k for k in METHOD_OPTIONS[method] if k in _NAMED_OPTIONS]
            users = [m for m, opts in METHOD_OPTIONS.items() if key in opts]
            raise ValueError(
                f"{key}: method {method!r} does not use it (it takes {', '.join(takes) or 'none of a, gamma, prior, rounding'}"
                f"; {key} is an option of {', '.join(users)})"
            )


def check_estimator_options(method: str, options, where: str | None = None) -> dict:
    """Validate the keyword arguments ``options`` of ``estimate(..., method=method, **options)`` without data
    (e.g. when a metric class is constructed, long before its first ``compute``): every key must be one the
    method uses (:data:`METHOD_OPTIONS`, plus ``max_rel_n_spread`` and ``top_shape``) and every value valid.
    Raises a ValueError naming the option; returns the options as a dict."""
    if method not in ESTIMATORS:
        raise ValueError(f"method: unknown estimator {method!r}; use one of {ESTIMATORS}")
    where = where or f"estimate(method={method!r})"
    opts = check_options(options, METHOD_OPTIONS[method] + _COMMON_OPTIONS, where)
    if "gamma" in opts:
        check_fraction(opts["gamma"], "gamma")
    if "rounding" in opts:
        check_choice(opts["rounding"], ("floor", "linear"), "rounding")
    if "a" in opts and opts["a"] is not None:
        from .mapping import _check_a

        _check_a(opts["a"])
    if "prior" in opts and opts["prior"] is not None:
        from .priors import as_prior

        as_prior(opts["prior"])  # the type and values; a vector's length is checked against n at compute
    if "max_rel_n_spread" in opts:
        from ._rank_hist import check_spread

        check_spread(opts["max_rel_n_spread"])
    if opts.get("top_shape") is not None and not isinstance(opts["top_shape"], TopShape):
        raise ValueError(f"top_shape: expected an identification.TopShape, got {type(opts['top_shape']).__name__}")
    fit = {k: v for k, v in opts.items() if k in _FIT_OPTIONS + ("lam", "beta")}
    if method in RANK_DISTRIBUTION_METHODS + ("bv_mle",):
        check_fit_options("mle" if method == "bv_mle" else method, **fit)
    return opts


# vector priors up to this many ranks (the corrections enumerate them exactly); a callable beyond
_VECTOR_PRIOR_MAX = 2_000_000


# the dispatcher returns the package-wide Estimate (value, stderr, n_instances, details, flags)
EstimatorResult = Estimate


def _metric_bounds(spec, hist: RankHistogram) -> tuple[float, float]:
    """[min, max] of M(r) over r in 1..n_g of every group (M is non-increasing in r)."""
    return _bounds_for(spec, tuple(np.unique(hist.n_items).tolist()))


@lru_cache(maxsize=256)
def _bounds_for(spec, ns: tuple) -> tuple[float, float]:
    n_t = torch.tensor(ns, dtype=torch.float64)
    lo = _metric_from_float_ranks(spec, n_t, n_t).min()
    hi = _metric_from_float_ranks(spec, torch.ones_like(n_t), n_t).max()
    return float(lo), float(hi)


def _result(value: float, stderr: float | None, n: float, details: dict, flags, bounds=None, identification=None) -> Estimate:
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
    if bounds is not None and not (bounds[0] <= value <= bounds[1]) and "outside_metric_range" not in flags:
        flags += ("outside_metric_range",)
    if identification is not None and "top_unresolved" not in flags:
        flags += ("top_unresolved",)
    details = dict(details)
    details["flags"] = tuple(flags)
    if identification is not None:
        details["interval"] = "identified"
    metric_range = None if bounds is None else (float(bounds[0]), float(bounds[1]))
    return Estimate(float(value), se, float(n), details, tuple(flags), identification, metric_range)


def _with_adaptive(result: Estimate, hist: RankHistogram, design: AdaptiveDesign, top_shape) -> Estimate:
    """The estimate of adaptive ranks: the identified interval under the stopping law, the cost in
    ``details["adaptive"]``, ``cap_reached`` where positives still rank first at the cap and the metric depends
    on the top there."""
    ident = result.identification
    if ident is not None:
        ident = Identification(ident.spec, ident.hist, ident.sampling, top_shape, adaptive=design)
    cost = adaptive_cost(hist, design)
    flags = tuple(result.flags)
    if ident is not None and cost.share_first_at_cap > 0 and "cap_reached" not in flags:
        flags += ("cap_reached",)
    details = dict(result.details)
    details["adaptive"] = cost.as_dict()
    details["flags"] = flags
    return dataclasses.replace(result, details=details, flags=flags, identification=ident)


def _merge_flags(flags, extra) -> tuple:
    return tuple(flags) + tuple(f for f in extra if f not in flags)


def _table_estimate(hist: RankHistogram, values: np.ndarray) -> tuple[float, float]:
    """Mean of the per-positive table values T_g[r~] and its standard error, over all groups at once
    (``values``: the groups' tables concatenated in group order)."""
    total = hist.total
    counts = hist.flat_counts
    value = float(counts @ values) / total
    ss = float(counts @ (values - value) ** 2)
    return value, (math.sqrt(ss / (total * (total - 1.0))) if total > 1 else math.inf)


def _correction(spec, hist: RankHistogram, method: str, sampling: str, gamma: float, prior, rounding: str, prior_for_n=None):
    try:
        from . import corrections
    except ImportError as exc:  # pragma: no cover - the corrections module ships with the package
        raise ValueError(f"method {method!r}: the corrections module is not available ({exc})") from None
    if prior_for_n is None:  # every group's table, concatenated (cached as a whole by the corrections module)
        values = corrections.stacked_tables(spec, hist.n_items, hist.n_samples, method, gamma, sampling, prior, rounding)
    else:
        values = np.concatenate([
            corrections._table_numpy(spec, int(n), int(m), method, gamma, sampling, prior_for_n(int(n)), rounding)
            for n, m in zip(hist.n_items, hist.n_samples)
        ])
    return _table_estimate(hist, values)


# fitted rank distributions of the last few (histogram, method, options): estimating several metrics
# from one evaluation's histogram fits once (the fit, with its bootstrap, dominates their cost)
_FITS: OrderedDict = OrderedDict()
_FITS_MAX = 8
_FITS_LOCK = threading.Lock()


def _fitted_distribution(hist: RankHistogram, method: str, sampling: str, options: dict):
    """:func:`estimate_rank_distribution` of ``hist``, reused while the same histogram (same groups and
    counts), method, law and options come back; options that cannot be hashed are fitted every time."""
    try:
        key = (hist.n_items.tobytes(), hist.n_samples.tobytes(), hist.flat_counts.tobytes(), method, sampling,
               tuple(sorted(options.items())))
        hash(key)
    except TypeError:
        return estimate_rank_distribution(hist, method=method, sampling=sampling, **options)
    with _FITS_LOCK:
        dist = _FITS.get(key)
        if dist is not None:
            _FITS.move_to_end(key)
            return dist
    dist = estimate_rank_distribution(hist, method=method, sampling=sampling, **options)
    with _FITS_LOCK:
        _FITS[key] = dist
        while len(_FITS) > _FITS_MAX:
            _FITS.popitem(last=False)
    return dist


def estimate(
    metric,
    sampled_ranks,
    n_items=None,
    n_samples=None,
    method: str = "mes",
    *,
    sampling: str = "binomial",
    weights=None,
    a: float | None = None,
    gamma: float | None = None,
    prior=None,
    rounding: str | None = None,
    max_rel_n_spread: float | None = None,
    top_shape: TopShape | None = None,
    adaptive=None,
    **options,
) -> EstimatorResult:
    """Estimate a global (full-catalogue) metric from sampled ranks, with a standard error.

    Args:
        metric: metric name (``"hit@10"``, ``"ndcg@10"``, ``"ap"``, ``"auc"``, ...).
        sampled_ranks: sampled ranks r~ in 1..m+1 (any shape, tensor or array, 0 = padding), or a
            :class:`~reco_sampled_plugin._rank_hist.RankHistogram`.
        n_items: n, candidates per instance (int or per-positive values).
        n_samples: m, sampled irrelevant items (int or per-positive values, e.g. from adaptive sampling).
        method: one of :data:`ESTIMATORS` (see the module docstring); default ``mes``, the most accurate
            rank-distribution estimator on ml-100k (docs/estimators.md).
        sampling: ``"binomial"`` (with replacement) or ``"hypergeometric"`` (rank-distribution and
            correction methods; the mapping functions assume neither).
        weights: optional per-positive frequency weights: their sum is the number of instances that
            standard errors (and bootstraps) assume, so scale them to it (e.g. 1/|T_u| per positive: one
            per user); a total of at most 1 gives stderr inf, flagged ``few_instances``.
        a: Beta shape for ``beta`` (required there; a = 1 is eq. 18), the starting value for ``beta_fit``.
        gamma, prior, rounding: the corrections' options: ``gamma`` for ``bv`` and ``bv_mle`` (default 0.1),
            ``prior`` for ``ls``, ``cls`` and ``bv`` (default uniform), ``rounding`` for ``rank_estimate``
            (default ``"floor"``). None means the default; a value given to a method that does not use it is
            a ValueError (it would otherwise be ignored silently), as is any other option the method does
            not take (:data:`METHOD_OPTIONS`).
        max_rel_n_spread: None (every distinct candidate count n gets its own table or likelihood) or s > 0:
            counts are moved onto a geometric grid of n (consecutive nodes within a factor 1 + s), each
            group split between its two neighbouring nodes linearly in 1/(n - 1) (``_rank_hist.pool_by_n``);
            far fewer tables, error measured in docs/estimators.md (s = 0.1 on ml-100k: < 1e-2 relative, < 2e-3 absolute).
            Flagged ``pooled_n`` when it changed the groups.
        top_shape: the shape assumption of the identified interval (``identification.TopShape``; default:
            density non-increasing over the first max(2 b, 2 K) ranks, no steeper than 1/r over the first b).
        adaptive: the design when the ranks come from adaptive sampling (``n_samples`` then holds each positive's
            final m): an :class:`~reco_sampled_plugin.adaptive.AdaptiveDesign` or ``(m, adaptive_max)``. Only
            ``mes``, ``mle`` and ``none`` take it (the likelihood ignores the stopping rule; fixed-m tables do
            not); the sizes are checked against the design, ``details["adaptive"]`` reports the cost (mean and
            largest m per positive, share at the cap, share still first there) and ``cap_reached`` flags a
            metric that still depends on the top at the cap's resolution.
        **options: passed to :func:`~reco_sampled_plugin.rank_distribution.estimate_rank_distribution`
            (``n_bootstrap``, ``tol``, ``max_iter``, ``lam``, ``seed``...) for ``mle``, ``mes``, ``bv_mle``.
            ``n_bootstrap=0`` skips the bootstrap: the standard error is then the cheap posterior one
            (``RankDistribution.metric(stderr="posterior")``, ``details["stderr_method"]``).

    Returns:
        :class:`EstimatorResult` (value, stderr, n_instances, details, flags). Where the metric depends on the
        shape of the rank distribution inside the first sampled bin (a cut-off below the resolution
        b = (n - 1)/(m + 1) + 1, or AP/RR/NDCG once b >= 2; flag ``top_unresolved``), ``interval(level)``
        also spans every value the data allow under ``top_shape`` (``identification.py``); the ``none``
        method (the sampled metric itself, not an estimate of the global one) keeps its sampling interval.

    Raises:
        ValueError: unknown method, empty histogram, cut-off K above n, invalid sizes, or options that the
            method does not take.
    """
    spec = parse_metric(metric)
    if method not in ESTIMATORS:
        raise ValueError(f"method: unknown estimator {method!r}; use one of {ESTIMATORS}")
    # every option before any work: an unknown one is named (not a TypeError deep inside), an invalid value
    # (tol=nan, gamma=nan, an unknown sampling law that a mapping would ignore) is a ValueError naming it
    sampling = check_law(sampling)
    _refuse_unused(method, {"a": a, "gamma": gamma, "prior": prior, "rounding": rounding})
    gamma = 0.1 if gamma is None else check_fraction(gamma, "gamma")
    rounding = "floor" if rounding is None else check_choice(rounding, ("floor", "linear"), "rounding")
    if options:
        check_options(options, tuple(k for k in METHOD_OPTIONS[method] if k not in _NAMED_OPTIONS),
                      f"estimate(method={method!r})")
    if method in RANK_DISTRIBUTION_METHODS + ("bv_mle",):
        check_fit_options("mle" if method == "bv_mle" else method, sampling, **options)
    hist = as_histogram(sampled_ranks, n_items, n_samples, weights)
    hist.check_nonempty()
    design = _design(adaptive)
    if design is not None:
        if method not in ADAPTIVE_METHODS:
            raise ValueError(
                f"method {method!r} assumes one fixed m per positive; adaptive sampling needs a likelihood "
                f"estimator: one of {ADAPTIVE_METHODS}"
            )
        if sampling != "binomial":
            raise ValueError("sampling: adaptive sampling draws with replacement (binomial law)")
        check_adaptive_histogram(hist, design)
        result = estimate(spec, hist, method=method, sampling=sampling, max_rel_n_spread=max_rel_n_spread,
                          top_shape=top_shape, **options)
        return _with_adaptive(result, hist, design, top_shape)
    pooled = pool_by_n(hist, max_rel_n_spread)
    pool_flag = [] if pooled.same_groups(hist) else ["pooled_n"]
    hist = pooled
    if spec.k is not None and spec.k > int(hist.n_items[hist.totals > 0].min()):
        raise ValueError(
            f"metric: cut-off K = {spec.k} is larger than the catalogue (n_items = {int(hist.n_items.min())})"
        )
    bounds = _metric_bounds(spec, hist)
    if top_shape is not None and not isinstance(top_shape, TopShape):
        raise ValueError(f"top_shape: expected an identification.TopShape, got {type(top_shape).__name__}")
    ident = Identification(spec, hist, sampling, top_shape) if method != "none" and top_sensitive(spec, hist) else None
    if method in MAPPING_METHODS:
        res = mapping_estimate(spec, hist, method=method, a=a)
        return _result(res.value, res.stderr, res.n_instances, res.details, _merge_flags(res.flags, pool_flag), bounds,
                       ident)
    if method in RANK_DISTRIBUTION_METHODS:
        dist = _fitted_distribution(hist, method, sampling, options)
        res = dist.metric(spec)
        return _result(res.value, res.stderr, res.n_instances, res.details, _merge_flags(res.flags, pool_flag), bounds,
                       ident)
    flags: list[str] = list(pool_flag)
    details: dict = {"method": method, "metric": str(spec)}
    if method == "bv_mle":
        dist = _fitted_distribution(hist, "mle", sampling, {"n_bootstrap": 0, **options})
        flags += [f for f in dist.flags if f in ("not_converged", "pooled_n", "all_at_top") and f not in flags]

        def prior_for_n(n: int, _dist=dist):
            return _dist.prior(n) if n <= _VECTOR_PRIOR_MAX else _dist.as_prior()

        value, se = _correction(spec, hist, "bv", sampling, gamma, None, rounding, prior_for_n)
        details.update({"gamma": gamma, "prior": "mle", "mle_iterations": dist.iterations})
    else:
        value, se = _correction(spec, hist, method, sampling, gamma, prior, rounding)
        details.update({"gamma": gamma if method == "bv" else None})
    resolution = (hist.n_items - 1.0) / (hist.n_samples + 1.0) + 1.0
    at_top = hist.top_counts > 0  # groups with positives at r~ = 1
    if spec.k is not None and np.any(spec.k < resolution[at_top]):
        flags.append("top_unresolved")
        if hist.all_at_top():
            flags.append("all_at_top")
            se = math.inf
    return _result(value, se, hist.total, details, flags, bounds, ident)
