"""An exact share's data and its keyed choice (``design.ExactShare``), below the draws and the fits.

What the sampled ranks carry (``SampledRanks.share_ranks``, ``SampledRanks.inclusion``; :func:`with_share_arrays`
for arrays drawn elsewhere), what travels with the histogram (:class:`ShareRows`, ``RankHistogram.share``) and the
choice itself given the inclusion probabilities (:func:`choose_share`: positive i is chosen iff its keyed uniform
u_i < pi_i, Poisson sampling). The probabilities come from above: ``_design_based.share_inclusion`` (the share for a
uniform share; from the model's fit of the sampled ranks for an active one: phase 2 of the two-phase design, which
needs phase 1's draw), and the draws (``ranking``, ``adaptive``, ``scorer_ranks``) call it through
``_design_based.draw_share``. The estimator of the share is ``_design_based.py``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from ._checks import MIN_INCLUSION, check_rank_values, check_weights
from ._hash import keyed_uniform

if TYPE_CHECKING:
    from ._sampled import SampledRanks
    from ._types import TensorLike

__all__ = ["ShareRows", "carries_share", "check_inclusion", "with_share_arrays", "choose_share", "keyed_choice"]


@dataclasses.dataclass(frozen=True, eq=False)
class ShareRows:
    """An exact share as rows, one per chosen positive (``RankHistogram.share``): ``n``, ``m`` (int64), ``sampled``
    (r~), ``exact`` (R), ``inclusion`` (pi), ``weight`` (float64); ``census``: every positive of the sample had
    pi = 1. Joined across batches and processes by :meth:`concat`, as the histogram's counts are added."""

    n: np.ndarray
    m: np.ndarray
    sampled: np.ndarray
    exact: np.ndarray
    inclusion: np.ndarray
    weight: np.ndarray
    census: bool = False

    @classmethod
    def of(cls, sampled: SampledRanks, weights: TensorLike | None = None) -> "ShareRows":
        """The rows of ``sampled``'s share (``share_ranks > 0``), weighted by ``weights`` (as ``estimate``)."""
        assert sampled.share_ranks is not None and sampled.inclusion is not None
        valid = sampled.ranks > 0
        chosen = sampled.share_ranks > 0
        m = sampled.sizes()
        m_t = m[chosen] if isinstance(m, torch.Tensor) else torch.full((int(chosen.sum()),), int(m))
        w = share_weights(sampled, weights)
        w_c = np.ones(int(chosen.sum())) if w is None else w[_host(chosen[valid])]
        f64 = np.float64
        return cls(_host(sampled.candidates()[chosen]).astype(np.int64), _host(m_t).astype(np.int64),
                   _host(sampled.ranks[chosen]).astype(f64), _host(sampled.share_ranks[chosen]).astype(f64),
                   _host(sampled.inclusion[chosen]).astype(f64), w_c.astype(f64),
                   census=bool((sampled.inclusion[valid] >= 1.0).all()))

    def concat(self, other: "ShareRows") -> "ShareRows":
        n, m, sampled, exact, inclusion, weight = (np.concatenate([getattr(self, k), getattr(other, k)]) for k in
                                                   ("n", "m", "sampled", "exact", "inclusion", "weight"))
        return ShareRows(n, m, sampled, exact, inclusion, weight, self.census and other.census)

    def equals(self, other: Any) -> bool:
        return isinstance(other, ShareRows) and self.census == other.census and all(
            np.array_equal(getattr(self, k), getattr(other, k)) for k in
            ("n", "m", "sampled", "exact", "inclusion", "weight"))


def carries_share(sample: Any) -> bool:
    """Whether ``sample`` (SampledRanks or RankHistogram) carries an exact share."""
    return getattr(sample, "share_ranks", None) is not None or getattr(sample, "share", None) is not None


def check_inclusion(pi: torch.Tensor, floor: float = MIN_INCLUSION) -> None:
    """Every positive's pi (``pi``: the positives' probabilities) in [MIN_INCLUSION, 1], a ValueError naming
    ``inclusion`` otherwise (``floor``: MIN_INCLUSION in the input's own precision)."""
    if not bool(((pi >= floor) & (pi <= 1)).all()):
        raise ValueError(f"inclusion: every positive's probability must lie in [{MIN_INCLUSION:g}, 1] (MIN_INCLUSION)")


