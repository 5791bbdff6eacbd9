"""Keyed draws: sampled negatives that are a pure function of (seed, instance id, positive item, draw index).

The draws of :func:`~reco_sampled_plugin.ranking.sampled_ranks` take their uniform numbers from a
``torch.Generator``: the items a row gets depend on where it stands in the stream (its batch, the rows before it).
Keyed draws take them from a counter-based hash of the row's :class:`RowKeys` instead, so the same instance gets the
same negatives whichever process, batch, chunk or position evaluates it: one process and many processes give
identical histograms (the reproducibility promise of the torchmetrics and Lightning adapters).

What is shared with the generator draws, called here: the map from uniform positions to the row's allowed items
(``ranking.allowed_position_to_item`` over ``ranking.forbidden_sorted``), the popularity inverse-cdf lookup
(``ranking.popularity_inverse_cdf``), the count of beating draws (``ranking.rank_among_drawn``), the popularity
statistics (``ranking.popularity_draw_stats``) and the scoring of drawn items (score matrix, factors:
``factor_ranks.positive_scores``, scorer: ``scorer_ranks.score_drawn``). What is keyed: the uniform numbers
(``_hash.keyed_uniform``), and the way draws without replacement are made distinct (uniform: a keyed key per pool
slot for small pools, fresh keys for duplicates, so a row's draws do not depend on how many redraws other rows
needed; popularity: an exponential race over the catalogue, one keyed key per item, :func:`_race_negatives`).

* :class:`RowKeys`: the randomness source (seed and per-row ids).
* :func:`keyed_negatives`: (B, P, m) items under a fixed-m design (uniform or popularity, with or without
  replacement).
* :func:`keyed_ranks`: sampled ranks against keyed negatives, scored by a :class:`DrawnScores` source (score matrix,
  factors or a scorer), in row chunks of bounded memory; :func:`keyed_adaptive_ranks`: the later stages of an
  adaptive design (and the rows of its cap stage, where an ``exact_at_cap`` design's completed positives lie).
* :class:`DeviceChecks`: validity flags kept on the device and read back together (``_inputs.run_checks``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import torch

from ._checks import MAX_ELEMENTS, check_elements
from ._hash import keyed_uniform
from ._inputs import Check, run_checks
from ._popularity import PopularityStats
from .adaptive import added_ranks, continues
from .design import AdaptiveDesign, SamplingDesign
from .factor_ranks import positive_scores
from .ranking import (POPULARITY_RESOLUTION, allowed_position_to_item, forbidden_sorted, popularity_draw_stats,
                      popularity_inverse_cdf, rank_among_drawn)
from .scorer_ranks import ScorerCalls, score_drawn

__all__ = ["RowKeys", "stage_seed", "keyed_negatives", "DrawnScores", "MatrixScores", "FactorScores",
           "ScorerScores", "KeyedRanks", "keyed_ranks", "AdaptiveRanks", "keyed_adaptive_ranks", "DeviceChecks"]


# ------------------------------------------------------------------------------------------ keys
def stage_seed(seed: int, stage: int) -> int:
    """The key of adaptive stage ``stage``'s draws (stage 0: ``seed`` itself)."""
    return int(seed) if stage == 0 else (int(seed) * 1_000_003 + 7919 * int(stage)) % (2**31 - 1)


class RowKeys(NamedTuple):
    """The randomness source of keyed draws: draw k of the positive in slot p of row b is keyed by
    (``seed``, ``ids[b]``, ``pos[b, p]``, k), never by the row's position, so a row draws the same items in any
    batch, chunk or process. ``ids``: (B,) int64 instance ids on the rows' device (:meth:`of`)."""

    seed: int
    ids: torch.Tensor

    @classmethod
    def of(cls, seed: int, ids: torch.Tensor, device: torch.device) -> "RowKeys":
        """Keys of ``ids`` (any integer dtype and device) as int64 on ``device``: the same numbers."""
        same = ids.device == device and ids.dtype == torch.int64
        return cls(int(seed), ids if same else ids.to(device=device, dtype=torch.int64))

    def take(self, index: Any) -> "RowKeys":
        """The keys of some rows (a slice or an index tensor)."""
        return RowKeys(self.seed, self.ids[index])

    def stage(self, stage: int) -> "RowKeys":
        """The keys of adaptive stage ``stage``'s draws (:func:`stage_seed`)."""
        return RowKeys(stage_seed(self.seed, stage), self.ids)

    def uniform(self, round_: int, pos: torch.Tensor, width: int, start: int = 0) -> torch.Tensor:
        """(B, P, ``width``) uniform float64 numbers of round ``round_`` for the (B, P) positives ``pos``: those of
        slots ``start`` .. ``start + width - 1`` (a slice of a wider draw is the same numbers)."""
        b, p = pos.shape
        slots = torch.arange(start, start + width, device=pos.device, dtype=torch.int64).view(1, 1, width)
        return keyed_uniform(self.seed, round_, self.ids.view(b, 1, 1), pos.view(b, p, 1), slots)


