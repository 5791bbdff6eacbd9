"""Ranking metrics straight from factor matrices and sparse interactions (recometrics' ``calc_reco_metrics``).

A model scores item j for user u as ``a_u . b_j (+ bias_j)``. :func:`evaluate_factors` computes those scores in
user batches on the factors' device into one reused buffer, sets every training item of the batch to -inf (so it
never competes), counts for each test item how many candidates beat it (compiled compare-and-count kernels,
``counting.py``), and derives every metric of recometrics from those exact ranks, per user.

Conventions (recometrics'):

* rows of ``X_train`` / ``X_test`` are users, columns items; a stored non-zero of ``X_test`` is a relevant item and
  its value the graded relevance used by NDCG (values may be negative: NDCG then divides by the ideal DCG of the
  positive values only and is NaN when no value is positive; every other metric treats the item as relevant);
  a stored non-zero of ``X_train`` is excluded from the ranking. Explicit zeros are dropped.
* candidates of a user: n_cand = n_items - |train row|; irrelevant candidates: n_cand - |test row|.
* column names ``P@k``, ``TP@k``, ``R@k``, ``AP@k``, ``TAP@k``, ``NDCG@k``, ``Hit@k``, ``RR@k``, ``ROC_AUC``,
  ``PR_AUC`` (``P@1 .. P@k`` with ``cumulative=True``).

NaN rules (a user's row is NaN in every column when any holds):

* no test item, or fewer test items than ``min_pos_test``;
* fewer than max(``min_items_pool``, k, 2) candidates (k: the largest cut-off asked for);
* no training item while ``consider_cold_start=False``;
* a non-finite score among its candidates (NaN or inf factors: a RuntimeWarning says how many users), or all its
  candidates scored equal.

Per metric: P, TP, R and Hit@k are NaN when the user has k or fewer candidates; every metric but NDCG is NaN when
all candidates are relevant. Where recometrics (0.1.6) departs from its own documentation we follow the
documentation and say so: it ignores ``min_pos_test`` > 1; without noise it reports NaN when the top k scores tie
(so every user at k = 1 unless ROC AUC is asked for); it makes NDCG NaN for users with exactly k candidates when
no AP, TAP, RR or AUC column is asked for; with ``cumulative=True`` it reports NDCG@|T| in place of NDCG@k' for
k' > |T|. Ties: recometrics sorts without a defined tie order; here ``ties`` picks a policy of
:func:`~reco_sampled_plugin.ranking.exact_ranks` and ``break_ties_with_noise`` adds its Uniform(-1e-12, 1e-12) noise
(seeded) before ranking.

Sampled side: ``n_samples=m`` (or a ``SamplingDesign``) draws m irrelevant items per test item from the same score
buffer and returns their sampled ranks next to the exact single-item ranks; ``method=`` adds corrected estimates
(:func:`reco_sampled_plugin.estimate`) next to the exact and the uncorrected sampled values, in the same pass;
``n_samples=SamplingDesign(m, adaptive_max=M)`` samples adaptively (m doubling for test items ranked first, up to
M) and reports the cost; with ``exact_at_cap=True`` the test items still ranked first at M keep their exact ranks
(those of the exact pass: no further scoring).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import scipy.sparse as sp
import torch

from . import registry
from ._checks import check_device, check_int, real_tensor
from .factor_ranks import other_positive_counts, overflow_rows
from ._inputs import finite_flags
from ._options import check_bool, check_names
from ._sparse import canonicalise, csr_copy
from .design import SamplingDesign, as_design
from .metric_names import MetricSpec, parse_metric
from ._rank_hist import as_histogram
from ._adaptive_law import adaptive_cost
from .adaptive import adaptive_sampled_ranks, completed_from_exact
from .ranking import (END_TIES, TIE_BOUNDS, SampledRanks, check_ties, exact_ranks_padded, sampled_ranks,
                      tied_positives)
from ._popularity import PopularityStats
from ._share import keyed_choice
from .user_metrics import SortedRanks, values_from_sorted
from .tie_expectation import expected_dcg, expected_metric_values
from ._types import TensorLike

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["evaluate_factors", "FactorEvaluation", "SampledEvaluation", "RECOMETRICS_METRICS"]

# recometrics' metric order (its column order), and its defaults (precision, average_precision, ndcg)
RECOMETRICS_METRICS = ("precision", "tp", "recall", "ap", "tap", "ndcg", "hit", "rr", "roc_auc", "pr_auc")
_DEFAULT_METRICS = ("precision", "ap", "ndcg")
_NAME_ALIASES = {
    "trunc_average_precision": "tap",
    "truncated_average_precision": "tap",
    "average_precision": "ap",
    "trunc_precision": "tp",
}
_WHOLE_LIST = ("auc", "roc_auc", "rocauc", "pr_auc", "prauc")
# elements of the (users x items) score buffer when batch_size is not given (256 MiB in float32)
_BUFFER_ELEMENTS = 1 << 26


# ----------------------------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class _CSR:
    """Canonical CSR arrays on the CPU: sorted, no duplicates, no explicit zeros."""

    indptr: np.ndarray  # int64 (n_rows + 1)
    indices: np.ndarray  # int64
    data: np.ndarray  # float64
    shape: tuple[int, int]

    @property
    def row_counts(self) -> np.ndarray:
        return np.diff(self.indptr)


def _to_csr(x: Any, name: str) -> _CSR:
    """scipy sparse (any format), torch sparse (any layout) or a dense array/tensor -> :class:`_CSR`."""
    if sp.issparse(x) and x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D sparse matrix, got {x.ndim} dimensions")
    m = csr_copy(x, name, torch.float64)  # canonicalised below: never touch the caller's arrays
    if m.dtype.kind not in "biuf":
        raise ValueError(f"{name}: expected real values, got dtype {m.dtype}")
    canonicalise(m)
    data = m.data.astype(np.float64, copy=False)
    if not np.isfinite(data).all():
        raise ValueError(f"{name}: contains NaN or inf values")
    return _CSR(m.indptr.astype(np.int64), m.indices.astype(np.int64), data, (int(m.shape[0]), int(m.shape[1])))


def _as_factor(x: Any, name: str, ndim: int) -> torch.Tensor:
    # the one numeric conversion (_checks): tensors (not meta), arrays, lists; ragged lists, strings, sparse
    # matrices, bools and complex numbers are refused naming ``name``
    t = real_tensor(x, name).detach()
    if t.dim() != ndim:
        want = "a (rows x factors) matrix" if ndim == 2 else "a vector"
        raise ValueError(f"{name}: expected {want}, got shape {tuple(t.shape)}")
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name}: expected real numbers, got dtype {t.dtype}")
    return t


def _gather_rows(csr: _CSR, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stored entries of the given rows, flat: (row within the batch, slot within the row, item, value)."""
    starts = csr.indptr[rows]
    counts = csr.indptr[rows + 1] - starts
    offsets = np.cumsum(counts) - counts
    row_of = np.repeat(np.arange(len(rows)), counts)
    slot = np.arange(int(counts.sum())) - np.repeat(offsets, counts)
    src = np.repeat(starts, counts) + slot
    return row_of, slot, csr.indices[src], csr.data[src]


