"""Corrected metrics with standard errors, and paired comparisons of two recommenders.

A corrected metric is the mean of a correction table M^ (corrections.py) looked up at the sampled
ranks r~ in 1..m+1 of the evaluated relevant items; its standard error is the sample standard
deviation over those instances / sqrt(#instances). Candidate counts n may differ per instance
(catalogue minus each user's training items): by default every distinct n gets its own exact table
(cached), so the lookup is exact, not grouped. With ``max_rel_n_spread=s`` tables are built only on a
geometric grid of n (consecutive nodes within a factor 1 + s) and each instance uses the table
interpolated linearly in 1/(n - 1) between its two neighbouring nodes: far fewer tables, with the
error measured in docs/corrections.md (s = 0.1: below 1e-4 relative on ml-100k). Tables are applied
on the device of the ranks.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._checks import MAX_SAMPLES, check_rank_values, check_sampled_support, check_size, check_sizes
from ._rank_hist import check_spread
from .corrections import table_numpy, check_gamma, check_method, n_interpolation, tables_for_counts
from ._estimate import Estimate, range_flags
from .metric_names import parse_metric
from .metrics import metric_bounds
from .sampling_laws import check_law

if TYPE_CHECKING:
    from .metric_names import MetricSpec
    from .priors import PriorLike
    from ._types import TensorLike

__all__ = ["corrected_values", "corrected_metric", "paired_difference"]


def _check_sampled(sampled_ranks: Any, m: int) -> torch.Tensor:
    r = check_rank_values(sampled_ranks, "sampled_ranks", whole=True)
    if r.numel() and (bool((r < 1).any()) or bool((r > m + 1).any())):
        bad = r[(r < 1) | (r > m + 1)].reshape(-1)[0].item()
        raise ValueError(f"sampled_ranks: values must lie in 1..m+1 = 1..{m + 1} (1-based), found {bad}")
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
    ``outside_metric_range`` (e.g. ``ls``, whose minimal-bias table has huge alternating entries)."""
    flags = range_flags(est.value, est.flags, bounds)
    details = {**dict(est.details), "flags": flags} if flags else dict(est.details)
    return dataclasses.replace(est, details=details, flags=flags, metric_range=(float(bounds[0]), float(bounds[1])))


def _bounds(spec: MetricSpec, n_items: int | TensorLike) -> tuple[float, float]:
    """The metric's range over the candidate counts ``n_items`` (an int or a tensor, any device)."""
    return metric_bounds(spec, torch.as_tensor(n_items).detach().cpu().reshape(-1).numpy())


def corrected_values(
    metric: str | MetricSpec,
    sampled_ranks: TensorLike,
    n_items: int | TensorLike,
    n_samples: int,
    method: str = "bv",
    gamma: float = 0.1,
    sampling: str = "binomial",
    prior: PriorLike = None,
    *,
    rounding: str = "floor",
    max_rel_n_spread: float | None = None,
) -> torch.Tensor:
    """Per-instance corrected values M^[r~] (float64, shape of ``sampled_ranks``, on its device).

    ``n_items`` is an int or a tensor of per-instance candidate counts broadcastable to the ranks.
    ``max_rel_n_spread``: None (a table per distinct n, exact) or s > 0 (tables on a geometric grid of n,
    interpolated in 1/(n - 1); see the module docstring).
    """
    m = check_size(n_samples, "n_samples", 1, MAX_SAMPLES)
    r = _check_sampled(sampled_ranks, m)
    n = check_sizes(n_items, "n_items", 2, like=r, like_name="sampled_ranks", exact=True, device=r.device)
    n = torch.broadcast_to(torch.as_tensor(n, dtype=torch.int64, device=r.device), r.shape)
    check_sampled_support(r, n, m, check_law(sampling))  # as estimate(): an r~ the design cannot produce is refused
    spread = check_spread(max_rel_n_spread)
    if r.numel() == 0:  # an empty batch (the end of a loop): no values; the settings are still checked
        parse_metric(metric), check_method(method), check_gamma(gamma), check_law(sampling)
        return torch.empty(r.shape, dtype=torch.float64, device=r.device)
    if spread is not None and n.numel():
        grid, j_np, t_np = n_interpolation(n.reshape(-1), spread)
        rows = [table_numpy(metric, int(v), m, method, gamma, sampling, prior, rounding) for v in grid.tolist()]
        tables = torch.from_numpy(np.stack(rows)).to(r.device)
        j = torch.from_numpy(j_np).to(r.device)
        t = torch.from_numpy(t_np).to(r.device)
        idx = r.reshape(-1) - 1
        hi = torch.clamp(j + 1, max=len(grid) - 1)
        vals = (1.0 - t) * tables[j, idx] + t * tables[hi, idx]
        return vals.reshape(r.shape)
    tables, inverse = tables_for_counts(metric, n.reshape(-1), m, method, gamma, sampling, prior, rounding)
    tables = tables.to(r.device)
    inverse = inverse.to(r.device)
    return tables[inverse, r.reshape(-1) - 1].reshape(r.shape)


