"""Sampled-rank histograms and cumulative metric sums shared by the mapping and rank-distribution estimators.

A :class:`RankHistogram` is the sufficient statistic of a sampled evaluation: for every distinct
pair (n, m) of candidate count and sample size, the counts of sampled ranks r~ = 1..m+1. It is
additive (batches, epochs and processes combine with :meth:`RankHistogram.merge`), so the
estimators never touch per-user data.

Conventions (package-wide): ``n`` = candidates of one instance (the relevant item included),
``m`` = sampled irrelevant items, ``r`` exact rank in 1..n, ``r~`` sampled rank in 1..m+1.

Exact groups (adaptive sampling with ``exact_at_cap``): positives ranked exactly at the cap are counted at their
exact rank R in groups (n, m = n - 1) flagged in :attr:`RankHistogram.exact`: sampling without replacement with
m = n - 1 gives r~ = R, so an exact group is read with that law (the point mass at R) whatever the law of the
other groups, and is never pooled with a sampled group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
from scipy import special

from ._checks import (MAX_SAMPLES, MAX_SIZE, MAX_TOTAL_WEIGHT, ArgumentTypeError, check_elements, check_rank_values,
                      check_real_array, check_sampled_support, check_sizes, check_weights)
from ._kept import DERIVED_MAX, KeepsDerived, same_as_before  # noqa: F401  (DERIVED_MAX: named here)
from ._options import check_optional, check_positive_float
from ._types import TensorLike
from .metric_names import MetricSpec
from .metrics import metric_from_float_ranks

__all__ = [
    "pair_groups",
    "RankHistogram",
    "sampled_rank_histogram",
    "as_histogram",
    "n_grid",
    "pool_by_n",
    "cumulative_metric",
    "metric_integral",
    "interval_mean_metrics",
]


def _size_array(x: Any, name: str) -> np.ndarray:
    """A fresh 1-D int64 copy of group sizes, refused unless whole, finite and real (``check_sizes``)."""
    v = check_sizes(x, name, None, maximum=None)
    return np.array(v.cpu().numpy() if isinstance(v, torch.Tensor) else v, dtype=np.int64).reshape(-1)


def _count_rows(counts: Any) -> tuple[np.ndarray, ...]:
    """Each group's counts as a fresh 1-D float64 row: ``counts`` an iterable of arrays of real numbers, one per group
    (an ArgumentTypeError naming ``counts`` for None, a string, a mapping; a ValueError for strings or bools inside)."""
    if counts is None or isinstance(counts, (str, bytes, dict)) or not hasattr(counts, "__iter__"):
        raise ArgumentTypeError(f"counts: expected one array of m + 1 counts per group (a list of arrays), got "
                                f"{type(counts).__name__}")
    return tuple(check_real_array(c, "counts", "counts (real numbers)").reshape(-1) for c in counts)


def _check_share(share: Any) -> None:
    """A histogram's ``share``: None or the ``_share.ShareRows`` of an exact share (a ValueError naming ``share``)."""
    from ._share import ShareRows

    if share is not None and not isinstance(share, ShareRows):
        raise ArgumentTypeError(f"share: expected None or an exact share's rows (_share.ShareRows, from "
                                f"SampledRanks.histogram()), got {type(share).__name__}")


def _check_design(design: Any) -> None:
    """A histogram's ``design``: None or a non-popularity SamplingDesign (a ValueError naming ``design``)."""
    if design is None:
        return
    from .design import SamplingDesign

    if not isinstance(design, SamplingDesign):
        raise ValueError(f"design: expected a SamplingDesign or None, got {type(design).__name__}")
    if design.popularity is not None:
        raise ValueError("design: a histogram cannot carry what popularity-sampled ranks need, each positive's beating "
                         "draws' 1/q~; estimate from the SampledRanks of the draw")


