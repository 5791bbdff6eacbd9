"""RecBole adapter, ``popN`` mode: the popularity law of RecBole's sampler and each positive's Hansen-Hurwitz statistics.

RecBole 1.2.1 (``recbole/sampler/sampler.py``) draws ``popN`` negatives with an alias table built from
``_get_candidates_list()``: every interaction of every phase (``Sampler``: the train, valid and test datasets;
``RepeatableSampler``, sequential models: the whole dataset), q_j proportional to (c_j / total)^alpha, i.e. to
c_j^alpha, over the items that occur (the padding item 0 and items without interactions are never drawn). alpha is
the sampler's own ``alpha``: ``train_neg_sample_args.alpha`` when training samples negatives (the evaluation samplers
reuse the training sampler), else RecBole's default 1.0 (:func:`recbole_alpha` reads it from the config alike). Each
positive gets N draws with replacement; a draw that hits one of the user's ``used_ids`` (``Sampler``: the items of
the user in this and the earlier phases; ``RepeatableSampler``: the row's target) is redrawn, so each draw follows q
renormalised over the row's drawable items: q~_j = w_j / W_u, W_u = sum of w over the items not used. This is the
law ``_popularity`` assumes (docs/popularity.md), and the statistics below are computed from RecBole's own drawn
negatives and the model's scores of them (tests/test_popularity_entry_points.py checks the law against RecBole's
sampler and the statistics against the core on the same draws).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch

from reco_sampled_plugin._popularity import (PopularityStats, RowTotals, class_totals, item_totals, stats_from_totals,
                                             weight_bins)
from reco_sampled_plugin.design import SamplingDesign, popularity_weights

__all__ = ["recbole_alpha", "sampler_weights", "popularity_columns", "check_planned_weights"]


def recbole_alpha(config: Any) -> float:
    """alpha of RecBole's evaluation sampler, read from the config as RecBole reads it (``data/utils.py``,
    ``create_samplers``): ``train_neg_sample_args.alpha`` when training samples negatives, else 1.0.

    Raises:
        ValueError naming ``train_neg_sample_args.alpha`` unless it is a finite number.
    """
    args = config["train_neg_sample_args"]
    if not hasattr(args, "get") or args.get("distribution", "none") in (None, "none", "None"):
        return 1.0
    raw = args.get("alpha", 1.0)
    try:
        a = float(raw) if not isinstance(raw, (bool, str, bytes)) else math.nan
    except (TypeError, ValueError):
        a = math.nan
    if not math.isfinite(a):
        raise ValueError(f"train_neg_sample_args.alpha: RecBole's popularity sampler raises the counts to alpha; "
                         f"expected a finite number, got {raw!r}")
    return a


def sampler_weights(sampler: Any, n_items: int) -> torch.Tensor:
    """(n_items,) float64 weights c_j^alpha of RecBole's sampler (its own candidate list and alpha), cached on it."""
    cached = sampler.__dict__.get("_rsp_pop_weights")
    if cached is not None and cached[0] == (n_items, sampler.alpha):
        return cached[1]
    items = np.asarray(sampler._get_candidates_list(), dtype=np.int64)
    counts = np.bincount(items, minlength=n_items)[:n_items].astype(np.float64)
    try:
        w = popularity_weights(torch.from_numpy(counts), sampler.alpha)
    except ValueError as e:
        raise ValueError(f"train_neg_sample_args.alpha: {str(e).removeprefix('alpha: ')}") from None
    sampler.__dict__["_rsp_pop_weights"] = ((n_items, sampler.alpha), w)
    return w


def check_planned_weights(planned: SamplingDesign, sampler: Any, w: torch.Tensor) -> None:
    """``rsp_design``'s popularity weights are RecBole's sampler's ``w`` up to a factor (the law renormalises them;
    float64, relative 1e-9), checked once per sampler: else a ValueError naming ``rsp_design`` (the estimates would
    assume a law RecBole does not draw). Weights on CPU (the sampler's are), so no device synchronisation."""
    if planned.popularity is None or sampler.__dict__.get("_rsp_planned") is planned:
        return
    p = planned.popularity.detach().cpu().to(torch.float64)
    q = w.detach().cpu().to(torch.float64)
    if p.shape != q.shape or not torch.allclose(p / p.sum(), q / q.sum(), rtol=1e-9, atol=0.0):
        raise ValueError(f"rsp_design: {planned.describe()} draws by its own popularity weights ({p.numel()}), not "
                         f"by RecBole's popN sampler's (interaction count^alpha over {q.numel()} items, "
                         f"train_neg_sample_args.alpha = {sampler.alpha:g}), so its estimates would assume a law "
                         "RecBole does not draw: plan from this data's popN weights (a popN pilot's SampledRanks)")
    sampler.__dict__["_rsp_planned"] = planned


