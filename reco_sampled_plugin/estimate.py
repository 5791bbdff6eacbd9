"""The value every estimator returns: a point estimate with its standard error."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

__all__ = ["Estimate", "EstimatorOutput"]


class EstimatorOutput(NamedTuple):
    """What a registered estimator's compute function returns (``registry.py``); ``estimate()`` turns it into
    an :class:`Estimate` (the metric's range, the identified interval, the design's flags)."""

    value: float
    stderr: float | None
    n_instances: float
    details: dict
    flags: tuple = ()


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
            ``fit_not_converged``, ``pooled_n``, ``outside_metric_range``, ``cap_reached`` (adaptive sampling:
            positives still rank first at the cap and the metric depends on the cap's bin).
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

    def sampling_interval(self, level: float = 0.95) -> tuple[float, float]:
        """Normal-approximation interval value +- z stderr: sampling noise only."""
        if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
            raise ValueError(f"level: must lie in (0, 1), got {level!r}")
        from statistics import NormalDist

        z = NormalDist().inv_cdf(0.5 + level / 2)
        return (self.value - z * self.stderr, self.value + z * self.stderr)

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Confidence interval at ``level`` that is honest about the unresolved top.

        Where the metric is identified by the data (:attr:`identification` is None) this is
        :meth:`sampling_interval`, clipped to :attr:`metric_range` when known (a Wald interval of a small HR@10
        would otherwise reach below 0; the clipped set keeps its coverage, the metric cannot lie outside).
        Where it depends on the shape of the rank distribution inside the first
        sampled bin (flag ``top_unresolved``), it is the hull of the sampling interval and the identified
        interval (every rank distribution consistent with the data and the documented shape assumption, see
        ``reco_sampled_plugin.identification``), clipped to the metric's range. Never NaN.
        """
        lo, hi = self.sampling_interval(level)
        if self.identification is None:
            if self.metric_range is None:
                return (lo, hi)
            return _clamp(lo, hi, self.metric_range)  # a metric of [0, 1] is never negative: the interval says so
        ident = self.identification.interval(level)
        lo = ident.lo if math.isnan(lo) else min(lo, ident.lo)
        hi = ident.hi if math.isnan(hi) else max(hi, ident.hi)
        return _clamp(lo, hi, self.identification.metric_range)

    def __float__(self) -> float:
        return float(self.value)

    def __repr__(self) -> str:
        extra = "" if not self.details else f", details={dict(self.details)!r}"
        if self.flags:
            extra += f", flags={self.flags!r}"
        return f"Estimate(value={self.value:.6g}, stderr={self.stderr:.3g}, n_instances={self.n_instances}{extra})"

    @staticmethod
    def from_values(values, details: Mapping[str, Any] | None = None) -> "Estimate":
        """Mean and standard error (ddof = 1) of per-instance values (a 1-D torch tensor or sequence); one instance:
        stderr inf and the flag ``few_instances`` (never an exactly known value)."""
        import torch

        v = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
        n = int(v.numel())
        if n == 0:
            raise ValueError("values: no instances to average")
        mean = float(v.mean())
        if n == 1:
            flags = ("few_instances",)
            return Estimate(mean, math.inf, n, {**dict(details or {}), "flags": flags}, flags)
        se = float(v.std(correction=1) / math.sqrt(n))
        return Estimate(mean, se, n, dict(details or {}))


def _clamp(lo: float, hi: float, metric_range: tuple[float, float]) -> tuple[float, float]:
    """Each end of the interval moved into the metric's range (an interval wholly outside it, around an unbounded
    estimator's out-of-range value, becomes the nearest end of the range: (0, 0), never lo > hi)."""
    r_lo, r_hi = metric_range
    return (min(max(lo, r_lo), r_hi), max(min(hi, r_hi), r_lo))
