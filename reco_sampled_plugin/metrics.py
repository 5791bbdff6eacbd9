"""Single-relevant-item metrics M(r) (Krichene & Rendle, section 3.1, eq. 7-13).

For one relevant item at 1-based rank ``r`` among ``n`` candidates (the relevant item included):

===============  ==============================
AUC              (n - r) / (n - 1)
Precision@k      [r <= k] / k
Recall@k, Hit@k  [r <= k]
TP@k             [r <= k]          (|T| = 1, so min(k, |T|) = 1)
AP@k, TAP@k      [r <= k] / r      (= RR@k)
NDCG@k           [r <= k] / log2(r + 1)
===============  ==============================

Without ``@k`` the cut-off is ``n``. A sampled metric applies the same M to the sampled rank
r~ in 1..m+1 with ``n = m + 1`` candidates.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from ._checks import check_device, check_elements, check_rank_values, check_ranks_in_range, check_sizes
from .metric_names import MetricSpec, parse_metric

if TYPE_CHECKING:
    from ._types import TensorLike

__all__ = ["metric_values", "metric_curve", "metric_bounds"]


def metric_from_float_ranks(spec: MetricSpec, r: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """M(r) on float64 ranks ``r`` and candidate counts ``n`` (broadcast), no validation."""
    kind, k = spec.kind, spec.k
    if kind == "auc":
        return (n - r) / (n - 1)
    inside = torch.ones_like(r, dtype=torch.bool) if k is None else (r <= k)
    if kind == "precision":
        assert k is not None  # precision has a cut-off (MetricSpec checks it)
        value = torch.full_like(r, 1.0 / k)
    elif kind in ("recall", "hit", "trunc_precision"):
        value = torch.ones_like(r)
    elif kind in ("ap", "trunc_ap", "rr"):
        value = 1.0 / r
    elif kind == "ndcg":
        value = math.log(2.0) / torch.log1p(r)
    else:  # pragma: no cover - MetricSpec validates kinds
        raise ValueError(f"metric: unsupported kind {kind!r}")
    return torch.where(inside, value, torch.zeros_like(value))


def metric_values(metric: str | MetricSpec, ranks: TensorLike, n_items: int | TensorLike) -> torch.Tensor:
    """M(r) for single-relevant-item ranks of any shape, as float64 on the ranks' device.

    Args:
        metric: a name such as ``"ndcg@10"``, ``"recall@10"``, ``"ap"``, ``"mrr"``, ``"auc"``.
        ranks: 1-based ranks (int or float tensor, any shape; fractional ranks from
            ``ties="average"`` are allowed).
        n_items: number of candidates ``n`` (the relevant item included): an int or a tensor
            broadcastable to the shape of ``ranks`` (per-instance candidate counts; never widening it: the values
            keep the ranks' shape, whatever the metric).

    Raises:
        ValueError: unknown metric, ranks outside 1..n, n < 1 (n < 2 for AUC), or a cut-off
            ``k`` larger than the candidate list.
    """
    spec = parse_metric(metric)
    r = check_rank_values(ranks, "ranks")
    n = check_sizes(n_items, "n_items", 2 if spec.kind == "auc" else 1, like=r, device=r.device, exact=True)
    n = torch.as_tensor(n, dtype=torch.float64, device=r.device)
    r = r.to(torch.float64)
    if spec.k is not None and n.numel() and spec.k > float(n.max()):
        raise ValueError(f"metric: k = {spec.k} is larger than the candidate list (n_items = {int(n.max())})")
    check_ranks_in_range(r, n)
    return metric_from_float_ranks(spec, r, n)


def metric_curve(metric: str | MetricSpec, n_items: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The whole table M(1), ..., M(n) as a float64 vector of length ``n_items`` (index 0 is r = 1).

    Raises:
        ValueError: naming ``n_items`` when the curve would exceed ``_checks.MAX_ELEMENTS`` (2^27) values; for a
            few ranks of a huge catalogue use :func:`metric_values`.
    """
    spec = parse_metric(metric)
    n_items = check_sizes(n_items, "n_items", 2 if spec.kind == "auc" else 1, one=True)
    check_elements(n_items, "n_items", "the curve M(1..n)")  # one value per rank: refused before allocating
    r = torch.arange(1, n_items + 1, dtype=torch.float64, device=check_device(device))
    return metric_values(spec, r, n_items)


def metric_bounds(spec: MetricSpec, n_items: int | TensorLike) -> tuple[float, float]:
    """[min, max] of M(r) over r in 1..n for every candidate count n in ``n_items`` (M is non-increasing in r):
    the metric's range, within which every interval is clamped."""
    import numpy as np

    return _bounds_for(spec, tuple(np.unique(np.asarray(n_items)).tolist()))


@lru_cache(maxsize=256)
def _bounds_for(spec: MetricSpec, ns: tuple) -> tuple[float, float]:
    n_t = torch.tensor(ns, dtype=torch.float64)
    lo = metric_from_float_ranks(spec, n_t, n_t).min()
    hi = metric_from_float_ranks(spec, torch.ones_like(n_t), n_t).max()
    return float(lo), float(hi)