# ------------------------------------------------------------------------------------------ checks
class DeviceChecks:
    """Validation flags kept on the device and read back together: one host synchronisation for every check of
    a batch (and any small values the host needs anyway), instead of one per check. The accumulating form of
    the core's deferred checks (``_inputs.Check``, read by ``_inputs.run_checks``).

    ``add(flag, message, name)``: a 0-dim bool tensor, True when the check failed (``name``: its kind, for a
    caller that defers it). ``read(*values)``: reads every flag and the given 0-dim integer tensors at once, raises
    ValueError with the first failed check's message, and returns the values as Python ints. Until ``read``,
    nothing waits for the device.

    ``defer=True`` (the torchmetrics adapters on an accelerator): ``read`` reads only the values it is given (none:
    no synchronisation at all) and keeps the flags, which the caller takes with :meth:`pending` (each a
    :class:`~reco_sampled_plugin._inputs.Check` with its name and message) and reads later, at compute.
    """

    def __init__(self, defer: bool = False) -> None:
        self._checks: list[Check] = []
        self.defer = defer

    def add(self, flag: torch.Tensor, message: str, name: str = "") -> None:
        def fail() -> None:
            raise ValueError(message)

        self._checks.append(Check(flag.reshape(()), fail, name, message))

    def __len__(self) -> int:
        return len(self._checks)

    def include(self, checks: Sequence[Check]) -> None:
        """Add checks made elsewhere (e.g. the inputs' pending index checks), ahead of this batch's own."""
        self._checks.extend(checks)

    def pending(self) -> list[Check]:
        """The flags not read yet (deferred), handed to the caller and cleared here."""
        checks, self._checks = self._checks, []
        return checks

    def read(self, *values: torch.Tensor) -> list[int]:
        if self.defer:  # the flags stay (pending); only the values the host needs now are read
            return run_checks([], list(values)) if values else []
        checks, self._checks = self._checks, []
        if not checks and not values:
            return []
        device = checks[0].bad.device if checks else values[0].device  # flags and values read on one device
        checks = [c if c.bad.device == device else c._replace(bad=c.bad.to(device)) for c in checks]
        return run_checks(checks, [v if v.device == device else v.to(device) for v in values])


# ------------------------------------------------------------------------------------------ draws
def keyed_negatives(pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, design: SamplingDesign, keys: RowKeys,
                    checks: DeviceChecks | None = None) -> torch.Tensor:
    """(B, P, m) irrelevant items per positive under the fixed-m part of ``design``, keyed by ``keys``; never a
    positive or an excluded item of the row (validated padded (B, P) / (B, E) indices, -1 padding).

    Uniform: over the row's allowed items, with replacement or without (the m items of a positive distinct: small
    pools take the m smallest keyed keys over the whole pool, larger ones redraw duplicates with fresh keys).
    Popularity with replacement: the item whose cumulative weight interval (weights over the row's drawable
    items, positives and excluded items at 0) holds u W_u, u keyed (the law of ``sampled_ranks(...,
    popularity=w)``). Popularity without replacement: successive sampling, each draw proportional to w among the
    row's drawable items not drawn yet (the law of ``sampled_ranks(..., SamplingDesign(m, replacement=False,
    popularity=w))``), by a keyed exponential race (:func:`_race_negatives`; slot 0 the first draw, and so on).
    Rows without a positive draw nothing under uniform designs (item 0 fills their slots; callers mask padded
    slots), so their pools need not hold m items; the keys do not depend on a row's position, so the other rows
    draw what they draw in a batch of their own.

    The check that every row with a positive has enough items to draw from is added to ``checks`` (read later,
    with the caller's other checks: no host synchronisation here), or read at once when ``checks`` is None.
    Uniform with replacement and popularity: nothing here waits for the device; uniform without replacement, one
    read (small pools, fused with the checks) and one per duplicate-redraw round after the first two.
    """
    own = checks is None
    checks = DeviceChecks() if checks is None else checks  # own: read here
    if design.popularity is not None:
        if design.popularity.shape[0] != n_items:
            raise ValueError(f"n_samples: the design's popularity weights count {design.popularity.shape[0]} items, "
                             f"the catalogue {n_items}")
        draw = _popularity_negatives if design.replacement else _race_negatives
        neg = draw(pos, exc, n_items, design, keys, checks)
    else:
        neg = _uniform_negatives(pos, exc, n_items, design.n_samples, keys, design.replacement, checks)
    if own and len(checks):
        checks.read()
    return neg


