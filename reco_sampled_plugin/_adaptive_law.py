"""The law and the cost of adaptive sampling (``adaptive.py`` draws it): what the estimators, the identification and
the planner read, below the draws (numpy and scipy only).

Likelihood (with replacement, p = (R - 1)/(n - 1)): a positive that stops at stage s with j = r~ - 1 beats has
probability (1 - p)^(M_s / 2) Binomial(j; M_s / 2, p) (s >= 1), which is C(M_s / 2, j) / C(M_s, j) times
Binomial(j; M_s, p): a factor that does not depend on R. So ``mle`` and ``mes`` take the final (n, M, r~) as if
M had been fixed (``rank_distribution``); estimators built from fixed-m tables (the corrections, the mappings) do
not apply and are refused.

Identification (``identification.py``): the band uses the nested events E(s, i) = {M_final > M_s} or
{M_final = M_s and r~ <= i}, whose probability given R is (1 - p)^(M_{s-1}) Bdtr(i - 1; M_s - M_{s-1}, p)
(:func:`stage_event_cdf`, M_{-1} = 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import special

from .design import AdaptiveDesign, SamplingDesign

if TYPE_CHECKING:
    from ._rank_hist import RankHistogram

__all__ = ["AdaptiveCost", "adaptive_cost", "check_adaptive_histogram", "stage_event_cdf", "expected_samples"]


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