def corrected_metric(
    metric: str | MetricSpec,
    sampled_ranks: TensorLike,
    n_items: int | TensorLike,
    n_samples: int,
    method: str = "bv",
    gamma: float = 0.1,
    sampling: str = "binomial",
    prior: PriorLike = None,
    *,
    rounding: str = "floor",
    max_rel_n_spread: float | None = None,
) -> Estimate:
    """Corrected sampled metric (Krichene & Rendle section 5) with its standard error.

    Args:
        metric: metric name, e.g. ``"ndcg@10"``, ``"recall@10"``, ``"ap"``, ``"auc"``.
        sampled_ranks: 1-based ranks r~ in 1..m+1, one per relevant item (any shape, any device).
        n_items: n, candidates per instance (int, or per-instance tensor: honoured exactly).
        n_samples: m, sampled irrelevant items per relevant item.
        method, gamma, sampling, prior, rounding: as :func:`~reco_sampled_plugin.corrections.correction_table`.
        max_rel_n_spread: None (exact table per distinct n) or s > 0: tables on a geometric grid of n with
            consecutive nodes within a factor 1 + s, interpolated in 1/(n - 1) (module docstring).

    Returns:
        :class:`Estimate` (value, stderr over instances, n_instances, details with the settings); a single
        instance gives stderr inf and the flag ``few_instances``. Its intervals lie inside the metric's range.
    """
    spec = parse_metric(metric)
    values = corrected_values(
        spec, sampled_ranks, n_items, n_samples, method, gamma, sampling, prior, rounding=rounding,
        max_rel_n_spread=max_rel_n_spread,
    )
    if values.numel() == 0:
        raise ValueError("sampled_ranks: empty, no instance to average (corrected_values gives per-instance values)")
    details = {
        "metric": str(spec),
        "method": check_method(method),
        "gamma": check_gamma(gamma),
        "sampling": check_law(sampling),
        "n_samples": int(n_samples),
        "max_rel_n_spread": max_rel_n_spread,
    }
    est = _spread_measured(Estimate.from_values(values.detach().cpu(), details))
    return _with_range(est, _bounds(spec, n_items))


def paired_difference(
    metric: str | MetricSpec,
    sampled_ranks_a: TensorLike,
    sampled_ranks_b: TensorLike,
    n_items: int | TensorLike,
    n_samples: int,
    method: str = "bv",
    gamma: float = 0.1,
    sampling: str = "binomial",
    prior: PriorLike = None,
    *,
    rounding: str = "floor",
) -> Estimate:
    """Corrected metric of A minus that of B on the same instances, with the paired standard error.

    ``details["prob_a_better"]`` is the normal-approximation probability that A's metric exceeds B's,
    Phi(value / stderr); ``details["prob_ordering_holds"]`` is that of the observed ordering,
    Phi(|value| / stderr) (1 when every instance has the same non-zero difference, 0.5 for a zero
    difference). A single instance has no measurable spread: stderr inf, flag ``few_instances``, and both
    probabilities 0.5 (no evidence either way), never certainty.
    """
    a = check_rank_values(sampled_ranks_a, "sampled_ranks_a")
    b = check_rank_values(sampled_ranks_b, "sampled_ranks_b")
    if a.shape != b.shape:
        raise ValueError(f"sampled_ranks_b: shape {tuple(b.shape)} differs from sampled_ranks_a {tuple(a.shape)}")
    if a.numel() == 0:
        raise ValueError("sampled_ranks_a: empty, no paired instance to compare")
    va = corrected_values(metric, a, n_items, n_samples, method, gamma, sampling, prior, rounding=rounding)
    vb = corrected_values(metric, b.to(a.device), n_items, n_samples, method, gamma, sampling, prior, rounding=rounding)
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
    details = {
        "metric": str(parse_metric(metric)),
        "method": check_method(method),
        "gamma": check_gamma(gamma),
        "prob_a_better": p_a,
        "prob_ordering_holds": max(p_a, 1 - p_a) if not math.isnan(p_a) else 0.5,
        "flags": est.flags,
    }
    return Estimate(est.value, est.stderr, est.n_instances, details, est.flags, metric_range=est.metric_range)