def _uniform_negatives(pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, m: int, keys: RowKeys,
                       replacement: bool, checks: DeviceChecks) -> torch.Tensor:
    b, p = pos.shape
    device = pos.device
    forb = forbidden_sorted(pos, exc, n_items)
    n_allowed = n_items - (forb < n_items).sum(1)
    active = (pos >= 0).any(1)
    need = "one irrelevant candidate" if replacement else f"m = {m} irrelevant candidates (no replacement)"
    checks.add((active & (n_allowed < (1 if replacement else m))).any(),
               f"n_samples: some row has fewer than {need} left to sample from", "sample_pool")
    pool = n_allowed.clamp(min=1)  # rows without a positive (or failing the check) draw in range all the same
    view = pool.view(b, 1, 1).to(torch.float64)
    top = pool.view(b, 1, 1) - 1

    def positions(round_: int) -> torch.Tensor:
        return torch.minimum((keys.uniform(round_, pos, m) * view).floor().to(torch.int64), top)

    pos_idx = positions(0)
    if not replacement:
        pos_idx = _distinct(pos_idx, pos, n_allowed, active, keys, checks, positions)
    neg = allowed_position_to_item(pos_idx, forb, n_items)
    # rows without a positive: item 0, as a batch of their own would hold (and always a valid index)
    return torch.where(active.view(b, 1, 1), neg.clamp(max=max(n_items - 1, 0)), torch.zeros_like(neg))


