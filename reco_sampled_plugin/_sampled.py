"""The sampled ranks of a draw (:class:`SampledRanks`, public as ``ranking.SampledRanks``): the data every estimator
reads, below the draws (``ranking``, ``adaptive``, ``scorer_ranks``) and the fits (``rank_distribution``,
``estimators``, ``popularity``), so that a draw may call a fit (the active exact share) without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._checks import MAX_SAMPLES, ArgumentTypeError
from ._options import check_bool
from ._popularity import PopularityStats
from ._share import ShareRows, with_share_arrays
from .design import SamplingDesign, as_design

if TYPE_CHECKING:
    from ._rank_hist import RankHistogram
    from ._types import TensorLike

__all__ = ["SampledRanks", "ranks_of_histogram"]


def _check_completed(exact: torch.Tensor, ranks: torch.Tensor, m: Any, design: SamplingDesign) -> None:
    """Exact ranks given with sampled ones (``SampledRanks.from_arrays``) must be what an ``exact_at_cap`` design
    completes: positives that reached the cap (m at its largest stage) still within its top (r~ <= t); any other
    exact rank contradicts the design (an estimate would read it as drawn where it was not). Shapes that differ are
    left to the histogram's own error."""
    adaptive = design.adaptive
    if adaptive is None or not design.exact_at_cap:
        raise ValueError(f"exact_ranks: only an adaptive design with exact_at_cap completes positives with exact ranks "
                         f"(those still within its top at the cap), not {design.describe()}; an exact share's ranks "
                         "go to share_ranks with inclusion")
    if exact.shape != ranks.shape:
        return
    done = exact.to(ranks.device) > 0
    final = torch.as_tensor(m, dtype=torch.int64, device=ranks.device)
    below = done & (final != adaptive.cap)
    if bool(below.any()):
        raise ValueError(f"exact_ranks: {int(below.sum())} exact rank(s) of positives whose draws stopped below the "
                         f"cap (n_samples != {adaptive.cap}, the design's largest stage): only positives that reach "
                         "the cap are completed")
    out = done & (ranks > adaptive.top)
    if bool(out.any()):
        raise ValueError(f"exact_ranks: {int(out.sum())} exact rank(s) of positives outside the top at the cap "
                         f"(sampled rank > {adaptive.top}): only those still within it are completed")