def _used_sums(sampler: Any, w: torch.Tensor) -> RowTotals:
    """Per user id: the weight of its ``used_ids``, how many of them have weight 0 and how many of weight > 0 fall in
    each popularity class (``_popularity.RowTotals``; cached per phase: one pass over the users' sets, flattened in
    C, then one ``index_add`` each over the entries: memory (users x POP_BINS))."""
    used = sampler.used_ids
    cached = sampler.__dict__.get("_rsp_pop_used")
    if cached is not None and cached[0] is used and cached[1] is w:
        return cached[2]
    sizes = np.fromiter((len(u) for u in used), dtype=np.int64, count=len(used))
    flat = np.fromiter(itertools.chain.from_iterable(used), dtype=np.int64, count=int(sizes.sum()))
    owner = torch.from_numpy(np.repeat(np.arange(len(used)), sizes))
    items = torch.from_numpy(flat)  # a set per user: each item once
    totals = item_totals(len(used), owner, items, torch.ones(items.shape, dtype=torch.bool), w, weight_bins(w))
    sampler.__dict__["_rsp_pop_used"] = (used, w, totals)
    return totals


def popularity_columns(sampler: Any, n_items: int, uids: torch.Tensor, pos_i: torch.Tensor, neg_items: torch.Tensor,
                       s_neg: torch.Tensor, s_pos: torch.Tensor, ties: str) -> tuple[PopularityStats, torch.Tensor]:
    """Each positive's :class:`PopularityStats` from RecBole's drawn negatives (``neg_items`` (P, N)) and their scores,
    and the sampler's weights.

    Beating indicators follow the sampled rank's tie policy: an equal score beats under ``pessimistic``, not under
    ``optimistic``, half under ``average`` (the expectation of the random order the rank draws). W_u is the total
    weight minus the user's used items' (``Sampler``) or minus the row's target (``RepeatableSampler``); the padding
    item 0 is never a candidate, so it is not counted among the unreachable (weight 0) candidates.
    """
    from recbole.sampler import RepeatableSampler

    dev = s_neg.device
    w = sampler_weights(sampler, n_items)
    cls = weight_bins(w)
    if isinstance(sampler, RepeatableSampler):  # used_ids: the row's own target
        t = pos_i.cpu().to(torch.int64)
        used = item_totals(t.shape[0], torch.arange(t.shape[0]), t, torch.ones(t.shape, dtype=torch.bool), w, cls)
    else:
        totals = _used_sums(sampler, w)
        u = uids.cpu()
        used = RowTotals(totals.weight[u], totals.zeros[u], totals.classes[u])
    zero_items = int((w[1:] == 0).sum())  # candidates never drawn (item 0 is RecBole's padding)
    total = (w.sum() - used.weight).to(dev)
    unreachable = (zero_items - used.zeros).clamp(min=0).to(dev)
    profile = (class_totals(w, cls).unsqueeze(0) - used.classes).to(dev)  # drawable candidates of weight > 0
    gt = s_neg > s_pos.unsqueeze(1)
    eq = s_neg == s_pos.unsqueeze(1)
    beat = gt.to(torch.float64) + (eq.to(torch.float64) * {"pessimistic": 1.0, "optimistic": 0.0,
                                                            "average": 0.5}[ties])
    valid = torch.ones(s_pos.shape, dtype=torch.bool, device=dev)
    stats = stats_from_totals(beat, neg_items.to(torch.int64), valid, w.to(dev), total, unreachable, given=True,
                              profile=profile, classes=cls.to(dev), positives=pos_i.to(dev, torch.int64))
    return stats, w
