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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PopularityStats", "popularity_stats", "stats_from_totals"]


@dataclass(frozen=True)
class PopularityStats:
    """What a popularity-sampled draw keeps per positive (all shaped like the ranks, 0 in padded slots).

    beating: float64, the beating draws, r~ - 1 (halves under ``ties="average"``).
    inv_q: float64, S1 = sum over beating draws of b_k / q~_j (q~ renormalised over the row's drawable candidates).
    inv_q2: float64, S2 = sum over beating draws of (b_k / q~_j)^2.
    unreachable: int64, the row's drawable candidates (irrelevant, not excluded) of weight 0: never drawn, so no
        estimate can count them (the estimators refuse rows that have any).

    Per positive and additive: batches, epochs and processes concatenate them like the ranks.
    """

    beating: torch.Tensor
    inv_q: torch.Tensor
    inv_q2: torch.Tensor
    unreachable: torch.Tensor

    def select(self, index) -> "PopularityStats":
        """The statistics of ``index`` (any tensor index of the ranks' shape, e.g. a bool mask of valid slots)."""
        return PopularityStats(self.beating[index], self.inv_q[index], self.inv_q2[index], self.unreachable[index])

    @staticmethod
    def cat(parts) -> "PopularityStats":
        """The statistics of several 1-D selections (:meth:`select`) concatenated in order."""
        parts = list(parts)
        return PopularityStats(*(torch.cat([getattr(p, f) for p in parts]) for f in
                                 ("beating", "inv_q", "inv_q2", "unreachable")))


def forbidden_weight(forbidden: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the total weight of its forbidden items and how many of them have weight 0: (B,) float64 and (B,)
    int64, from (B, F) sorted items padded with n (an item listed twice, a positive given twice, counts once)."""
    n = w.shape[0]
    real = forbidden < n
    if forbidden.shape[1] > 1:
        real[:, 1:] &= forbidden[:, 1:] != forbidden[:, :-1]
    wf = torch.where(real, w[forbidden.clamp(max=max(n - 1, 0))], torch.zeros((), dtype=torch.float64, device=w.device))
    return wf.sum(1), (real & (wf == 0)).sum(1)


def popularity_stats(beat: torch.Tensor, neg: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor,
                     forbidden: torch.Tensor, given: bool = False) -> PopularityStats:
    """:class:`PopularityStats` of one batch of popularity draws.

    Args:
        beat: (B, P, m) the draws' beating indicators (bool) or weights in [0, 1] (float: 1/2 for ties under
            ``ties="average"``), as counted in the sampled ranks.
        neg: (B, P, m) int64 drawn items (any value in padded slots).
        valid: (B, P) bool, the slots that hold a positive.
        weights: (n,) float64 popularity weights w (validated: finite, >= 0).
        forbidden: (B, F) the row's positives and excluded items, sorted, padded with n (``ranking.forbidden_sorted``),
            or their (weight sum, count of weight 0) per row, (B,) each (:func:`forbidden_weight`).
        given: the negatives were given, not drawn by the plugin (which never draws an item of weight 0): check them
            (one host synchronisation; a draw's statistics cost none).

    Raises:
        ValueError naming ``negatives`` when a given negative of a valid slot has weight 0 (the popularity law
        cannot have drawn it).
    """
    w = weights.to(torch.float64)
    w_forbidden, zero_forbidden = forbidden_weight(forbidden, w) if isinstance(forbidden, torch.Tensor) else forbidden
    total = w.sum() - w_forbidden  # W_u: the drawable candidates' weight
    unreachable = (w == 0).sum() - zero_forbidden
    return stats_from_totals(beat, neg, valid, w, total.view(-1, 1).expand(valid.shape),
                             unreachable.view(-1, 1).expand(valid.shape), given)


def stats_from_totals(beat: torch.Tensor, neg: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor,
                      total: torch.Tensor, unreachable: torch.Tensor, given: bool = False) -> PopularityStats:
    """:class:`PopularityStats` from each positive's drawable weight W_u and count of unreachable candidates,
    where the caller knows them without a list of forbidden items (RecBole's sampler: its per-user used items).

    Args:
        beat, neg, valid, weights, given: as :func:`popularity_stats` (any leading shape S instead of (B, P):
            ``beat`` / ``neg`` S + (m,), ``valid`` S).
        total: S, float64, W_u = sum of w over the positive's drawable candidates (irrelevant, not excluded).
        unreachable: S, int64, its drawable candidates of weight 0.
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
    return PopularityStats(beating, z.sum(-1), (z * z).sum(-1), unreach)
