"""Exact ranks straight from factor matrices: the scores are computed tile by tile and never stored.

For a factor model the scores of B users are ``U @ V.T`` (B x n), plus an optional per-item bias. Ranking them the usual way writes the
whole B x n matrix to memory and reads it back to count, for each held-out item, the items that score
higher. Here each (B_t x C) tile of scores is computed into a small reused buffer (about 2^22 scores,
cache-sized), counted against the positives' scores while it is hot, and overwritten by the next tile:
the count costs no extra trip to memory and the full matrix never exists (BENCHMARKS.md: faster than
the score matmul alone into a full buffer).

Scores are compared as float values of the tile matmul; a positive's own score comes from one dot product
per positive. Positives and excluded items are set to -inf in each tile (they do not count as other
items); positives are then compared with each other on their dot-product scores, so a positive never
counts itself and every comparison between two positives uses the same two numbers. Ranks equal
:func:`~reco_sampled_plugin.ranking.exact_ranks` on ``U @ V.T`` except where another item's score lies
within float rounding of a positive's (the two computations may round the same product differently;
identical with exactly representable scores, tested).
"""

from __future__ import annotations

import math
import weakref

import torch

from .counting import count_beating_tile
from .ranking import _check_ties, exact_ranks, prepare_index, tied_positives

__all__ = ["exact_ranks_from_factors", "check_factors", "check_finite_factors", "factor_ranks_padded", "positive_scores"]

#: scores per tile (B_t x C): 2^22 float32 = 16 MiB, reused for every tile. Measured for 1,024 users x
#: 100,000 items (d = 64, 5 positives, 20 exclusions): C = 8,192 with 2^22 scores 80 ms, C = 16,384 with 2^23
#: 85 ms, C = 16,384 with 2^24 121 ms; the score matmul alone into a full buffer 84 ms.
TILE_ELEMENTS = 1 << 22
# items per tile (C) at most; users per tile B_t = TILE_ELEMENTS // C
_TILE_ITEMS = 1 << 13


def _factor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"{name}: expected a 2-D floating tensor, got shape {tuple(x.shape)} and dtype {x.dtype}")
    return x


# the item factors are usually the same tensor for every user batch: their largest norm is cached, held
# with a weak reference to that very tensor (a new tensor can reuse a freed one's id and address) and
# keyed by its storage, version counter and shape (an in-place update recomputes it)
_item_norm: tuple[weakref.ref, tuple, float] | None = None


def _max_norm(x: torch.Tensor, name: str, cache: bool = False) -> float:
    """Largest row norm (float64), raising when a factor is NaN or inf (then the norm is not finite)."""
    global _item_norm
    cache = cache and not x.is_inference()  # inference tensors have no version counter: never cached
    key = (x.data_ptr(), x._version, tuple(x.shape), x.dtype, x.device) if cache else None
    if cache and _item_norm is not None and _item_norm[0]() is x and _item_norm[1] == key:
        return _item_norm[2]
    norms = torch.linalg.vector_norm(x, dim=1, dtype=torch.float64)  # float64: no overflow from finite values
    if not bool(torch.isfinite(norms).all()):
        raise ValueError(f"{name}: contains NaN or inf")
    value = float(norms.max()) if norms.numel() else 0.0
    if cache:
        _item_norm = (weakref.ref(x), key, value)
    return value


def _max_abs(x: torch.Tensor) -> float:
    """Largest absolute value (float64), raising when ``x`` holds NaN or inf."""
    m = x.detach().abs().max().to(torch.float64) if x.numel() else torch.zeros((), dtype=torch.float64)
    if not bool(torch.isfinite(m)):
        raise ValueError("item_bias: contains NaN or inf")
    return float(m)


