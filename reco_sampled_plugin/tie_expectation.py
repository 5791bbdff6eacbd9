"""Per-user metrics under ``ties="average"``: the expected value over uniformly random orders of tied items.

A relevant item whose score equals the scores of other candidates occupies one of the positions
``lo .. hi`` of its tie group (``lo`` = 1 + the candidates scoring strictly higher, ``hi`` = the
candidates scoring at least as high, itself included), each with probability 1 / g, g = hi - lo + 1.
Feeding the group's mean position into a cut-off metric is not the metric's expectation: a relevant
item tied with one irrelevant item at the top has mean position 1.5, so HR@1 would be 0 where every
order of the tie gives 1 or 0 with equal chance (expected 0.5); three relevant items tied at the top
would all sit at position 2, so P@2 would be 1.5. This module returns, for every metric of the catalogue,
the exact expectation over the g! orders of each tie group (all orders equally likely), in closed form:

* hits@k, DCG@k, AUC are sums over relevant items of a function of the item's position; each item's
  position is uniform on ``lo .. hi``, so the expectation is a difference of cumulative sums
  (tables of 1 / log2(p + 1) and 1 / p up to the largest cut-off needed).
* AP@k: position p of a group holding j relevant items of g is relevant with probability j / g, and then
  (j - 1)(p - lo) / (g - 1) of the others lie before it on average (hypergeometric), so
  E[AP numerator] = sum_p (j / g) (A + 1 + (j - 1)(p - lo) / (g - 1)) / p, A = relevant items above the group.
* Hit@k: 1 - P(no relevant item in the top k); at most one tie group straddles k, and
  P(none of its j relevant items among its first c positions) = C(g - j, c) / C(g, c).
* RR@k: the first relevant position of the first group with relevant items has
  P(min = lo + t) = C(g - 1 - t, j - 1) / C(g, j), t = 0 .. g - j.

With no ties (g = 1 everywhere) every formula reduces to the metric of the integer ranks.
NaN rules are those of :mod:`~reco_sampled_plugin.user_metrics` (recometrics).
"""

from __future__ import annotations

import math

import torch

from .metric_names import MetricSpec

__all__ = ["HIT_COUNTS", "expected_metric_values", "expected_single_item_values", "expected_dcg", "undefined_users", "ideal_dcg"]


HIT_COUNTS = ("precision", "trunc_precision", "recall", "hit")  # the metrics counting hits: undefined where k >= n


