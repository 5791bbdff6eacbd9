"""Sampled ranks from a scorer: draw first, then score only the positives and the drawn items.

Sampling exists to save scoring. Where every (user, item) pair costs a forward pass (context-aware models such as
DeepFM or DCN, cross-encoders, LLM re-rankers), full ranking costs n pairs per user; this loop costs 1 + m per
held-out item (plus the adaptive stages' new draws), and never builds a score row.

The scorer protocol: ``scorer(users, items) -> scores`` with ``users`` (B,) int64 user ids and ``items`` (B, L)
int64 item indices, both on the positives' device, returning (B, L) real scores on that device, higher = better.
The scorer must be *pointwise*: a pair's score may not depend on the other items of the call (the loop batches
pairs freely, in calls of at most ``max_pairs`` pairs).

Draws are those of :func:`~reco_sampled_plugin.ranking.sampled_ranks` and
:func:`~reco_sampled_plugin.adaptive.adaptive_sampled_ranks`, from the same code and the same generator: on the
materialised score matrix the two paths give the same draws, ranks and ties (tested). An adaptive design with
``exact_at_cap`` then scores the whole candidate list of the rows whose positives are still first at the cap
(:func:`complete_from_scorer`) and ranks those positives exactly, as
:func:`~reco_sampled_plugin.adaptive.adaptive_sampled_ranks` reads them from the matrix. What the loop returns is a
:class:`~reco_sampled_plugin.ranking.SampledRanks`, so every estimator, interval and adapter takes it unchanged,
with a :class:`ScoringCost` in its ``cost`` field.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ._checks import check_elements, check_generator, check_int, check_required, check_size, real_tensor
from ._options import check_bool
from .adaptive import added_ranks, completion_targets, continues
from .design import SamplingDesign, as_design
from .exclusions import Exclusions, as_exclusions
from ._types import TensorLike
from .ranking import (SampledRanks, allowed_position_to_item, check_popularity, check_ties, complete_at_cap, draw_negatives,
                      exclusion_counts, forbidden_sorted, padded_candidate_counts, popularity_draw_stats,
                      prepare_sampling_index, rank_among_drawn, stage_positives)

logger = logging.getLogger(__name__)

__all__ = ["Scorer", "ScoringCost", "sampled_ranks_from_scorer", "DEFAULT_MAX_PAIRS", "ScorerCalls", "score_drawn",
           "full_ranking_pairs", "check_scorer",
           "adaptive_stages", "complete_from_scorer"]

#: ``scorer(users (B,), items (B, L)) -> scores (B, L)``: pointwise, on the items' device
Scorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: pairs per scorer call unless the caller says otherwise (2^16: a batch a GPU model scores in one pass)
DEFAULT_MAX_PAIRS = 1 << 16


@dataclass(frozen=True)
class ScoringCost:
    """What the scorer loop cost.

    pairs: (user, item) pairs scored (the positives once, each drawn item once per draw); calls: scorer calls;
    scorer_seconds: wall time inside the scorer (synchronised on CUDA at the end of each call); loop_seconds: the
    loop's own time outside the scorer (draws, checks, counting); full_pairs: the pairs full ranking would score
    (each row with a positive: its n items minus its excluded items); stages: sampling stages run (1 for a fixed m).
    """

    pairs: int
    calls: int
    scorer_seconds: float
    loop_seconds: float
    full_pairs: int
    stages: int = 1

    @property
    def share_of_full(self) -> float:
        """Pairs scored / pairs full ranking would score."""
        return self.pairs / self.full_pairs if self.full_pairs else math.nan

    def __add__(self, other: "ScoringCost") -> "ScoringCost":
        """The cost of two loops together (``stages``: the larger)."""
        return ScoringCost(self.pairs + other.pairs, self.calls + other.calls,
                           self.scorer_seconds + other.scorer_seconds, self.loop_seconds + other.loop_seconds,
                           self.full_pairs + other.full_pairs, max(self.stages, other.stages))

    def as_dict(self) -> dict:
        return {"pairs": self.pairs, "calls": self.calls, "scorer_seconds": self.scorer_seconds,
                "loop_seconds": self.loop_seconds, "full_pairs": self.full_pairs, "stages": self.stages,
                "share_of_full": self.share_of_full}


def check_scorer(scorer: Any) -> Scorer:
    """``scorer`` if it is callable (a ValueError naming ``scorer`` otherwise)."""
    if not callable(scorer):
        raise ValueError(f"scorer: expected a callable scorer(users, items) -> scores, got {type(scorer).__name__}")
    return scorer


class ScorerCalls:
    """The scorer's calls: chunking to ``max_pairs``, checking each answer, timing, counting."""

    def __init__(self, scorer: Scorer, max_pairs: int, check_finite: bool, device: torch.device) -> None:
        check_scorer(scorer)
        self.scorer, self.max_pairs, self.check_finite, self.device = scorer, max_pairs, check_finite, device
        self.pairs = self.calls = 0
        self.seconds = 0.0
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.name = getattr(scorer, "__qualname__", None) or type(scorer).__name__

    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(K, L) float64 scores of ``items`` (K, L) for ``users`` (K,), in calls of at most ``max_pairs`` pairs
        (rows first; a row longer than ``max_pairs`` is split into column blocks)."""
        k, length = items.shape
        out = torch.empty((k, length), dtype=torch.float64, device=self.device)
        if k == 0 or length == 0:
            return out
        cols = min(length, self.max_pairs)
        rows = max(1, self.max_pairs // cols)
        for r0 in range(0, k, rows):
            for c0 in range(0, length, cols):
                r1, c1 = min(k, r0 + rows), min(length, c0 + cols)
                out[r0:r1, c0:c1] = self._call(users[r0:r1], items[r0:r1, c0:c1].contiguous(), r0)
        return out

    def _call(self, users: torch.Tensor, items: torch.Tensor, first_row: int) -> torch.Tensor:
        where = f"call {self.calls + 1} ({items.shape[0]} rows from row {first_row}, {items.shape[1]} items each)"
        self._sync()
        t = time.perf_counter()
        try:
            got = self.scorer(users, items)
            self._sync()
        except Exception as exc:  # noqa: BLE001 - re-raised with the batch named, the cause chained
            raise ValueError(f"scorer {self.name!r} raised {type(exc).__name__} on {where}: {exc}") from exc
        finally:
            self.seconds += time.perf_counter() - t
        self.calls += 1
        self.pairs += items.numel()
        if not isinstance(got, torch.Tensor):
            raise ValueError(f"scorer {self.name!r} returned {type(got).__name__} on {where}; expected a tensor of "
                             f"shape {tuple(items.shape)}")
        if tuple(got.shape) != tuple(items.shape):
            raise ValueError(f"scorer {self.name!r} returned shape {tuple(got.shape)} on {where}; expected "
                             f"{tuple(items.shape)} (one score per (user, item) pair)")
        if got.dtype == torch.bool or got.is_complex():
            raise ValueError(f"scorer {self.name!r} returned dtype {got.dtype} on {where}; expected real scores")
        if got.device != items.device:
            raise ValueError(f"scorer {self.name!r} returned scores on {got.device} on {where}; expected them on "
                             f"{items.device}, the items' device")
        got = got.detach().to(torch.float64)
        if self.check_finite and got.is_floating_point() and not bool(torch.isfinite(got).all()):
            bad = int((~torch.isfinite(got)).sum())
            raise ValueError(f"scorer {self.name!r} returned {bad} non-finite score(s) (NaN or inf) on {where}")
        return got


def check_users(users: Any, b: int, device: torch.device) -> torch.Tensor:
    """``users`` as (B,) int64 user ids on ``device`` (a ValueError naming ``users`` otherwise)."""
    user_ids = real_tensor(users, "users").to(device)
    if user_ids.is_floating_point() or user_ids.dtype == torch.bool or user_ids.shape != (b,):
        raise ValueError(f"users: expected ({b},) integer user ids, got shape {tuple(user_ids.shape)} and dtype "
                         f"{user_ids.dtype}")
    return user_ids.to(torch.int64)


def score_drawn(calls: ScorerCalls, users: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, slots: torch.Tensor,
                pos_scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of the positives (B, P) and their drawn items (B, P, m), float64, for the ``slots`` (B, P) bool only
    (0 elsewhere), through ``calls``: each positive with its drawn items in one list ``[positive, drawn...]``, or,
    with ``pos_scores`` given (an adaptive stage: the positives are scored already), its drawn items alone.
    ``users`` (B,): the ids handed to the scorer."""
    b, p, m = neg.shape
    rows, cols = slots.nonzero(as_tuple=True)
    neg_s = torch.zeros((b, p, m), dtype=torch.float64, device=neg.device)
    if pos_scores is None:
        got = calls.score(users[rows], torch.cat([pos[rows, cols].unsqueeze(1), neg[rows, cols]], 1))
        pos_s = torch.zeros((b, p), dtype=torch.float64, device=neg.device)
        pos_s[rows, cols] = got[:, 0]
        neg_s[rows, cols] = got[:, 1:]
    else:
        pos_s = pos_scores.to(torch.float64)
        neg_s[rows, cols] = calls.score(users[rows], neg[rows, cols])
    return pos_s, neg_s


