"""Paired comparisons of two recommenders on the same instances.

:func:`paired_difference` looks the correction table M^ (corrections.py) of one method (a name such as ``"bv"`` or
the registry's method object: ``registry.Bv(gamma=0.2)``, ``registry.Cls()``, ...) under one design (an int m or a
fixed-m ``SamplingDesign``) up at each instance's sampled ranks r~ in 1..m+1 under both recommenders and averages the
differences; its standard error is the sample standard deviation of the differences / sqrt(#instances). Candidate
counts n may differ per instance (catalogue minus each user's training items): every distinct n gets its own exact
table (cached). Tables are applied on the device of the ranks. A corrected metric of one recommender is
``estimate(metric, sample, method)`` (``estimators.py``).
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import torch

from . import registry
from ._checks import check_rank_values, check_sampled_support, check_sizes
from .corrections import as_correction, tables_for_counts
from ._estimate import Estimate, in_range
from .metric_names import parse_metric
from .metrics import metric_bounds

if TYPE_CHECKING:
    from .corrections import Correction
    from .design import SamplingDesign
    from .metric_names import MetricSpec
    from ._types import TensorLike

__all__ = ["paired_difference"]


def _check_sampled(sampled_ranks: Any, m: int, name: str) -> torch.Tensor:
    r = check_rank_values(sampled_ranks, name, whole=True)
    if r.numel() and (bool((r < 1).any()) or bool((r > m + 1).any())):
        bad = r[(r < 1) | (r > m + 1)].reshape(-1)[0].item()
        pad = " (0 pads a SampledRanks' rows: pass the ranks of the instances both models ranked, flattened)" if bad == 0 else ""
        raise ValueError(f"{name}: values must lie in 1..m+1 = 1..{m + 1} (1-based), found {bad}{pad}")
    return r.to(torch.int64)


def _spread_measured(est: Estimate) -> Estimate:
    """``est`` where its instances have a spread to measure; for a single instance (no sample standard
    deviation exists) the standard error is inf and the estimate flagged ``few_instances``, as ``estimate()``
    does: one instance must never read as an exactly known value."""
    if est.n_instances > 1:
        return est
    flags = tuple(est.flags) + (() if "few_instances" in est.flags else ("few_instances",))
    return dataclasses.replace(est, stderr=math.inf, details={**dict(est.details), "flags": flags}, flags=flags)


def _with_range(est: Estimate, bounds: tuple[float, float]) -> Estimate:
    """``est`` with the metric's range (its intervals never leave it); a value outside is flagged
    ``outside_metric_range`` (e.g. ``ls``, whose minimal-bias table has huge alternating entries) and becomes the
    range's nearest end, as ``estimate()``'s (``_estimate.in_range``)."""
    value, flags, details = in_range(est.value, est.flags, est.details, bounds)
    if flags:
        details["flags"] = flags
    return dataclasses.replace(est, value=value, details=details, flags=flags,
                               metric_range=(float(bounds[0]), float(bounds[1])))


def _bounds(spec: MetricSpec, n_items: int | TensorLike) -> tuple[float, float]:
    """The metric's range over the candidate counts ``n_items`` (an int or a tensor, any device)."""
    return metric_bounds(spec, torch.as_tensor(n_items).detach().cpu().reshape(-1).numpy())


def _table_values(metric: str | MetricSpec, r: torch.Tensor, n_items: int | TensorLike, m: int,
                  corr: Correction) -> torch.Tensor:
    """The correction table M^ of each instance's n looked up at its sampled rank (float64, on the device of ``r``):
    one exact table per distinct n (``corrections.tables_for_counts``, cached)."""
    n = check_sizes(n_items, "n_items", 2, like=r, like_name="sampled_ranks", exact=True, device=r.device)
    n = torch.broadcast_to(torch.as_tensor(n, dtype=torch.int64, device=r.device), r.shape)
    check_sampled_support(r, n, m, corr.law)  # as estimate(): an r~ the design cannot produce is refused
    tables, inverse = tables_for_counts(metric, n.reshape(-1), m, corr)
    return tables.to(r.device)[inverse.to(r.device), r.reshape(-1) - 1].reshape(r.shape)