def undefined_users(kind: str, k: torch.Tensor, t: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """(B,) True where a metric is NaN by recometrics' rules: no relevant item or one candidate; the
    hit-count metrics when k >= n; every metric but NDCG when no irrelevant candidate is left."""
    nan = (t == 0) | (n <= 1)
    if kind in HIT_COUNTS:
        nan = nan | (n <= k)
    if kind != "ndcg":
        nan = nan | (n - t <= 0)
    return nan


def ideal_dcg(gain: torch.Tensor, valid: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B,) IDCG@k: the gains (B, P) sorted in decreasing order at positions 1, 2, ... (binary gains: ones)."""
    position = torch.arange(1, gain.shape[1] + 1, dtype=torch.float64, device=gain.device)
    ideal = torch.sort(torch.where(valid, gain, torch.zeros_like(gain)), dim=1, descending=True).values
    disc = math.log(2.0) / torch.log1p(position)
    return torch.where(position <= k.unsqueeze(1), ideal * disc, torch.zeros_like(ideal)).sum(1)


def _cumulative(values: torch.Tensor) -> torch.Tensor:
    """[0, v1, v1 + v2, ...]: prefix sums with a leading 0 (index x = sum of the first x values)."""
    return torch.cat([values.new_zeros(1), torch.cumsum(values, 0)])


def _log_choose(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma(a - b + 1)


def expected_metric_values(
    spec: MetricSpec,
    lo: torch.Tensor,
    hi: torch.Tensor,
    n_candidates: torch.Tensor,
    gain: torch.Tensor | None = None,
    max_position: int | None = None,
) -> torch.Tensor:
    """(B,) float64 expected metric per user over random orders of tied items.

    Args:
        spec: the metric.
        lo, hi: (B, P) first and last position of each relevant item's tie group among the user's
            candidates (1-based; lo = hi without ties), 0 in padded slots. Other relevant items compete.
        n_candidates: (B,) candidates per user.
        gain: optional (B, P) graded relevance for NDCG (binary otherwise).
        max_position: an upper bound on every ``hi`` (e.g. the catalogue size); computed when None
            (one host synchronisation).

    Returns:
        (B,) float64, NaN where the metric is undefined for the user.
    """
    lo = lo.to(torch.float64)
    hi = hi.to(torch.float64)
    n = n_candidates.to(torch.float64)
    valid = lo > 0
    t = valid.sum(1).to(torch.float64)
    k = n if spec.k is None else torch.full_like(n, float(spec.k))
    kk = k.unsqueeze(1)
    g = torch.where(valid, hi - lo + 1, torch.ones_like(lo))
    # relevant items above the group (A) and in it (j): positions of lo among the row's sorted valid lo's
    key = torch.where(valid, lo, torch.full_like(lo, math.inf))
    ordered = torch.sort(key, dim=1).values.contiguous()
    above = torch.searchsorted(ordered, key.contiguous(), side="left").to(torch.float64)
    j = torch.searchsorted(ordered, key.contiguous(), side="right").to(torch.float64) - above
    inside = torch.where(valid, torch.clamp(torch.minimum(hi, kk) - lo + 1, min=0), torch.zeros_like(lo))  # positions <= k
    kind = spec.kind
    if kind in ("precision", "trunc_precision", "recall"):
        hits = (inside / g).sum(1)
        out = hits / {"precision": k, "trunc_precision": torch.minimum(k, t), "recall": t}[kind]
    elif kind == "ndcg":
        gains = torch.ones_like(lo) if gain is None else gain.to(torch.float64)
        gains = torch.where(valid, gains, torch.zeros_like(gains))
        dcg = expected_dcg(lo, hi, gains, spec.k, k, max_position)
        idcg = ideal_dcg(gains, valid, k)
        out = torch.where(idcg > 0, dcg / idcg, torch.full_like(dcg, math.nan))
    elif kind in ("ap", "trunc_ap"):
        partial = _group_sums(lo, hi, kk, inside, spec.k, max_position, "reciprocal")
        share = torch.where(g > 1, (j - 1) / torch.clamp(g - 1, min=1), torch.zeros_like(g))
        per_item = torch.where(inside > 0, ((above + 1 - share * lo) * partial + share * inside) / g, torch.zeros_like(lo))
        out = per_item.sum(1) / (t if kind == "ap" else torch.minimum(k, t))
    elif kind == "hit":
        c = kk - lo + 1  # positions of a straddling group inside the cut-off
        log_none = _log_choose(torch.clamp(g - j, min=0), torch.clamp(c, min=0)) - _log_choose(g, torch.clamp(c, 0, None).minimum(g))
        p_none = torch.where(c > g - j, torch.zeros_like(lo), torch.exp(log_none))
        p_none = torch.where(lo > kk, torch.ones_like(lo), torch.where(hi <= kk, torch.zeros_like(lo), p_none))
        p_none = torch.where(valid, p_none, torch.ones_like(lo))
        out = 1.0 - p_none.min(1).values if lo.shape[1] else torch.zeros_like(t)
    elif kind == "rr":
        out = _expected_reciprocal_rank(lo, g, j, above, valid, k, spec.k)
    elif kind == "auc":
        n_neg = n - t
        expected_above = (lo + hi) / 2 - (above + (j + 1) / 2)  # irrelevant candidates expected above the item
        beaten = torch.where(valid, n_neg.unsqueeze(1) - expected_above, torch.zeros_like(lo))
        out = beaten.sum(1) / (t * n_neg)
    else:  # pragma: no cover - MetricSpec validates kinds
        raise ValueError(f"metric: unsupported kind {kind!r}")
    return torch.where(undefined_users(kind, k, t, n), torch.full_like(out, math.nan), out)


def _group_sums(lo: torch.Tensor, hi: torch.Tensor, kk: torch.Tensor, inside: torch.Tensor, k: int | None,
                max_position: int | None, what: str) -> torch.Tensor:
    """(B, P): sum over each group's positions p = lo .. min(hi, k) of 1 / log2(p + 1) (``"discount"``) or 1 / p
    (``"reciprocal"``), from a prefix-sum table up to the largest position needed; 0 where none is inside k."""
    valid = lo > 0
    if max_position is None:  # one synchronisation: the table's length
        max_position = int(torch.where(valid, hi, torch.zeros_like(hi)).max()) if hi.numel() else 0
    top = max(1, min(int(max_position), k if k is not None else int(max_position)))
    p = torch.arange(1, top + 1, dtype=torch.float64, device=lo.device)
    table = _cumulative(math.log(2.0) / torch.log1p(p) if what == "discount" else 1.0 / p)
    end = torch.clamp(torch.minimum(hi, kk), 0, top).long()
    start = torch.clamp(lo - 1, 0, top).long()
    return torch.where(inside > 0, table[end] - table[start], torch.zeros_like(lo))


def expected_dcg(lo: torch.Tensor, hi: torch.Tensor, gain: torch.Tensor, k: int | None, cutoff: torch.Tensor,
                 max_position: int | None = None) -> torch.Tensor:
    """(B,) expected DCG@k over random orders of tied items: sum_i gain_i * mean of 1 / log2(p + 1) over the
    positions p = lo_i .. hi_i of item i's tie group, counting p <= k only. ``lo``, ``hi``, ``gain``: (B, P)
    float64, 0 in padded slots (any real gains, negative ones included); ``k`` the metric's cut-off (None: per
    user ``cutoff``, (B,), e.g. the candidate counts); ``max_position`` bounds every ``hi`` (None: computed)."""
    valid = lo > 0
    kk = cutoff.to(torch.float64).unsqueeze(1)
    g = torch.where(valid, hi - lo + 1, torch.ones_like(lo))
    inside = torch.where(valid, torch.clamp(torch.minimum(hi, kk) - lo + 1, min=0), torch.zeros_like(lo))
    partial = _group_sums(lo, hi, kk, inside, k, max_position, "discount")
    return (torch.where(valid, gain, torch.zeros_like(gain)) * partial / g).sum(1)


def _expected_reciprocal_rank(lo: torch.Tensor, g: torch.Tensor, j: torch.Tensor, above: torch.Tensor, valid: torch.Tensor,
                              k: torch.Tensor, cutoff: int | None = None) -> torch.Tensor:
    """E[1 / first relevant position, 0 beyond k]: the first group holding relevant items (above = 0). ``cutoff``: the
    metric's k, which bounds the grid of positions summed (k wide: nothing read back); None: the grid as wide as the
    widest first group inside each user's k (one synchronisation)."""
    first = valid & (above == 0)
    lo1 = torch.where(first, lo, torch.full_like(lo, math.inf)).min(1).values  # (B,), inf without positives
    has = torch.isfinite(lo1)
    pick = torch.where(first, torch.arange(lo.shape[1], device=lo.device), lo.shape[1]).min(1).values.clamp(max=max(lo.shape[1] - 1, 0))
    if lo.shape[1] == 0:
        return torch.zeros_like(k)
    g1 = g.gather(1, pick.unsqueeze(1))[:, 0]
    j1 = j.gather(1, pick.unsqueeze(1))[:, 0]
    lo1 = torch.where(has, lo1, torch.ones_like(lo1))
    span = torch.clamp(torch.minimum(g1 - j1, k - lo1), min=-1)  # last offset t to sum (-1: nothing inside k)
    if cutoff is not None:  # span <= k - lo1 <= k - 1
        width = cutoff if span.numel() else 0
    else:
        width = int(span.max()) + 1 if span.numel() else 0  # one synchronisation (the grid's width)
    if width <= 0:
        return torch.zeros_like(k)
    tt = torch.arange(width, dtype=torch.float64, device=lo.device).unsqueeze(0)
    g1, j1, lo1, span = g1.unsqueeze(1), j1.unsqueeze(1), lo1.unsqueeze(1), span.unsqueeze(1)
    log_p = _log_choose(torch.clamp(g1 - 1 - tt, min=0), torch.clamp(j1 - 1, min=0)) - _log_choose(g1, j1)
    terms = torch.where(tt <= span, torch.exp(log_p) / (lo1 + tt), torch.zeros_like(log_p))
    return torch.where(has, terms.sum(1), torch.zeros_like(k))