@dataclass(frozen=True, eq=False)
class SampledRanks:
    """Sampled ranks together with what an estimator needs to read them: the draw's design and sizes.

    ranks: (B, P) sampled ranks r~ in 1..m+1 (0 in padded slots; float64 for ``ties="average"``), or any shape
        for ranks simulated from exact ranks.
    n_candidates: n, the irrelevant items each draw could come from plus the relevant item itself: (B,) per
        row from :func:`sampled_ranks` (catalogue minus excluded items minus the row's positives, plus 1; a row
        without a positive: its irrelevant items), or per positive (shaped like ``ranks``).
    negatives: (B, P, m) int64 indices of the drawn irrelevant items (-1 in padded slots), or None where
        no item indices exist (ranks simulated from exact ranks, adaptive draws).
    design: the :class:`~reco_sampled_plugin.design.SamplingDesign` of the draw (pre-drawn ``negatives``:
        uniform with replacement unless the caller passed a design).
    n_samples: per-positive final sample sizes of an adaptive draw (int64, shaped like ``ranks``, 0 in padded
        slots); None for a fixed m (``design.n_samples``).
    cost: what scoring cost, from :func:`~reco_sampled_plugin.scorer_ranks.sampled_ranks_from_scorer`
        (:class:`~reco_sampled_plugin.scorer_ranks.ScoringCost`); None from a score matrix.
    popularity_stats: a popularity design's per-positive statistics of the beating draws (the number, sum of 1/q~
        and of 1/q~^2: :class:`~reco_sampled_plugin._popularity.PopularityStats`, docs/popularity.md), which the
        Hansen-Hurwitz estimator ``hh`` reads; None for uniform designs (r~ says it all there) and for draws
        without replacement (not independent: no Hansen-Hurwitz weights).
    exact_ranks: adaptive designs with ``exact_at_cap``: the exact rank R (1..n, among the n - 1 irrelevant
        candidates and the positive itself, ties as the draw's ``ties``) of each positive still ranked first at
        the cap, 0 elsewhere (positives that stopped earlier, padding); shaped like ``ranks``, int64 (float64 for
        ``ties="average"``). None without completion. ``ranks`` keeps the sampled rank r~ of every positive, so
        the uncorrected sampled metric (``none``) is unchanged; the rank-distribution fits read a completed
        positive as the point mass at its R (:meth:`histogram`).
    share_ranks: designs with an ``exact_share``: the exact rank R (as ``exact_ranks``) of each positive the share
        chose, 0 elsewhere (shaped like ``ranks``); None without a share. ``ranks`` keeps every sampled rank, so
        every other estimator reads these ranks as before; ``diff`` (and ``auto``) read the share
        (``_design_based.py``; drawn by ``_share.py``).
    inclusion: with ``share_ranks``: each positive's inclusion probability pi in [1e-9, 1] (``MIN_INCLUSION``) (float64, shaped like
        ``ranks``, 0 in padded slots), with which the share was chosen.

    ``estimate(metric, sampled)`` takes it alone; its parts are read by attribute (it does not unpack).
    """

    ranks: torch.Tensor
    n_candidates: torch.Tensor
    negatives: torch.Tensor | None = None
    design: SamplingDesign | None = None
    n_samples: torch.Tensor | None = None
    cost: Any = None  # a scorer_ranks.ScoringCost (not imported here: scorer_ranks builds on this module)
    popularity_stats: PopularityStats | None = None
    exact_ranks: torch.Tensor | None = None
    share_ranks: torch.Tensor | None = None
    inclusion: torch.Tensor | None = None

    @classmethod
    def from_arrays(cls, ranks: TensorLike, n_items: TensorLike, n_samples: TensorLike | None = None,
                    design: SamplingDesign | int | None = None, *, exact_ranks: TensorLike | None = None,
                    share_ranks: TensorLike | None = None, inclusion: TensorLike | None = None) -> "SampledRanks":
        """Sampled ranks drawn elsewhere, with what estimation needs: the one constructor from plain arrays.

        Args:
            ranks: sampled ranks r~ in 1..m+1 (any shape, tensor or array, any device; 0 marks padding).
            n_items: n, candidates per positive (the relevant item included): an int or per-positive values
                broadcastable to ``ranks``.
            n_samples: m, sampled irrelevant items: an int or per-positive values (an adaptive design: each
                positive's final m); None: the design's m.
            design: how the m items were drawn (:class:`~reco_sampled_plugin.design.SamplingDesign` or an int m):
                None means uniform with replacement (the binomial law); ``SamplingDesign(m, replacement=False)``
                the hypergeometric law; ``SamplingDesign(m, adaptive_max=cap)`` adaptive sampling (``n_samples``
                then holds each positive's final m, checked against the stages at estimation). Popularity designs
                are refused: their estimators read the draws' weights (use the SampledRanks of the draw).
            exact_ranks: adaptive designs with ``exact_at_cap``: the exact rank R of each positive completed at
                the cap, 0 elsewhere (:attr:`exact_ranks`); refused under any other design, and for a positive
                below the cap or outside its top there (what the design cannot have completed).
            share_ranks, inclusion: an exact share (:attr:`share_ranks`, :attr:`inclusion`), both or neither.

        Raises:
            ValueError: naming the argument: ranks not whole, sizes out of their range, shapes that do not
                broadcast, exact ranks the design cannot have completed. A rank outside 1..m + 1 or an n below 2
                is refused where the ranks are read (``estimate``, ``histogram``), as every sample's is.
        """
        from ._checks import check_rank_values, check_sizes

        r = check_rank_values(ranks, "sampled_ranks", whole=True, padding=True)
        n = check_sizes(n_items, "n_items", 0, like=r, like_name="sampled_ranks", exact=True, device=r.device)
        if design is not None:
            design = as_design(design, name="design")
            if design.popularity is not None:
                raise ValueError("design: bare ranks cannot carry what popularity-sampled ranks need, each positive's "
                                 "beating draws' 1/q~; pass the SampledRanks of the draw (sampled_ranks(..., "
                                 "SamplingDesign(m, popularity=w)), sampled_ranks_from_scorer)")
        if n_samples is None:
            if design is None:
                raise ArgumentTypeError("n_samples: required, expected m per positive (it may be None only where a "
                                        "design gives m), got None")
            if design.adaptive_max is not None:
                raise ValueError("n_samples: an adaptive design needs each positive's final m (None given)")
            m: Any = None
        else:
            m = check_sizes(n_samples, "n_samples", 0, like=r, like_name="sampled_ranks", exact=True, device=r.device,
                            maximum=MAX_SAMPLES)
        if design is None:
            first = m if isinstance(m, int) else int(m.max()) if m.numel() else 1
            design = SamplingDesign(max(first, 1))
        if isinstance(m, int) and design.adaptive_max is None and m != design.n_samples:
            raise ValueError(f"n_samples: m = {m} contradicts the design's m = {design.n_samples} ({design.describe()}); "
                             "give one of them, or the same m")
        if isinstance(m, int) and m == design.n_samples and design.adaptive_max is None:
            m = None  # the design's fixed m
        sizes = None if m is None else torch.as_tensor(m, dtype=torch.int64, device=r.device).expand(r.shape)
        e = None if exact_ranks is None else check_rank_values(exact_ranks, "exact_ranks", whole=True, padding=True)
        if e is not None:
            _check_completed(e, r, m, design)
        out = cls(r, torch.as_tensor(n, dtype=torch.int64, device=r.device), None, design, sizes, exact_ranks=e)
        if share_ranks is None and inclusion is None:
            return out
        return with_share_arrays(out, share_ranks, inclusion)

    def sizes(self) -> torch.Tensor | int:
        """m per positive: the adaptive sizes, else the design's m."""
        if self.n_samples is not None:
            return self.n_samples
        if self.design is None:
            raise ValueError("sampled: these ranks carry no design; pass n_samples (m)")
        return self.design.n_samples

    def candidates(self) -> torch.Tensor:
        """n per positive, shaped like ``ranks`` (a per-row n broadcast over the row's positives)."""
        n = self.n_candidates
        r = self.ranks
        if n.shape == r.shape:
            return n
        if r.dim() == 2 and n.dim() == 1 and n.shape[0] == r.shape[0]:
            return n.unsqueeze(1).expand(r.shape)
        return n.expand(r.shape)

    def histogram(self, weights: TensorLike | None = None, *, exact: bool = True) -> RankHistogram:
        """The :class:`~reco_sampled_plugin._rank_hist.RankHistogram` of these ranks (padding dropped), with
        per-positive n and m; ``weights`` as in :func:`~reco_sampled_plugin.estimators.estimate`. With
        ``exact`` (default) and :attr:`exact_ranks`, the completed positives form exact groups (n, m = n - 1) of
        their exact ranks (``RankHistogram.exact``); ``exact=False``: every positive's sampled rank r~. An exact
        share (:attr:`share_ranks`) travels as ``RankHistogram.share``. An equal
        histogram made before is returned again (``_rank_hist.same_histogram``: with the fits it keeps)."""
        from ._rank_hist import same_histogram, sampled_rank_histogram

        exact = check_bool(exact, "exact")
        hist = sampled_rank_histogram(self.ranks, self.candidates(), self.sizes(), weights,
                                      exact_ranks=self.exact_ranks if exact else None)
        if self.share_ranks is not None:  # the exact share travels with the counts (``_share.ShareRows``)
            hist = hist.with_share(ShareRows.of(self, weights))
        return same_histogram(self, hist)

    def __getstate__(self) -> dict:
        """The fields, without the histograms remembered by :meth:`histogram` and the popularity units remembered
        by ``popularity.popularity_draws`` (with what they keep; pickles and copies)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_histograms", "_units")}


def ranks_of_histogram(hist: RankHistogram, design: SamplingDesign) -> SampledRanks:
    """The :class:`SampledRanks` of a histogram's positives under a fixed-m ``design``: one positive per count (1-D,
    in the histogram's cell order), no per-draw statistics. What a streaming state keeps of popularity draws without
    replacement, whose ranks carry no Hansen-Hurwitz weights (``sampled_ranks`` keeps none: the draws are not
    independent) and which a histogram cannot carry with its design (``RankHistogram`` refuses popularity designs):
    ``estimate(metric, ranks_of_histogram(hist, design), method)`` reads them as the core reads the draw's own.
    The counts must be whole (unweighted positives)."""
    counts = hist.flat_counts
    if not np.array_equal(counts, np.round(counts)):
        raise ValueError("hist: ranks_of_histogram needs whole counts (one per positive), got weighted counts")
    m = hist.n_samples.astype(np.int64)
    each = counts.astype(np.int64)
    r = np.concatenate([np.arange(1, k + 2, dtype=np.int64) for k in m]) if len(m) else np.zeros(0, np.int64)
    group = np.repeat(np.arange(len(m)), m + 1)
    ranks = torch.from_numpy(np.repeat(r, each))
    n = torch.from_numpy(np.repeat(hist.n_items.astype(np.int64)[group], each))
    return SampledRanks(ranks, n, None, design)
