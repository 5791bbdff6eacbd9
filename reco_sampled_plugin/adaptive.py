"""Adaptive sampling (Li et al., AAAI 2023): its draws.

A positive is first ranked against m = ``n_samples`` sampled irrelevant items. While it ranks first (r~ = 1) and
2m does not exceed ``adaptive_max``, it draws m more items (so its sample size doubles) and its rank becomes
1 + #{new items scoring higher} (no earlier item beat it). The stages are M_s = m 2^s, s = 0..S, with
M_S = the largest m 2^s <= ``adaptive_max`` (the *cap*).

Likelihood (with replacement, p = (R - 1)/(n - 1)): a positive that stops at stage s with j = r~ - 1 beats has
probability (1 - p)^(M_s / 2) Binomial(j; M_s / 2, p) (s >= 1), which is C(M_s / 2, j) / C(M_s, j) times
Binomial(j; M_s, p): a factor that does not depend on R. So ``mle`` and ``mes`` take the final (n, M, r~) as if
M had been fixed (``rank_distribution``); estimators built from fixed-m tables (the corrections, the mappings) do
not apply and are refused.

Exact completion (``SamplingDesign(..., exact_at_cap=True)``): the positives still ranked first at the cap are
then ranked exactly among their whole candidate list (``ranking.complete_at_cap``; ``SampledRanks.exact_ranks``),
drawing nothing: the draws are those without it. Their likelihood is (1 - p)^cap times the point mass at the
exact R, a constant times the point mass (``rank_distribution``), so the top is resolved and ``cap_reached``
cannot occur.

The stopping law and the cost (what the estimators, the identification and the planner read):
``_adaptive_law.py``, below the draws.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._checks import check_generator, check_rank_values, check_required, check_sizes
from ._inputs import finite_check, run_checks, score_tensor
from ._options import check_bool
from .design import AdaptiveDesign, SamplingDesign, as_design
from . import registry
from .ranking import (SampledRanks, check_ties, complete_at_cap, prepare_index, prepare_sampling_index, sampled_ranks,
                      share_from_matrix, stage_positives)
from .simulate import simulate_sampled_ranks

if TYPE_CHECKING:
    from .exclusions import Exclusions
    from ._types import TensorLike

__all__ = [
    "adaptive_sampled_ranks",
    "adaptive_sampled_ranks_from_exact",
]

# a live view of the registry (an estimator registered later appears): the estimators whose likelihood takes
# adaptive sample sizes as given (module docstring); ``none`` reports the uncorrected sampled metric
__getattr__ = registry.module_views(__name__, ADAPTIVE_METHODS={"adaptive": True})


# ----------------------------------------------------------------------------------------- completion
def completion_targets(ranks: torch.Tensor, sizes: torch.Tensor, design: SamplingDesign | AdaptiveDesign) -> torch.Tensor:
    """(B, P) bool: the positives an ``exact_at_cap`` design completes: still within the top (0 < r~ <= t, t the
    design's ``adaptive_top``) at the cap (``design.cap``; an :class:`~reco_sampled_plugin.design.AdaptiveDesign`
    reads them too)."""
    return continues(ranks, design) & (sizes == design.cap)


def continues(ranks: torch.Tensor, design: SamplingDesign | AdaptiveDesign) -> torch.Tensor:
    """(B, P) bool: the positives whose sampled rank keeps them drawing (0 < r~ <= t; padded slots hold 0)."""
    top = design.top if isinstance(design, AdaptiveDesign) else design.adaptive_top
    return ranks == 1 if top == 1 else (ranks > 0) & (ranks <= top)


def added_ranks(ranks: torch.Tensor, more: torch.Tensor) -> torch.Tensor:
    """A stage's rank among all its draws: r~ + (r~' - 1), r~' the positive's rank among the stage's new draws
    alone (the beats add; ``ties="random"`` then places it among each draw's ties separately)."""
    return ranks + (more.to(ranks.dtype) - 1)


def completed_from_exact(exact_ranks: torch.Tensor, ranks: torch.Tensor, sizes: torch.Tensor,
                         design: SamplingDesign) -> torch.Tensor:
    """``SampledRanks.exact_ranks`` of an ``exact_at_cap`` draw whose exact ranks are at hand (simulated from
    them, or ranked beside the draws as ``evaluate_factors`` does): ``exact_ranks`` at the :func:`completion_targets`,
    0 elsewhere (shaped and typed like ``exact_ranks``)."""
    return torch.where(completion_targets(ranks, sizes, design), exact_ranks, torch.zeros_like(exact_ranks))


def _adaptive(n_samples: Any) -> SamplingDesign:
    """The adaptive design of the draws' ``n_samples`` (a ValueError naming it for anything else: an int m is the
    fixed design ``SamplingDesign(m)``, as :func:`~reco_sampled_plugin.ranking.sampled_ranks` reads it)."""
    design = as_design(check_required(n_samples, "n_samples", "an adaptive SamplingDesign(m, adaptive_max=cap)"))
    if design.adaptive_max is None:
        raise ValueError(f"n_samples: {design!r} is not adaptive; adaptive sampling takes SamplingDesign(m, "
                         "adaptive_max=cap) (a fixed m draws with sampled_ranks)")
    return design


def adaptive_sampled_ranks_from_exact(
    exact_ranks: TensorLike, n_items: TensorLike, n_samples: SamplingDesign, generator: torch.Generator | None = None
) -> SampledRanks:
    """Adaptive sampling simulated from exact ranks (with replacement): positives with r~ <= t (the design's
    ``adaptive_top``, default 1) draw as many new samples again (m doubles) until r~ > t or m reaches the cap.

    ``n_samples``: an adaptive :class:`~reco_sampled_plugin.design.SamplingDesign` ``SamplingDesign(m,
    adaptive_max=cap)``: first stage m, stages m 2^s up to ``cap`` (rounded down to m 2^s).

    Returns:
        :class:`~reco_sampled_plugin.ranking.SampledRanks` with per-positive n and final m (int64 tensors shaped
        like ``exact_ranks``) and the design: ``.ranks`` (sampled ranks among the final m), ``.n_samples`` (final m).
    """
    design = _adaptive(n_samples)
    m0, cap = design.n_samples, design.cap
    check_generator(generator)
    r = check_rank_values(exact_ranks, "exact_ranks", whole=True)
    n = check_sizes(n_items, "n_items", 2, like=r, like_name="exact_ranks", exact=True, device=r.device)
    n = torch.as_tensor(n, dtype=torch.float64, device=r.device).expand(r.shape)
    ranks = simulate_sampled_ranks(r, n, m0, "binomial", generator)
    m = torch.full_like(ranks, m0)
    m_cur = m0
    while m_cur * 2 <= cap:  # at most log2(cap / m0) stages, each vectorised over positives
        need = continues(ranks, design) & (m == m_cur)
        if not bool(need.any()):
            break
        extra = simulate_sampled_ranks(r[need], n[need], m_cur, "binomial", generator)
        ranks[need] = added_ranks(ranks[need], extra)  # its rank among 2m: the beats of both draws
        m[need] = 2 * m_cur
        m_cur *= 2
    exact = None
    if design.exact_at_cap:  # the given exact ranks of the positives still first at the cap
        exact = completed_from_exact(r.to(torch.int64), ranks, m, design)
    return SampledRanks(ranks, n.to(torch.int64), None, design, m, None, exact_ranks=exact)


def adaptive_sampled_ranks(
    scores: torch.Tensor,
    positives: TensorLike,
    n_samples: SamplingDesign,
    exclude: TensorLike | Exclusions | None = None,
    generator: torch.Generator | None = None,
    ties: str = "pessimistic",
    *,
    check_finite: bool = True,
) -> SampledRanks:
    """Adaptive sampled ranks from scores (Li et al., AAAI 2023), uniform sampling with replacement.

    ``n_samples`` is an adaptive :class:`~reco_sampled_plugin.design.SamplingDesign`, ``SamplingDesign(m,
    adaptive_max=cap)``. Each positive is first ranked against m drawn items; while its sampled rank is at most t
    (``adaptive_top``, default 1: while first) and 2m does not exceed ``cap``, it draws m more items (so m doubles)
    and its rank becomes r~ + #{new items scoring higher}.
    Stages redraw only for rows that still need it (at most log2(cap / m) stages). With ``exact_at_cap`` the
    positives still first at the cap get their exact rank from the row (:func:`~reco_sampled_plugin.ranking.complete_at_cap`,
    ``SampledRanks.exact_ranks``; no further draw). ``exclude``, ``generator``, ``ties``, ``check_finite`` as in
    :func:`~reco_sampled_plugin.ranking.sampled_ranks`.

    Returns:
        :class:`~reco_sampled_plugin.ranking.SampledRanks` (ranks, n_candidates per row, the design, and the
        final m per positive): ``.ranks``, (B, P) sampled ranks among each positive's final sample (0 in padded
        slots; float64 for ``ties="average"``), and ``.n_samples``, the final m per positive (int64, 0 in padded
        slots).
    """
    design = _adaptive(n_samples)
    m0, cap = design.n_samples, design.cap
    check_generator(generator)
    check_ties(ties)
    check_finite = check_bool(check_finite, "check_finite")
    scores = score_tensor(scores)  # the one conversion of scores: arrays and lists as sampled_ranks takes them
    b, n = scores.shape
    # positives and exclusions validated and prepared once (the exclusions sorted once), reused by every stage
    pos, exc, later = prepare_sampling_index(positives, exclude, b, n, scores.device,
                                             [finite_check(scores)] if check_finite else [])
    run_checks(later)
    first = sampled_ranks(scores, pos, m0, exclude=exc, generator=generator, ties=ties, check_finite=False)
    ranks = first.ranks.clone()
    valid = ranks > 0
    sizes = torch.where(valid, torch.full_like(ranks, m0, dtype=torch.int64), torch.zeros_like(ranks, dtype=torch.int64))
    from_mask = (positives if isinstance(positives, torch.Tensor) else torch.as_tensor(positives)).dtype == torch.bool
    m_cur = m0
    while m_cur * 2 <= cap:  # stages, not a loop over positives
        need = continues(ranks, design) & (sizes == m_cur)
        idx = need.any(1).nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        more = sampled_ranks(
            scores[idx], stage_positives(pos, idx, from_mask), m_cur, exclude=None if exc is None else exc.select(idx),
            generator=generator, ties=ties, check_finite=False,
        ).ranks
        if more.shape[1] < ranks.shape[1]:  # a mask's stage rows trimmed to their longest: the rest is padding
            more = torch.nn.functional.pad(more, (0, ranks.shape[1] - more.shape[1]))
        sub_need = need[idx]
        ranks[idx] = torch.where(sub_need, added_ranks(ranks[idx], more), ranks[idx])
        sizes[idx] = torch.where(sub_need, torch.full_like(sizes[idx], 2 * m_cur), sizes[idx])
        m_cur *= 2
    exact = None
    if design.exact_at_cap:  # read from the rows: draws nothing
        pos, exc_padded = prepare_index(positives, exclude, scores.shape[0], scores.shape[1], scores.device)
        exact = complete_at_cap(completion_targets(ranks, sizes, design), pos, exc_padded, scores.shape[1], ties, generator,
                                lambda idx: scores[idx])
    out = SampledRanks(ranks, first.n_candidates, None, design, sizes, None, exact_ranks=exact)
    if design.exact_share is None:
        return out
    return share_from_matrix(out, scores, pos, exc, ties, generator)  # the exact share, ranked from the matrix
