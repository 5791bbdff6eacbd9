"""Per-positive statistics of popularity-sampled draws: what the Hansen-Hurwitz estimators need beyond r~.

One helper, :func:`popularity_stats`, is called by every path that draws (or is given) popularity-sampled negatives:
:func:`~reco_sampled_plugin.ranking.sampled_ranks` (score matrix; ``evaluate_factors`` draws through it) and
:func:`~reco_sampled_plugin.scorer_ranks.sampled_ranks_from_scorer` (the scorer loop).

The law (NOTATION.md, "Popularity (non-uniform) sampling"; docs/popularity.md): the m draws of a positive are
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
weights, so batches agree). That is 3 x POP_BINS float32 per positive, additive like the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["PopularityStats", "popularity_stats", "POP_BINS", "weight_bins"]

#: Popularity classes of the per-positive profile (equal width in log w between the smallest positive weight and the
#: largest): 16 classes over counts 1..600 at alpha = 1 are a factor 1.5 wide each.
POP_BINS = 16

_FIELDS = ("beating", "inv_q", "inv_q2", "unreachable", "profile", "beat_bins", "miss_bins")


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

    beating: float64, the beating draws, r~ - 1 (halves under ``ties="average"``).
    inv_q: float64, S1 = sum over beating draws of b_k / q~_j (q~ renormalised over the row's drawable candidates).
    inv_q2: float64, S2 = sum over beating draws of (b_k / q~_j)^2.
    unreachable: int64, the row's drawable candidates (irrelevant, not excluded) of weight 0: never drawn, so no
        estimate can count them (the estimators refuse rows that have any).
    profile: float32 (..., POP_BINS), the row's drawable candidates of weight > 0 in each popularity class
        (:func:`weight_bins`).
    beat_bins: float32 (..., POP_BINS), the distinct drawn items in each class that beat the positive (b: 1/2 for
        a tie under ``ties="average"``).
    miss_bins: float32 (..., POP_BINS), the distinct drawn items in each class that do not (1 - b).

    Per positive and additive: batches, epochs and processes concatenate them like the ranks.
    """

    beating: torch.Tensor
    inv_q: torch.Tensor
    inv_q2: torch.Tensor
    unreachable: torch.Tensor
    profile: torch.Tensor
    beat_bins: torch.Tensor
    miss_bins: torch.Tensor

    def select(self, index) -> "PopularityStats":
        """The statistics of ``index`` (any tensor index of the ranks' shape, e.g. a bool mask of valid slots)."""
        return PopularityStats(*(getattr(self, f)[index] for f in _FIELDS))

    @staticmethod
    def cat(parts) -> "PopularityStats":
        """The statistics of several 1-D selections (:meth:`select`) concatenated in order."""
        parts = list(parts)
        return PopularityStats(*(torch.cat([getattr(p, f) for p in parts]) for f in _FIELDS))


def popularity_stats(beat: torch.Tensor, neg: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor,
                     forbidden: torch.Tensor, given: bool = False) -> PopularityStats:
    """:class:`PopularityStats` of one batch of popularity draws.

    Args:
        beat: (B, P, m) the draws' beating indicators (bool) or weights in [0, 1] (float: 1/2 for ties under
            ``ties="average"``), as counted in the sampled ranks.
        neg: (B, P, m) int64 drawn items (any value in padded slots).
        valid: (B, P) bool, the slots that hold a positive.
        weights: (n,) float64 popularity weights w (validated: finite, >= 0).
        forbidden: (B, F) the row's positives and excluded items, sorted, padded with n (``ranking.forbidden_sorted``).
        given: the negatives were given, not drawn by the plugin (which never draws an item of weight 0): check them
            (one host synchronisation; a draw's statistics cost none).

    Raises:
        ValueError naming ``negatives`` when a given negative of a valid slot has weight 0 (the popularity law
        cannot have drawn it).
    """
    n = weights.shape[0]
    w = weights.to(torch.float64)
    real = forbidden < n
    if forbidden.shape[1] > 1:  # an item listed twice (a positive given twice) counts once
        real[:, 1:] &= forbidden[:, 1:] != forbidden[:, :-1]
    wf = torch.where(real, w[forbidden.clamp(max=max(n - 1, 0))], torch.zeros((), dtype=torch.float64, device=w.device))
    total = w.sum() - wf.sum(1)  # W_u: the drawable candidates' weight
    unreachable = (w == 0).sum() - (real & (wf == 0)).sum(1)
    q = w[neg.clamp(min=0)] / total.view(-1, 1, 1)
    drawn_zero = valid.unsqueeze(2) & (q <= 0)
    if given and bool(drawn_zero.any()):
        rows = drawn_zero.any(2).any(1)
        raise ValueError(f"negatives: {int(rows.sum())} row(s) hold a negative of popularity weight 0, which the "
                         f"popularity law cannot draw (first: row {int(rows.nonzero()[0, 0])})")
    b = beat.to(torch.float64)
    z = torch.where(b > 0, b / torch.where(q > 0, q, torch.ones_like(q)), torch.zeros_like(b))
    z = torch.where(valid.unsqueeze(2), z, torch.zeros_like(z))
    beating = torch.where(valid, b.sum(2), torch.zeros_like(b[..., 0]))
    unreach = torch.where(valid, unreachable.view(-1, 1).expand(valid.shape), torch.zeros_like(valid, dtype=torch.int64))
    profile, beat_bins, miss_bins = _class_counts(b, neg, valid, w, forbidden, real)
    return PopularityStats(beating, z.sum(2), (z * z).sum(2), unreach, profile, beat_bins, miss_bins)


def _class_counts(b: torch.Tensor, neg: torch.Tensor, valid: torch.Tensor, w: torch.Tensor, forbidden: torch.Tensor,
                  real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per positive, the row's drawable candidates per popularity class and the distinct drawn items per class that
    beat it (b) or not (1 - b): (B, P, POP_BINS) float32 each, 0 in padded slots. An item drawn twice counts once
    (its membership of the set above the positive is one fact)."""
    n = w.shape[0]
    cls = weight_bins(w)
    bsz, p = valid.shape
    f32 = torch.float32
    total = torch.zeros(POP_BINS, dtype=f32, device=w.device).scatter_add_(0, cls, (w > 0).to(f32))
    fc = cls[forbidden.clamp(max=max(n - 1, 0))]
    fw = (real & (w[forbidden.clamp(max=max(n - 1, 0))] > 0)).to(f32)
    row = total.unsqueeze(0) - torch.zeros(bsz, POP_BINS, dtype=f32, device=w.device).scatter_add_(1, fc, fw)
    vf = valid.unsqueeze(2).to(f32)
    profile = row.unsqueeze(1) * vf
    srt, order = torch.sort(neg, dim=2)
    first = torch.ones_like(srt, dtype=torch.bool)
    first[..., 1:] = srt[..., 1:] != srt[..., :-1]
    keep = first.to(f32) * vf
    bs = b.gather(2, order).to(f32)
    c = cls[srt.clamp(min=0, max=max(n - 1, 0))]
    zeros = torch.zeros(bsz, p, POP_BINS, dtype=f32, device=w.device)
    beat_bins = zeros.scatter_add(2, c, bs * keep)
    miss_bins = zeros.scatter_add(2, c, (1.0 - bs) * keep)
    return profile, beat_bins, miss_bins