def with_share_arrays(sampled: SampledRanks, share_ranks: TensorLike | None, inclusion: TensorLike | None
                      ) -> SampledRanks:
    """``sampled`` with an exact share given as arrays (``SampledRanks.from_arrays``): both or neither, shaped like
    the ranks, exact ranks in 1..n where chosen (0 elsewhere), probabilities in [MIN_INCLUSION, 1] at every positive."""
    if share_ranks is None or inclusion is None:
        raise ValueError("inclusion: an exact share needs both share_ranks and inclusion (one was None)")
    e = check_rank_values(share_ranks, "share_ranks", whole=True, padding=True).to(sampled.ranks.device)
    raw = torch.as_tensor(inclusion)
    # the floor in the input's own precision (float32's 1e-9 is 9.99999972e-10 in float64), then at least MIN_INCLUSION
    floor = float(torch.tensor(MIN_INCLUSION, dtype=raw.dtype)) if raw.is_floating_point() else MIN_INCLUSION
    p = raw.to(device=sampled.ranks.device, dtype=torch.float64)
    r = sampled.ranks
    for name, t in (("share_ranks", e), ("inclusion", p)):
        if t.shape != r.shape:
            raise ValueError(f"{name}: expected the shape of the ranks {tuple(r.shape)}, got {tuple(t.shape)}")
    valid = r > 0
    if bool(((e > 0) & ~valid).any()):
        raise ValueError("share_ranks: an exact rank where the ranks hold padding (0)")
    if bool((e > sampled.candidates()).any()):
        raise ValueError("share_ranks: a rank above the positive's n (n_items)")
    check_inclusion(p[valid], floor)
    p = p.clamp(min=MIN_INCLUSION)
    return dataclasses.replace(sampled, share_ranks=e, inclusion=torch.where(valid, p, torch.zeros_like(p)))


def choose_share(sampled: SampledRanks, row_keys: torch.Tensor, pos: torch.Tensor,
                 rank_rows: Callable[[torch.Tensor], torch.Tensor], inclusion: np.ndarray) -> SampledRanks:
    """``sampled`` with the exact share of its design (``design.exact_share``, not None) chosen with ``inclusion``,
    pi of each positive (``ranks > 0``, row-major; ``_design_based.share_inclusion``): positive j of row b is chosen
    iff ``keyed_uniform(seed, row_keys[b], pos[b, j]) < pi`` (``row_keys`` (B,) int64: user ids, or row numbers;
    ``pos`` (B, P) item indices, -1 padding), then ``rank_rows(chosen)`` ((B, P) bool -> (B, P) exact ranks, 0
    elsewhere: the score matrix's rows or the scorer's completion) ranks the chosen ones."""
    share = None if sampled.design is None else sampled.design.exact_share
    assert share is not None, "choose_share: the design has no exact share"
    valid = sampled.ranks > 0
    pi = torch.zeros(valid.shape, dtype=torch.float64, device=valid.device)
    pi[valid] = torch.as_tensor(inclusion, dtype=torch.float64, device=valid.device)
    chosen = valid & keyed_choice(share.seed, row_keys, pos, pi)
    exact = rank_rows(chosen)
    return dataclasses.replace(sampled, share_ranks=exact, inclusion=pi)


def keyed_choice(seed: int, row_keys: torch.Tensor, pos: torch.Tensor, pi: torch.Tensor | float) -> torch.Tensor:
    """(B, P) bool: positive j of row b is chosen iff ``keyed_uniform(seed, row_keys[b], pos[b, j]) < pi`` (``pi``
    (B, P) float64 or one number; padding slots (-1) are keyed as item 0: mask them). No host synchronisation."""
    u = keyed_uniform(seed, row_keys.to(torch.int64).reshape(-1, 1), pos.clamp(min=0).to(torch.int64))
    return (u if u.device == pos.device else u.to(pos.device)) < pi


def share_weights(sampled: SampledRanks, weights: TensorLike | None) -> np.ndarray | None:
    """The weights of ``sampled``'s positives (``ranks > 0``, row-major) as float64, checked as ``estimate`` checks
    them; None for None."""
    if weights is None:
        return None
    r = sampled.ranks
    w = torch.broadcast_to(check_weights(weights, "weights", like=r, device=r.device, counts=True), r.shape)
    return _host(w[r > 0]).astype(np.float64)


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
