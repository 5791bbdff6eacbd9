"""Exact and sampled ranks of held-out relevant items, from a batch of scores (any device).

Conventions: ranks are 1-based (1 = best); a higher score ranks higher. Positives and exclusions
come as a (B, n) boolean mask or a (B, P) int64 index tensor padded with -1. Output ranks have the
padded layout (B, P) (for a mask input: positives in ascending item order) with 0 in padded slots.

Tie policies (for items with exactly equal scores):

* ``"pessimistic"`` (default): tied items rank above the positive, rank = #{candidates with s >= s_p};
* ``"optimistic"``: they rank below, rank = 1 + #{candidates with s > s_p};
* ``"average"``: the mean of the two (float ranks, halves possible);
* ``"random"``: a seeded uniformly random order of each tie group, consistent across the positives
  of a row (two tied positives never share a rank).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ._checks import MAX_SAMPLES, check_int, check_same_device, check_sizes, check_weights
from ._inputs import as_padded_index, check_finite_rows, check_scores
from .counting import count_beating, count_beating_checked, count_tied_before, item_keys

__all__ = [
    "TIES",
    "exact_ranks",
    "sampled_ranks",
    "candidate_counts",
    "SampledRanks",
    # building blocks on validated, padded inputs (used by the adapters)
    "as_padded_index",
    "exact_ranks_padded",
    "forbidden_sorted",
    "allowed_position_to_item",
]

TIES = ("pessimistic", "optimistic", "average", "random")


def _check_ties(ties: str) -> str:
    if ties not in TIES:
        raise ValueError(f"ties: unknown policy {ties!r}; use one of {TIES}")
    return ties


def _row_seeds(batch: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    gen_device = generator.device if generator is not None else torch.device("cpu")
    seeds = torch.randint(0, 2**31 - 1, (batch, 1), generator=generator, device=gen_device, dtype=torch.int64)
    return seeds.to(device)


def _gather_padded(scores: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    valid = idx >= 0
    return scores.gather(1, idx.clamp(min=0)), valid


def _removed_counts(
    removed_scores: torch.Tensor,
    removed_valid: torch.Tensor,
    removed_idx: torch.Tensor,
    pos_scores: torch.Tensor,
    pos_idx: torch.Tensor,
    inclusive: bool,
) -> torch.Tensor:
    """How many removed items (excluded, or other positives) beat each positive; never the positive itself."""
    cmp = removed_scores.unsqueeze(1) >= pos_scores.unsqueeze(2) if inclusive else removed_scores.unsqueeze(1) > pos_scores.unsqueeze(2)
    keep = removed_valid.unsqueeze(1) & (removed_idx.unsqueeze(1) != pos_idx.unsqueeze(2))
    return (cmp & keep).sum(-1)


def _removed_tied_before(
    removed_scores, removed_valid, removed_idx, pos_scores, pos_idx, pos_keys, row_seed
) -> torch.Tensor:
    keys = item_keys(removed_idx.clamp(min=0), row_seed)
    cmp = (removed_scores.unsqueeze(1) == pos_scores.unsqueeze(2)) & (keys.unsqueeze(1) < pos_keys.unsqueeze(2))
    keep = removed_valid.unsqueeze(1) & (removed_idx.unsqueeze(1) != pos_idx.unsqueeze(2))
    return (cmp & keep).sum(-1)


def _prepare(scores, positives, exclude, check_finite):
    scores = check_scores(scores, check_finite)
    b, n = scores.shape
    pos, exc = prepare_index(positives, exclude, b, n, scores.device)
    return scores, pos, exc


def prepare_index(positives, exclude, b: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positives and exclusions of B rows over n items as padded (B, P) / (B, E) int64 indices (-1 padding),
    validated: in range, no positive also excluded (a ValueError naming the argument)."""
    if n == 0:  # an empty catalogue: nothing to rank (an empty (B, 0) mask still gives (B, 0) ranks)
        given = positives if isinstance(positives, torch.Tensor) else torch.as_tensor(positives)
        if given.dtype != torch.bool and given.numel():
            raise ValueError("scores: has 0 items (columns), so there is nothing to rank the positives among; "
                             "give scores for the whole catalogue")
    pos = as_padded_index(positives, n, b, "positives", device)
    exc = None
    if exclude is not None:
        exc = as_padded_index(exclude, n, b, "exclude", device)
        if pos.numel() and exc.numel():  # each positive looked up in its row's sorted exclusions: O(B (P + E))
            srt = torch.sort(exc, dim=1).values  # memory, not a (B, P, E) comparison
            at = torch.searchsorted(srt, pos.contiguous()).clamp(max=srt.shape[1] - 1)
            clash = (srt.gather(1, at) == pos) & (pos >= 0)
            if bool(clash.any()):
                rows = clash.any(1)
                raise ValueError(
                    f"exclude: {int(rows.sum())} row(s) exclude one of their own positives "
                    f"(first: row {int(rows.nonzero()[0, 0])}); a relevant item cannot also be excluded"
                )
    return pos, exc