def paired_difference(
    metric: str | MetricSpec,
    sampled_ranks_a: TensorLike,
    sampled_ranks_b: TensorLike,
    n_items: int | TensorLike,
    n_samples: SamplingDesign | int,
    method: str | registry.Method = registry.DEFAULT_CORRECTION,
) -> Estimate:
    """Corrected metric of A minus that of B on the same instances, with the paired standard error.

    ``n_samples`` is the design (an int m, or a fixed-m ``SamplingDesign``: ``replacement=False`` for draws without
    replacement) and ``method`` the correction (a name of ``corrections.METHODS`` or the registry's method object,
    ``registry.Bv(gamma=0.2, prior=...)``), as in :func:`~reco_sampled_plugin.corrections.correction_table`.
    ``details["prob_a_better"]`` is the normal-approximation probability that A's metric exceeds B's,
    Phi(value / stderr); ``details["prob_ordering_holds"]`` is that of the observed ordering,
    Phi(|value| / stderr) (1 when every instance has the same non-zero difference, 0.5 for a zero
    difference). A single instance has no measurable spread: stderr inf, flag ``few_instances``, and both
    probabilities 0.5 (no evidence either way), never certainty. ``details["gamma"]`` is bv's (None for the others).

    Where either model's metric depends on the unresolved top (its ``estimate`` flagged ``top_unresolved``: a
    cut-off inside the first sampled bin), so does the difference: flag ``top_unresolved``,
    ``details["identified_difference"]`` = (lo_A - hi_B, hi_A - lo_B) from the two models' 95% intervals (each
    holds every rank distribution consistent with its data; unpaired, so conservative), which
    :meth:`~Estimate.interval` covers (its bias-aware ends, as for ``gmod``'s twin gap); both probabilities None
    where that range holds 0 (the data are consistent with either ordering).
    """
    a = check_rank_values(sampled_ranks_a, "sampled_ranks_a")
    b = check_rank_values(sampled_ranks_b, "sampled_ranks_b")
    if a.shape != b.shape:
        raise ValueError(f"sampled_ranks_b: shape {tuple(b.shape)} differs from sampled_ranks_a {tuple(a.shape)}")
    if a.numel() == 0:
        raise ValueError("sampled_ranks_a: empty, no paired instance to compare")
    corr, m = as_correction(method, n_samples)
    a, b = _check_sampled(a, m, "sampled_ranks_a"), _check_sampled(b.to(a.device), m, "sampled_ranks_b")
    va = _table_values(metric, a, n_items, m, corr)
    vb = _table_values(metric, b, n_items, m, corr)
    est = _spread_measured(Estimate.from_values((va - vb).detach().cpu()))
    lo, hi = _bounds(parse_metric(metric), n_items)
    est = _with_range(est, (lo - hi, hi - lo))  # a difference of two values in [lo, hi]: flagged outside it
    if math.isinf(est.stderr):  # one instance: no spread to measure, so no evidence for either ordering
        p_a = 0.5
    elif est.stderr > 0:
        z = est.value / est.stderr
        p_a = NormalDist().cdf(z)
    else:
        p_a = 0.5 if est.value == 0 else float(est.value > 0)
    obj = registry.as_method(method)
    flags, shift, identified = est.flags, None, None
    ends = _unresolved_ends(metric, (a, b), n_items, n_samples, obj)
    if ends is not None:  # the data cannot say how either model's first sampled bin is shaped
        flags = flags + ("top_unresolved",) if "top_unresolved" not in flags else flags
        identified = (ends[0][0] - ends[1][1], ends[0][1] - ends[1][0])
        shift = (max(est.value - identified[0], 0.0), max(identified[1] - est.value, 0.0))
        if identified[0] <= 0.0 <= identified[1]:  # either ordering is consistent with the data
            p_a = math.nan
    details = {
        "metric": str(parse_metric(metric)),
        "method": obj.name,
        "gamma": getattr(obj, "gamma", None),
        "prob_a_better": None if math.isnan(p_a) else p_a,
        "prob_ordering_holds": None if math.isnan(p_a) else max(p_a, 1 - p_a),
        "flags": flags,
        **({"identified_difference": identified} if identified is not None else {}),
        **({"unclipped_value": est.details["unclipped_value"]} if "unclipped_value" in est.details else {}),
    }
    return Estimate(est.value, est.stderr, est.n_instances, details, flags, metric_range=est.metric_range,
                    twin_gap=shift)


def _unresolved_ends(metric: str | MetricSpec, ranks: tuple[torch.Tensor, torch.Tensor], n_items: int | TensorLike,
                     n_samples: SamplingDesign | int, method: registry.Method) -> list[tuple[float, float]] | None:
    """Each model's 95% interval (:meth:`Estimate.interval`: the identified one where its top is unresolved) where
    either model's estimate is flagged ``top_unresolved``, else None (both identified by the data)."""
    from ._sampled import SampledRanks
    from .estimators import estimate

    ests = [estimate(metric, SampledRanks.from_arrays(r, n_items, None, n_samples), method) for r in ranks]
    if not any("top_unresolved" in e.flags for e in ests):
        return None
    return [e.interval(0.95) for e in ests]