def _exact_flags(exact: Any, n: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(G,) read-only bool flags of the exact groups (None: none), each with m = n - 1 (a ValueError naming
    ``exact`` otherwise)."""
    if exact is None:
        flags = np.zeros(len(n), dtype=bool)
    else:
        raw = np.asarray(exact)
        if raw.dtype != bool or raw.shape != (len(n),):
            raise ValueError(f"exact: expected one bool per group, shape ({len(n)},), got dtype {raw.dtype} and "
                             f"shape {raw.shape}")
        flags = raw.copy()
        bad = flags & (m != n - 1)
        if bad.any():
            g = int(np.flatnonzero(bad)[0])
            raise ValueError(f"exact: group {g} is exact but has m = {m[g]} != n - 1 = {n[g] - 1} (an exact group "
                             "counts exact ranks 1..n)")
    flags.setflags(write=False)
    return flags


@dataclass(frozen=True)
class RankHistogram(KeepsDerived):
    """Counts of sampled ranks per (n, m) group.

    Attributes:
        n_items: (G,) int64, candidates n of each group (relevant item included).
        n_samples: (G,) int64, sampled irrelevant items m of each group.
        counts: G float64 arrays; ``counts[g][i - 1]`` is the (weighted) number of positives of group g
            with sampled rank r~ = i, i = 1..m_g+1 (read-only copies: a histogram never changes).
        exact: (G,) bool, True for an exact group (module docstring: m = n - 1, counts at the exact ranks R);
            None (the default) means no exact group.
        design: the :class:`~reco_sampled_plugin.design.SamplingDesign` the ranks were drawn under, of which
            estimation reads the law (``replacement=False``: hypergeometric) and the adaptive stages
            (``adaptive_max``); the groups carry their own m. None (the default): uniform draws with replacement
            of a fixed m. A popularity design is refused: a histogram cannot carry the draws' weights
            (estimate from the draw's :class:`~reco_sampled_plugin.ranking.SampledRanks`).
        share: an exact share's rows (``_share.ShareRows``: per chosen positive its n, m, r~, exact rank,
            inclusion probability and weight), which :meth:`merge` and :meth:`concat` join and the difference
            estimator ``diff`` reads; None (the default) without a share.

    What estimation derives from the counts is kept on the histogram (``_derived``, of ``_kept.KeepsDerived``: at
    most :data:`DERIVED_MAX` entries): its fitted rank distributions by method object and law, its pooled forms,
    the identification's programs and intervals; copies, pickles and :meth:`with_design` start without them.
    """

    n_items: np.ndarray
    n_samples: np.ndarray
    counts: tuple[np.ndarray, ...]
    # None (no exact group) is accepted; __post_init__ always stores a (G,) bool array, the type readers see
    exact: np.ndarray = None  # type: ignore[assignment]
    design: Any = None
    share: Any = None
    if TYPE_CHECKING:  # derived in __post_init__, not fields
        _totals: np.ndarray = field(init=False)
        _flat: np.ndarray = field(init=False)
        _starts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        # copies, read-only: the totals, the concatenated counts and the estimators' fit cache read them later
        # whole, finite, real (check_sizes); the ranges are checked per group below
        n = _size_array(self.n_items, "n_items")
        m = _size_array(self.n_samples, "n_samples")
        counts = _count_rows(self.counts)
        for a in (n, m, *counts):
            a.setflags(write=False)
        if not (len(n) == len(m) == len(counts)):
            raise ValueError("RankHistogram: n_items, n_samples and counts need one entry per group")
        if len(n):  # vectorised checks; the first offending group is named
            sizes = np.fromiter((c.shape[0] for c in counts), dtype=np.int64, count=len(counts))
            flat = np.concatenate(counts) if counts else np.zeros(0)
            bad_count = ~np.isfinite(flat) | (flat < 0)
            for mask, msg in (
                (m < 1, lambda g: f"n_samples: must be >= 1, got {m[g]} in group {g}"),
                (m > MAX_SIZE, lambda g: f"n_samples: must be <= {MAX_SIZE}, got {m[g]} in group {g}"),
                (n < 2, lambda g: f"n_items: need at least 2 candidates, got {n[g]} in group {g}"),
                (n > MAX_SIZE, lambda g: f"n_items: must be <= {MAX_SIZE} = 2^40, got {n[g]} in group {g}"),
                (sizes != m + 1, lambda g: f"counts: group {g} has m = {m[g]} and needs {m[g] + 1} counts, got {sizes[g]}"),
            ):
                if mask.any():
                    raise ValueError(msg(int(np.flatnonzero(mask)[0])))
            if bad_count.any():
                first = int(np.flatnonzero(bad_count)[0])
                owner = int(np.searchsorted(np.cumsum(sizes), first, side="right"))
                raise ValueError(f"counts: group {owner} has negative or non-finite counts")
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            totals = np.add.reduceat(flat, starts) if flat.size else np.zeros(len(n))
            if not totals.sum() <= MAX_TOTAL_WEIGHT:  # also catches a total that overflowed to inf
                raise ValueError(
                    f"counts: the total {totals.sum():g} exceeds {MAX_TOTAL_WEIGHT:g}, the most instances standard "
                    "errors and bootstraps can count exactly; scale the counts (weights) down"
                )
        else:
            totals, flat, starts = np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
        totals.setflags(write=False)
        flat.setflags(write=False)
        exact = _exact_flags(self.exact, n, m)
        _check_design(self.design)
        _check_share(self.share)
        object.__setattr__(self, "n_items", n)
        object.__setattr__(self, "n_samples", m)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "exact", exact)
        object.__setattr__(self, "_totals", totals)
        object.__setattr__(self, "_flat", flat)
        object.__setattr__(self, "_starts", starts)

    @classmethod
    def _trusted(cls, n: np.ndarray, m: np.ndarray, counts: np.ndarray, exact: np.ndarray | None = None,
                 design: Any = None) -> "RankHistogram":
        """A histogram from valid parts built by this package (int64 n >= 2, m >= 1; ``counts`` (G, W) float64
        with finite non-negative entries, row g holding group g's m_g + 1 counts first): no re-validation."""
        sizes = m + 1
        if (sizes == counts.shape[1]).all():
            flat = counts.reshape(-1)
        else:
            flat = np.concatenate([counts[g, : sizes[g]] for g in range(counts.shape[0])])
        return cls._trusted_ragged(n, m, flat, exact, design)

    @classmethod
    def _trusted_ragged(cls, n: np.ndarray, m: np.ndarray, flat: np.ndarray, exact: np.ndarray | None = None,
                        design: Any = None) -> "RankHistogram":
        """:meth:`_trusted` from the groups' counts laid end to end (``flat``, group g's m_g + 1 counts after
        those of groups 0..g-1)."""
        self = object.__new__(cls)
        sizes = m + 1
        flat.setflags(write=False)
        starts = (np.cumsum(sizes) - sizes).astype(np.int64)
        rows = tuple(np.split(flat, starts[1:])) if len(starts) else ()
        totals = np.add.reduceat(flat, starts)
        totals.setflags(write=False)
        n.setflags(write=False)
        m.setflags(write=False)
        exact = np.zeros(len(n), dtype=bool) if exact is None else np.array(exact, dtype=bool)
        exact.setflags(write=False)
        for name, value in (("n_items", n), ("n_samples", m), ("counts", rows), ("exact", exact), ("design", design),
                            ("share", None), ("_totals", totals), ("_flat", flat), ("_starts", starts)):
            object.__setattr__(self, name, value)
        return self

    @property
    def n_groups(self) -> int:
        return len(self.counts)

    def with_design(self, design: Any) -> "RankHistogram":
        """These counts under ``design`` (a SamplingDesign or None: see :attr:`design`)."""
        _check_design(design)
        out = object.__new__(type(self))
        out.__dict__.update(self.__getstate__())
        object.__setattr__(out, "design", design)
        return out

    def with_share(self, share: Any) -> "RankHistogram":
        """These counts with an exact share's rows (:attr:`share`; None: without)."""
        out = object.__new__(type(self))
        out.__dict__.update(self.__getstate__())
        object.__setattr__(out, "share", share)
        return out

    @property
    def has_exact(self) -> bool:
        """Whether some group is exact (module docstring)."""
        return bool(self.exact.any())

    def select(self, keep: np.ndarray) -> "RankHistogram":
        """The groups ``keep`` ((G,) bool or indices), in order (itself when that is every group)."""
        idx = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep, dtype=np.int64)
        if idx.shape[0] == self.n_groups and np.array_equal(idx, np.arange(self.n_groups)):
            return self
        return RankHistogram(self.n_items[idx], self.n_samples[idx], tuple(self.counts[g] for g in idx),
                             self.exact[idx], self.design, self.share)

    def exact_part(self) -> "RankHistogram":
        """The exact groups only."""
        return self.select(self.exact)

    def sampled_part(self) -> "RankHistogram":
        """The sampled (not exact) groups only."""
        return self.select(~self.exact)

    def completed_as_sampled(self) -> "RankHistogram":
        """The sampled view of an ``exact_at_cap`` histogram: each exact group's positives, completed because they
        were still first at the cap, counted at r~ = 1 among the last stage's M draws in the sampled group (n, M), as a
        method that reads sampled ranks alone takes them (itself without exact groups). A ValueError where the
        design (:attr:`design`) has no cap: exact groups of full ranking have no sampled rank."""
        if not self.has_exact:
            return self
        adaptive = None if self.design is None else getattr(self.design, "adaptive", None)
        if adaptive is None or not getattr(self.design, "exact_at_cap", False):
            raise ValueError("sample: the histogram has exact groups but no exact_at_cap design (its design: "
                             f"{None if self.design is None else self.design.describe()}); exactly ranked positives "
                             "without a cap have no sampled rank")
        cap = int(adaptive.stages[-1])  # the last stage's draws (m 2^s <= adaptive_max)
        done = self.exact_part()
        firsts = np.zeros((done.n_groups, cap + 1))
        firsts[:, 0] = done.totals
        at_cap = RankHistogram._trusted(done.n_items.copy(), np.full(done.n_groups, cap, dtype=np.int64), firsts,
                                        design=self.design)
        return self.sampled_part().merge(at_cap)

    def concat(self, other: "RankHistogram") -> "RankHistogram":
        """The groups of both histograms side by side (this one's first; equal keys are not merged)."""
        if other.n_groups == 0 and other.share is None:
            return self
        if self.n_groups == 0 and self.share is None:
            return other
        out = RankHistogram._trusted_ragged(np.concatenate([self.n_items, other.n_items]),
                                            np.concatenate([self.n_samples, other.n_samples]),
                                            np.concatenate([self._flat, other._flat]),
                                            np.concatenate([self.exact, other.exact]), self.design)
        share = _join_shares(self.share, other.share)
        return out if share is None else out.with_share(share)

    @property
    def totals(self) -> np.ndarray:
        """(G,) total count per group (computed once; read-only)."""
        return self._totals

    @property
    def flat_counts(self) -> np.ndarray:
        """Every group's counts concatenated in group order (read-only; what tables are dotted with)."""
        return self._flat

    @property
    def top_counts(self) -> np.ndarray:
        """(G,) count of each group at sampled rank r~ = 1."""
        return self._flat[self._starts]

    def counts_within(self, top: int) -> np.ndarray:
        """(G,) count of each group at sampled ranks r~ <= ``top`` (``top_counts`` at 1; an adaptive design's
        positives that would draw more: ``_adaptive_law``)."""
        if top == 1:
            return self.top_counts
        ends = np.append(self._starts[1:], self._flat.shape[0])
        cum = np.concatenate([[0], np.cumsum(self._flat)])
        return cum[np.minimum(self._starts + top, ends)] - cum[self._starts]

    def all_at_top(self) -> bool:
        """True when no positive has a sampled rank above 1 (every count lies at r~ = 1)."""
        rest = np.ones(self._flat.shape[0], dtype=bool)
        rest[self._starts] = False
        return not bool(self._flat[rest].any())

    @property
    def total(self) -> float:
        """Total (weighted) number of positives."""
        return float(self.totals.sum())

    def sampled_metric(self, spec: MetricSpec) -> float:
        """The uncorrected sampled metric: the (weighted) mean of M(r~) over lists of m + 1 candidates."""
        m = self.n_samples
        value = 0.0
        for mg in np.unique(m):  # usually one sample size: the groups' counts summed, then one dot product
            summed = self._flat[self._starts[m == mg][:, None] + np.arange(mg + 1)].sum(0)
            value += float(summed @ _sampled_curve(spec, int(mg)))
        return value / self.total

    def without_empty_groups(self) -> "RankHistogram":
        """This histogram without its (n, m) groups of total count 0 (itself when it has none; the same object
        every time, with what it keeps: :meth:`_derived`)."""
        if bool((self._totals > 0).all()):
            return self
        return self._derived("without_empty_groups", lambda: self.select(self._totals > 0))

    def merge(self, other: "RankHistogram") -> "RankHistogram":
        """Sum of two histograms (groups with equal (n, m) and exactness are added; exact groups last); their
        designs must agree (a ValueError naming ``other``), except that None takes the other's."""
        if self.design is not None and other.design is not None and self.design != other.design:
            raise ValueError(f"other: drawn under another design ({other.design.describe()} vs "
                             f"{self.design.describe()}); histograms of different designs do not add")
        table: dict[tuple[bool, int, int], np.ndarray] = {}
        for h in (self, other):
            for ng, mg, cg, eg in zip(h.n_items, h.n_samples, h.counts, h.exact):
                key = (bool(eg), int(ng), int(mg))
                table[key] = table[key] + cg if key in table else cg.copy()
        keys = sorted(table)
        return RankHistogram(
            np.array([k[1] for k in keys], dtype=np.int64),
            np.array([k[2] for k in keys], dtype=np.int64),
            tuple(table[k] for k in keys),
            np.array([k[0] for k in keys], dtype=bool),
            self.design if self.design is not None else other.design,
            _join_shares(self.share, other.share),
        )

    def same_groups(self, other: "RankHistogram") -> bool:
        """True when both histograms have the same (n, m) groups, exact or not, in the same order."""
        return (np.array_equal(self.n_items, other.n_items) and np.array_equal(self.n_samples, other.n_samples)
                and np.array_equal(self.exact, other.exact))

    def check_support(self, law: str = "uniform") -> None:
        """Raise a ValueError where a counted r~ cannot occur under the design (``_checks.check_sampled_support``:
        r~ in 2..m with n = 2), whatever the estimator."""
        if not (self.n_items == 2).any():
            return
        cols = np.flatnonzero(self._flat)
        g = np.searchsorted(self._starts, cols, side="right") - 1
        check_sampled_support(cols - self._starts[g] + 1, self.n_items[g], self.n_samples[g], law)

    def check_nonempty(self, weights: Any = None) -> None:
        """Raise a ValueError when no positive was counted: naming ``weights`` when the caller gave weights (every
        one 0, so nothing is left to estimate from), else ``sampled_ranks``."""
        if self.n_groups == 0 or self.total <= 0:
            given = 0 if weights is None else weights.numel() if isinstance(weights, torch.Tensor) else np.size(weights)
            if given:  # weights for some positives, every one 0
                raise ValueError("weights: every weight is 0 (no positive with a sampled rank and a weight > 0 is left "
                                 "to estimate from)")
            raise ValueError("sampled_ranks: the histogram is empty (no positive with a sampled rank)")


def same_histogram(owner: Any, hist: RankHistogram) -> RankHistogram:
    """``hist``, or the equal histogram (same groups, counts and design) that this call returned before for
    ``owner`` (the object ``hist`` was built from, e.g. a SampledRanks; its last two histograms are remembered):
    the same object, with what it keeps (:meth:`RankHistogram._derived`), so estimating several metrics from one
    sample fits it once. Equal counts, not the owner's identity, decide: an owner changed in place gets new ones."""
    return same_as_before(owner, "_histograms", hist, lambda old, new: (
        old.same_groups(new) and old.design == new.design and np.array_equal(old.flat_counts, new.flat_counts)
        and (old.share is new.share or (old.share is not None and old.share.equals(new.share)))))


def _join_shares(a: Any, b: Any) -> Any:
    """The exact-share rows of two histograms joined (``ShareRows.concat``); None where neither has any. One with a
    share and one without do not add (a ValueError naming ``other``)."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        raise ValueError("other: one histogram carries an exact share and the other not; histograms of different "
                         "designs do not add")
    return a.concat(b)


def _flat(x: Any, name: str) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    return t.reshape(-1)


def sampled_rank_histogram(sampled_ranks: TensorLike, n_items: TensorLike, n_samples: TensorLike,
                           weights: TensorLike | None = None, *, exact_ranks: TensorLike | None = None) -> RankHistogram:
    """Histogram of sampled ranks, grouped by (n, m).

    Args:
        sampled_ranks: sampled ranks r~ in 1..m+1 (any shape, tensor or array, any device); 0 marks padding
            (as in :func:`reco_sampled_plugin.sampled_ranks`) and is ignored.
        n_items: candidates n, an int or per-positive values broadcastable against ``sampled_ranks``.
        n_samples: m, an int or per-positive values (adaptive sampling gives positives different m).
        weights: optional non-negative per-positive weights (default 1).
        exact_ranks: optional exact ranks R in 1..n of completed positives, 0 elsewhere, shaped like
            ``sampled_ranks`` (``SampledRanks.exact_ranks``): those positives are counted at R in exact groups
            (n, m = n - 1) (module docstring), the others at r~ as usual.

    Returns:
        :class:`RankHistogram` (computed with one ``bincount``; vectorised, no loop over positives).
    """
    if isinstance(sampled_ranks, RankHistogram):
        return sampled_ranks
    if exact_ranks is not None:
        return _with_exact_groups(sampled_ranks, n_items, n_samples, weights, exact_ranks)
    r = check_rank_values(sampled_ranks, "sampled_ranks", whole=True, padding=True)
    dev = r.device
    # minimum 0: padded slots may carry 0 (adaptive sizes); the kept positives are checked below
    # exact: one value per instance or one for all (never more instances than ranks: (B, 1) ranks with (B,) n)
    n = check_sizes(n_items, "n_items", 0, like=r, like_name="sampled_ranks", exact=True, device=dev)
    m = check_sizes(n_samples, "n_samples", 0, like=r, like_name="sampled_ranks", exact=True, device=dev,
                    maximum=MAX_SAMPLES)
    w = None if weights is None else check_weights(weights, "weights", like=r, max_total=MAX_TOTAL_WEIGHT, device=dev,
                                                    counts=True)
    tensors = [torch.as_tensor(x, dtype=torch.int64, device=dev) if i else x for i, x in enumerate((r, n, m))]
    tensors = torch.broadcast_tensors(*(tensors if w is None else tensors + [w]))
    r = tensors[0].reshape(-1).to(torch.int64)
    n = tensors[1].reshape(-1)
    m = tensors[2].reshape(-1)
    keep = r != 0
    if w is not None:
        w = tensors[3].reshape(-1)
        w = w[keep]
    r, n, m = r[keep], n[keep], m[keep]
    if r.numel() == 0:
        return RankHistogram(np.zeros(0, np.int64), np.zeros(0, np.int64), ())
    if bool((m < 1).any()):
        raise ValueError("n_samples: must be >= 1")
    if bool((n < 2).any()):
        raise ValueError("n_items: need at least 2 candidates (the relevant item and one irrelevant item)")
    if bool((r < 1).any()) or bool((r > m + 1).any()):
        bad = (r < 1) | (r > m + 1)
        raise ValueError(
            f"sampled_ranks: {int(bad.sum())} value(s) outside 1..m+1 (m = n_samples), e.g. {int(r[bad][0])}"
        )
    return _bincount_histogram(r, n, m, w)


def _with_exact_groups(sampled_ranks: TensorLike, n_items: TensorLike, n_samples: TensorLike, weights: TensorLike | None,
                       exact_ranks: TensorLike) -> RankHistogram:
    """:func:`sampled_rank_histogram` of the positives without an exact rank, then the exact groups of the others."""
    r = check_rank_values(sampled_ranks, "sampled_ranks", whole=True, padding=True)
    e = check_rank_values(exact_ranks, "exact_ranks", whole=True, padding=True).to(r.device)
    if e.shape != r.shape:
        raise ValueError(f"exact_ranks: expected the shape of sampled_ranks {tuple(r.shape)}, got {tuple(e.shape)}")
    e = e.to(torch.int64)
    done = e > 0
    if bool((done & (r == 0)).any()):
        raise ValueError("exact_ranks: an exact rank where sampled_ranks holds padding (0)")
    zero = torch.zeros_like(r)
    sampled = sampled_rank_histogram(torch.where(done, zero, r), n_items, n_samples, weights)
    if not bool(done.any()):
        return sampled
    n = check_sizes(n_items, "n_items", 0, like=r, like_name="sampled_ranks", exact=True, device=r.device)
    n = torch.broadcast_to(torch.as_tensor(n, dtype=torch.int64, device=r.device), r.shape)
    if bool((done & (e > n)).any()):
        raise ValueError(f"exact_ranks: {int((done & (e > n)).sum())} value(s) above the positive's n (n_items)")
    exact = sampled_rank_histogram(e, n, torch.where(done, n - 1, torch.zeros_like(n)), weights)
    if weights is not None and exact.n_groups:  # zero weights may leave no exact count
        exact = exact.without_empty_groups()
    exact = RankHistogram._trusted_ragged(exact.n_items.copy(), exact.n_samples.copy(), exact.flat_counts.copy(),
                                          np.ones(exact.n_groups, dtype=bool))
    return sampled.concat(exact)


def _group_ids(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct values of non-negative int64 ``key`` and each entry's index among them: one
    ``bincount`` over the key range when that range is small (candidate counts: a few thousand), else a
    sort (``np.unique``)."""
    if key.shape[0] == 0:
        return key.copy(), np.zeros(0, np.int64)
    lo, hi = int(key.min()), int(key.max())
    if hi - lo <= 4 * key.shape[0] + 4096:
        present = np.bincount(key - lo, minlength=hi - lo + 1) > 0
        return np.flatnonzero(present) + lo, (np.cumsum(present) - 1)[key - lo]
    return np.unique(key, return_inverse=True)


def pair_groups(n: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (n, m) pairs of int64 ``n``, ``m`` >= 0 sorted by n then m, and each entry's index among them: one
    int64 key n (max m + 1) + m where it cannot overflow (:func:`_group_ids`), else numpy's row-wise unique, in the same
    order (n up to 2^40 times m + 1 up to 2^24 + 1 leaves int64: the key wrapped around to n = 0)."""
    if n.shape[0] == 0:
        return n.copy(), m.copy(), np.zeros(0, np.int64)
    span = int(m.max()) + 1
    if int(n.max()) <= (np.iinfo(np.int64).max - span) // span:
        key, gid = _group_ids(n * span + m)
        return key // span, key % span, gid
    pairs, gid = np.unique(np.stack([n, m], 1), axis=0, return_inverse=True)
    return pairs[:, 0].copy(), pairs[:, 1].copy(), gid.reshape(-1)


def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _bincount_histogram(r: np.ndarray, n: np.ndarray, m: np.ndarray, w: np.ndarray | None) -> RankHistogram:
    """The histogram of valid inputs (integer r in 1..m+1, n >= 2, m >= 1; float64 weights or None; 1-D
    tensors or arrays of equal length, not empty): one ``bincount`` over (group, r~) in numpy. For callers
    whose ranks are valid by construction (adapters building them from their own tables); others use
    :func:`sampled_rank_histogram`, which checks first."""
    r, n, m = (_numpy(x).astype(np.int64, copy=False) for x in (r, n, m))
    w = None if w is None else _numpy(w).astype(np.float64, copy=False)
    m0 = m[0]
    if (m == m0).all():  # one sample size (the common case): groups are the distinct n
        un, gid = _group_ids(n)
        um = np.full(un.shape[0], m0, dtype=np.int64)
    else:
        un, um, gid = pair_groups(n, m)
    if un[0] < 2 or um.min() < 1:  # O(groups): the checks of the validating constructor that can fail here
        g = 0 if un[0] < 2 else int(np.argmin(um))
        raise ValueError(f"n_items: need at least 2 candidates, got {un[g]} in group {g}" if un[0] < 2
                         else f"n_samples: must be >= 1, got {um[g]} in group {g}")
    width = int(um.max()) + 1
    cells = int((um + 1).sum())
    check_elements(min(cells, un.shape[0] * width), "n_samples",
                   f"the histogram ({un.shape[0]} distinct (n, m) groups of m + 1 counts each)")
    if un.shape[0] * width <= 4 * (cells + 1024):  # widths alike: one dense (G, W) block
        counts: np.ndarray = np.bincount(gid * width + (r - 1), weights=w, minlength=un.shape[0] * width)
        counts = counts.astype(np.float64, copy=False).reshape(un.shape[0], width)
        return RankHistogram._trusted(un, um, counts)
    # widths that differ (adaptive sampling: m up to 32 m): a ragged layout, group g at offset[g]
    offsets = np.concatenate([[0], np.cumsum(um + 1)]).astype(np.int64)
    flat = np.bincount(offsets[gid] + (r - 1), weights=w, minlength=int(offsets[-1])).astype(np.float64, copy=False)
    return RankHistogram._trusted_ragged(un, um, flat)


def as_histogram(sampled_ranks: TensorLike | RankHistogram, n_items: TensorLike | None = None,
                 n_samples: TensorLike | None = None, weights: TensorLike | None = None) -> RankHistogram:
    """A :class:`RankHistogram` as given, or built from per-positive sampled ranks; either way without its
    groups of total count 0 (zero weights): an empty group must not move an estimate (its n would still
    stretch a rank grid) or fail a check of its own."""
    if not isinstance(sampled_ranks, RankHistogram):
        if n_items is None or n_samples is None:
            missing = "n_items" if n_items is None else "n_samples"  # the message starts with the missing one
            raise ValueError(f"{missing}: required (None given); n_items and n_samples are required unless "
                             "sampled_ranks is a RankHistogram")
        sampled_ranks = sampled_rank_histogram(sampled_ranks, n_items, n_samples, weights)
    return sampled_ranks.without_empty_groups()


# --------------------------------------------------------------------------------------------------
# grouping candidate counts n (catalogue minus each user's training items) onto a geometric grid


def check_spread(max_rel_n_spread: Any) -> float | None:
    """Validate ``max_rel_n_spread`` (None, or a finite number > 0, not a str or bool), raising a ValueError naming it."""
    return check_optional(max_rel_n_spread, check_positive_float, "max_rel_n_spread")


def n_grid(n_min: int, n_max: int, max_rel_n_spread: float) -> np.ndarray:
    """Geometric grid of whole candidate counts from ``n_min`` to ``n_max`` (both included) whose
    consecutive nodes differ by a factor of at most about 1 + ``max_rel_n_spread`` (int64, ascending)."""
    n_min, n_max = int(n_min), int(n_max)
    s = check_spread(max_rel_n_spread)
    if n_max <= n_min or s is None:
        return np.array([n_min], dtype=np.int64)
    steps = max(1, math.ceil(math.log(n_max / n_min) / math.log1p(s) - 1e-12))
    g = np.rint(n_min * (n_max / n_min) ** (np.arange(steps + 1) / steps)).astype(np.int64)
    g[0], g[-1] = n_min, n_max
    return np.unique(g)


def pool_by_n(hist: RankHistogram, max_rel_n_spread: float | None) -> RankHistogram:
    """Move every (n, m) group onto a geometric grid of candidate counts (per m), splitting its counts
    between the two neighbouring grid nodes n_j <= n <= n_j+1 with weights linear in 1/(n - 1).

    Any estimator that is a mean of per-positive table values T_n[r~] (corrections, mappings) then uses
    the interpolated table (1 - t) T_{n_j} + t T_{n_j+1} for a positive with candidate count n, i.e. tables
    are built for the grid nodes only. Interpolation in 1/(n - 1), the scale of the sampled rank
    ((n - 1)/m exact ranks per sampled rank), makes the error second order in the spread; measured
    errors are in docs/estimators.md. ``None`` returns ``hist`` unchanged. Total counts are preserved. The pooled
    histogram is kept on ``hist`` (``RankHistogram._derived``): the same object, with its fits, every time.
    """
    s = check_spread(max_rel_n_spread)
    if s is None or hist.n_groups <= 1:
        return hist
    return hist._derived(("pool_by_n", s), lambda: _pool_by_n(hist, s))


def _pool_by_n(hist: RankHistogram, s: float) -> RankHistogram:
    """:func:`pool_by_n` of a histogram with several groups onto the grid of spread ``s`` (checked)."""
    if hist.has_exact:  # exact groups are pooled among themselves (pool_exact_groups), never with sampled ones
        return pool_by_n(hist.sampled_part(), s).concat(pool_exact_groups(hist.exact_part(), n_grid_nodes=s))
    n_out: list[int] = []
    m_out: list[int] = []
    c_out: list[np.ndarray] = []
    for mval in np.unique(hist.n_samples):  # one grid per sample size (adaptive sampling: a few)
        idx = np.flatnonzero(hist.n_samples == mval)
        ns = hist.n_items[idx]
        grid = n_grid(int(ns.min()), int(ns.max()), s)
        acc = np.zeros((len(grid), int(mval) + 1))
        j = np.clip(np.searchsorted(grid, ns, side="right") - 1, 0, max(len(grid) - 2, 0))
        if len(grid) == 1:
            t = np.zeros(len(ns))
        else:
            x = 1.0 / (ns - 1.0)
            x0, x1 = 1.0 / (grid[j] - 1.0), 1.0 / (grid[j + 1] - 1.0)
            t = np.clip((x - x0) / (x1 - x0), 0.0, 1.0)
        for g, jj, tt in zip(idx, j, t):  # one pass over the (n, m) groups (hundreds), not over users
            acc[jj] += (1.0 - tt) * hist.counts[g]
            if tt > 0:
                acc[jj + 1] += tt * hist.counts[g]
        keep = acc.sum(axis=1) > 0
        n_out += grid[keep].tolist()
        m_out += [int(mval)] * int(keep.sum())
        c_out += list(acc[keep])
    return RankHistogram(np.asarray(n_out, dtype=np.int64), np.asarray(m_out, dtype=np.int64), tuple(c_out))


def pool_exact_groups(hist: RankHistogram, max_groups: int | None = None, n_grid_nodes: float | None = None
                      ) -> RankHistogram:
    """Fewer exact groups (module docstring): each moved to a larger n, its counts kept at their exact ranks R
    (R <= n still holds; only the truncation of P(R) at n moves, by the spread). ``n_grid_nodes`` s: onto the
    geometric grid of n (:func:`n_grid`), each group to the smallest node >= its n; else, beyond ``max_groups``
    groups, into quantile bins of n (by count), each to its bin's largest n. ``hist`` holds exact groups only."""
    if hist.n_groups <= 1 or (n_grid_nodes is None and (max_groups is None or hist.n_groups <= max_groups)):
        return hist
    order = np.argsort(hist.n_items, kind="stable")
    ns = hist.n_items[order]
    if n_grid_nodes is not None:
        grid = n_grid(int(ns[0]), int(ns[-1]), n_grid_nodes)
        target = grid[np.searchsorted(grid, ns, side="left")]
    else:
        assert max_groups is not None  # n_grid_nodes is None here, so the early return needed max_groups
        tot = hist.totals[order]
        cum = np.cumsum(tot) / max(tot.sum(), 1e-300)
        label = np.minimum((cum * max_groups - 1e-12).astype(np.int64), max_groups - 1)
        top = np.zeros(max_groups, dtype=np.int64)
        np.maximum.at(top, label, ns)
        target = top[label]
    nodes = np.unique(target)
    acc = {int(v): np.zeros(int(v)) for v in nodes}
    for g, t in zip(order, target):  # one pass over the exact groups (their distinct n), not over positives
        c = hist.counts[g]
        acc[int(t)][: c.shape[0]] += c
    n_out = np.asarray(nodes, dtype=np.int64)
    return RankHistogram(n_out, n_out - 1, tuple(acc[int(v)] for v in nodes), np.ones(len(nodes), dtype=bool))


# --------------------------------------------------------------------------------------------------
# cumulative metric sums C(j) = sum_{R=1}^{j} M(R) without materialising M over 1..n

_NDCG_EXACT = 8192


@lru_cache(maxsize=1)
def _ndcg_prefix() -> np.ndarray:
    r = np.arange(1, _NDCG_EXACT + 1, dtype=np.float64)
    return np.concatenate([[0.0], np.cumsum(math.log(2.0) / np.log1p(r))])


def _ndcg_sum(j: np.ndarray) -> np.ndarray:
    """sum_{R=1}^{j} ln2 / ln(R + 1): exact up to 8192, Euler-Maclaurin (midpoint form) beyond (error < 1e-14)."""
    j = np.asarray(j, dtype=np.float64)
    prefix = _ndcg_prefix()
    small = j <= _NDCG_EXACT
    out = np.empty_like(j)
    out[small] = prefix[j[small].astype(np.int64)]
    if np.any(~small):
        a = float(_NDCG_EXACT) + 0.5
        b = j[~small] + 0.5
        ln2 = math.log(2.0)

        def integral(x: np.ndarray | float) -> Any:  # antiderivative of ln2 / ln(x + 1) is ln2 * li(x + 1) = ln2 * Ei(ln(x + 1))
            return ln2 * special.expi(np.log1p(x))

        def gprime(x: np.ndarray | float) -> np.ndarray | float:
            return -ln2 / ((x + 1.0) * np.log1p(x) ** 2)

        # sum_{R=A}^{B} g(R) = int_{A-1/2}^{B+1/2} g - (g'(B+1/2) - g'(A-1/2)) / 24 + O(g''')
        out[~small] = prefix[-1] + (integral(b) - integral(a)) - (gprime(b) - gprime(a)) / 24.0
    return out


def cumulative_metric(spec: MetricSpec, j: int | np.ndarray, n: float | np.ndarray) -> np.ndarray:
    """C(j) = sum_{R=1}^{j} M(R) for whole numbers j in 0..n (float64), n candidates.

    Closed forms (harmonic numbers through digamma, AUC's arithmetic series) or a short exact sum plus
    Euler-Maclaurin (NDCG), so the cost does not depend on n.
    """
    j = np.asarray(j, dtype=np.float64)
    jj = j if spec.k is None else np.minimum(j, float(spec.k))
    kind = spec.kind
    if kind in ("recall", "hit", "trunc_precision"):
        return jj.copy()
    if kind == "precision":
        assert spec.k is not None  # precision has a cut-off (MetricSpec checks it)
        return jj / float(spec.k)
    if kind in ("ap", "trunc_ap", "rr"):
        return special.digamma(jj + 1.0) + np.euler_gamma
    if kind == "ndcg":
        return _ndcg_sum(jj)
    if kind == "auc":
        return (jj * n - jj * (jj + 1.0) / 2.0) / (n - 1.0)
    raise ValueError(f"metric: unsupported kind {kind!r}")  # pragma: no cover


def metric_at(spec: MetricSpec, r: np.ndarray, n: float | np.ndarray) -> np.ndarray:
    """M(r) for whole-number ranks r in 1..n (float64 numpy; n a number or an array broadcast against r)."""
    rt = torch.as_tensor(np.asarray(r, dtype=np.float64))
    return metric_from_float_ranks(spec, rt, torch.as_tensor(np.asarray(n, dtype=np.float64))).numpy()


@lru_cache(maxsize=256)
def _sampled_curve(spec: MetricSpec, m: int) -> np.ndarray:
    """M(1), ..., M(m + 1) on a sampled list of m + 1 candidates (read-only, cached)."""
    curve = metric_at(spec, np.arange(1, m + 2), m + 1)
    curve.setflags(write=False)
    return curve


def metric_integral(spec: MetricSpec, x: np.ndarray, n: float | np.ndarray) -> np.ndarray:
    """S(x) = integral_0^x M(ceil(t)) dt for real x in [0, n]: the cumulative sum with linear interpolation.

    For whole x, S(x) = C(x); a rank distribution uniform on the real interval (lo, hi] has metric mean
    (S(hi) - S(lo)) / (hi - lo).
    """
    n = np.asarray(n, dtype=np.float64)
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, n)
    fl = np.floor(x)
    frac = x - fl
    nxt = np.minimum(fl + 1.0, n)
    return cumulative_metric(spec, fl, n) + frac * metric_at(spec, nxt, n)


def interval_mean_metric(spec: MetricSpec, lo: np.ndarray, hi: np.ndarray, n: float | np.ndarray) -> np.ndarray:
    """Mean of M over a rank uniform on (lo, hi] (real bounds, 0 <= lo < hi <= n)."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    width = hi - lo
    if np.any(width <= 0):
        raise ValueError("interval_mean_metric: empty interval")  # pragma: no cover - internal
    return (metric_integral(spec, hi, n) - metric_integral(spec, lo, n)) / width


#: The largest cut-off K whose metrics share the prefix-sum table of :func:`interval_mean_metrics` (8 MiB per metric)
_PREFIX_MAX_K = 1 << 20


@lru_cache(maxsize=64)
def _cutoff_prefix(specs: tuple[MetricSpec, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For cut-off metrics (M = 0 beyond k, independent of n): M(j + 1) padded with a 0 column and the
    prefix sums C(j), j = 0..K_max, as (S, K_max + 1) arrays (read-only)."""
    k_max = max(sp.k for sp in specs if sp.k is not None)  # cut-off metrics: every k is set
    r = np.arange(1, k_max + 1, dtype=np.float64)
    vals = np.stack([metric_at(sp, r, float(k_max)) for sp in specs])
    mpad = np.concatenate([vals, np.zeros((len(specs), 1))], axis=1)
    prefix = np.concatenate([np.zeros((len(specs), 1)), np.cumsum(vals, axis=1)], axis=1)
    mpad.setflags(write=False)
    prefix.setflags(write=False)
    return mpad, prefix


def interval_mean_metrics(specs: Sequence[MetricSpec], lo: np.ndarray, hi: np.ndarray, n: float | np.ndarray) -> np.ndarray:
    """:func:`interval_mean_metric` for several metrics at once: (len(specs), *lo.shape) float64 (n a number or an
    array broadcast against lo and hi, e.g. one row of intervals per candidate count).

    Cut-off metrics share one prefix-sum table over ranks 1..K_max (cost O(S K_max + S len(lo)), any n);
    other metrics (AUC, AP, NDCG without cut-off) go one by one.
    """
    specs = tuple(specs)
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    out = np.empty((len(specs),) + np.broadcast_shapes(lo.shape, np.shape(n)))
    # the prefix table holds K_max values per metric: cut-offs beyond _PREFIX_MAX_K go one by one (closed forms: a
    # precision@2^40 tried to allocate 8 TiB)
    cut = [i for i, sp in enumerate(specs) if sp.k is not None and sp.kind != "auc" and sp.k <= _PREFIX_MAX_K]
    for i in range(len(specs)):
        if i not in cut:
            out[i] = interval_mean_metric(specs[i], lo, hi, n)
    if cut:
        if np.any(hi - lo <= 0):
            raise ValueError("interval_mean_metric: empty interval")  # pragma: no cover - internal
        mpad, prefix = _cutoff_prefix(tuple(specs[i] for i in cut))
        k_max = prefix.shape[1] - 1

        def integral(x: np.ndarray) -> np.ndarray:
            x = np.clip(x, 0.0, np.minimum(np.asarray(n, dtype=np.float64), float(k_max)))
            fl = np.floor(x)
            idx = fl.astype(np.int64)
            return prefix[:, idx] + (x - fl) * mpad[:, idx]

        out[cut] = (integral(hi) - integral(lo)) / (hi - lo)
    return out