def candidate_counts(n_items: int, positives: torch.Tensor, exclude: torch.Tensor | None, count_other_positives: bool = True) -> torch.Tensor:
    """Candidates per row: n_items minus excluded items (minus the other positives when they do not compete).

    ``positives`` and ``exclude`` are padded (B, P) index tensors (-1 padding).
    """
    n_items = check_sizes(n_items, "n_items", 0)
    n_exc = (exclude >= 0).sum(1) if exclude is not None else torch.zeros(positives.shape[0], dtype=torch.int64, device=positives.device)
    n = n_items - n_exc
    if not count_other_positives:  # a row without a positive: its irrelevant items only
        n = n - ((positives >= 0).sum(1) - 1).clamp(min=0)
    return n


def exact_ranks(
    scores: torch.Tensor,
    positives: torch.Tensor,
    exclude: torch.Tensor | None = None,
    ties: str = "pessimistic",
    *,
    count_other_positives: bool = True,
    generator: torch.Generator | None = None,
    check_finite: bool = True,
) -> torch.Tensor:
    """1-based rank of every positive among the non-excluded items of its row.

    Args:
        scores: (B, n) scores of every item for B users (any floating dtype and device).
        positives: held-out relevant items: (B, n) bool mask, (B, P) int64 padded with -1, or (B,).
        exclude: items to leave out of the ranking (training items), same forms; None for none.
        ties: ``"pessimistic"`` (default), ``"optimistic"``, ``"average"`` or ``"random"``; relevant items tied
            with each other are placed in slot order by the first two (their ranks form an ordering).
        count_other_positives: True (default) ranks each positive among all candidates, the other
            positives included (the ranking every full-list metric uses); False ranks it among the
            irrelevant candidates only, the rank that sampled metrics estimate.
        generator: seeds ``ties="random"``.
        check_finite: raise on NaN or inf scores (checked in the counting pass over ``scores``).

    Returns:
        (B, P) ranks in the positives' padded layout, 0 in padded slots; int64, or float64 for
        ``ties="average"``.
    """
    _check_ties(ties)
    scores, pos, exc = _prepare(scores, positives, exclude, False)
    return exact_ranks_padded(scores, pos, exc, ties, count_other_positives, generator, check_finite=check_finite)