def full_ranking_pairs(n_items: int, exc: torch.Tensor | Exclusions | None, rows: torch.Tensor) -> int:
    """The (user, item) pairs full ranking would score for the ``rows`` (B,) bool: each such row's n items minus
    its excluded items (padded (B, E) indices, -1 padding, or an :class:`~reco_sampled_plugin.exclusions.Exclusions`):
    ``ScoringCost.full_pairs``."""
    n_exc = exclusion_counts(exc, rows.shape[0], rows.device)
    return int(((n_items - n_exc) * rows).sum())


def _positives_device(positives: Any) -> torch.device:
    return positives.device if isinstance(positives, torch.Tensor) else torch.device("cpu")


def sampled_ranks_from_scorer(
    scorer: Scorer,
    positives: TensorLike,
    n_items: int,
    design: int | SamplingDesign,
    *,
    exclude: TensorLike | Exclusions | None = None,
    users: TensorLike | None = None,
    generator: torch.Generator | None = None,
    max_pairs: int = DEFAULT_MAX_PAIRS,
    ties: str = "pessimistic",
    check_finite: bool = True,
) -> SampledRanks:
    """Sampled ranks of held-out items, scoring only the positives and the items drawn for them.

    Args:
        scorer: ``scorer(users, items) -> scores`` (module docstring): users (B',) int64, items (B', L) int64 on
            the positives' device; (B', L) real scores back on that device. Pointwise.
        positives: (B, n) bool mask, (B, P) int64 padded with -1, or (B,): the held-out items of B rows.
        n_items: n, the catalogue size (items 0..n - 1).
        design: m (int: uniform with replacement) or a :class:`~reco_sampled_plugin.design.SamplingDesign`:
            uniform with or without replacement, popularity weights, or adaptive (``adaptive_max``): positives
            still ranked first draw the next stage's new items, stage after stage, up to the cap; only their new
            items are scored. With ``exact_at_cap`` the rows of positives still first at the cap then score
            their whole candidate list once (n - 1 pairs per row, one more stage in ``cost.stages``) and those
            positives get their exact ranks (``SampledRanks.exact_ranks``). With ``exact_share`` the rows of the
            share's chosen positives score their whole candidate list (in ``cost``) and those positives get their
            exact ranks (``SampledRanks.share_ranks``, ``inclusion``).
        exclude: items never drawn and never ranked (training items), same forms as ``positives``, or an
            :class:`~reco_sampled_plugin.exclusions.Exclusions` prepared once for these rows
            (:func:`~reco_sampled_plugin.exclusions.prepare_exclusions`: repeated evaluations reuse it).
        users: (B,) int64 user ids handed to the scorer (default ``arange(B)``: row numbers).
        generator: ``torch.Generator`` of the draws (the same generator gives the same draws as
            :func:`~reco_sampled_plugin.ranking.sampled_ranks` on the score matrix).
        max_pairs: at most this many (user, item) pairs per scorer call.
        ties: tie policy as in :func:`~reco_sampled_plugin.ranking.exact_ranks`.
        check_finite: refuse NaN / inf scores (a ValueError naming the scorer and the call).

    Returns:
        :class:`~reco_sampled_plugin.ranking.SampledRanks` as :func:`~reco_sampled_plugin.ranking.sampled_ranks`
        (fixed m: ranks, n_candidates, negatives, design) or
        :func:`~reco_sampled_plugin.adaptive.adaptive_sampled_ranks` (adaptive: final m per positive) return it,
        with ``cost`` a :class:`ScoringCost`.

    Raises:
        ValueError: bad input (as ``sampled_ranks``), ``max_pairs`` < 1, or a scorer that raises or returns the
            wrong type, shape, dtype or device, or non-finite scores (named, with the call's rows).
    """
    t_start = time.perf_counter()
    check_scorer(scorer)  # before any other argument
    design = as_design(check_required(design, "design", "an int m or a SamplingDesign"))
    ties = check_ties(ties)
    check_finite = check_bool(check_finite, "check_finite")
    max_pairs = check_int(max_pairs, "max_pairs", minimum=1)
    check_generator(generator)
    n = check_size(n_items, "n_items", 1)
    device = _positives_device(positives)
    given = positives if isinstance(positives, torch.Tensor) else real_tensor(positives, "positives", booleans=True)
    b = given.shape[0] if given.dim() else 1
    pos, exc, later = prepare_sampling_index(positives, exclude, b, n, device)  # exclusions sorted once, for all
    user_ids = torch.arange(b, device=device) if users is None else check_users(users, b, device)
    calls = ScorerCalls(scorer, max_pairs, check_finite, device)
    adaptive = design.adaptive_max is not None
    m = design.n_samples
    p = pos.shape[1]
    check_elements(b * p * m, "design", "the draw of B x P x m negatives")
    popularity = None if design.popularity is None else check_popularity(design.popularity, n, device)
    valid = pos >= 0
    neg = draw_negatives(pos, exc, n, m, design.replacement, popularity, generator, device, later)
    pos_scores, neg_scores = score_drawn(calls, user_ids, pos, neg, valid)  # stage 0: [positive, drawn...]
    ranks, beat = rank_among_drawn(pos_scores, neg_scores, pos, neg, ties, generator, beating=True)
    stats = None if adaptive else popularity_draw_stats(design, beat, neg, pos, exc, n)  # popularity: 1/q~ sums
    n_cand = padded_candidate_counts(n, pos, exc, count_other_positives=False)
    stages = 1
    sizes = exact = None
    if adaptive:
        given_as = positives if isinstance(positives, torch.Tensor) else torch.as_tensor(positives)
        from_mask = given_as.dtype == torch.bool
        ranks, sizes, stages = adaptive_stages(calls, pos, exc, user_ids, pos_scores, ranks, design, n, ties, generator,
                                               from_mask=from_mask)
        neg_out = None
        if design.exact_at_cap:
            need = completion_targets(ranks, sizes, design)
            exact = complete_from_scorer(calls, need, pos, exc, user_ids, pos_scores, n, ties, generator)
            stages += int(bool(need.any()))
    else:
        neg_out = torch.where(valid.unsqueeze(2), neg, torch.full_like(neg, -1))
    shared = SampledRanks(ranks, n_cand, None, design, sizes, None, stats)
    if design.exact_share is not None:  # the chosen positives' rows scored whole: their pairs in the cost
        shared = _share(shared, calls, user_ids, pos, exc, pos_scores, n, ties, generator)
        stages += int(bool((shared.share_ranks > 0).any()))  # type: ignore[operator, union-attr]  # set by _share
    full = full_ranking_pairs(n, exc, valid.any(1))
    total = time.perf_counter() - t_start
    cost = ScoringCost(calls.pairs, calls.calls, calls.seconds, max(total - calls.seconds, 0.0), full, stages)
    logger.debug("sampled_ranks_from_scorer: %d (user, item) pairs scored in %d call(s), %d stage(s) (%.2f%% of full "
                 "ranking's %d); %.3f s in the scorer, %.3f s drawing and ranking", cost.pairs, cost.calls, cost.stages,
                 100 * cost.share_of_full, cost.full_pairs, cost.scorer_seconds, cost.loop_seconds)
    return SampledRanks(ranks, n_cand, neg_out, design, sizes, cost, stats, exact_ranks=exact,
                        share_ranks=shared.share_ranks, inclusion=shared.inclusion)