def exact_ranks_from_factors(
    user_factors: torch.Tensor,
    item_factors: torch.Tensor,
    positives: torch.Tensor,
    exclude: torch.Tensor | None = None,
    ties: str = "pessimistic",
    *,
    item_bias: torch.Tensor | None = None,
    count_other_positives: bool = True,
    tile_elements: int = TILE_ELEMENTS,
) -> torch.Tensor:
    """1-based rank of every positive among the non-excluded items, scores = ``user_factors @ item_factors.T
    (+ item_bias)``.

    Args:
        user_factors: (B, d) user factors (any floating dtype and device).
        item_factors: (n, d) item factors, same dtype and device.
        positives: held-out relevant items: (B, n) bool mask, (B, P) int64 padded with -1, or (B,).
        exclude: items to leave out of the ranking (training items), same forms; None for none.
        ties: ``"pessimistic"`` (default), ``"optimistic"`` or ``"average"`` (``"random"``: use
            :func:`~reco_sampled_plugin.ranking.exact_ranks` on the score matrix).
        item_bias: optional (n,) score offset per item (an MF model's item bias), same dtype and device.
        count_other_positives: as in :func:`~reco_sampled_plugin.ranking.exact_ranks`.
        tile_elements: scores per tile (memory: one tile of the factors' dtype).

    Returns:
        (B, P) ranks in the positives' padded layout, 0 in padded slots; int64, or float64 for ``average``.

    Raises:
        ValueError: shapes, dtypes or devices that do not match, NaN or inf factors or biases,
            ``ties="random"``, invalid positives / exclusions (as :func:`~reco_sampled_plugin.ranking.exact_ranks`).
    """
    return _ranks_from_factors(user_factors, item_factors, positives, exclude, ties, count_other_positives,
                               tile_elements, item_bias)[0]