def tied_positives(pos_scores: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) counts of the other valid positives of the row with an equal score that come before / after
    each positive in slot order. Deterministic tie policies place tied relevant items in slot order, so
    their ranks form an ordering (two tied relevant items at ranks 1 and 2, never both 1 or both 2, which
    would give P@1 = 2 or an AUC above 1)."""
    p = pos_scores.shape[1]
    tied = (pos_scores.unsqueeze(2) == pos_scores.unsqueeze(1)) & valid.unsqueeze(1) & valid.unsqueeze(2)
    slot = torch.arange(p, device=pos_scores.device)
    before = (tied & (slot.view(1, 1, p) < slot.view(1, p, 1))).sum(2)
    after = (tied & (slot.view(1, 1, p) > slot.view(1, p, 1))).sum(2)
    return before, after


def exact_ranks_padded(scores, pos, exc, ties, count_other_positives=True, generator=None, *, check_finite: bool = False) -> torch.Tensor:
    """:func:`exact_ranks` on validated inputs: (B, n) scores, padded (B, P) positives and (B, E)
    exclusions (-1 padding, see :func:`as_padded_index`), no input checks except, with ``check_finite``,
    the NaN/inf check of the scores (done by the counting pass itself); (B, P) 1-based ranks."""
    if check_finite and pos.shape[1] == 0:
        check_scores(scores, True)
        check_finite = False

    def count(ref: torch.Tensor, inclusive: bool) -> torch.Tensor:  # the first count also checks the scores
        nonlocal check_finite
        if not check_finite:
            return count_beating(scores, ref, inclusive=inclusive)
        counts, finite_rows = count_beating_checked(scores, ref, inclusive=inclusive)
        check_finite_rows(finite_rows)
        check_finite = False
        return counts

    pos_scores, pos_valid = _gather_padded(scores, pos)
    removed = [exc] if exc is not None else []
    if not count_other_positives:
        removed.append(pos)
    if removed:
        rem_idx = torch.cat(removed, dim=1)
        rem_scores, rem_valid = _gather_padded(scores, rem_idx)
    # counts over the whole row, then subtract what removed items contributed
    if ties in ("pessimistic", "average"):
        ge = count(pos_scores, True)  # includes the positive itself
        if removed:
            ge = ge - _removed_counts(rem_scores, rem_valid, rem_idx, pos_scores, pos, inclusive=True)
    if ties in ("optimistic", "average", "random"):
        gt = count(pos_scores, False)
        if removed:
            gt = gt - _removed_counts(rem_scores, rem_valid, rem_idx, pos_scores, pos, inclusive=False)
    if count_other_positives and ties in ("pessimistic", "optimistic") and pos.shape[1] > 1:
        before, after = tied_positives(pos_scores, pos_valid)  # tied relevant items in slot order
        if ties == "pessimistic":
            ge = ge - after
        else:
            gt = gt + before
    if ties == "pessimistic":
        ranks = ge
    elif ties == "optimistic":
        ranks = gt + 1
    elif ties == "average":
        ranks = (ge + gt + 1).to(torch.float64) / 2
    else:
        seeds = _row_seeds(scores.shape[0], generator, scores.device)
        pos_keys = item_keys(pos.clamp(min=0), seeds)
        tb = count_tied_before(scores, pos_scores, pos_keys, seeds)
        if removed:
            tb = tb - _removed_tied_before(rem_scores, rem_valid, rem_idx, pos_scores, pos, pos_keys, seeds)
        ranks = gt + 1 + tb
    return torch.where(pos_valid, ranks, torch.zeros_like(ranks))


class SampledRanks(NamedTuple):
    """Result of :func:`sampled_ranks`.

    ranks: (B, P) sampled ranks r~ in 1..m+1 (0 in padded slots).
    n_candidates: (B,) int64, n = the irrelevant items each draw could come from, plus the relevant
        item itself (catalogue minus excluded items minus the row's positives, plus 1; a row without a
        positive: its irrelevant items).
    negatives: (B, P, m) int64 indices of the drawn irrelevant items (-1 in padded slots).
    """

    ranks: torch.Tensor
    n_candidates: torch.Tensor
    negatives: torch.Tensor


def forbidden_sorted(pos: torch.Tensor, exc: torch.Tensor | None, n_items: int) -> torch.Tensor:
    """Per row, the positives and excluded items (padded (B, P) / (B, E) indices, -1 padding) sorted
    ascending, padding replaced by ``n_items`` (sorts last): the items a sampler must skip."""
    forb = pos if exc is None else torch.cat([pos, exc], dim=1)
    forb = torch.where(forb >= 0, forb, torch.full_like(forb, n_items))  # padding sorts last
    return torch.sort(forb, dim=1).values


def _uniform_positions(n_allowed: torch.Tensor, shape: tuple[int, ...], generator, device) -> torch.Tensor:
    """Uniform integers in [0, n_allowed[b]) of the given (B, ...) shape."""
    gen_device = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(shape, generator=generator, device=gen_device, dtype=torch.float64).to(device)
    view = n_allowed.view((-1,) + (1,) * (len(shape) - 1)).to(torch.float64)
    return torch.minimum((u * view).floor().to(torch.int64), view.to(torch.int64) - 1)


def allowed_position_to_item(positions: torch.Tensor, forb_sorted: torch.Tensor, n_items: int) -> torch.Tensor:
    """Map the u-th allowed position (0-based, (B, K)) to its item index, skipping the row's sorted
    forbidden items (:func:`forbidden_sorted`): uniform positions become uniform irrelevant items."""
    b = positions.shape[0]
    q = forb_sorted.shape[1]
    if q == 0:
        return positions
    # g_i = forb_i - i = allowed items below forbidden item i (non-decreasing); padding -> huge
    g = forb_sorted - torch.arange(q, device=forb_sorted.device)
    g = torch.where(forb_sorted < n_items, g, torch.full_like(g, torch.iinfo(torch.int64).max))
    flat = positions.reshape(b, math.prod(positions.shape[1:]))  # not -1: b may be 0
    shift = torch.searchsorted(g.contiguous(), flat.contiguous(), right=True)
    return (flat + shift).reshape(positions.shape)


def draws_for_rows_with_positives(pos: torch.Tensor, exc: torch.Tensor | None, m: int, draw) -> torch.Tensor:
    """(B, P, m) negatives from ``draw(pos, exc, rows)`` for the rows that have a positive only (``rows``: their
    bool mask, None when every row has one, so such a batch draws as it always did). Rows without a positive
    draw nothing (item 0 fills their slots; callers mask padded slots), so their pools need not hold m items."""
    active = (pos >= 0).any(1)
    if bool(active.all()):
        return draw(pos, exc, None)
    out = torch.zeros((pos.shape[0], pos.shape[1], m), dtype=torch.int64, device=pos.device)
    if bool(active.any()):
        out[active] = draw(pos[active], None if exc is None else exc[active], active)
    return out


def _draw_for_rows_with_positives(pos, exc, n_items, m, replacement, popularity, generator, device) -> torch.Tensor:
    if popularity is not None:
        return draws_for_rows_with_positives(
            pos, exc, m, lambda p, e, _: _draw_popularity(p, e, n_items, m, replacement, popularity, generator, device))
    return draws_for_rows_with_positives(pos, exc, m, lambda p, e, _: _draw_uniform(p, e, n_items, m, replacement, generator, device))


def _draw_uniform(pos, exc, n_items, m, replacement, generator, device) -> torch.Tensor:
    b, p = pos.shape
    forb = forbidden_sorted(pos, exc, n_items)
    n_allowed = n_items - (forb < n_items).sum(1)
    if not replacement:
        too_few = n_allowed < m
        if bool(too_few.any()):
            raise ValueError(
                f"n_samples: m = {m} draws without replacement, but {int(too_few.sum())} row(s) have fewer "
                f"irrelevant candidates (smallest: {int(n_allowed.min())})"
            )
    if bool((n_allowed < 1).any()):
        raise ValueError("positives: some row has no irrelevant candidate left to sample from")
    positions = _uniform_positions(n_allowed, (b, p, m), generator, device)
    if not replacement:
        positions = _make_distinct(positions, n_allowed, generator, device)
    return allowed_position_to_item(positions, forb, n_items)


def _make_distinct(positions: torch.Tensor, n_allowed: torch.Tensor, generator, device) -> torch.Tensor:
    """Make the m draws of each (row, positive) distinct: uniform draws without replacement.

    Rows whose pool is small (n_allowed <= 4m) take the m smallest of random keys over the pool
    (memory B x P x 4m at most); the others redraw duplicates until none are left (few rounds,
    since duplicates are rare there).
    """
    b, p, m = positions.shape
    small = n_allowed <= 4 * m
    if bool(small.any()):
        rows = small.nonzero().squeeze(1)
        width = int(n_allowed[rows].max())
        gen_device = generator.device if generator is not None else torch.device("cpu")
        keys = torch.rand((rows.numel(), p, width), generator=generator, device=gen_device).to(device)
        beyond = torch.arange(width, device=device).view(1, 1, -1) >= n_allowed[rows].view(-1, 1, 1)
        keys = keys.masked_fill(beyond, 2.0)
        positions = positions.clone()
        positions[rows] = torch.topk(keys, m, dim=2, largest=False).indices
    for _ in range(1000):  # each round redraws only the duplicates: expected rounds are few
        srt, order = torch.sort(positions, dim=2)
        dup_sorted = torch.zeros_like(srt, dtype=torch.bool)
        dup_sorted[..., 1:] = srt[..., 1:] == srt[..., :-1]
        if not bool(dup_sorted.any()):
            return positions
        dup = torch.zeros_like(dup_sorted).scatter(2, order, dup_sorted)
        fresh = _uniform_positions(n_allowed, (b, p, m), generator, device)
        positions = torch.where(dup, fresh, positions)
    raise RuntimeError("could not draw distinct samples; please report this")  # pragma: no cover


# elements of the (rows x n) probability block built for popularity draws
_POPULARITY_BLOCK = 1 << 24


def check_popularity(popularity, n_items: int, device) -> torch.Tensor:
    """(n,) float64 popularity weights on ``device``: finite, >= 0, a finite total (:func:`check_weights`)."""
    w = check_weights(popularity, "popularity", device=device)
    if w.shape != (n_items,):
        raise ValueError(f"popularity: expected one weight per item, shape ({n_items},), got {tuple(w.shape)}")
    return w


def _draw_popularity(pos, exc, n_items, m, replacement, popularity, generator, device) -> torch.Tensor:
    """Draw m items per positive with probability proportional to ``popularity`` among the allowed
    items, in blocks of rows so memory stays bounded for catalogues in the millions."""
    b, p = pos.shape
    w = torch.as_tensor(popularity, dtype=torch.float64, device=device)  # validated by sampled_ranks (check_popularity)
    forb = pos if exc is None else torch.cat([pos, exc], dim=1)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    out = torch.empty((b, p, m), dtype=torch.int64, device=device)
    reps = 1 if replacement else max(p, 1)
    block = max(1, _POPULARITY_BLOCK // (n_items * reps))
    need = m if not replacement else 1
    for start in range(0, b, block):  # row blocks bound memory; each block is vectorised
        sl = slice(start, min(start + block, b))
        f = forb[sl]
        probs = w.unsqueeze(0).repeat(f.shape[0], 1)
        rows = torch.arange(f.shape[0], device=device).unsqueeze(1).expand_as(f)
        valid = f >= 0
        probs[rows[valid], f[valid]] = 0.0
        short = (probs > 0).sum(1) < need
        if bool(short.any()):
            raise ValueError(
                f"popularity: {int(short.sum())} row(s) have fewer than {need} irrelevant items with positive weight"
            )
        if p == 0:
            continue
        if replacement:
            draws = torch.multinomial(probs.to(gen_device), p * m, replacement=True, generator=generator)
        else:
            draws = torch.multinomial(probs.repeat_interleave(p, dim=0).to(gen_device), m, replacement=False, generator=generator)
        out[sl] = draws.to(device).view(-1, p, m)
    return out


def sampled_ranks(
    scores: torch.Tensor,
    positives: torch.Tensor,
    n_samples: int | None = None,
    exclude: torch.Tensor | None = None,
    replacement: bool = True,
    popularity: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    *,
    negatives: torch.Tensor | None = None,
    ties: str = "pessimistic",
    check_finite: bool = True,
) -> SampledRanks:
    """Rank each positive against its own m sampled irrelevant items.

    For every positive, m items are drawn from the row's irrelevant candidates (never a positive
    of the row, never an excluded item): uniformly with replacement (the binomial law),
    uniformly without replacement (hypergeometric), or proportionally to ``popularity``.
    The sampled rank is r~ = 1 + #{drawn items scoring higher} (ties per ``ties``), in 1..m+1.

    Args:
        scores: (B, n) scores.
        positives: (B, n) bool mask, (B, P) int64 padded with -1, or (B,).
        n_samples: m, the number of irrelevant items per positive (inferred from ``negatives``).
        exclude: items never drawn and never ranked (training items), same forms as positives.
        replacement: draw with replacement (default) or without.
        popularity: optional (n,) non-negative weights for popularity-weighted draws.
        generator: a ``torch.Generator`` for reproducible draws (and random tie-breaking).
        negatives: pre-drawn irrelevant items instead of drawing: (B, m) shared by the row's
            positives (NCF-style files with 99 negatives per user) or (B, P, m).
        ties: tie policy as in :func:`exact_ranks`.

    Returns:
        :class:`SampledRanks` (ranks, n_candidates, negatives).
    """
    _check_ties(ties)
    scores, pos, exc = _prepare(scores, positives, exclude, check_finite)
    b, n = scores.shape
    p = pos.shape[1]
    device = scores.device
    if negatives is not None:
        neg = torch.as_tensor(negatives)
        check_same_device(scores=scores, negatives=neg)
        if neg.is_floating_point() or neg.dtype == torch.bool:
            raise ValueError(f"negatives: expected integer item indices, got dtype {neg.dtype}")
        neg = neg.to(torch.int64)
        if neg.dim() == 2:
            if neg.shape[0] != b:
                raise ValueError(f"negatives: expected shape ({b}, m) or ({b}, {p}, m), got {tuple(neg.shape)}")
            neg = neg.unsqueeze(1).expand(b, p, neg.shape[1])
        if neg.dim() != 3 or neg.shape[:2] != (b, p):
            raise ValueError(f"negatives: expected shape ({b}, m) or ({b}, {p}, m), got {tuple(neg.shape)}")
        if n_samples is not None and check_int(n_samples, "n_samples", 1) != neg.shape[2]:
            raise ValueError(f"n_samples: {n_samples} disagrees with the {neg.shape[2]} negatives given per positive")
        m = neg.shape[2]
        if m < 1:
            raise ValueError("negatives: need at least one negative per positive")
        if bool((neg < 0).any()) or bool((neg >= n).any()):
            raise ValueError(f"negatives: item indices must lie in 0..{n - 1}")
        forb = pos if exc is None else torch.cat([pos, exc], dim=1)
        hit = (neg.reshape(b, p * m, 1) == forb.unsqueeze(1)) & (forb.unsqueeze(1) >= 0)
        if bool(hit.any()):
            rows = hit.any(2).any(1)
            raise ValueError(
                f"negatives: {int(rows.sum())} row(s) draw a positive or excluded item as a negative "
                f"(first: row {int(rows.nonzero()[0, 0])})"
            )
    else:
        if n_samples is None:
            raise ValueError("n_samples: required unless negatives are given")
        m = check_int(n_samples, "n_samples", minimum=1, maximum=MAX_SAMPLES)
        if popularity is not None:  # checked once per call, also when no row has a positive
            popularity = check_popularity(popularity, n, device)
        neg = _draw_for_rows_with_positives(pos, exc, n, m, replacement, popularity, generator, device)
    pos_scores, pos_valid = _gather_padded(scores, pos)
    neg_scores = scores.gather(1, neg.reshape(b, p * m)).reshape(b, p, m)
    above = neg_scores > pos_scores.unsqueeze(2)
    if ties == "optimistic":
        ranks = above.sum(2) + 1
    else:
        tied = neg_scores == pos_scores.unsqueeze(2)
        if ties == "pessimistic":
            ranks = above.sum(2) + tied.sum(2) + 1
        elif ties == "average":
            ranks = (above.sum(2) + 1).to(torch.float64) + tied.sum(2).to(torch.float64) / 2
        else:
            seeds = _row_seeds(b, generator, device)
            pos_keys = item_keys(pos.clamp(min=0), seeds)
            neg_keys = item_keys(neg, seeds.unsqueeze(2))
            ranks = above.sum(2) + (tied & (neg_keys < pos_keys.unsqueeze(2))).sum(2) + 1
    ranks = torch.where(pos_valid, ranks, torch.zeros_like(ranks))
    neg = torch.where(pos_valid.unsqueeze(2), neg, torch.full_like(neg, -1))
    n_cand = candidate_counts(n, pos, exc, count_other_positives=False)
    return SampledRanks(ranks, n_cand, neg)