def _distinct(pos_idx: torch.Tensor, pos: torch.Tensor, n_allowed: torch.Tensor, active: torch.Tensor, keys: RowKeys,
              checks: DeviceChecks, positions: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """The (B, P, m) allowed positions ``pos_idx`` made distinct per positive: small pools (<= 4 m) take the m
    smallest keyed keys (round -1) over the pool; in the others the duplicates take the positions of later rounds
    (``positions(round)``) until none is left."""
    b, _, m = pos_idx.shape
    small = active & (n_allowed <= 4 * m)
    # one read: the checks and whether (and how wide) small pools are, before drawing from them
    any_small, width = checks.read(small.any(), torch.where(small, n_allowed, 0).max()
                                   if b else torch.zeros((), dtype=torch.int64))
    if any_small:  # every row computed (keys are per row: the same as a batch of the small rows alone)
        width = max(width, m)
        slots = torch.arange(width, device=pos.device, dtype=torch.int64).view(1, 1, -1)
        key = keys.uniform(-1, pos, width).masked_fill(slots >= n_allowed.view(-1, 1, 1), 2.0)
        pos_idx = torch.where(small.view(b, 1, 1), torch.topk(key, m, dim=2, largest=False).indices, pos_idx)
    # duplicates are rare where the pool is large: few rounds. The first two run unchecked (a round without a
    # duplicate changes nothing, so this is the same draw), then one read per round until none is left
    live = active.view(b, 1, 1) & (n_allowed >= m).view(b, 1, 1)  # rows that can have m distinct items
    for round_ in range(1, 10_000):
        srt, order = torch.sort(pos_idx, dim=2)
        dup_sorted = torch.zeros_like(srt, dtype=torch.bool)
        dup_sorted[..., 1:] = (srt[..., 1:] == srt[..., :-1]) & live
        if round_ > 2 and not bool(dup_sorted.any()):
            break
        dup = torch.zeros_like(dup_sorted).scatter(2, order, dup_sorted)
        pos_idx = torch.where(dup, positions(round_), pos_idx)
    return pos_idx


def _popularity_negatives(pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, design: SamplingDesign,
                          keys: RowKeys, checks: DeviceChecks) -> torch.Tensor:
    """Keyed popularity draws with replacement: ``ranking.popularity_inverse_cdf`` of keyed numbers (round 0)."""
    assert design.popularity is not None  # keyed_negatives dispatches here for popularity designs only
    w = design.popularity
    if w.device != pos.device or w.dtype != torch.float64:  # (already there: no conversion, no copy)
        w = w.to(device=pos.device, dtype=torch.float64)
    forb = forbidden_sorted(pos, exc, n_items)
    neg, _ = popularity_inverse_cdf(w, forb, n_items, keys.uniform(0, pos, design.n_samples))
    active = (pos >= 0).any(1)
    padded = torch.cat([w, w.new_zeros(1)])  # the forbidden lists' padding (n_items) weighs nothing
    weighted = (padded[forb] > 0).sum(1)
    none_left = active & ((w > 0).sum() - weighted < 1)
    checks.add(none_left.any(), "popularity: some row has no irrelevant item of positive weight left to sample from",
               "sample_pool")
    # as ``ranking.draw_negatives``: drawable items below 2^-40 of the weight are past the cumulative sum's resolution
    total = w.sum()
    checks.add((active & ~none_left & (total - padded[forb].sum(1) < total * POPULARITY_RESOLUTION)).any(),
               "popularity: in some row the items that may be drawn hold less than 2^-40 of the weight, below what "
               "draws from float64 cumulative weights resolve; flatten the weights (a smaller exponent, counts + 1)",
               "sample_pool")
    return neg


#: The round whose keyed numbers drive the race of popularity draws without replacement (slot = item index)
_RACE_ROUND = -2

#: Race keys held at once: a tile of rows x P x (an item block + m) float64 numbers, at most about this many
#: (2^22: 32 MiB, the hash's int64 temporaries a few times that; one row whose P x n exceeds it walks the catalogue
#: in item blocks, merging a running top m)
RACE_TILE = 1 << 22


def _race_tiles(p: int, n_items: int, m: int) -> tuple[int, int]:
    """(rows per tile, items per block) of :func:`_race_negatives` within :data:`RACE_TILE` keys."""
    cols = min(n_items, max(m, RACE_TILE // max(p, 1)))
    return max(1, RACE_TILE // (max(p, 1) * (cols + m))), max(cols, 1)


def _race_negatives(pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, design: SamplingDesign,
                    keys: RowKeys, checks: DeviceChecks) -> torch.Tensor:
    """Keyed popularity draws without replacement: successive sampling (each draw proportional to w among the
    row's drawable items not drawn yet) as an exponential race (Efraimidis & Spirakis 2006). Item j races positive
    p of row b with the key E / w_j, E = -log(1 - u) a unit exponential of the keyed uniform u of (seed, round -2,
    id, p's item, j); positives, excluded items and items of weight 0 never finish (key inf). The m smallest keys,
    ascending, are the m draws in order: the first is item j with probability w_j / W (the smallest of independent
    exponentials of rates w), and, the exponentials being memoryless, each next one is the next draw among the
    items left: the law of ``ranking._draw_popularity`` without replacement.

    Every item is keyed, so a row's draws are a function of its keys alone whatever the batch (no redraw rounds,
    no host synchronisation): cost O(B P n) hashes, memory O(:data:`RACE_TILE`) (rows in tiles, the catalogue in
    blocks: :func:`_race_tiles`). A row with a positive and fewer than m drawable items of weight > 0 fails the
    check added to ``checks``; rows without a positive may have fewer (item 0 fills the slots left)."""
    assert design.popularity is not None  # keyed_negatives dispatches here for popularity designs only
    b, p = pos.shape
    m = design.n_samples
    if b == 0 or p == 0:
        return torch.zeros((b, p, m), dtype=torch.int64, device=pos.device)
    w = design.popularity
    if w.device != pos.device or w.dtype != torch.float64:  # (already there: no conversion, no copy)
        w = w.to(device=pos.device, dtype=torch.float64)
    forb = forbidden_sorted(pos, exc, n_items)
    rows, cols = _race_tiles(p, n_items, m)
    parts = [_race_rows(pos[lo:lo + rows], forb[lo:lo + rows], w, m, cols, keys.take(slice(lo, lo + rows)))
             for lo in range(0, b, rows)]
    key = torch.cat([k for k, _ in parts])
    neg = torch.cat([i for _, i in parts])
    done = torch.isfinite(key)  # a slot past the row's drawable items keeps inf
    checks.add(((pos >= 0).any(1) & ~done[:, 0, -1]).any(),
               f"popularity: some row has fewer than m = {m} irrelevant items of positive weight left to sample from "
               "(no replacement)", "sample_pool")
    return torch.where(done, neg, torch.zeros_like(neg))


def _race_rows(pos: torch.Tensor, forb: torch.Tensor, w: torch.Tensor, m: int, cols: int,
               keys: RowKeys) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, items), each (r, P, m), of the race of :func:`_race_negatives` over the rows ``pos`` (r, P) with
    their sorted forbidden items ``forb`` (r, F): the catalogue in blocks of ``cols`` items, each block's keys
    merged into the running m smallest (ascending)."""
    r, p = pos.shape
    n = w.shape[0]
    best = torch.full((r, p, m), math.inf, dtype=torch.float64, device=pos.device)
    items = torch.zeros((r, p, m), dtype=torch.int64, device=pos.device)
    for lo in range(0, n, cols):
        width = min(cols, n - lo)
        at = forb - lo  # the forbidden items of the block, as a (r, width) mask (one scatter, padding outside)
        inside = (at >= 0) & (at < width)
        blocked = torch.zeros((r, width + 1), dtype=torch.bool, device=pos.device)
        blocked = blocked.scatter_(1, torch.where(inside, at, width), True)[:, :width]
        wb = w[lo:lo + width]
        race = -torch.log1p(-keys.uniform(_RACE_ROUND, pos, width, start=lo)) / wb  # u < 1: E finite
        race = race.masked_fill(blocked.unsqueeze(1) | (wb <= 0), math.inf)
        block = torch.topk(race, min(m, width), dim=2, largest=False, sorted=False)  # the block's best, then merged
        top = torch.topk(torch.cat([best, block.values], 2), m, dim=2, largest=False, sorted=True)
        best, items = top.values, torch.cat([items, block.indices + lo], 2).gather(2, top.indices)
    return best, items


# ------------------------------------------------------------------------------------------ scores
class DrawnScores(Protocol):
    """What scores a batch's positives and their drawn items for :func:`keyed_ranks`."""

    def take(self, index: Any) -> "DrawnScores":
        """The source of some rows (a slice or an index tensor)."""

    def for_stages(self, pos_scores: torch.Tensor) -> "DrawnScores":
        """The source of an adaptive design's later stages, given the first stage's positive scores."""

    def score(self, pos: torch.Tensor, neg: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores of the (B, P) positives and their (B, P, m) drawn items; only the ``slots`` (B, P) bool count."""


class MatrixScores(NamedTuple):
    """Drawn items scored by a (B, n) score matrix (gathered, in its dtype)."""

    scores: torch.Tensor

    def take(self, index: Any) -> "MatrixScores":
        return MatrixScores(self.scores[index])

    def for_stages(self, pos_scores: torch.Tensor) -> "MatrixScores":
        return self

    def score(self, pos: torch.Tensor, neg: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, p, m = neg.shape
        return self.scores.gather(1, pos.clamp(min=0)), self.scores.gather(1, neg.reshape(b, p * m)).reshape(b, p, m)


class FactorScores(NamedTuple):
    """Drawn items scored by ``u @ v.T + bias`` without forming it: one dot product each
    (``factor_ranks.positive_scores``, in chunks); ``pos_scores`` the positives' (B, P) scores when known (e.g.
    from the exact pass), else computed the same way."""

    u: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor | None = None
    pos_scores: torch.Tensor | None = None

    def take(self, index: Any) -> "FactorScores":
        return FactorScores(self.u[index], self.v, self.bias, _take(self.pos_scores, index))

    def for_stages(self, pos_scores: torch.Tensor) -> "FactorScores":
        return self  # the given scores (or the same dot products) again: the numbers of the first stage

    def score(self, pos: torch.Tensor, neg: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, p, m = neg.shape
        ps = positive_scores(self.u, self.v, self.bias, pos) if self.pos_scores is None else self.pos_scores
        return ps, positive_scores(self.u, self.v, self.bias, neg.reshape(b, p * m)).reshape(b, p, m)


class ScorerScores(NamedTuple):
    """Drawn items scored through a scorer's calls (``scorer_ranks.score_drawn``: only the slots that count, each
    positive with its drawn items in one list, or its drawn items alone once ``pos_scores`` are known); ``users``
    (B,) the ids handed to the scorer. Scores are float64."""

    calls: ScorerCalls
    users: torch.Tensor
    pos_scores: torch.Tensor | None = None

    def take(self, index: Any) -> "ScorerScores":
        return ScorerScores(self.calls, self.users[index], _take(self.pos_scores, index))

    def for_stages(self, pos_scores: torch.Tensor) -> "ScorerScores":
        return self._replace(pos_scores=pos_scores)  # a positive is scored once, in the first stage

    def score(self, pos: torch.Tensor, neg: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return score_drawn(self.calls, self.users, pos, neg, slots, self.pos_scores)


def _check_products(pos_scores: torch.Tensor, neg_scores: torch.Tensor, valid: torch.Tensor,
                    checks: DeviceChecks | None) -> None:
    """Refuse dot products of the ranked slots that came out infinite (finite factors past the dtype's range, or inf
    entries where the factors are not checked): ranked, they were sampled ranks of 1 or m + 1 without a word. Added
    to ``checks`` under the factor batches' overflow check (read with the batch's others), or read at once."""
    bad = (torch.isinf(pos_scores) & valid).any() | (torch.isinf(neg_scores) & valid.unsqueeze(-1)).any()
    message = ("user_factors: the scores could overflow, and the dot products of drawn items did (inf); scale the "
               "factors or give them in float64")
    if checks is None:
        if bool(bad):
            raise ValueError(message)
    else:
        checks.add(bad, message, "factors_overflow")


def _take(x: torch.Tensor | None, index: Any) -> torch.Tensor | None:
    return None if x is None else x[index]


# ------------------------------------------------------------------------------------------ ranks
class KeyedRanks(NamedTuple):
    """What :func:`keyed_ranks` returns: ``ranks`` (B, P) r~ (0 in padded slots and slots not asked for; int64, or
    float64 under ``ties="average"``), ``pos_scores`` (B, P) the positives' scores, ``stats`` the popularity
    statistics (popularity designs, else None)."""

    ranks: torch.Tensor
    pos_scores: torch.Tensor
    stats: PopularityStats | None


def _rows_per_chunk(p: int, m: int) -> int:
    """Rows drawn at once so that a chunk's B x P x m negatives (and their scores) stay within MAX_ELEMENTS / 8
    values: the keys are per row, so chunks draw what the whole batch would, in bounded memory (a batch of 256
    users at m = 2^20 asked for 2 GiB of indices at once). One row's P x m above MAX_ELEMENTS is refused."""
    check_elements(p * m, "n_samples", "one user's P x m drawn negatives")
    return max(1, (MAX_ELEMENTS // 8) // max(p * m, 1))


@torch.no_grad()
def keyed_ranks(source: DrawnScores, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, design: SamplingDesign,
                keys: RowKeys, ties: str, *, slots: torch.Tensor | None = None,
                checks: DeviceChecks | None = None) -> KeyedRanks:
    """Sampled ranks r~ = 1 + #{drawn items beating the positive} (ties per ``ties``, ``ranking.rank_among_drawn``)
    against the keyed negatives of the fixed-m part of ``design`` (:func:`keyed_negatives`; an adaptive design's
    first stage), on validated padded (B, P) positives and (B, E) exclusions, scored by ``source``.

    ``slots``: (B, P) bool, the slots to rank (default every positive; the others get rank 0, as padded slots; a
    scorer scores only them). ``checks``: see :func:`keyed_negatives` (None: read here, chunk by chunk). Rows in
    chunks (:func:`_rows_per_chunk`): the keys are per row, so chunks draw what the whole batch would."""
    b, p = pos.shape
    step = _rows_per_chunk(p, design.n_samples)
    if b <= step:
        return _keyed_chunk(source, pos, exc, n_items, design, keys, ties, slots, checks)
    parts = [_keyed_chunk(source.take(slice(lo, lo + step)), pos[lo:lo + step], _take(exc, slice(lo, lo + step)),
                          n_items, design, keys.take(slice(lo, lo + step)), ties, _take(slots, slice(lo, lo + step)),
                          checks) for lo in range(0, b, step)]
    stats = None if parts[0].stats is None else PopularityStats.cat(part.stats for part in parts if part.stats)
    return KeyedRanks(torch.cat([part.ranks for part in parts]), torch.cat([part.pos_scores for part in parts]), stats)


def _keyed_chunk(source: DrawnScores, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, design: SamplingDesign,
                 keys: RowKeys, ties: str, slots: torch.Tensor | None, checks: DeviceChecks | None) -> KeyedRanks:
    """:func:`keyed_ranks` of one chunk of rows."""
    valid = pos >= 0 if slots is None else slots & (pos >= 0)
    neg = keyed_negatives(pos, exc, n_items, design, keys, checks)
    pos_scores, neg_scores = source.score(pos, neg, valid)
    if isinstance(source, FactorScores):
        _check_products(pos_scores, neg_scores, valid, checks)
    ranked = pos if slots is None else torch.where(valid, pos, -1)
    if design.popularity is None:
        return KeyedRanks(rank_among_drawn(pos_scores, neg_scores, ranked, neg, ties, None), pos_scores, None)
    ranks, beat = rank_among_drawn(pos_scores, neg_scores, ranked, neg, ties, None, beating=True)
    return KeyedRanks(ranks, pos_scores, popularity_draw_stats(design, beat, neg, ranked, exc, n_items))


class AdaptiveRanks(NamedTuple):
    """What :func:`keyed_adaptive_ranks` returns: ``ranks`` and ``sizes`` (B, P) int64, the final r~ and m (0 in
    padded slots); ``last`` the (k,) int64 rows that drew the cap's stage (read on the host with that stage: every
    positive still first at the cap lies in them), None for a design of one stage (cap < 2 m: nothing read)."""

    ranks: torch.Tensor
    sizes: torch.Tensor
    last: torch.Tensor | None


def keyed_adaptive_ranks(source: DrawnScores, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
                         first: KeyedRanks, design: AdaptiveDesign, keys: RowKeys, ties: str) -> AdaptiveRanks:
    """The later stages of adaptive sampling (``reco_sampled_plugin.adaptive``) with keyed draws: ``first`` the
    first stage's :func:`keyed_ranks`; a positive still within the top (r~ <= t, the design's ``top``) among its
    M_s draws ranks against
    M_{s+1} - M_s fresh keyed items (only it: a scorer scores only the slots that go on), keyed by
    ``keys.stage(s)``, so a positive's draws do not depend on batching. The pools were checked in the first stage:
    nothing is checked (or read) here. Returns :class:`AdaptiveRanks` (ranks, final sizes, the cap stage's rows).

    One host synchronisation per stage (the rows that go on: a data-dependent size), log2(cap / m) of them
    whatever the data: a stage nobody reaches draws for no row (empty tensors) rather than ending the loop, so a
    batch costs the same number of synchronisations whatever its ranks."""
    ranks = first.ranks.clone()
    sizes = torch.where(ranks > 0, torch.full_like(ranks, design.n_samples), torch.zeros_like(ranks))
    stages = design.stages.tolist()
    later = source.for_stages(first.pos_scores)
    rows = None
    for s in range(1, len(stages)):
        need = continues(ranks, design) & (sizes == stages[s - 1])
        rows = need.any(1).nonzero().squeeze(1)
        sub = need[rows]
        more = keyed_ranks(later.take(rows), pos[rows], _take(exc, rows), n_items,
                           SamplingDesign.trusted(stages[s] - stages[s - 1]), keys.take(rows).stage(s), ties,
                           slots=sub, checks=DeviceChecks()).ranks
        ranks[rows] = torch.where(sub, added_ranks(ranks[rows], more), ranks[rows])
        sizes[rows] = torch.where(sub, torch.full_like(more, stages[s]), sizes[rows])
    return AdaptiveRanks(ranks, sizes, rows)