def check_factors(user_factors, item_factors, item_bias=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Validated (B, d) user factors, (n, d) item factors and optional (n,) item bias (same dtype and device)."""
    u = _factor(user_factors, "user_factors")
    v = _factor(item_factors, "item_factors")
    if u.shape[1] != v.shape[1]:
        raise ValueError(f"item_factors: {v.shape[1]} factors but user_factors has {u.shape[1]} (they must match)")
    if u.dtype != v.dtype or u.device != v.device:
        raise ValueError(f"item_factors: dtype/device {v.dtype}/{v.device} differ from user_factors' {u.dtype}/{u.device}")
    if v.shape[0] == 0:
        raise ValueError("item_factors: no items")
    if item_bias is not None:
        if not isinstance(item_bias, torch.Tensor):
            item_bias = torch.as_tensor(item_bias, dtype=v.dtype, device=v.device)
        if item_bias.shape != (v.shape[0],) or item_bias.dtype != v.dtype or item_bias.device != v.device:
            raise ValueError(
                f"item_bias: expected ({v.shape[0]},) {v.dtype} on {v.device} like item_factors, got "
                f"{tuple(item_bias.shape)} {item_bias.dtype} on {item_bias.device}"
            )
    return u, v, item_bias


def check_finite_factors(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """Raise when a factor or bias is NaN or inf (then scores would be). :func:`factor_ranks_padded` checks
    this itself (through the norms of its overflow bound); sampled ranks alone need this."""
    for x, name in ((u, "user_factors"), (v, "item_factors"), (bias, "item_bias")):
        if x is not None and not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name}: contains NaN or inf; ranks would be meaningless")


def _ranks_from_factors(user_factors, item_factors, positives, exclude, ties, count_other_positives=True,
                        tile_elements=TILE_ELEMENTS, item_bias=None):
    """:func:`exact_ranks_from_factors`, also returning the validated padded positives and exclusions."""
    _check_ties(ties)
    if ties == "random":
        raise ValueError("ties: 'random' is not supported from factors; use exact_ranks(user_factors @ item_factors.T, ...)")
    u, v, bias = check_factors(user_factors, item_factors, item_bias)
    pos, exc = prepare_index(positives, exclude, u.shape[0], v.shape[0], u.device)
    ranks, _ = factor_ranks_padded(u, v, bias, pos, exc, ties, count_other_positives, tile_elements)
    return ranks, pos, exc


def positive_scores(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, items: torch.Tensor) -> torch.Tensor:
    """Scores of the (B, K) items ``items`` (-1 padding allowed: scored as item 0) for the B users, by one
    dot product each (plus the item bias): the numbers every comparison with those items uses."""
    idx = items.clamp(min=0)
    s = torch.bmm(v[idx], u.unsqueeze(2)).squeeze(2)
    return s if bias is None else s + bias[idx]


@torch.no_grad()
def factor_ranks_padded(
    u: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    pos: torch.Tensor,
    exc: torch.Tensor | None,
    ties: str = "pessimistic",
    count_other_positives: bool = True,
    tile_elements: int = TILE_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact ranks from validated factors (:func:`check_factors`) and padded indices
    (:func:`~reco_sampled_plugin.ranking.prepare_index`); ``ties`` pessimistic, optimistic or average.

    Returns the (B, P) ranks and the positives' (B, P) dot-product scores (+inf in padded slots), or None
    in their place when the factors could overflow and the materialized scores were ranked instead.
    """
    b, n = u.shape[0], v.shape[0]
    if b == 0 or pos.shape[1] == 0:
        dtype = torch.float64 if ties == "average" else torch.int64
        return torch.zeros(pos.shape, dtype=dtype, device=u.device), torch.zeros(pos.shape, dtype=u.dtype, device=u.device)
    # no score can overflow when |u| |v| + |bias| stays below the dtype's largest value (Cauchy-Schwarz);
    # otherwise rank the materialized scores, whose NaN/inf check then names the rows
    bound = _max_norm(u, "user_factors") * _max_norm(v, "item_factors", cache=True)
    if bias is not None:
        bound += _max_abs(bias)
    if not bound < torch.finfo(u.dtype).max / 4:
        scores = u @ v.T if bias is None else torch.addmm(bias, u, v.T)
        return exact_ranks(scores, pos, exc, ties, count_other_positives=count_other_positives), None

    valid = pos >= 0
    s_pos = positive_scores(u, v, bias, pos).masked_fill(~valid, math.inf)  # padded slots: nothing beats +inf
    masked = pos if exc is None else torch.cat([pos, exc], 1)  # -inf in every tile: never counted as items
    need_ge = ties in ("pessimistic", "average")
    need_gt = ties in ("optimistic", "average")
    ge = torch.zeros(pos.shape, dtype=torch.int64, device=u.device)
    gt = torch.zeros(pos.shape, dtype=torch.int64, device=u.device)
    cols = min(n, _TILE_ITEMS, max(1, int(tile_elements)))
    rows = max(1, int(tile_elements) // cols)
    buf = torch.empty((min(rows, b), cols), dtype=u.dtype, device=u.device)
    for r0 in range(0, b, rows):
        r1 = min(b, r0 + rows)
        u_t, ref, m_t = u[r0:r1], s_pos[r0:r1], masked[r0:r1]
        for c0 in range(0, n, cols):
            c1 = min(n, c0 + cols)
            tile = buf[: r1 - r0, : c1 - c0]
            if bias is None:
                torch.matmul(u_t, v[c0:c1].T, out=tile)
            else:
                torch.addmm(bias[c0:c1], u_t, v[c0:c1].T, out=tile)
            hit = (m_t >= c0) & (m_t < c1)
            rr, slot = hit.nonzero(as_tuple=True)
            tile[rr, m_t[rr, slot] - c0] = -math.inf
            if need_ge:
                ge[r0:r1] += count_beating_tile(tile, ref, inclusive=True)
            if need_gt:
                gt[r0:r1] += count_beating_tile(tile, ref, inclusive=False)
    if count_other_positives:  # the other positives, compared on the same dot-product scores
        other = valid.unsqueeze(1) & valid.unsqueeze(2) & ~torch.eye(pos.shape[1], dtype=torch.bool, device=u.device)
        ge += ((s_pos.unsqueeze(1) >= s_pos.unsqueeze(2)) & other).sum(2)
        gt += ((s_pos.unsqueeze(1) > s_pos.unsqueeze(2)) & other).sum(2)
        if ties != "average":  # tied relevant items in slot order, as exact_ranks
            before, after = tied_positives(s_pos, valid)
            ge -= after
            gt += before
    if ties == "pessimistic":
        ranks = ge + 1
    elif ties == "optimistic":
        ranks = gt + 1
    else:
        ranks = (ge + gt + 2).to(torch.float64) / 2
    return torch.where(valid, ranks, torch.zeros_like(ranks)), s_pos
