"""The law and the cost of adaptive sampling (``adaptive.py`` draws it): what the estimators, the identification and
the planner read, below the draws (numpy and scipy only).

Likelihood (with replacement, p = (R - 1)/(n - 1), t = the design's ``top``): the draws are nested and a positive
draws stage s + 1 while its count of beats A_s among the first M_s draws is at most t - 1. Given j = r~ - 1 beats
among the final M draws their positions are exchangeable whatever p is, so P(stop at M with r~) = Binomial(j; M, p)
times a factor free of R (t = 1: (1 - p)^(M_s / 2) Binomial(j; M_s / 2, p) = C(M_s / 2, j) / C(M_s, j)
Binomial(j; M_s, p)). So ``mle``, ``mes`` and ``gmod`` take the final (n, M, r~) as if M had been fixed
(``rank_distribution``); estimators built from fixed-m tables (the corrections, the mappings) do not apply and are
refused.

Identification (``identification.py``): the band uses the nested events E(s, i) = {M_final > M_s} or
{M_final = M_s and r~ <= i}. Below the cap E(s, i) = {A_{s-1} <= t - 1, A_s <= max(i, t) - 1} (a positive cannot
stop there with r~ <= t); at the cap {A_{S-1} <= t - 1, A_S <= i - 1}. Its probability given R is
sum_{a < t} Binomial(a; M_{s-1}, p) Bdtr(i' - 1 - a; M_s - M_{s-1}, p) (:func:`stage_event_cdf`, M_{-1} = 0; t = 1:
(1 - p)^(M_{s-1}) Bdtr(i - 1; M_s - M_{s-1}, p)).
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
    positive ranked within the top (r~ <= t, the design's ``top``) below the cap (it would have drawn more). Exact
    groups (completed at the cap) are not stages: they are left out."""
    occupied = (hist.totals > 0) & ~hist.exact
    stages = design.stages
    bad = occupied & ~np.isin(hist.n_samples, stages)
    if bad.any():
        raise ValueError(
            f"n_samples: size {int(hist.n_samples[bad][0])} is not a stage of adaptive sampling from m = "
            f"{design.n_samples} to adaptive_max = {design.adaptive_max} (sizes {stages.tolist()})"
        )
    early = occupied & (hist.n_samples < design.cap) & (hist.counts_within(design.top) > 0)
    if early.any():
        where = "first" if design.top == 1 else f"within the top {design.top} (adaptive_top)"
        raise ValueError(
            f"sampled_ranks: positives ranked {where} among m = {int(hist.n_samples[early][0])} samples stopped "
            f"below the cap {design.cap}; adaptive sampling draws more for them (was adaptive_max meant?)"
        )


def adaptive_cost(hist: RankHistogram, design: SamplingDesign | AdaptiveDesign) -> AdaptiveCost:
    """:class:`AdaptiveCost` of a histogram of adaptive ranks (groups keyed by (n, final M)); ``design`` an adaptive
    :class:`SamplingDesign` (or its stages, an :class:`AdaptiveDesign`). A ValueError names ``hist`` (not a
    RankHistogram, or empty: no cost to report) or ``design``, and one the histogram cannot come from
    (:func:`check_adaptive_histogram`: it names ``n_samples``) is refused as by ``estimate``."""
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
    check_adaptive_histogram(hist, design)  # sizes that are stages, no positive left first below the cap
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
    i = np.asarray(i, dtype=np.float64)
    t = design.top
    k = (i if stage == len(stages) - 1 else np.maximum(i, t)) - 1.0
    if t == 1 or before == 0:  # A_{s-1} = 0 for sure (stage 0) or needed (t = 1)
        with np.errstate(divide="ignore"):  # p = 1: log 0 = -inf, survival 0
            survive = np.exp(before * np.log1p(-p)) if before else np.ones_like(p)
        return survive * special.bdtr(np.minimum(k, new), new, p)  # scipy's bdtr is NaN above n
    out = np.zeros(np.broadcast_shapes(p.shape, k.shape))
    for a in range(t):  # t terms: P(A_{s-1} = a) P(new beats <= k - a)
        kk = np.minimum(k - a, new)  # scipy's bdtr is NaN above n (and below 0)
        tail = np.where(kk < 0, 0.0, special.bdtr(np.maximum(kk, 0.0), new, p))
        out += special.binom(before, a) * _pow(p, a) * _pow(1.0 - p, before - a) * tail
    return out


def _pow(x: np.ndarray, e: float) -> np.ndarray:
    """x^e with 0^0 = 1 (numpy's convention) and no warning at x = 0."""
    with np.errstate(divide="ignore"):
        return np.exp(e * np.log(x)) if e else np.ones_like(x)


def expected_samples(p: Any, design: AdaptiveDesign) -> tuple[np.ndarray, np.ndarray]:
    """(E[M_final | p], P(within the top at the cap | p)) of adaptive sampling, for p = (R - 1)/(n - 1) of any shape:
    stage s is drawn with probability P(A_{s-1} <= t - 1) = Bdtr(t - 1; M_{s-1}, p) (M_{-1} = 0; t = 1:
    (1 - p)^(M_{s-1})), so E[M] = sum_s (M_s - M_{s-1}) Bdtr(t - 1; M_{s-1}, p) draws; a positive is still within the
    top at the cap with probability Bdtr(t - 1; cap, p) (the share an ``exact_at_cap`` design ranks exactly, n - 1
    scored pairs each). Closed forms: no draw (the planner's cost order, Wald's identity in
    ``benchmarks/studies/gmod_oracle.py``)."""
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore"):  # p = 1: log 0 = -inf, survival 0
        log_q = np.log1p(-p)
    t = design.top

    def going_on(size: int) -> np.ndarray:
        return np.exp(size * log_q) if t == 1 else special.bdtr(t - 1, size, p)

    mean = np.zeros_like(log_q)
    before = 0
    for m_s in design.stages.tolist():
        mean += (m_s - before) * (going_on(before) if before else 1.0)
        before = m_s
    return mean, going_on(before)
