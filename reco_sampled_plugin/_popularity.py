"""Per-positive statistics of popularity-sampled draws: what the Hansen-Hurwitz estimators need beyond r~.

One helper, :func:`popularity_stats`, is called by every path that draws (or is given) popularity-sampled negatives:
:func:`~reco_sampled_plugin.ranking.sampled_ranks` (score matrix; ``evaluate_factors`` draws through it) and
:func:`~reco_sampled_plugin.scorer_ranks.sampled_ranks_from_scorer` (the scorer loop).

The law (docs/popularity.md): the m draws of a positive are
independent, with replacement, from q~_j = w_j / W_u over the row's drawable candidates (irrelevant, not excluded;
W_u their total weight). The plugin's draw gives the row's positives and excluded items weight 0 (an inverse-cdf
lookup among the others), which is the law of RecBole's ``popN``: a draw that hits a used item is redrawn.

Sufficiency: with z_k = b_k / q~_{j_k} (b_k = 1 when draw k beats the positive, 1/2 for a tie under
``ties="average"``, else 0), the Hansen-Hurwitz estimate of R - 1 is (1/m) sum_k z_k and the unbiased estimate of
its variance is (sum_k z_k^2 - m zbar^2) / (m (m - 1)); both, and the Kish effective sample size of the weights
(sum z)^2 / sum z^2, read only m, S1 = sum_k z_k and S2 = sum_k z_k^2. Non-beating draws have z_k = 0, so S1 and S2
are sums over the beating draws alone.

The top-K fit (``_popularity_fit``, method ``pl_fit``) also reads, per positive, which popularity class each
*distinct* drawn item falls in and whether it beats the positive, and how many drawable candidates the row has in
each class: counts over :data:`POP_BINS` classes of equal width in log w (:func:`weight_bins`, fixed by the design's
weights, so batches agree). That is 3 x POP_BINS float32 per positive, additive like the rest. A row's profile
is the catalogue's class counts minus those of its forbidden items (positives and exclusions, each counted once,
weight-0 items never), summed per row as the forbidden weight W is: from the padded sorted list
(:func:`forbidden_weight`), from CSR exclusions (:func:`exclusion_totals`, one ``index_add`` over the T entries) or
from a caller's own per-row sets (RecBole's used items): (B, POP_BINS) per batch, no host synchronisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple

import torch

if TYPE_CHECKING:
    from .exclusions import Exclusions

__all__ = ["PopularityStats", "RowTotals", "popularity_stats", "stats_from_totals", "POP_BINS", "PROFILE_FIELDS",
           "weight_bins", "class_totals", "item_totals", "forbidden_weight", "exclusion_totals"]

#: Popularity classes of the per-positive profile (equal width in log w between the smallest positive weight and the
#: largest): 16 classes over counts 1..600 at alpha = 1 are a factor 1.5 wide each.
POP_BINS = 16

#: The fields ``pl_fit`` reads beyond the Hansen-Hurwitz sums (None where a source cannot carry them).
PROFILE_FIELDS = ("profile", "beat_bins", "miss_bins")


def weight_bins(weights: torch.Tensor, bins: int = POP_BINS) -> torch.Tensor:
    """(n,) int64 class of each item, 0..bins - 1 by equal steps of log w from the smallest positive weight to the
    largest (every item in class 0 when they are all equal; weight-0 items in class 0, never drawn). No host
    synchronisation."""
    w = weights.to(torch.float64)
    lw = torch.log(torch.where(w > 0, w, torch.ones_like(w)))
    inf = torch.full_like(lw, math.inf)
    lo = torch.where(w > 0, lw, inf).min()
    hi = torch.where(w > 0, lw, -inf).max()
    width = ((hi - lo) / bins).clamp_min(1e-12)
    idx = torch.floor((lw - lo) / width).clamp(0, bins - 1)
    return torch.where(w > 0, idx, torch.zeros_like(idx)).to(torch.int64)


@dataclass(frozen=True)
class PopularityStats:
    """What a popularity-sampled draw keeps per positive (all shaped like the ranks, 0 in padded slots).

    Per positive and additive: batches, epochs and processes concatenate them like the ranks.
    """

    beating: torch.Tensor
    """float64, the beating draws, r~ - 1 (halves under ``ties="average"``)."""
    inv_q: torch.Tensor
    """float64, S1 = sum over beating draws of b_k / q~_j (q~ renormalised over the row's drawable candidates)."""
    inv_q2: torch.Tensor
    """float64, S2 = sum over beating draws of (b_k / q~_j)^2."""
    unreachable: torch.Tensor
    """int64, the row's drawable candidates (irrelevant, not excluded) of weight 0: never drawn, so no estimate can
    count them (the estimators refuse rows that have any)."""
    profile: torch.Tensor | None = None
    """float32 (..., POP_BINS), the row's drawable candidates of weight > 0 in each popularity class
    (:func:`weight_bins`); None where the source cannot carry it (rank files), then ``pl_fit`` refuses."""
    beat_bins: torch.Tensor | None = None
    """float32 (..., POP_BINS), the distinct drawn items in each class that beat the positive (b: 1/2 for a tie under
    ``ties="average"``); None with ``profile``."""
    miss_bins: torch.Tensor | None = None
    """float32 (..., POP_BINS), the distinct drawn items in each class that do not (1 - b); None with ``profile``."""
    positive_weight: torch.Tensor | None = None
    """float64, the popularity weight w of the positive itself (0 in padded slots): the covariate by which ``pl_fit``
    stratifies the positives (``_popularity_fit.strata``); None where the source does not know it (rank files,
    statistics saved before it was kept), then ``pl_fit`` fits all positives as one."""

    @property
    def has_profile(self) -> bool:
        """Whether the class counts ``pl_fit`` reads are here (every field of :data:`PROFILE_FIELDS`)."""
        return all(getattr(self, f) is not None for f in PROFILE_FIELDS)

    def select(self, index: Any) -> "PopularityStats":
        """The statistics of ``index`` (any tensor index of the ranks' shape, e.g. a bool mask of valid slots)."""
        def sel(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index]

        return PopularityStats(self.beating[index], self.inv_q[index], self.inv_q2[index], self.unreachable[index],
                               sel(self.profile), sel(self.beat_bins), sel(self.miss_bins), sel(self.positive_weight))

    @staticmethod
    def cat(parts: Iterable["PopularityStats"]) -> "PopularityStats":
        """The statistics of several 1-D selections (:meth:`select`) concatenated in order (the class counts only
        where every part has them)."""
        every = list(parts)

        def cat(f: str) -> torch.Tensor:
            return torch.cat([getattr(p, f) for p in every])

        whole = all(p.has_profile for p in every)
        known = all(p.positive_weight is not None for p in every)
        profile, beat_bins, miss_bins = (cat(f) if whole else None for f in PROFILE_FIELDS)
        return PopularityStats(cat("beating"), cat("inv_q"), cat("inv_q2"), cat("unreachable"), profile, beat_bins,
                               miss_bins, cat("positive_weight") if known else None)


class RowTotals(NamedTuple):
    """Per row, what its forbidden items (positives and excluded items, each once) take from the catalogue:
    ``weight`` (B,) float64 their total weight, ``zeros`` (B,) int64 how many have weight 0, ``classes``
    (B, POP_BINS) float32 how many of weight > 0 fall in each popularity class (:func:`weight_bins`)."""

    weight: torch.Tensor
    zeros: torch.Tensor
    classes: torch.Tensor

    def plus(self, other: "RowTotals") -> "RowTotals":
        """The totals of the union of two disjoint sets of items (they add field by field; ``+`` stays the tuple's
        concatenation)."""
        return RowTotals(self.weight + other.weight, self.zeros + other.zeros, self.classes + other.classes)


def class_totals(w: torch.Tensor, cls: torch.Tensor | None = None) -> torch.Tensor:
    """(POP_BINS,) float32: the catalogue's items of weight > 0 in each popularity class."""
    cls = weight_bins(w) if cls is None else cls
    return torch.zeros(POP_BINS, dtype=torch.float32, device=w.device).scatter_add_(0, cls, (w > 0).to(torch.float32))


def item_totals(rows: int, row_of: torch.Tensor, items: torch.Tensor, keep: torch.Tensor, w: torch.Tensor,
                 cls: torch.Tensor) -> RowTotals:
    """:class:`RowTotals` of flat (row, item) entries (``row_of``, ``items``: (T,) int64; ``keep``: (T,) bool, the
    entries that count, each item at most once per row), by three ``index_add`` over the entries: memory
    O(T + rows x POP_BINS), no host synchronisation."""
    wi = torch.where(keep, w[items], torch.zeros((), dtype=torch.float64, device=w.device))
    weight = torch.zeros(rows, dtype=torch.float64, device=w.device).index_add_(0, row_of, wi)
    zeros = torch.zeros(rows, dtype=torch.int64, device=w.device).index_add_(
        0, row_of, (keep & (wi == 0)).to(torch.int64))
    flat = row_of * POP_BINS + cls[items]
    classes = torch.zeros(rows * POP_BINS, dtype=torch.float32, device=w.device).index_add_(
        0, flat, (keep & (wi > 0)).to(torch.float32)).view(rows, POP_BINS)
    return RowTotals(weight, zeros, classes)


def forbidden_weight(forbidden: torch.Tensor, w: torch.Tensor, cls: torch.Tensor | None = None) -> RowTotals:
    """:class:`RowTotals` from (B, F) sorted items padded with n (``ranking.forbidden_sorted``; an item listed twice,
    a positive given twice, counts once)."""
    n = w.shape[0]
    real = forbidden < n
    if forbidden.shape[1] > 1:
        real[:, 1:] &= forbidden[:, 1:] != forbidden[:, :-1]
    bsz, f = forbidden.shape
    row_of = torch.arange(bsz, device=w.device).repeat_interleave(f)
    return item_totals(bsz, row_of, forbidden.clamp(max=max(n - 1, 0)).reshape(-1), real.reshape(-1), w,
                        weight_bins(w) if cls is None else cls)


def exclusion_totals(positives: torch.Tensor, exc: Exclusions, w: torch.Tensor, cls: torch.Tensor | None = None) -> RowTotals:
    """:class:`RowTotals` of a row's positives ((B, P) sorted ascending, padded with n: ``forbidden_sorted(pos,
    None, n)``) and its CSR exclusions (an :class:`~reco_sampled_plugin.exclusions.Exclusions` of the same rows):
    the exclusions summed per row over their T entries, the positives once each, those also excluded not again."""
    cls = weight_bins(w) if cls is None else cls
    n = w.shape[0]
    also = exc.contains(positives)  # a positive also excluded: counted with the exclusions
    pos = torch.where(also, torch.full_like(positives, n), positives)  # still sorted where it matters: equal
    ones = torch.ones(exc.items.shape, dtype=torch.bool, device=w.device)  # neighbours stay neighbours
    return forbidden_weight(pos, w, cls).plus(item_totals(exc.rows, exc.row_of, exc.items, ones, w, cls))


def popularity_stats(beat: torch.Tensor, neg: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor,
                     forbidden: torch.Tensor | RowTotals, given: bool = False, *,
                     positives: torch.Tensor | None = None) -> PopularityStats:
    """:class:`PopularityStats` of one batch of popularity draws.

    Args:
        beat: (B, P, m) the draws' beating indicators (bool) or weights in [0, 1] (float: 1/2 for ties under
            ``ties="average"``), as counted in the sampled ranks.
        neg: (B, P, m) int64 drawn items (any value in padded slots).
        valid: (B, P) bool, the slots that hold a positive.
        weights: (n,) float64 popularity weights w (validated: finite, >= 0).
        forbidden: (B, F) the row's positives and excluded items, sorted, padded with n (``ranking.forbidden_sorted``),
            or their :class:`RowTotals` (:func:`forbidden_weight`, :func:`exclusion_totals`).
        given: the negatives were given, not drawn by the plugin (which never draws an item of weight 0): check them
            (one host synchronisation; a draw's statistics cost none).
        positives: (B, P) int64 the positives' items (any value in padded slots): their weights are kept
            (``positive_weight``); None: not kept.

    Raises:
        ValueError naming ``negatives`` when a given negative of a valid slot has weight 0 (the popularity law
        cannot have drawn it).
    """
    w = weights.to(torch.float64)
    cls = weight_bins(w)
    tot = forbidden_weight(forbidden, w, cls) if isinstance(forbidden, torch.Tensor) else forbidden
    total = w.sum() - tot.weight  # W_u: the drawable candidates' weight
    unreachable = (w == 0).sum() - tot.zeros
    profile = class_totals(w, cls).unsqueeze(0) - tot.classes  # (B, POP_BINS): the drawable candidates per class
    return stats_from_totals(beat, neg, valid, w, total.view(-1, 1).expand(valid.shape),
                             unreachable.view(-1, 1).expand(valid.shape), given,
                             profile=profile.unsqueeze(1).expand(valid.shape + (POP_BINS,)), classes=cls,
                             positives=positives)


def stats_from_totals(beat: torch.Tensor, neg: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor,
                      total: torch.Tensor, unreachable: torch.Tensor, given: bool = False, *,
                      profile: torch.Tensor | None = None, classes: torch.Tensor | None = None,
                      positives: torch.Tensor | None = None) -> PopularityStats:
    """:class:`PopularityStats` from each positive's drawable weight W_u and count of unreachable candidates,
    where the caller knows them without a list of forbidden items (RecBole's sampler: its per-user used items).

    Args:
        beat, neg, valid, weights, given: as :func:`popularity_stats` (any leading shape S instead of (B, P):
            ``beat`` / ``neg`` S + (m,), ``valid`` S).
        total: S, float64, W_u = sum of w over the positive's drawable candidates (irrelevant, not excluded).
        unreachable: S, int64, its drawable candidates of weight 0.
        profile: S + (POP_BINS,), its drawable candidates of weight > 0 per popularity class (:func:`class_totals`
            minus the forbidden items' :class:`RowTotals` ``classes``); None: the statistics carry no class counts
            (``pl_fit`` refuses them).
        classes: the items' classes (:func:`weight_bins` of ``weights``) when already computed.
        positives: S, int64, the positives' items (any value in padded slots), or None: ``positive_weight``.
    """
    w = weights.to(torch.float64)
    q = w[neg.clamp(min=0)] / total.to(torch.float64).unsqueeze(-1)
    drawn_zero = valid.unsqueeze(-1) & (q <= 0)
    if given and bool(drawn_zero.any()):
        rows = drawn_zero.any(-1).reshape(drawn_zero.shape[0], -1).any(1)
        raise ValueError(f"negatives: {int(rows.sum())} row(s) hold a negative of popularity weight 0, which the "
                         f"popularity law cannot draw (first: row {int(rows.nonzero()[0, 0])})")
    b = beat.to(torch.float64)
    z = torch.where(b > 0, b / torch.where(q > 0, q, torch.ones_like(q)), torch.zeros_like(b))
    z = torch.where(valid.unsqueeze(-1), z, torch.zeros_like(z))
    beating = torch.where(valid, b.sum(-1), torch.zeros_like(b[..., 0]))
    unreach = torch.where(valid, unreachable.to(torch.int64), torch.zeros_like(valid, dtype=torch.int64))
    pw = None if positives is None else torch.where(
        valid, w[positives.clamp(min=0, max=max(w.shape[0] - 1, 0))], torch.zeros((), dtype=torch.float64,
                                                                                   device=w.device))
    if profile is None:
        return PopularityStats(beating, z.sum(-1), (z * z).sum(-1), unreach, positive_weight=pw)
    cls = weight_bins(w) if classes is None else classes
    vf = valid.unsqueeze(-1).to(torch.float32)
    beat_bins, miss_bins = _drawn_classes(b, neg, vf, cls)
    return PopularityStats(beating, z.sum(-1), (z * z).sum(-1), unreach, profile.to(torch.float32) * vf,
                           beat_bins, miss_bins, pw)


def _drawn_classes(b: torch.Tensor, neg: torch.Tensor, vf: torch.Tensor, cls: torch.Tensor) \
        -> tuple[torch.Tensor, torch.Tensor]:
    """Per positive, the distinct drawn items per popularity class that beat it (b) or not (1 - b): S + (POP_BINS,)
    float32 each, 0 in padded slots (``vf``: S + (1,) float 0/1). An item drawn twice counts once (its membership
    of the set above the positive is one fact)."""
    n = cls.shape[0]
    srt, order = torch.sort(neg, dim=-1)
    first = torch.ones_like(srt, dtype=torch.bool)
    first[..., 1:] = srt[..., 1:] != srt[..., :-1]
    keep = first.to(torch.float32) * vf
    bs = b.gather(-1, order).to(torch.float32)
    c = cls[srt.clamp(min=0, max=max(n - 1, 0))]
    zeros = torch.zeros(srt.shape[:-1] + (POP_BINS,), dtype=torch.float32, device=neg.device)
    return zeros.scatter_add(-1, c, bs * keep), zeros.scatter_add(-1, c, (1.0 - bs) * keep)