def _padded(n_rows: int, row_of: np.ndarray, slot: np.ndarray, values: np.ndarray, fill: float) -> np.ndarray:
    """Flat entries -> (n_rows, widest row) array padded with ``fill``. Vectorised."""
    width = int(slot.max()) + 1 if slot.size else 0
    out = np.full((n_rows, width), fill, dtype=values.dtype)
    out[row_of, slot] = values
    return out


# ----------------------------------------------------------------------------------------------------------------
# metric names


def _metric_specs(metrics: Sequence[str] | str | None, k: int, cumulative: bool) -> tuple[list[MetricSpec], list[MetricSpec]]:
    """(base specs, output specs) from recometrics-style names; names without ``@`` take ``k``."""
    if metrics is None:
        names: Sequence[Any] = _DEFAULT_METRICS
    elif isinstance(metrics, str) and metrics.lower() == "all":
        names = RECOMETRICS_METRICS
    else:
        names = check_names(metrics, "metrics", "metric names such as 'ndcg' or 'ndcg@10'")  # one str: one metric
    base: list[MetricSpec] = []
    for name in names:
        if isinstance(name, MetricSpec):
            spec = name
        elif not isinstance(name, str):
            raise ValueError(f"metrics: expected metric names such as 'ndcg' or 'ndcg@10', got {name!r}")
        elif "@" in name:
            spec = parse_metric(name)
        else:
            key = name.strip().lower().replace("-", "_")
            key = _NAME_ALIASES.get(key, key)
            spec = parse_metric(key if key in _WHOLE_LIST else f"{key}@{k}")
        if spec not in base:
            base.append(spec)
    out: list[MetricSpec] = []
    for spec in base:
        if cumulative and spec.k is not None:
            out.extend(MetricSpec(spec.kind, j) for j in range(1, spec.k + 1))
        else:
            out.append(spec)
    return base, out


# ----------------------------------------------------------------------------------------------------------------
# per-batch metrics


def _ndcg(spec: MetricSpec, s: SortedRanks, dcg: torch.Tensor | None = None) -> torch.Tensor:
    """NDCG with recometrics' handling of negative relevance: DCG sums the raw values of the hits, the ideal DCG
    the positive values only; NaN when no value is positive (or no test item, or fewer than 2 candidates).
    ``dcg``: the (B,) DCG when given (the expectation over tie orders of ``ties="average"``)."""
    k = s.cutoff(spec)
    gain = s.gain
    assert gain is not None  # evaluate_factors ranks with the test values as relevance
    if dcg is None:
        inside = s.ranks <= k.unsqueeze(1)
        discount = math.log(2.0) / torch.log1p(torch.where(s.valid, s.ranks, torch.ones_like(s.ranks)))
        dcg = torch.where(inside, gain * discount, torch.zeros_like(discount)).sum(1)
    ideal = torch.sort(gain.clamp(min=0.0), dim=1, descending=True).values
    ideal_disc = math.log(2.0) / torch.log1p(s.position)
    idcg = torch.where(s.position <= k.unsqueeze(1), ideal * ideal_disc, torch.zeros_like(ideal)).sum(1)
    nan = (s.n_pos == 0) | (s.n <= 1) | ~(idcg > 0)
    return torch.where(nan, torch.full_like(dcg, math.nan), dcg / torch.where(idcg > 0, idcg, torch.ones_like(idcg)))