def _share(sampled: SampledRanks, calls: ScorerCalls, user_ids: torch.Tensor, pos: torch.Tensor,
           exc: torch.Tensor | Exclusions | None, pos_scores: torch.Tensor, n: int, ties: str,
           generator: torch.Generator | None) -> SampledRanks:
    """``sampled`` with its design's exact share (``_design_based.draw_share``, rows keyed by user id): the chosen
    positives' rows score their whole candidate list through ``calls`` (:func:`complete_from_scorer`)."""
    from ._design_based import draw_share

    return draw_share(sampled, user_ids, pos, lambda chosen: complete_from_scorer(
        calls, chosen, pos, exc, user_ids, pos_scores, n, ties, generator))


def complete_from_scorer(calls: ScorerCalls, need: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | Exclusions | None,
                         user_ids: torch.Tensor, pos_scores: torch.Tensor, n: int, ties: str,
                         generator: torch.Generator | None) -> torch.Tensor:
    """Exact ranks of the ``need`` (B, P) positives (0 elsewhere), scoring through ``calls`` the whole candidate
    list of each row holding one: its irrelevant items (catalogue minus the row's positives minus its
    exclusions), once per row whatever its number of such positives, in calls of at most ``max_pairs`` pairs.
    The rows are ranked as :func:`~reco_sampled_plugin.ranking.complete_at_cap` ranks the score matrix's (same
    blocks, same tie order): a row's scores are its scored candidates and its positives' ``pos_scores`` (B, P)
    (scored in the first stage); excluded entries are never read. Within a block, rows are padded to its longest
    candidate list with their own last candidate (scored again: counted in ``calls.pairs``). ``exc``: padded, or
    prepared :class:`~reco_sampled_plugin.exclusions.Exclusions` (read in padded form here: the completion
    synchronises with the host anyway, for its blocks)."""
    if isinstance(exc, Exclusions):
        exc = exc.padded()

    def row_scores(idx: torch.Tensor) -> torch.Tensor:
        sub_pos = pos[idx]
        forb = forbidden_sorted(sub_pos, None if exc is None else exc[idx], n)
        n_allowed = n - (forb < n).sum(1)
        width = int(n_allowed.max())
        at = torch.minimum(torch.arange(width, device=idx.device).unsqueeze(0), (n_allowed - 1).unsqueeze(1))
        items = allowed_position_to_item(at, forb, n)
        got = calls.score(user_ids[idx], items)
        k = idx.numel()
        row = torch.zeros((k, n + 1), dtype=torch.float64, device=idx.device)  # column n: the padded slots' sink
        row.scatter_(1, items, got)
        valid = sub_pos >= 0
        row.scatter_(1, torch.where(valid, sub_pos, torch.full_like(sub_pos, n)), pos_scores[idx].to(torch.float64))
        return row[:, :n]

    return complete_at_cap(need, pos, exc, n, ties, generator, row_scores)


