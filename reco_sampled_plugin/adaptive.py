"""Adaptive sampling (Li et al., AAAI 2023): its design, its draws, its law and what it cost.

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
then ranked exactly among their whole candidate list (:func:`complete_at_cap`; ``SampledRanks.exact_ranks``),
drawing nothing: the draws are those without it. Their likelihood is (1 - p)^cap times the point mass at the
exact R, a constant times the point mass (``rank_distribution``), so the top is resolved and ``cap_reached``
cannot occur.

Identification (``identification.py``): the band uses the nested events E(s, i) = {M_final > M_s} or
{M_final = M_s and r~ <= i}, whose probability given R is (1 - p)^(M_{s-1}) Bdtr(i - 1; M_s - M_{s-1}, p)
(:func:`stage_event_cdf`, M_{-1} = 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from scipy import special

from ._checks import check_generator, check_rank_values, check_required, check_sizes
from ._inputs import finite_check, run_checks, score_tensor
from ._options import check_bool
from .design import AdaptiveDesign, SamplingDesign, as_design
from . import registry
from .ranking import SampledRanks, check_ties, prepare_sampling_index, sampled_ranks, stage_positives
from .simulate import simulate_sampled_ranks

if TYPE_CHECKING:
    from .exclusions import Exclusions
    from ._rank_hist import RankHistogram
    from ._types import TensorLike

__all__ = [
    "AdaptiveCost",
    "adaptive_cost",
    "check_adaptive_histogram",
    "stage_event_cdf",
    "expected_samples",
    "adaptive_sampled_ranks",
    "adaptive_sampled_ranks_from_exact",
]

# a live view of the registry (an estimator registered later appears): the estimators whose likelihood takes
# adaptive sample sizes as given (module docstring); ``none`` reports the uncorrected sampled metric
__getattr__ = registry.module_views(__name__, ADAPTIVE_METHODS={"adaptive": True})


@dataclass(frozen=True)
class AdaptiveCost:
    """What adaptive sampling cost, per positive (weighted like the histogram).

    mean_samples, max_samples: sampled irrelevant items per positive (final M; the positive is scored too; a
    completed positive counts its cap). share_at_cap: share of positives that reached the cap;
    share_first_at_cap: of those still ranked first there with an unknown exact rank (resolved no finer than
    (n - 1)/(cap + 1) + 1); share_completed: ranked exactly there (``exact_at_cap``; in ``as_dict`` only when
    some were). start, cap: the design.
    """

    mean_samples: float
    max_samples: int
    share_at_cap: float
    share_first_at_cap: float
    start: int
    cap: int
    share_completed: float

    def as_dict(self) -> dict:
        keys = ("mean_samples", "max_samples", "share_at_cap", "share_first_at_cap", "start", "cap")
        return {k: getattr(self, k) for k in keys + (("share_completed",) if self.share_completed else ())}


def check_adaptive_histogram(hist: RankHistogram, design: AdaptiveDesign) -> None:
    """Raise ValueError where the histogram cannot come from ``design``: a sample size that is not a stage, or a
    positive ranked first below the cap (it would have drawn more). Exact groups (completed at the cap) are not
    stages: they are left out."""
    occupied = (hist.totals > 0) & ~hist.exact
    stages = design.stages
    bad = occupied & ~np.isin(hist.n_samples, stages)
    if bad.any():
        raise ValueError(
            f"n_samples: size {int(hist.n_samples[bad][0])} is not a stage of adaptive sampling from m = "
            f"{design.n_samples} to adaptive_max = {design.adaptive_max} (sizes {stages.tolist()})"
        )
    early = occupied & (hist.n_samples < design.cap) & (hist.top_counts > 0)
    if early.any():
        raise ValueError(
            f"sampled_ranks: positives ranked first among m = {int(hist.n_samples[early][0])} samples stopped "
            f"below the cap {design.cap}; adaptive sampling draws more for them (was adaptive_max meant?)"
        )


def adaptive_cost(hist: RankHistogram, design: SamplingDesign | AdaptiveDesign) -> AdaptiveCost:
    """:class:`AdaptiveCost` of a histogram of adaptive ranks (groups keyed by (n, final M)); ``design`` an adaptive
    :class:`SamplingDesign` (or its stages, an :class:`AdaptiveDesign`). A ValueError names ``hist`` (not a
    RankHistogram, or empty: no cost to report) or ``design``."""
    from ._rank_hist import RankHistogram

    if not isinstance(hist, RankHistogram):
        raise ValueError(f"hist: expected a RankHistogram (sampled_rank_histogram), got {type(hist).__name__}")
    adaptive = design if isinstance(design, AdaptiveDesign) else \
        design.adaptive if isinstance(design, SamplingDesign) else None
    if adaptive is None:
        raise ValueError(f"design: expected an adaptive design (start m and cap), got {design!r}")
    design = adaptive
    if hist.total <= 0:
        raise ValueError("hist: empty (no positive counted), so there is no cost to report")
    tot = hist.totals
    total = float(tot.sum())
    sizes = np.where(hist.exact, design.cap, hist.n_samples)  # a completed positive drew up to the cap
    at_cap = sizes >= design.cap
    return AdaptiveCost(
        mean_samples=float(tot @ sizes) / total,
        max_samples=int(sizes[tot > 0].max()),
        share_at_cap=float(tot[at_cap].sum()) / total,
        share_first_at_cap=float(hist.top_counts[at_cap & ~hist.exact].sum()) / total,
        start=design.n_samples,
        cap=design.cap,
        share_completed=float(tot[hist.exact].sum()) / total,
    )


def stage_event_cdf(p: np.ndarray, design: AdaptiveDesign, stage: int, i: np.ndarray) -> np.ndarray:
    """P(E(stage, i) | p) for p = (R - 1)/(n - 1) (...,) and cut points i (J,): (..., J) (module docstring)."""
    stages = design.stages
    before = 0 if stage == 0 else int(stages[stage - 1])
    new = int(stages[stage]) - before
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)[..., None]
    k = np.asarray(i, dtype=np.float64) - 1.0
    with np.errstate(divide="ignore"):  # p = 1: log 0 = -inf, survival 0
        survive = np.exp(before * np.log1p(-p)) if before else np.ones_like(p)
    return survive * special.bdtr(k, new, p)


def expected_samples(p: Any, design: AdaptiveDesign) -> tuple[np.ndarray, np.ndarray]:
    """(E[M_final | p], P(first at the cap | p)) of adaptive sampling, for p = (R - 1)/(n - 1) of any shape: stage s
    is drawn with probability (1 - p)^(M_{s-1}) (M_{-1} = 0), so E[M] = sum_s (M_s - M_{s-1}) (1 - p)^(M_{s-1}) draws;
    a positive is still ranked first at the cap with probability (1 - p)^cap (the share an ``exact_at_cap`` design
    ranks exactly, n - 1 scored pairs each). Closed forms: no draw (the planner's cost order, Wald's identity in
    ``benchmarks/studies/gmod_oracle.py``)."""
    with np.errstate(divide="ignore"):  # p = 1: log 0 = -inf, survival 0
        log_q = np.log1p(-np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0))
    mean = np.zeros_like(log_q)
    before = 0
    for m_s in design.stages.tolist():
        mean += (m_s - before) * (np.exp(before * log_q) if before else 1.0)
        before = m_s
    return mean, np.exp(before * log_q)


# ----------------------------------------------------------------------------------------- completion
#: elements of one block of full score rows built to rank completed positives exactly (rows x n)
COMPLETION_BLOCK = 1 << 22


def completion_targets(ranks: torch.Tensor, sizes: torch.Tensor, design: SamplingDesign) -> torch.Tensor:
    """(B, P) bool: the positives an ``exact_at_cap`` design completes: still ranked first (r~ = 1) at the cap."""
    return (ranks == 1) & (sizes == design.cap)


def _fork(generator: torch.Generator | None) -> torch.Generator | None:
    """A copy of ``generator`` (same state): the completion's random tie order draws nothing from the caller's."""
    if generator is None:
        return None
    fork = torch.Generator(device=generator.device)
    fork.set_state(generator.get_state())
    return fork


def complete_at_cap(need: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, ties: str,
                    generator: torch.Generator | None, row_scores: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Exact ranks of the ``need`` (B, P) positives among their rows' irrelevant candidates (catalogue minus the
    row's positives minus its exclusions) and themselves, 0 elsewhere: (B, P) int64 (float64 for ``ties="average"``).

    The rows holding such a positive are ranked in blocks of ``COMPLETION_BLOCK // n`` rows:
    ``row_scores(rows)`` ((k,) int64 row indices) returns their (k, n) scores (the score matrix's rows, or the
    scorer loop's rows built from the scored candidates: only the candidates' and the positives' entries are
    read), then :func:`~reco_sampled_plugin.ranking.exact_ranks_padded` with ``count_other_positives=False``.
    ``ties="random"`` orders ties by a copy of ``generator`` (one seed per row and block, as the matrix path and
    the scorer path both draw them), so the caller's generator is not advanced. ``pos`` / ``exc``: padded (B, P) /
    (B, E) indices (-1 padding).
    """
    from .ranking import exact_ranks_padded

    dtype = torch.float64 if ties == "average" else torch.int64
    out = torch.zeros(need.shape, dtype=dtype, device=need.device)
    rows = need.any(1).nonzero().squeeze(1)
    if rows.numel() == 0:
        return out
    gen = _fork(generator)
    block = max(1, COMPLETION_BLOCK // max(n_items, 1))
    for start in range(0, rows.numel(), block):  # blocks of rows bound the (k, n) buffer
        idx = rows[start:start + block]
        scores = row_scores(idx)
        r = exact_ranks_padded(scores, pos[idx], None if exc is None else exc[idx], ties, False, gen)
        out[idx] = torch.where(need[idx], r.to(dtype), out[idx])
    return out


# ------------------------------------------------------------------------------------------------ draws
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
    """Adaptive sampling simulated from exact ranks (with replacement): positives with r~ = 1 draw as many new
    samples again (m doubles) until r~ > 1 or m reaches the cap.

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
        need = (ranks == 1) & (m == m_cur)
        if not bool(need.any()):
            break
        extra = simulate_sampled_ranks(r[need], n[need], m_cur, "binomial", generator)
        ranks[need] = extra  # no earlier sample beat it, so its rank among 2m is 1 + (beats among the new m)
        m[need] = 2 * m_cur
        m_cur *= 2
    exact = None
    if design.exact_at_cap:  # the given exact ranks of the positives still first at the cap
        exact = torch.where(completion_targets(ranks, m, design), r.to(torch.int64), torch.zeros_like(ranks))
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
    adaptive_max=cap)``. Each positive is first ranked against m drawn items; while it ranks first and 2m does not
    exceed ``cap``, it draws m more items (so m doubles) and its rank becomes 1 + #{new items scoring higher}.
    Stages redraw only for rows that still need it (at most log2(cap / m) stages). With ``exact_at_cap`` the
    positives still first at the cap get their exact rank from the row (:func:`complete_at_cap`,
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
        need = (ranks == 1) & (sizes == m_cur)
        idx = need.any(1).nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        more = sampled_ranks(
            scores[idx], stage_positives(pos, idx, from_mask), m_cur, exclude=None if exc is None else exc.select(idx),
            generator=generator, ties=ties, check_finite=False,
        ).ranks
        sub_need = need[idx]
        ranks[idx] = torch.where(sub_need, more.to(ranks.dtype), ranks[idx])
        sizes[idx] = torch.where(sub_need, torch.full_like(sizes[idx], 2 * m_cur), sizes[idx])
        m_cur *= 2
    exact = None
    if design.exact_at_cap:  # read from the rows: draws nothing
        from .ranking import prepare_index

        pos, exc_padded = prepare_index(positives, exclude, scores.shape[0], scores.shape[1], scores.device)
        exact = complete_at_cap(completion_targets(ranks, sizes, design), pos, exc_padded, scores.shape[1], ties, generator,
                                lambda idx: scores[idx])
    out = SampledRanks(ranks, first.n_candidates, None, design, sizes, None, exact_ranks=exact)
    if design.exact_share is None:
        return out
    from ._design_based import share_from_matrix  # the exact share: the chosen positives ranked from the matrix

    return share_from_matrix(out, scores, pos, exc, ties, generator)