def expected_single_item_values(spec: MetricSpec, lo: torch.Tensor, hi: torch.Tensor, n_items: torch.Tensor,
                                max_position: int | None = None) -> torch.Tensor:
    """The single-relevant-item metric M(r) of the papers (``metrics.metric_values``) averaged over the positions
    r = lo .. hi of the item's tie group (``ties="average"``): its expectation over the orders of the tie, where
    M at the mean rank would count an item tied with one other at the top as HR@1 = 0 rather than 0.5.

    ``lo``, ``hi``: 1-based positions, any shape (lo = hi: M(lo)); ``n_items``: candidates, broadcastable;
    ``max_position`` bounds every ``hi`` (None: computed, one synchronisation). Returns float64."""
    lo, hi = lo.to(torch.float64), hi.to(torch.float64)
    n = torch.as_tensor(n_items, dtype=torch.float64, device=lo.device).expand_as(lo)
    if spec.kind == "auc":  # linear in r: M of the mean position
        return (n - (lo + hi) / 2) / (n - 1)
    g = hi - lo + 1
    cut = hi if spec.k is None else torch.full_like(lo, float(spec.k))
    inside = torch.clamp(torch.minimum(hi, cut) - lo + 1, min=0)
    if spec.kind in ("precision", "recall", "hit", "trunc_precision"):
        scale = 1.0
        if spec.kind == "precision":
            assert spec.k is not None  # precision has a cut-off (MetricSpec checks it)
            scale = float(spec.k)
        return inside / g / scale
    what = "discount" if spec.kind == "ndcg" else "reciprocal"  # ap, trunc_ap, rr: 1 / r for one relevant item
    flat = [t.reshape(-1, 1) for t in (lo, hi, cut, inside)]
    return (_group_sums(flat[0], flat[1], flat[2], flat[3], spec.k, max_position, what) / g.reshape(-1, 1)).reshape(lo.shape)