def _all_tied(scores: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """For the given rows: are all candidates (entries > -inf) equal to ``ref`` (a candidate's score)?"""
    block = scores[rows]
    return ((block == ref.unsqueeze(1)) | (block == -math.inf)).all(1)


@dataclass(frozen=True)
class SampledEvaluation:
    """Per test item of the evaluated users (flat, in user order), from :func:`evaluate_factors` with ``n_samples``.

    users: (N,) int64 user (row) index; items: (N,) int64 test item.
    sampled_ranks: (N,) rank r~ in 1..m+1 among the item and its m sampled irrelevant items.
    exact_ranks: (N,) exact rank among the user's irrelevant candidates and the item itself (other test items
        left out: the single-relevant-item rank that sampled metrics estimate); float64 for ``ties="average"``.
    n_candidates: (N,) n for that rank: irrelevant candidates + 1.
    n_samples: m (the first stage's m with adaptive sampling).
    sample_sizes: (N,) int64 final m of each test item (all m without adaptive sampling).
    adaptive_max: the cap of adaptive sampling, or None.
    popularity_stats: (N,) per test item, the beating draws' statistics of a popularity design (with replacement):
        what ``hh`` and ``pl_fit`` read (``SampledRanks.popularity_stats``); None otherwise.
    share_ranks, inclusion: (N,) an ``exact_share`` design's chosen items' exact ranks (0 elsewhere) and their
        inclusion probabilities (``SampledRanks.share_ranks``, ``inclusion``); None otherwise.
    completed_ranks: (N,) an ``exact_at_cap`` design's completion: the exact rank (``exact_ranks``) of each test
        item still ranked first at the cap, 0 elsewhere (``SampledRanks.exact_ranks``: the exact groups the
        estimators read); None otherwise.
    """

    users: torch.Tensor
    items: torch.Tensor
    sampled_ranks: torch.Tensor
    exact_ranks: torch.Tensor
    n_candidates: torch.Tensor
    n_samples: int
    sample_sizes: torch.Tensor | None = None
    adaptive_max: int | None = None
    popularity_stats: PopularityStats | None = None
    share_ranks: torch.Tensor | None = None
    inclusion: torch.Tensor | None = None
    completed_ranks: torch.Tensor | None = None


@dataclass(frozen=True)
class FactorEvaluation:
    """Result of :func:`evaluate_factors` when ``n_samples`` is given.

    metrics: the per-user exact metrics (DataFrame or dict of tensors, as without sampling).
    sampled: :class:`SampledEvaluation`, the per-item sampled and exact single-item ranks.
    summary: per metric (rows, recometrics names): ``exact`` (mean single-item metric over the test items),
        ``sampled`` (uncorrected sampled metric), and with ``correction``: ``corrected``, ``stderr`` and the 95%
        interval ``lo``, ``hi`` (``Estimate.interval``); with ``adaptive_max`` the cost: ``mean_samples``,
        ``max_samples``, ``share_at_cap`` (a DataFrame when ``as_df``, else a dict of dicts).
    estimates: {column name: :class:`~reco_sampled_plugin.Estimate`} with ``correction``; empty otherwise.
    """

    metrics: Any
    sampled: SampledEvaluation
    summary: Any
    estimates: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------------------
# options (each checked once, before any work)


@dataclass(frozen=True)
class _Columns:
    """The metric columns asked for and how they come back (recometrics' names and layout)."""

    base: list[MetricSpec]  # as asked (the sampled summary's rows)
    specs: list[MetricSpec]  # the output columns (every cut-off 1..k with ``cumulative``)
    k: int
    cumulative: bool
    rename_k: bool
    as_df: bool

    @classmethod
    def checked(cls, metrics: Sequence[str] | str | None, k: int, cumulative: bool, rename_k: bool,
                as_df: bool) -> "_Columns":
        k = check_int(k, "k", minimum=1)
        cumulative, rename_k, as_df = (check_bool(v, name) for v, name in
                                       ((cumulative, "cumulative"), (rename_k, "rename_k"), (as_df, "as_df")))
        base, specs = _metric_specs(metrics, k, cumulative)
        return cls(base, specs, k, cumulative, rename_k, as_df)

    @property
    def k_pool(self) -> int:
        """The largest cut-off (a user needs at least that many candidates)."""
        return max([self.k] + [s.k for s in self.specs if s.k is not None])

    def names(self) -> list[str]:
        """Output column names: ``P@K`` for the cut-off ``k`` when not ``rename_k`` (and not cumulative)."""
        if self.rename_k or self.cumulative:
            return [s.column for s in self.specs]
        return [s.column[: -len(str(self.k))] + "K" if s.k == self.k else s.column for s in self.specs]


@dataclass(frozen=True)
class _UserRules:
    """recometrics' criteria for evaluating a user at all (the others get NaN)."""

    min_pos_test: int
    min_items_pool: int
    consider_cold_start: bool

    @classmethod
    def checked(cls, min_pos_test: int, min_items_pool: int, consider_cold_start: bool,
                no_train: bool) -> "_UserRules":
        """``no_train``: X_train is None, so every user is a cold-start user and counts."""
        return cls(check_int(min_pos_test, "min_pos_test", minimum=1),
                   check_int(min_items_pool, "min_items_pool", minimum=1),
                   check_bool(consider_cold_start, "consider_cold_start") or no_train)


@dataclass(frozen=True)
class _Ranking:
    """How scores become ranks: tie policy, recometrics' noise, the seed of every random draw, users per batch."""

    ties: str
    noise: bool
    seed: int
    batch_size: int | None

    @classmethod
    def checked(cls, ties: str, break_ties_with_noise: bool, seed: int, batch_size: int | None) -> "_Ranking":
        seed = check_int(seed, "seed", minimum=0)
        ties = check_ties(ties)
        noise = check_bool(break_ties_with_noise, "break_ties_with_noise")
        if batch_size is not None:
            batch_size = check_int(batch_size, "batch_size", minimum=1)
        return cls(ties, noise, seed, batch_size)


def _sampling_options(n_samples: int | SamplingDesign | None, method: "str | registry.Method | None",
                      base: list[MetricSpec], ties: str) -> tuple[SamplingDesign | None, "registry.Method | None"]:
    """(design, method object), or (None, None) without sampling: the method checked against the design and against
    the metrics it must estimate (hh: AUC only). No method: every entry point's default estimator, but none for
    ``ties="average"`` (fractional sampled ranks, which the estimators refuse)."""
    correction = None if method is None else registry.as_method(method)
    design = _sampling_design(n_samples, correction)
    if correction is None and design is not None and ties != "average":
        correction = registry.as_method(registry.DEFAULT_ESTIMATOR)
    if correction is not None:
        entry = registry.get(correction)
        refused = [str(sp_) for sp_ in base if not entry.takes_metric(sp_.kind)]
        if refused:
            raise ValueError(f"metrics: method {correction.name!r} estimates {', '.join(entry.metrics or ())} only, "
                             f"not {', '.join(refused)}; pass e.g. metrics=['roc_auc']")
    return design, correction


def _sampling_design(n_samples: int | SamplingDesign | None,
                     correction: registry.Method | None) -> SamplingDesign | None:
    """The sampling design (:func:`~reco_sampled_plugin.design.as_design`: a SamplingDesign, or an int m), with the
    ``method`` checked against the design; None without sampling. Checked before any work."""
    if n_samples is None:
        if correction is not None:
            raise ValueError("method: needs n_samples (the number of sampled irrelevant items per test item)")
        return None
    design = as_design(n_samples)
    entry = None if correction is None else registry.get(correction)
    if entry is not None and not entry.supports(design):
        name = entry.name
        if design.popularity is not None:
            raise ValueError(f"method: {name!r} assumes uniform sampling; with popularity use one of "
                             f"{registry.names(design=design)} (hh: AUC only; docs/popularity.md)")
        if design.adaptive is not None:
            raise ValueError(f"method: {name!r} assumes one fixed m per test item; with adaptive_max "
                             f"use one of {registry.names(adaptive=True)}")
        raise ValueError(f"method: {name!r} does not support {design.describe()} "
                         f"(use one of {registry.names(design=design)})")
    return design


# ----------------------------------------------------------------------------------------------------------------
# the model and the users evaluated


def _interactions(X_train: Any, X_test: Any, k_pool: int) -> tuple[_CSR, _CSR]:
    """(train, test) as :class:`_CSR` of one shape (no train matrix: an empty one); the cut-offs fit the items."""
    test = _to_csr(X_test, "X_test")
    n_users, n_items = test.shape
    if n_users == 0 or n_items == 0:
        raise ValueError(f"X_test: empty matrix of shape {test.shape}")
    if X_train is None:
        train = _CSR(np.zeros(n_users + 1, np.int64), np.zeros(0, np.int64), np.zeros(0), test.shape)
    else:
        train = _to_csr(X_train, "X_train")
        if train.shape != test.shape:
            raise ValueError(f"X_train: shape {train.shape} differs from X_test's {test.shape} (users x items)")
    if k_pool > n_items:
        raise ValueError(f"k: cut-off {k_pool} is larger than the number of items ({n_items})")
    return train, test


def _check_disjoint(train: _CSR, test: _CSR) -> None:
    """A test item must not be a training item of the same user."""
    if not (train.indices.size and test.indices.size):
        return
    tr = sp.csr_matrix((np.ones(train.indices.size), train.indices, train.indptr), shape=train.shape)
    te = sp.csr_matrix((np.ones(test.indices.size), test.indices, test.indptr), shape=test.shape)
    both = tr.multiply(te).tocsr()
    both.eliminate_zeros()
    if both.nnz:
        users_bad = np.flatnonzero(np.diff(both.indptr))
        raise ValueError(
            f"X_test: {users_bad.size} user(s) have test items that are also in X_train "
            f"(first: user {int(users_bad[0])}, item {int(both.indices[both.indptr[users_bad[0]]])}); "
            "train and test must not overlap for a user"
        )


@dataclass(frozen=True)
class _Model:
    """A model's scores on ``device`` in ``dtype``: ``users @ items.T`` (item biases as one more factor,
    recometrics' layout [A, 1] . [B, bias]), or ``bias`` alone for every user (a non-personalised model)."""

    users: torch.Tensor | None  # (n_users, d) or (n_users, d + 1)
    items: torch.Tensor | None  # (n_items, d) or (n_items, d + 1); None with users
    bias: torch.Tensor | None  # (n_items,) when there are no factors, else None
    device: torch.device
    dtype: torch.dtype

    def scores(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The (len(rows), n_items) scores of the users ``rows``, written into ``out``."""
        if self.users is not None:
            assert self.items is not None  # set together
            return torch.matmul(self.users.index_select(0, rows), self.items.T, out=out)
        assert self.bias is not None  # a model without factors has biases
        return out.copy_(self.bias.unsqueeze(0).expand(out.shape))

    def score_checks(self, train: _CSR) -> tuple[np.ndarray, np.ndarray]:
        """(finite, maybe_overflow), (n_users,) bool each: users whose factors and every non-excluded item's are
        finite (the others get NaN), and users whose scores could overflow (their candidates get an exact check,
        :func:`~reco_sampled_plugin.factor_ranks.overflow_rows`)."""
        n_users = train.shape[0]
        if self.users is not None:
            assert self.items is not None  # set together
            finite_users = finite_flags(self.users, dim=1).cpu().numpy()
            item_ok = finite_flags(self.items, dim=1)
            maybe_inf = overflow_rows(self.users, self.items).cpu().numpy()
        else:
            assert self.bias is not None  # a model without factors has biases
            finite_users = np.ones(n_users, dtype=bool)
            item_ok = torch.isfinite(self.bias)
            maybe_inf = np.zeros(n_users, dtype=bool)
        bad_items = np.flatnonzero(~item_ok.cpu().numpy())
        if bad_items.size:  # users that keep a non-finite item among their candidates
            excluded_bad = np.bincount(
                np.repeat(np.arange(n_users), train.row_counts)[np.isin(train.indices, bad_items)], minlength=n_users
            )
            finite_users &= excluded_bad == bad_items.size
        return finite_users, maybe_inf


def _model(user_factors: TensorLike | None, item_factors: TensorLike | None, item_biases: TensorLike | None,
           shape: tuple[int, int], device: torch.device | str | None, dtype: torch.dtype | None) -> _Model:
    """The factors (or the biases alone) checked against the (users x items) ``shape`` and put on the device in the
    score dtype (default float32 when every factor is float32, else float64, as recometrics)."""
    n_users, n_items = shape
    if (user_factors is None) != (item_factors is None):
        raise ValueError("user_factors, item_factors: pass both, or neither (with item_biases only)")
    bias = None if item_biases is None else _as_factor(item_biases, "item_biases", 1)
    a_mat = b_mat = None
    if user_factors is None:
        if bias is None:
            raise ValueError("item_biases: required when user_factors and item_factors are None")
        ref = bias
    else:
        ref = a_mat = _as_factor(user_factors, "user_factors", 2)
        b_mat = _as_factor(item_factors, "item_factors", 2)
        if a_mat.shape[0] != n_users:
            raise ValueError(f"user_factors: {a_mat.shape[0]} rows but X_test has {n_users} users")
        if b_mat.shape[0] != n_items:
            raise ValueError(f"item_factors: {b_mat.shape[0]} rows but X_test has {n_items} items")
        if a_mat.shape[1] != b_mat.shape[1]:
            raise ValueError(
                f"item_factors: {b_mat.shape[1]} factors but user_factors has {a_mat.shape[1]} (they must match)"
            )
    if bias is not None and bias.shape[0] != n_items:
        raise ValueError(f"item_biases: {bias.shape[0]} values but X_test has {n_items} items")
    dev = check_device(device) or ref.device
    if dtype is None:
        all32 = all(t.dtype == torch.float32 for t in (a_mat, b_mat, bias) if t is not None)
        dtype = torch.float32 if all32 else torch.float64
    if dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype: expected a floating dtype, got {dtype}")
    if a_mat is None or b_mat is None:
        assert bias is not None  # checked above
        return _Model(None, None, bias.to(device=dev, dtype=dtype), dev, dtype)
    a_mat = a_mat.to(device=dev, dtype=dtype)
    b_mat = b_mat.to(device=dev, dtype=dtype)
    if bias is not None:  # recometrics' layout: [A, 1] . [B, bias]
        a_mat = torch.cat([a_mat, torch.ones((n_users, 1), dtype=dtype, device=dev)], 1)
        b_mat = torch.cat([b_mat, bias.to(device=dev, dtype=dtype).unsqueeze(1)], 1)
    return _Model(a_mat, b_mat, None, dev, dtype)


def _evaluated_users(train: _CSR, test: _CSR, rules: _UserRules, k_pool: int, finite: np.ndarray) -> np.ndarray:
    """Sorted indices of the users evaluated at all (recometrics' criteria, and finite scores: ``finite``)."""
    n_tr = train.row_counts
    n_te = test.row_counts
    n_cand = test.shape[1] - n_tr
    valid = (n_te > 0) & (n_te >= rules.min_pos_test) & (n_cand >= max(rules.min_items_pool, k_pool, 2))
    if not rules.consider_cold_start:
        valid &= n_tr > 0
    lost = np.flatnonzero(valid & ~finite)
    if lost.size:  # recometrics' NaN rows, but said: one NaN user reads like a user without test items
        warnings.warn(f"evaluate_factors: {lost.size:,} user(s) with test items have NaN or inf factors (theirs, or "
                      f"an item's among their candidates; first: user {int(lost[0])}): their rows are NaN "
                      "(recometrics' convention) and the means skip them", RuntimeWarning, stacklevel=3)
    return np.flatnonzero(valid & finite)


# ----------------------------------------------------------------------------------------------------------------
# one batch of users: scores, ranks, metrics


@dataclass(frozen=True)
class _Batch:
    """The interactions of a batch of evaluated users on the device (padded) and on the CPU (flat)."""

    rows_np: np.ndarray  # (b,) user indices
    rows: torch.Tensor  # the same on the device
    pos: torch.Tensor  # (b, P) test items, -1 padded
    n_cand: torch.Tensor  # (b,) candidates: items not in the training row
    relevance: torch.Tensor | None  # (b, P) test values (0 padded) when a metric reads them (NDCG)
    ex_row: np.ndarray  # flat training entries: row within the batch,
    ex_slot: np.ndarray  # slot within the row,
    ex_item: np.ndarray  # and item

    @classmethod
    def of(cls, train: _CSR, test: _CSR, rows_np: np.ndarray, dev: torch.device, values: bool) -> "_Batch":
        b = len(rows_np)
        ex_row, ex_slot, ex_item, _ = _gather_rows(train, rows_np)
        te_row, te_slot, te_item, te_val = _gather_rows(test, rows_np)
        pos = torch.from_numpy(_padded(b, te_row, te_slot, te_item, -1)).to(dev)
        n_cand = torch.from_numpy(test.shape[1] - (train.indptr[rows_np + 1] - train.indptr[rows_np])).to(dev)
        rel = torch.from_numpy(_padded(b, te_row, te_slot, te_val, 0.0)).to(dev) if values else None
        return cls(rows_np, torch.from_numpy(rows_np).to(dev), pos, n_cand, rel, ex_row, ex_slot, ex_item)

    def overflowed(self, scores: torch.Tensor, maybe_inf: np.ndarray) -> torch.Tensor:
        """(b,) bool: rows with a non-finite score among their candidates, checked exactly where ``maybe_inf``
        (excluded items do not count); False elsewhere (their scores cannot overflow)."""
        b = len(self.rows_np)
        nan_rows = torch.zeros(b, dtype=torch.bool, device=scores.device)
        flag_np = np.flatnonzero(maybe_inf[self.rows_np])
        if flag_np.size:  # rare
            flag = torch.from_numpy(flag_np).to(scores.device)
            bad = ~torch.isfinite(scores[flag])
            local = np.full(b, -1)
            local[flag_np] = np.arange(flag_np.size)
            sel = local[self.ex_row] >= 0  # excluded items of the flagged rows do not count
            bad[torch.from_numpy(local[self.ex_row][sel]).to(scores.device),
                torch.from_numpy(self.ex_item[sel]).to(scores.device)] = False
            nan_rows[flag] = bad.any(1)
        return nan_rows

    def exclude(self, scores: torch.Tensor) -> None:
        """Training items never compete: -inf scores them below every candidate (flat indices: no padding)."""
        if self.ex_item.size:
            dev = scores.device
            scores[torch.from_numpy(self.ex_row).to(dev), torch.from_numpy(self.ex_item).to(dev)] = -math.inf

    def padded_exclusions(self) -> torch.Tensor:
        """(b, E) training items, -1 padded (what sampling must never draw)."""
        b = len(self.rows_np)
        return torch.from_numpy(_padded(b, self.ex_row, self.ex_slot, self.ex_item, -1)).to(self.pos.device)


def _all_tied_rows(scores: torch.Tensor, ranks: torch.Tensor, bt: _Batch, pos_scores: torch.Tensor,
                   ties: str) -> torch.Tensor:
    """(b,) bool: rows whose candidates all score equal (and are more than one), without noise. Only rows whose
    ranks allow it are read (pessimistic: the last relevant item at n; optimistic: the first at 1)."""
    n_items = scores.shape[1]
    if ties == "pessimistic":
        flag = ranks.max(1).values == bt.n_cand
    elif ties == "optimistic":
        flag = torch.where(bt.pos >= 0, ranks, torch.full_like(ranks, n_items + 1)).min(1).values == 1
    elif ties == "average":
        flag = ranks[:, 0] * 2 == (bt.n_cand + 1)
    else:
        flag = torch.ones(len(bt.rows_np), dtype=torch.bool, device=scores.device)
    out = torch.zeros(len(bt.rows_np), dtype=torch.bool, device=scores.device)
    flagged = flag.nonzero().squeeze(1)
    if flagged.numel():
        out[flagged] = _all_tied(scores, flagged, pos_scores[flagged]) & (bt.n_cand[flagged] > 1)
    return out


def _batch_ranks(scores: torch.Tensor, bt: _Batch, nan_rows: torch.Tensor, ranking: _Ranking,
                 noise: torch.Tensor | None, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(ranks, tie bounds, NaN rows) of the test items among the candidates (training items already at -inf):
    :func:`~reco_sampled_plugin.ranking.exact_ranks_padded`; ``ties="average"`` also returns the (b, P, 2) tie
    groups [lo, hi] its metrics take expectations over. ``noise`` (recometrics' option) is added to ``scores``
    first; rows whose candidates all tie join the NaN rows."""
    pos_scores = scores.gather(1, bt.pos[:, :1])[:, 0]
    if noise is not None:  # recometrics checks for all-equal scores before adding noise
        nan_rows = nan_rows | _all_tied(scores, torch.arange(len(bt.rows_np), device=scores.device), pos_scores)
        noise.uniform_(-1e-12, 1e-12, generator=gen)
        scores.add_(noise[: scores.shape[0]])
    if ranking.ties == "average":  # tie groups [lo, hi]: the metrics are expectations over the orders of tied items
        bounds: torch.Tensor | None = exact_ranks_padded(scores, bt.pos, None, TIE_BOUNDS, True, gen)
        assert bounds is not None
        ranks = bounds.sum(-1).to(torch.float64) / 2  # the average rank (0 in padded slots)
    else:
        bounds, ranks = None, exact_ranks_padded(scores, bt.pos, None, ranking.ties, True, gen)
    if noise is None:  # all scores tied: the last relevant item at n (pessimistic), the first at 1
        nan_rows = nan_rows | _all_tied_rows(scores, ranks, bt, pos_scores, ranking.ties)
    return ranks, bounds, nan_rows


def _batch_metrics(specs: list[MetricSpec], ranks: torch.Tensor, bounds: torch.Tensor | None, bt: _Batch,
                   n_items: int) -> dict[str, torch.Tensor]:
    """{column: (b,) values} of every metric from the exact ranks (expectations over the tie groups ``bounds``
    for ``ties="average"``)."""
    s = SortedRanks(ranks, bt.n_cand, bt.relevance)
    out = {}
    for spec in specs:
        if bounds is None:
            vals = _ndcg(spec, s) if spec.kind == "ndcg" else values_from_sorted(spec, s)
        elif spec.kind == "ndcg":
            rel = bt.relevance.double() if bt.relevance is not None else (bt.pos >= 0).double()
            vals = _ndcg(spec, s, expected_dcg(bounds[..., 0].double(), bounds[..., 1].double(), rel, spec.k,
                                               s.cutoff(spec), n_items))
        else:
            vals = expected_metric_values(spec, bounds[..., 0], bounds[..., 1], bt.n_cand, max_position=n_items)
        out[spec.column] = vals
    return out


def _evaluate_batches(model: _Model, train: _CSR, test: _CSR, users: np.ndarray, maybe_inf: np.ndarray,
                      specs: list[MetricSpec], ranking: _Ranking,
                      design: SamplingDesign | None) -> tuple[dict[str, torch.Tensor], list[tuple]]:
    """({column: (n_users,) float64, NaN where not evaluated}, the sampled parts of :func:`_sample_batch`), user
    batch by user batch: the batch's scores in one reused buffer, vectorised within the batch."""
    n_users, n_items = test.shape
    dev = model.device
    results = {s.column: torch.full((n_users,), math.nan, dtype=torch.float64, device=dev) for s in specs}
    parts: list[tuple] = []
    batch_size = ranking.batch_size or max(1, min(4096, _BUFFER_ELEMENTS // n_items))
    buf = torch.empty((min(batch_size, max(len(users), 1)), n_items), dtype=model.dtype, device=dev)
    noise = torch.empty_like(buf) if ranking.noise else None
    gen = torch.Generator(device=dev).manual_seed(ranking.seed)
    values = any(s.kind == "ndcg" for s in specs)
    for start in range(0, len(users), batch_size):  # user batches bound memory; each batch is vectorised
        bt = _Batch.of(train, test, users[start : start + batch_size], dev, values)
        scores = model.scores(bt.rows, buf[: len(bt.rows_np)])
        nan_rows = bt.overflowed(scores, maybe_inf)  # exact check of the candidates where the norms allow overflow
        bt.exclude(scores)
        ranks, bounds, nan_rows = _batch_ranks(scores, bt, nan_rows, ranking, noise, gen)
        for col, vals in _batch_metrics(specs, ranks, bounds, bt, n_items).items():
            results[col][bt.rows] = torch.where(nan_rows, torch.full_like(vals, math.nan), vals)
        if design is not None:  # sampling needs the exclusions as a padded index (never drawn)
            parts.append(_sample_batch(scores, bt.pos, bt.padded_exclusions(), ranks, bt.rows, nan_rows, bt.n_cand,
                                       design, gen, ranking.ties))
    return results, parts


# ----------------------------------------------------------------------------------------------------------------
# the entry point


# tabular exception: recometrics' calc_reco_metrics signature (21 parameters)
def evaluate_factors(
    X_train: Any,
    X_test: Any,
    user_factors: TensorLike | None = None,
    item_factors: TensorLike | None = None,
    k: int = 5,
    item_biases: TensorLike | None = None,
    metrics: Sequence[str] | str | None = None,
    *,
    cumulative: bool = False,
    min_pos_test: int = 1,
    min_items_pool: int = 2,
    consider_cold_start: bool = True,
    ties: str = "pessimistic",
    break_ties_with_noise: bool = False,
    seed: int = 1,
    as_df: bool = True,
    rename_k: bool = True,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    n_samples: int | SamplingDesign | None = None,
    method: "str | registry.Method | None" = None,
) -> "pd.DataFrame | dict[str, torch.Tensor] | FactorEvaluation":
    """Per-user ranking metrics of a factor model, like recometrics' ``calc_reco_metrics`` (see the module doc).

    Args:
        X_train: (users x items) training interactions (excluded from the ranking): scipy sparse (CSR, COO, ...),
            torch sparse (COO, CSR), or dense; ``None`` for none (then cold-start users count).
        X_test: (users x items) test interactions, same forms; values are graded relevance for NDCG.
        user_factors: (users x d) numpy array or torch tensor (float32 or float64), or None with ``item_biases``
            only (a non-personalised model).
        item_factors: (items x d), same forms; None together with ``user_factors``.
        k: the cut-off of metrics named without ``@`` (recometrics' ``k``); with ``cumulative`` columns 1..k.
        item_biases: optional (items,) scores added to every user's scores.
        metrics: names (``"precision"``, ``"tp"``, ``"recall"``, ``"ap"``, ``"tap"``, ``"ndcg"``, ``"hit"``,
            ``"rr"``, ``"roc_auc"``, ``"pr_auc"``, or any with ``@k``), ``"all"`` for the ten, or None for
            recometrics' defaults (precision, average precision, NDCG).
        cumulative: every metric at every cut-off 1..k.
        min_pos_test, min_items_pool, consider_cold_start: users failing them get NaN (module doc).
        ties: tie policy for exactly equal scores (``"pessimistic"``, ``"optimistic"``, ``"average"``,
            ``"random"``).
        break_ties_with_noise: add Uniform(-1e-12, 1e-12) noise to the scores first (recometrics' option;
            its default there is True), seeded by ``seed``.
        seed: seeds the noise, random tie-breaking and sampling.
        as_df: a pandas DataFrame (recometrics' columns), else a dict {column: (users,) float64 tensor}.
        rename_k: False names columns of the ``k`` cut-off ``P@K`` rather than ``P@5`` (not cumulative).
        batch_size: users per score batch (default: a buffer of about 2**26 scores).
        device: where scores are computed (default: the factors' device).
        dtype: score dtype (default float32 when every factor is float32, else float64, as recometrics).
        n_samples: a :class:`~reco_sampled_plugin.design.SamplingDesign`, or an int m (uniform with
            replacement); also rank every test item against its sampled irrelevant items (returns a
            :class:`FactorEvaluation`). The design says the law: without replacement (hypergeometric); popularity
            weights (``method="hh"`` corrects AUC (``metrics=["roc_auc"]``), ``"pl_fit"`` every metric,
            ``"none"`` reports the sampled metrics; docs/popularity.md); ``adaptive_max`` (a test item ranked
            first among its m samples draws m more, m doubling, up to the cap; ``method`` then one that takes
            adaptive designs, ``registry.names(adaptive=True)``; with
            ``exact_at_cap=True`` the items still first at the cap keep their exact ranks,
            ``SampledEvaluation.completed_ranks``, read as exact groups by ``auto``, ``mes``, ``gmod``, ``mle``).
            ``exact_share``
            (``SamplingDesign(m, exact_share=ExactShare(s))``, uniform or active): the keyed share of the test items
            (keyed by user index and item) keeps its exact ranks beside the sampled ones
            (``SampledEvaluation.share_ranks``, ``inclusion``), and ``method="auto"`` (or ``"diff"``) gives the
            design-based estimate (docs/estimators.md); the exact ranks cost nothing extra (every test item is
            ranked exactly here anyway).
        method: the estimator of the corrected estimates next to the exact values (with ``n_samples``; default
            ``"auto"``, every entry point's, but none with ``ties="average"``, whose fractional sampled ranks the
            estimators refuse): a registered name (``reco_sampled_plugin.registry.names()``:
            ``"bv"``, ``"cls"``, ``"mle"``...) or its options object (``registry.Bv(gamma=0.2)``); it must support
            the design (``registry.get(method).supports(design)``).

    Returns:
        The per-user metrics (DataFrame or dict), or a :class:`FactorEvaluation` when ``n_samples`` is given.

    Raises:
        ValueError: naming the argument, for shape mismatches, a test item also in the user's training row,
            non-finite interaction values, bad options.
    """
    rules = _UserRules.checked(min_pos_test, min_items_pool, consider_cold_start, no_train=X_train is None)
    ranking = _Ranking.checked(ties, break_ties_with_noise, seed, batch_size)
    columns = _Columns.checked(metrics, k, cumulative, rename_k, as_df)
    design, correction = _sampling_options(n_samples, method, columns.base, ranking.ties)
    train, test = _interactions(X_train, X_test, columns.k_pool)
    model = _model(user_factors, item_factors, item_biases, test.shape, device, dtype)
    _check_disjoint(train, test)
    finite, maybe_inf = model.score_checks(train)
    users = _evaluated_users(train, test, rules, columns.k_pool, finite)
    results, parts = _evaluate_batches(model, train, test, users, maybe_inf, columns.specs, ranking, design)
    names = columns.names()
    per_user = _output({name: results[s.column] for s, name in zip(columns.specs, names)}, names, columns.as_df)
    if design is None:
        return per_user
    if method is None and not users.size:  # the default estimator has nothing to estimate: NaN rows, no estimate
        correction = None
    return _sampled_result(per_user, parts, columns.base, design, correction, columns.as_df, model.device)


def _output(results: dict, names: list[str], as_df: bool) -> "pd.DataFrame | dict[str, torch.Tensor]":
    if not as_df:
        return {name: results[name] for name in names}
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("evaluate_factors(as_df=True) needs pandas; pass as_df=False for tensors") from exc
    return pd.DataFrame({name: results[name].detach().cpu().numpy() for name in names})


# ----------------------------------------------------------------------------------------------------------------
# sampled side


def _single_item_ranks(scores: torch.Tensor, pos: torch.Tensor, ranks: torch.Tensor, ties: str,
                       gen: torch.Generator | None) -> torch.Tensor:
    """Exact rank of each test item among the irrelevant candidates and itself: the full rank minus the other
    test items that beat it (read from the same buffer, so bit-identical comparisons)."""
    if ties == "random":
        return exact_ranks_padded(scores, pos, None, ties, False, gen)
    ps = scores.gather(1, pos.clamp(min=0))
    valid = pos >= 0
    ge, gt = other_positive_counts(ps, valid)
    if ties in END_TIES:  # the full rank counts the tied test items before it in slot order
        return ranks - gt - tied_positives(ps, valid)[0]
    return ranks - (ge + gt).to(torch.float64) / 2


def _sample_batch(scores: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor, ranks: torch.Tensor, rows: torch.Tensor,
                  nan_rows: torch.Tensor, n_cand_b: torch.Tensor, design: SamplingDesign, gen: torch.Generator | None,
                  ties: str) -> tuple:
    n_pos = (pos >= 0).sum(1)
    keep = ~nan_rows & (n_cand_b - n_pos >= 1)  # rows with an irrelevant candidate to draw
    if not bool(keep.all()):
        idx = keep.nonzero().squeeze(1)
        scores, pos, exc, ranks, rows = scores[idx], pos[idx], exc[idx], ranks[idx], rows[idx]
    if pos.shape[0] == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=pos.device)
        return empty, empty, empty, empty.to(ranks.dtype), empty, empty, None, \
            empty.to(ranks.dtype) if design.exact_at_cap else None
    exc_arg = exc if exc.shape[1] else None
    # the share is chosen on the whole sample (_with_share); the completion reads the exact pass's ranks (below)
    draws = dataclasses.replace(design, exact_share=None, exact_at_cap=False)
    if design.adaptive is None:
        res = sampled_ranks(scores, pos, draws, exclude=exc_arg, generator=gen, ties=ties, check_finite=False)
        sizes: Any = torch.full_like(pos, design.n_samples)  # adaptive: the draws' sizes (always set there)
    else:
        res = adaptive_sampled_ranks(scores, pos, draws, exclude=exc_arg, generator=gen, ties=ties,
                                     check_finite=False)
        sizes = res.n_samples
    s_ranks, n_cand = res.ranks, res.n_candidates
    single = _single_item_ranks(scores, pos, ranks, ties, gen)
    valid = pos >= 0
    users = rows.unsqueeze(1).expand_as(pos)[valid]
    n_single = n_cand.unsqueeze(1).expand_as(pos)[valid]
    stats = None if res.popularity_stats is None else res.popularity_stats.select(valid)
    completed = completed_from_exact(single, s_ranks, sizes, design)[valid] if design.exact_at_cap else None
    return users, pos[valid], s_ranks[valid], single[valid], n_single, sizes[valid], stats, completed


def _sampled_result(per_user: dict, parts: list, base_specs: list[MetricSpec], design: SamplingDesign,
                    correction: registry.Method | None, as_df: bool, dev: torch.device) -> FactorEvaluation:
    from .metrics import metric_from_float_ranks

    if parts:
        users, items, sranks, eranks, n_single, sizes = (torch.cat([p[i] for p in parts]) for i in range(6))
    else:
        z = torch.zeros(0, dtype=torch.int64, device=dev)
        users, items, sranks, eranks, n_single, sizes = z, z, z, z, z, z
    kept = [p[6] for p in parts if p[6] is not None]
    stats = PopularityStats.cat(kept) if kept else None
    completed = None  # an exact_at_cap design's completed exact ranks (empty without an evaluated user)
    if design.exact_at_cap:
        completed = torch.cat([p[7] for p in parts]) if parts else eranks
    m, adaptive = design.n_samples, design.adaptive
    drawn = None
    if users.numel():
        if design.popularity is not None:  # the draw's statistics travel with the ranks (hh reads them)
            drawn = SampledRanks(sranks, n_single, None, design, popularity_stats=stats)
        elif sranks.is_floating_point():  # ties="average": expected ranks, kept (estimate() names the fix)
            drawn = SampledRanks(sranks, n_single, None, design, None if adaptive is None else sizes,
                                 exact_ranks=completed)
        else:  # the per-positive final m of an adaptive design, else the design's m; the completed exact ranks
            drawn = SampledRanks.from_arrays(sranks, n_single, m if adaptive is None else sizes, design,
                                             exact_ranks=completed)
        drawn = _with_share(drawn, users, items, eranks)
    sampled = SampledEvaluation(users, items, sranks, eranks, n_single, m, sizes, design.adaptive_max, stats,
                                None if drawn is None else drawn.share_ranks, None if drawn is None else drawn.inclusion,
                                completed)
    cost = None
    if adaptive is not None and users.numel():
        cost = adaptive_cost(as_histogram(sranks, n_single, sizes), adaptive).as_dict()
    summary: dict[str, dict[str, float]] = {}
    estimates: dict = {}
    for spec in base_specs:
        row: dict[str, float] = {"n_instances": float(users.numel())}
        if users.numel():
            n_f = n_single.to(torch.float64)
            row["exact"] = float(metric_from_float_ranks(spec, eranks.to(torch.float64), n_f).mean())
            row["sampled"] = float(
                metric_from_float_ranks(spec, sranks.to(torch.float64), sizes.to(torch.float64) + 1.0).mean()
            )
        else:
            row["exact"] = row["sampled"] = math.nan
        if correction is not None:
            from .estimators import estimate  # lazily: the estimators pull in scipy-heavy modules

            if users.numel() == 0:
                raise ValueError("method: no test item could be sampled (no evaluated user)")
            assert drawn is not None  # built above for every sampled test item
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                est = estimate(spec, drawn, correction)
            estimates[spec.column] = est
            row["corrected"] = float(est.value)
            row["stderr"] = float(est.stderr)
            row["lo"], row["hi"] = (float(v) for v in est.interval(0.95))
        if cost is not None:
            row.update({k: cost[k] for k in ("mean_samples", "max_samples", "share_at_cap")})
        summary[spec.column] = row
    if as_df:
        import pandas as pd

        summary = pd.DataFrame.from_dict(summary, orient="index")
    return FactorEvaluation(per_user, sampled, summary, estimates)


def _with_share(drawn: SampledRanks, users: torch.Tensor, items: torch.Tensor, eranks: torch.Tensor) -> SampledRanks:
    """``drawn`` (every test item's sampled ranks, flat) with its design's exact share (itself without one): pi from
    the whole sample (``_design_based.share_inclusion``: an active share fits the model on every item's sampled
    ranks), the keyed choice of (share seed, user index, item) as the core's draws choose (``_share.keyed_choice``),
    and the chosen items' exact ranks, already computed for every test item (no scoring beyond the exact pass)."""
    share = None if drawn.design is None else drawn.design.exact_share
    if share is None:
        return drawn
    from ._design_based import share_inclusion

    pi = torch.as_tensor(share_inclusion(drawn, share), dtype=torch.float64, device=users.device)
    chosen = keyed_choice(share.seed, users, items.view(-1, 1), pi.view(-1, 1)).view(-1)
    return dataclasses.replace(drawn, share_ranks=torch.where(chosen, eranks, torch.zeros_like(eranks)), inclusion=pi)