def adaptive_stages(calls: ScorerCalls, pos: torch.Tensor, exc: torch.Tensor | Exclusions | None,
                    user_ids: torch.Tensor, pos_scores: torch.Tensor, ranks: torch.Tensor, design: SamplingDesign,
                    n: int, ties: str, generator: torch.Generator | None, *,
                    from_mask: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The adaptive stages of :func:`~reco_sampled_plugin.adaptive.adaptive_sampled_ranks` after the first, scoring
    only the positives still going on (r~ <= the design's ``adaptive_top``): the rows that need a stage taken from
    the prepared positives and exclusions (``Exclusions.select``: nothing re-validated or re-sorted), shaped as the
    score-matrix path shapes them (so the draws' shapes and random numbers are the same). Also the later stages of a
    first stage drawn elsewhere (RecBole's ``uniN``: ``adapters._recbole_stages``).

    Args: ``calls`` the scorer's :class:`ScorerCalls`; ``pos`` / ``exc`` the validated padded (B, P) positives and
    exclusions (an :class:`~reco_sampled_plugin.exclusions.Exclusions` or padded (B, E) indices:
    :func:`~reco_sampled_plugin.ranking.prepare_sampling_index`), on the device the stages draw on; ``user_ids``
    (B,) handed to the scorer; ``pos_scores`` (B, P) float64 and ``ranks`` (B, P) int64 of the first stage (0 in
    padded slots); ``design`` adaptive; ``n`` the catalogue size; ``ties`` a core tie policy; ``from_mask``: the
    caller gave the positives as a (B, n) bool mask (a stage then trims its rows to their longest, as the mask's
    own preparation would).

    Returns: (ranks (B, P), final m per positive (B, P) int64, stages run including the first).
    """
    m0, cap = design.n_samples, design.cap
    valid = ranks > 0
    sizes = torch.where(valid, torch.full_like(ranks, m0, dtype=torch.int64), torch.zeros_like(ranks, dtype=torch.int64))
    device = pos.device
    exc = as_exclusions(exc, n, pos.shape[0])
    m_cur, stages = m0, 1
    while m_cur * 2 <= cap:
        need = continues(ranks, design) & (sizes == m_cur)
        idx = need.any(1).nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        stages += 1
        sub_pos = stage_positives(pos, idx, from_mask)
        sub_exc = None if exc is None else exc.select(idx)
        p_sub = sub_pos.shape[1]
        check_elements(idx.numel() * p_sub * m_cur, "design", "an adaptive stage's draw")
        neg = draw_negatives(sub_pos, sub_exc, n, m_cur, True, None, generator, device)
        sub_pos_scores, neg_scores = score_drawn(calls, user_ids[idx], sub_pos, neg, need[idx][:, :p_sub],
                                                 pos_scores[idx][:, :p_sub])  # only the positives going on
        more = rank_among_drawn(sub_pos_scores, neg_scores, sub_pos, neg, ties, generator)
        if p_sub < ranks.shape[1]:
            more = torch.nn.functional.pad(more, (0, ranks.shape[1] - p_sub))
        full_need = need[idx]
        ranks[idx] = torch.where(full_need, added_ranks(ranks[idx], more), ranks[idx])
        sizes[idx] = torch.where(full_need, torch.full_like(sizes[idx], 2 * m_cur), sizes[idx])
        m_cur *= 2
    return ranks, sizes, stages
