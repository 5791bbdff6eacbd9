"""The value every estimator returns: a point estimate with its standard error."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

__all__ = ["Estimate", "EstimatorOutput", "FLAG_TEXT", "bias_aware_halfwidth", "explain_flags", "in_range", "interval_values",
           "range_flags",
           "INTERVAL_SUFFIXES", "SAME_INTERVAL_NOTE"]

#: The suffixes of an interval's bounds in every output (RecBole result keys, Lightning logs, torchmetrics
#: ``compute()``): ``<name>_lo`` and ``<name>_hi`` are ``Estimate.interval(0.95)``.
INTERVAL_SUFFIXES = ("_lo", "_hi")

#: Each flag of an :class:`Estimate` in words (the one mapping every output uses: CLI, report, RecBole, Lightning,
#: torchmetrics); ``uncorrected``: the plain sampled metric (method ``none``), but for AUC at a fixed uniform m.
#: ``{plan}`` and ``{m}`` are filled in by :func:`explain_flags`.
FLAG_TEXT: dict[str, str] = {
    "top_unresolved": "top of the ranking not resolved by {m} samples: the 95% interval spans every value the data "
                      "allow under the top-shape assumption, whatever the estimator; {advice} ({plan})",
    "cap_reached": "adaptive sampling reached its cap with positives still ranked first: the top stays unresolved "
                   "there; raise the cap ({plan})",
    "all_at_top": "every positive ranked first among its samples: no spread to measure (stderr inf); rank exactly or "
                  "sample more",
    "few_instances": "one evaluated instance (total weight at most 1): no spread to measure, stderr inf",
    "not_converged": "the fit stopped at its iteration cap before converging (raise max_iter)",
    "fit_not_converged": "the fit stopped at its iteration cap before converging (raise max_iter)",
    "pooled_n": "candidate counts pooled into bins (max_groups) before fitting",
    "outside_metric_range": "the estimator's raw value lies outside the metric's range (an unbounded correction such "
                            "as ls): the point is the range's nearest end (details['unclipped_value']), its interval "
                            "lies in the range",
    "interval_omits_bias": "a mapping's interval is its sampling noise only: the mapping's bias, which depends on the "
                           "unknown rank distribution and can exceed the interval's width, is not in it; the default "
                           "estimator (auto) gives an interval that holds it",
    "several_m": "several sample sizes m in one histogram",
    "weights_concentrated": "popularity sampling: a few rarely drawn items carry most of the Hansen-Hurwitz weight "
                            "(Kish effective sample size of the beating draws' 1/q below 10% of their number, or more "
                            "than 1% of the catalogue in popularity classes the draws are expected to hit fewer than "
                            "5 times: details['rare_share']); the estimate and its standard error rest on the few "
                            "draws of those items, or on none: raise m or flatten the sampling law (a smaller alpha)",
    "uncorrected": "the plain sampled metric (method none), not an estimate of the full-catalogue metric: its "
                   "interval covers the sampled metric only",
    "no_instances": "nothing was counted: no value (NaN)",
    "no_exact_share": "method diff on ranks without an exact share: the model's estimate (auto), not a design-based "
                      "one; draw with SamplingDesign(m, exact_share=...)",
    "few_exact": "fewer than 30 exactly ranked positives in the share: the design-based interval is rough (stderr inf "
                 "below 2); raise the share",
    "estimator_failed": "the estimator failed on these data (see the warning): no value (NaN)",
}

#: The line under a table of estimates whose intervals are the identified one (flag ``top_unresolved``).
SAME_INTERVAL_NOTE = ("note: where the top is unresolved the 95% interval is what the data allow under the shape "
                      "assumption, the same for every estimator: equal intervals do not mean the methods agree")


def _plan_command(metric: str | None, n_items: int | None, users: int | None, pilot: str | None,
                  pilot_design: Any = None) -> str:
    """The ``reco-sampled plan`` invocation for these data (placeholders where a value is unknown); a ``pilot``
    file with the ``pilot_design`` its lines leave out (a SamplingDesign: its m, and its cap when adaptive) is read
    back with ``--pilot-n-samples`` / ``--pilot-adaptive-max``."""
    import shlex

    parts = ["reco-sampled plan", f"--n-items {n_items if n_items is not None else 'N'}",
             f"--n-users {users if users is not None else 'U'}", f"--metric {metric or 'METRIC'}",
             "--target-rel-error 0.05"]
    if pilot:
        parts.append(f"--pilot {shlex.quote(os.fspath(pilot))}")
        if pilot_design is not None:
            parts.append(f"--pilot-n-samples {pilot_design.n_samples}")
            if pilot_design.adaptive_max is not None:
                parts.append(f"--pilot-adaptive-max {pilot_design.adaptive_max}")
    return " ".join(parts)


#: What resolves the top, by design (``{advice}`` of ``top_unresolved``): a fixed uniform m, an adaptive design (already
#: adaptive: its cap), a popularity design (which adaptive sampling does not take).
TOP_ADVICE = {"fixed": "rank exactly or sample adaptively", "adaptive": "rank exactly or raise the adaptive cap",
              "popularity": "rank exactly or raise m (adaptive sampling does not take popularity designs)"}


def _design_context(design: Any, n_samples: int | str | None) -> tuple[str, int | str | None]:
    """The ``TOP_ADVICE`` key of ``design`` (None: fixed) and m as the text shows it (``100..800`` when adaptive)."""
    if design is None:
        return "fixed", n_samples
    if getattr(design, "popularity", None) is not None:
        return "popularity", n_samples if n_samples is not None else design.n_samples
    cap = getattr(design, "adaptive_max", None)
    if cap is not None:
        return "adaptive", f"{design.n_samples}..{cap}"
    return "fixed", n_samples if n_samples is not None else design.n_samples


def explain_flags(flags: Iterable[str], *, metric: str | None = None, n_items: int | None = None, n_samples: int | str | None = None,
                  users: int | None = None, pilot: str | None = None, pilot_design: Any = None,
                  design: Any = None) -> list[str]:
    """Each flag of ``flags`` as one sentence users understand (:data:`FLAG_TEXT`; an unknown flag as itself).

    The context fills the advice in: ``n_samples`` (m), and ``metric``, ``n_items``, ``users``, ``pilot`` (a rank
    file; ``pilot_design`` the SamplingDesign its lines leave out, passed as ``--pilot-n-samples`` and
    ``--pilot-adaptive-max``) the ``reco-sampled plan`` command to run (placeholders such as ``N`` where not given). Each context value
    is checked (a ValueError naming it): sizes are whole numbers, ``n_samples`` may also be a description such as
    ``"100..3200"``, ``metric`` and ``pilot`` are strings. ``design`` (a ``SamplingDesign``) fits the advice to it
    (:data:`TOP_ADVICE`: an adaptive design is told to raise its cap, a popularity design is never told to sample
    adaptively) and gives m where ``n_samples`` is not given."""
    from ._checks import check_int, check_size
    from .metric_names import MetricSpec

    if isinstance(flags, (str, bytes)):
        raise ValueError(f"flags: expected a list of flag names, got the string {flags!r}")
    if metric is not None and not isinstance(metric, (str, MetricSpec)):
        raise ValueError(f"metric: expected a metric name such as 'ndcg@10', got {metric!r}")
    if pilot is not None and not isinstance(pilot, (str, os.PathLike)):
        raise ValueError(f"pilot: expected a file name, got {pilot!r}")
    n_items = None if n_items is None else check_size(n_items, "n_items", 1)
    users = None if users is None else check_int(users, "users", 0)
    if n_samples is not None and not isinstance(n_samples, str):
        n_samples = check_size(n_samples, "n_samples", 1)
    if pilot_design is not None:
        from .design import as_design

        pilot_design = as_design(pilot_design, name="pilot_design")
    plan = _plan_command(metric, n_items, users, pilot, pilot_design)
    kind, n_samples = _design_context(design, n_samples)
    m = "m" if n_samples is None else f"m = {n_samples}"
    out = []
    if flags is None or (isinstance(flags, (tuple, list)) and not flags):
        flags = ()
    else:
        from ._options import check_names

        flags = check_names(flags, "flags", "flag names such as 'few_instances'")
    for f in dict.fromkeys(flags):  # once each, in order
        text = FLAG_TEXT.get(f)
        out.append(f"{f}: " + (text.format(m=m, plan=plan, advice=TOP_ADVICE[kind]) if text is not None else f))
    return out


def interval_values(name: str, est: "Estimate", *, interval: bool = True, stderr: bool = False) -> dict[str, float]:
    """The keys every keyed output puts beside ``name``'s value (RecBole results, Lightning logs, torchmetrics
    ``compute()``): ``<name>_lo`` / ``<name>_hi``, the 95% :meth:`Estimate.interval` (``interval``), and
    ``<name>_stderr``, sampling noise only (``stderr``, opt-in)."""
    from ._options import check_bool

    interval, stderr = check_bool(interval, "interval"), check_bool(stderr, "stderr")
    out: dict[str, float] = {}
    if interval:
        lo, hi = est.interval(0.95)
        out[name + INTERVAL_SUFFIXES[0]], out[name + INTERVAL_SUFFIXES[1]] = lo, hi
    if stderr:
        out[f"{name}_stderr"] = est.stderr
    return out


def in_range(value: float, flags: Iterable[str], details: Mapping[str, Any],
             bounds: tuple[float, float] | None) -> tuple[float, tuple[str, ...], dict]:
    """(value, flags, details) with the point inside ``bounds`` (the metric's range): a raw value outside is flagged
    ``outside_metric_range`` (:func:`range_flags`), the point becomes the range's nearest end and the raw value is kept
    in ``details["unclipped_value"]``; the projection never moves the point away from the metric."""
    flags = range_flags(float(value), flags, bounds)
    details = dict(details)
    if bounds is not None and not math.isnan(value) and not bounds[0] <= value <= bounds[1]:
        if _outside(float(value), bounds):  # rounding at an end (a few ulps) moves the point, says nothing
            details["unclipped_value"] = float(value)
        value = min(max(float(value), float(bounds[0])), float(bounds[1]))
    return float(value), flags, details


def _outside(value: float, bounds: tuple[float, float]) -> bool:
    """Whether ``value`` lies outside ``bounds`` by more than float64 rounding (1e-12 of the range's largest end: a
    precision@3 of 3 items, 1/3, computed as 0.33333333333333337 is on its one-point range, not outside it; a
    precision@2^40's 9.1e-13 range keeps a tolerance of 9.1e-25)."""
    lo, hi = float(bounds[0]), float(bounds[1])
    tol = 1e-12 * max(abs(lo), abs(hi))
    return not lo - tol <= value <= hi + tol


def range_flags(value: float, flags: Iterable[str], bounds: tuple[float, float] | None) -> tuple[str, ...]:
    """``flags`` plus ``outside_metric_range`` where ``value`` lies outside ``bounds`` (the metric's range; an
    unbounded estimator such as ``ls`` can leave it); NaN and None bounds add nothing."""
    flags = tuple(flags)
    if bounds is None or math.isnan(value) or not _outside(value, bounds) or "outside_metric_range" in flags:
        return flags
    return flags + ("outside_metric_range",)


class EstimatorOutput(NamedTuple):
    """What a registered estimator's compute function returns (``registry.py``); ``estimate()`` turns it into
    an :class:`Estimate` (the metric's range, the identified interval, the design's flags)."""

    value: float
    stderr: float | None
    n_instances: float
    details: dict
    flags: tuple = ()
    identification: Any = None
    """Where the estimator itself says what the data cannot identify (``pl_fit`` under popularity sampling): an
    object with ``interval(level)`` and ``metric_range`` (as ``identification.Identification``); ``estimate()``
    uses it instead of the uniform law's identified interval."""


@dataclass(frozen=True)
class Estimate:
    """A metric estimate averaged over evaluation instances.

    Attributes:
        value: the estimate (mean over instances).
        stderr: its standard error over the instances (sample std / sqrt(n_instances); inf for one instance,
            flagged ``few_instances``: one instance has no spread to measure).
        n_instances: number of evaluated instances (relevant items; a total weight when weighted).
        details: estimator-specific extras (method, gamma, sampling law, ...); treat as read-only.
        flags: explicit warnings instead of silent numbers: ``top_unresolved`` (the cut-off lies
            where the sampled data cannot resolve ranks: :meth:`interval` then also spans what the data cannot
            identify), ``all_at_top`` (every positive at r~ = 1;
            stderr is inf), ``few_instances`` (total weight at most 1: stderr inf), ``not_converged``,
            ``fit_not_converged``, ``pooled_n``, ``outside_metric_range`` (the raw value left the range: the point is
            its nearest end), ``cap_reached`` (adaptive sampling: positives still rank first at the cap and the
            metric depends on the cap's bin), ``interval_omits_bias`` (a mapping: its interval is sampling noise
            only). Whatever the flags, :meth:`interval` and :meth:`sampling_interval` hold :attr:`value`.
    """

    value: float
    stderr: float
    n_instances: int | float
    details: Mapping[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    identification: Any = field(default=None, compare=False, repr=False)
    """``identification.Identification`` where the metric depends on the unresolved top (else None)."""
    metric_range: tuple[float, float] | None = field(default=None, compare=False, repr=False)
    """The metric's range (e.g. (0, 1)) when the estimator knows it: :meth:`interval` never leaves it."""
    twin_gap: tuple[float, float] | None = field(default=None, compare=False, repr=False)
    """(down, up): how far the estimate may be shifted each way: the metric's move in twins of the data that the
    draws barely tell apart (``RankDistribution.twin_gap``, ``gmod``), or a correction table's plug-in bias
    (``details["table_bias"]``, ``corrections.plug_in_bias``); :meth:`interval` reaches that much further each way."""

    def sampling_interval(self, level: float = 0.95) -> tuple[float, float]:
        """Normal-approximation interval value +- z stderr: sampling noise only (not what the data cannot identify:
        see :meth:`interval`), clipped to the metric's range when known (:attr:`metric_range`, or the
        identification's)."""
        lo, hi = self._wald(level)
        bounds = self._range()
        return self._holding_value(*((lo, hi) if bounds is None else _clamp(lo, hi, bounds)))

    def _holding_value(self, lo: float, hi: float) -> tuple[float, float]:
        """(lo, hi) stretched to hold the point: no estimate lies outside its own interval, whatever built it (a
        NaN value, nothing estimated, leaves the interval as it is)."""
        v = float(self.value)
        if math.isnan(v):
            return (lo, hi)
        return (v if math.isnan(lo) else min(lo, v), v if math.isnan(hi) else max(hi, v))

    def _wald(self, level: float) -> tuple[float, float]:
        if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
            raise ValueError(f"level: must lie in (0, 1), got {level!r}")
        from statistics import NormalDist

        z = NormalDist().inv_cdf(0.5 + level / 2)
        return (self.value - z * self.stderr, self.value + z * self.stderr)

    def _range(self) -> tuple[float, float] | None:
        if self.identification is not None:
            return tuple(self.identification.metric_range)
        return self.metric_range

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Confidence interval at ``level`` that is honest about the unresolved top.

        Where the metric is identified by the data (:attr:`identification` is None) this is
        :meth:`sampling_interval`, clipped to :attr:`metric_range` when known (a Wald interval of a small HR@10
        would otherwise reach below 0; the clipped set keeps its coverage, the metric cannot lie outside),
        where the estimator gives a :attr:`twin_gap` (``gmod``: how far the metric moves in near-indistinguishable
        twins of the data), each end is Armstrong & Kolesar's bias-aware one, value -+ stderr cv(gap / stderr):
        it covers at ``level`` whenever the estimate is shifted by at most that end's gap (a correction table's
        plug-in bias enters the same way).
        Where it depends on the shape of the rank distribution inside the first
        sampled bin (flag ``top_unresolved``), it is the hull of the sampling interval and the identified
        interval (every rank distribution consistent with the data and the documented shape assumption, see
        ``reco_sampled_plugin.identification``), clipped to the metric's range. Never NaN where the value is a
        number, and always holds the value (``lo <= value <= hi``: no point outside its own interval).
        """
        lo, hi = self._wald(level)
        if self.twin_gap is not None:  # bias-aware ends: each covers whenever the shift is within the gap
            lo = self.value - bias_aware_halfwidth(self.stderr, self.twin_gap[0], level)
            hi = self.value + bias_aware_halfwidth(self.stderr, self.twin_gap[1], level)
        bounds = self._range()
        if bounds is not None:  # a metric of [0, 1] is never negative, the interval says so
            lo, hi = _clamp(lo, hi, bounds)
        if self.identification is None:
            return self._holding_value(lo, hi)
        ident = self.identification.interval(level)
        lo = ident.lo if math.isnan(lo) else min(lo, ident.lo)
        hi = ident.hi if math.isnan(hi) else max(hi, ident.hi)
        return self._holding_value(*_clamp(lo, hi, self.identification.metric_range))

    def __float__(self) -> float:
        return float(self.value)

    def __repr__(self) -> str:
        extra = "" if not self.details else f", details={dict(self.details)!r}"
        if self.flags:
            extra += f", flags={self.flags!r}"
        return f"Estimate(value={self.value:.6g}, stderr={self.stderr:.3g}, n_instances={self.n_instances}{extra})"

    @staticmethod
    def from_values(values: Any, details: Mapping[str, Any] | None = None) -> "Estimate":
        """Mean and standard error (ddof = 1) of per-instance values (a 1-D torch tensor or sequence); one instance:
        stderr inf and the flag ``few_instances`` (never an exactly known value)."""
        import torch

        from ._checks import _numeric

        v = _numeric(values, "values", "real per-instance values").to(torch.float64).reshape(-1)
        n = int(v.numel())
        if n == 0:
            raise ValueError("values: no instances to average")
        if not bool(torch.isfinite(v).all()):  # a NaN would make the mean NaN, an inf the stderr NaN
            bad = v[~torch.isfinite(v)][0].item()
            raise ValueError(f"values: must be finite, got {bad} (leave undefined instances out before averaging)")
        mean = float(v.mean())
        if n == 1:
            flags = ("few_instances",)
            return Estimate(mean, math.inf, n, {**dict(details or {}), "flags": flags}, flags)
        se = float(v.std(correction=1) / math.sqrt(n))
        return Estimate(mean, se, n, dict(details or {}))


def bias_aware_halfwidth(stderr: float, bias: float, level: float) -> float:
    """Half-width stderr cv(bias / stderr) of an interval that covers with probability ``level`` an estimate that
    is normal with sd ``stderr`` and shifted by at most ``bias`` (Armstrong & Kolesar, Econometrica 2020, "Simple
    and honest confidence intervals in nonparametric regression", eq. 6): cv(t) is the ``level`` quantile of
    |N(t, 1)|. Between z stderr (no shift) and bias + z stderr; ``bias`` itself where stderr is 0, inf where it is
    inf."""
    from statistics import NormalDist

    bias = abs(float(bias))
    z = NormalDist().inv_cdf(0.5 + level / 2)
    if not math.isfinite(stderr):
        return math.inf
    if stderr <= 0.0:
        return bias
    t = bias / stderr
    phi = NormalDist().cdf

    def covered(c: float) -> float:
        return phi(c - t) - phi(-c - t)

    lo, hi = max(z, t), t + z  # covered(lo) <= level <= covered(hi)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if covered(mid) < level:
            lo = mid
        else:
            hi = mid
    return stderr * hi


def _clamp(lo: float, hi: float, metric_range: tuple[float, float]) -> tuple[float, float]:
    """Each end of the interval moved into the metric's range (an interval wholly outside it, around an unbounded
    estimator's out-of-range value, becomes the nearest end of the range: (0, 0), never lo > hi)."""
    r_lo, r_hi = metric_range
    return (min(max(lo, r_lo), r_hi), max(min(hi, r_hi), r_lo))
