"""Correction tables M^ for sampled metrics (Krichene & Rendle, KDD 2020, section 5).

A correction is a table of m + 1 numbers (index 0 is r~ = 1): the corrected metric of an evaluation
is the mean of M^[r~ - 1] over its relevant items. What a table is besides its metric, n and m is one object: the
registry's method object (``"bv"`` or ``registry.Bv(gamma=0.2, prior=("beta", 0.5))``, ``registry.Cls()``,
``registry.RankEstimate(rounding="linear")``, ``registry.Uncorrected()``) and the sampling law of the design
(``n_samples``: a :class:`~reco_sampled_plugin.design.SamplingDesign` of fixed m, or an int m: uniform with
replacement). Both are checked once and normalised into a hashable :class:`Correction` (the tables' cache key).
Methods:

``none``           M^(r~) = M(r~) on the m + 1 sampled candidates (the plain sampled metric).
``rank_estimate``  eq. 20: M^(r~) = M(1 + (n - 1)(r~ - 1)/m), ``rounding="floor"`` (the paper) or
                   ``"linear"`` (linear interpolation of M between integer ranks).
``ls``             eq. 21-23: minimal bias  sum_r p(r) (E[M^(r~) | r] - M(r))^2.  The design matrix
                   A[r, i] = sqrt(p(r)) P(r~ = i | r) has condition ~1e15 (n = 1e4, m = 99); we solve
                   the least-squares problem by SVD with a relative cut-off (LAPACK gelsd), so the
                   coefficients stay bounded and the bias is minimal to ~1e-12; never compare raw
                   ``ls`` coefficients, compare its bias.
``cls``            eq. 21 under M^[i] >= M^[i + 1]: a non-negative least-squares problem in the
                   differences d_i = M^[i] - M^[i + 1] >= 0 and a free last value (Lawson-Hanson NNLS).
``bv``             eq. 24-25: argmin bias^2 + gamma Var, i.e. ((1-gamma) A'A + gamma diag(c)) M^ = A'b with
                   c[i] = sum_r p(r) P(i | r). gamma = 1 is the posterior mean (eq. 26), computed in
                   closed form; gamma -> 0 tends to ``ls`` (gamma = 0 is ``ls``). Solved from these normal equations
                   by Cholesky (condition about 1/gamma under the uniform prior, more where some c_i are small),
                   or, where LAPACK estimates a condition above 1e5 (``BV_MIN_RCOND``), as the
                   stacked least-squares problem
                   [sqrt(1-gamma) R; sqrt(gamma c)] M^ = [y / sqrt(1-gamma); 0] (condition ~ sqrt(1/gamma)).

How the sums over r = 1..n are done (see quadrature.py): rows are real ranks r_k with weights w_k such
that sum_k w_k f(r_k) = sum_r p(r) f(r):

* uniform prior, metric polynomial on its support (recall, hit, precision, truncated precision are
  constant on r <= k, AUC is linear): one Gauss rule with m + 2 nodes on 1..k and one on k+1..n --
  exact at any n (agreement with the enumerated sum to ~1e-13 relative);
* uniform prior, AP / NDCG / RR (1/r or 1/log2(r + 1) on the support): composite rule (head enumerated,
  pieces [a, 2a) with m + 13 Gauss nodes each); measured relative error < 1e-10;
* Beta or callable prior: composite rules for everything (measured relative error < 1e-9);
* a vector prior, or n <= 4 (m + 2): every rank enumerated (exact).

The tall weighted system of ``ls``, ``cls`` (and ill-conditioned ``bv``) is compressed by a Householder QR to
(m + 1) rows before solving; tables are built on the CPU in float64 with numpy / scipy and cached
(``functools.lru_cache``) by (metric, n, m, :class:`Correction`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np
import scipy.linalg
import scipy.optimize
import torch

from . import registry
from ._blas import SMALL_SYSTEM, one_blas_thread
from ._checks import (MAX_ELEMENTS, check_required, check_device, check_elements, check_rank_values, check_ranks_in_range, check_sizes,
                      real_tensor)
from ._options import check_fraction, check_metric_names
from .design import SamplingDesign, as_design
from .metric_names import MetricSpec, parse_metric
from .metrics import metric_from_float_ranks
from ._types import TensorLike
from .priors import Prior, PriorLike, UniformPrior, as_prior
from .quadrature import EXTRA_NODES, composite_rule, gauss_rule, pmf_at_ranks
from .sampling_laws import check_law

if TYPE_CHECKING:
    from ._rank_hist import RankHistogram
    from ._estimate import EstimatorOutput
    from .rank_distribution import RankDistribution

__all__ = [
    "METHODS",
    "correction_table",
    "correction_tables",
    "design_rule",
    "expected_corrected",
    "table_bias",
    "clear_correction_cache",
    "tables_by_n",
]

#: the methods whose tables this module solves (the registry's entries with ``estimate_by_table`` use them)
METHODS = ("none", "rank_estimate", "ls", "cls", "bv")
# kinds whose M(r) is a polynomial of degree <= 1 in r on 1..k (constant, or linear for AUC)
_POLY_KINDS = frozenset({"recall", "hit", "precision", "trunc_precision", "auc"})
# singular values below this fraction of the largest are dropped by the ``ls`` solver
LS_RCOND = 1e-10
#: largest m of the tables that solve a system (``ls``, ``cls``, ``bv``): O(m^2) memory and O(m^3) time
#: (m = 1e4: ~1e12 flops, docs/corrections.md); a larger m is refused rather than tried
MAX_SOLVED_SAMPLES = 10_000
#: largest m of the lookup tables (``none``, ``rank_estimate``): (n - 1)(r~ - 1) exact in int64 for n <= 2^40
MAX_LOOKUP_SAMPLES = 1 << 20


def check_method(method: str) -> str:
    """``method`` if it names a correction table (:data:`METHODS`, the registry's names), else a ValueError
    naming ``method``."""
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method: unknown correction {method!r}; use one of {METHODS}")
    return method


@dataclass(frozen=True)
class Correction:
    """One correction besides its metric, n and m: the method of :data:`METHODS`, its settings and the sampling
    law, normalised so that a setting the table does not read shares the cache entry (``gamma`` only for ``bv``,
    ``bv`` at gamma = 0 is ``ls`` (eq. 25 is then eq. 22), ``prior`` only for ``ls`` / ``cls`` / ``bv``, ``rounding``
    only for ``rank_estimate``). Hashable (a :class:`~reco_sampled_plugin.priors.Prior` hashes by its key): the key of
    the table caches. Build it with :func:`as_correction` (a method object) or :func:`correction_from_options`."""

    method: str
    law: str
    gamma: float = 0.0
    prior: Prior = field(default_factory=UniformPrior)
    rounding: str = "floor"

    @property
    def solved(self) -> bool:
        """Whether the table solves a system (``ls``, ``cls``, ``bv``), not a lookup (``none``, ``rank_estimate``)."""
        return self.method in ("ls", "cls", "bv")


def correction_from_options(method: str, sampling: str, options: Mapping[str, Any]) -> Correction:
    """The :class:`Correction` of a method name, a sampling law and the method's options as the registry's compute
    functions receive them (``gamma``, ``prior``, ``rounding``; None or absent: the default), each checked."""
    name = check_method(method)
    law = check_law(sampling)
    if name == "none":
        return Correction(name, law)
    if name == "rank_estimate":
        rounding = options.get("rounding") or "floor"
        if not isinstance(rounding, str) or rounding not in ("floor", "linear"):
            raise ValueError(f"rounding: use 'floor' or 'linear', got {rounding!r}")
        return Correction(name, law, rounding=rounding)
    gamma = 0.0
    if name == "bv":
        gamma = check_fraction(0.1 if options.get("gamma") is None else options["gamma"], "gamma")
        name = "bv" if gamma > 0.0 else "ls"  # eq. 25 at gamma = 0 is eq. 22
    return Correction(name, law, gamma, as_prior(options.get("prior")))


def as_correction(method: str | registry.Method, n_samples: SamplingDesign | int) -> tuple[Correction, int]:
    """The :class:`Correction` and m of a correction method (a name of :data:`METHODS` with its defaults, or the
    registry's method object: ``registry.Bv(gamma=0.2)``) under the design ``n_samples`` (a fixed-m
    :class:`~reco_sampled_plugin.design.SamplingDesign` of uniform draws, or an int m).

    Raises:
        ValueError: naming ``method`` (not a correction table, or options of ``estimate`` only: pooling of n,
            a top shape) or ``n_samples`` (an adaptive or popularity design, a bad m).
    """
    obj = correction_method(method)
    design = fixed_design(n_samples)
    return correction_from_options(obj.name, design.law, obj.options()), design.n_samples


def correction_method(method: str | registry.Method) -> registry.Method:
    """``method`` as the registry's method object of a correction table (a name of :data:`METHODS`: its class with
    the defaults), else a ValueError naming ``method``: another estimator, or ``estimate()``'s own options set
    (``max_rel_n_spread``, ``top_shape``)."""
    if isinstance(method, str):
        check_method(method)
    obj = registry.as_method(method)
    check_method(obj.name)
    given = [k for k in registry.COMMON_OPTIONS if getattr(obj, k) is not None]
    if given:
        raise ValueError(f"method: {given[0]} is an option of estimate(), not of a correction table (one table "
                         "per n, under the design's law)")
    return obj


def fixed_design(n_samples: SamplingDesign | int) -> SamplingDesign:
    """``n_samples`` as a design of a fixed m drawn uniformly (with or without replacement), else a ValueError
    naming ``n_samples``."""
    design = as_design(check_required(n_samples, "n_samples", "an int m or a SamplingDesign"), name="n_samples")
    if design.adaptive_max is not None or design.popularity is not None:
        raise ValueError(f"n_samples: a correction table is for a fixed m drawn uniformly, got {design.describe()}; "
                         "estimate() corrects adaptive and popularity designs")
    return design


def _check_sizes(spec: MetricSpec, n_items: Any, n_samples: Any, law: str, method: str | None = None) -> tuple[int, int]:
    """n and m of one table: n in 2..MAX_SIZE; m >= 1 and at most MAX_SOLVED_SAMPLES for the methods that
    solve a system (``ls``, ``cls``, ``bv``; ``method=None``: the same bound), MAX_LOOKUP_SAMPLES for
    ``none`` / ``rank_estimate`` (one entry per r~)."""
    n = check_sizes(n_items, "n_items", 2, one=True)
    m_max = MAX_LOOKUP_SAMPLES if method in ("none", "rank_estimate") else MAX_SOLVED_SAMPLES
    m = check_sizes(n_samples, "n_samples", 1, one=True, maximum=None)
    if m > m_max:
        why = (
            "the documented limit of the ls / cls / bv tables: they need O(m^2) memory and O(m^3) time"
            if m_max == MAX_SOLVED_SAMPLES else "so that (n - 1)(r~ - 1) stays exact in int64"
        )
        raise ValueError(f"n_samples: m = {m} is above {m_max}, {why}")
    if law == "hypergeometric" and m >= n:
        raise ValueError(
            f"n_samples: m = {m} draws without replacement need m < n_items = {n} "
            "(at most n_items - 1 irrelevant candidates exist)"
        )
    if spec.k is not None and spec.k > n:
        raise ValueError(f"metric: k = {spec.k} is larger than the candidate list (n_items = {n})")
    return n, m


def _metric(spec: MetricSpec, r: np.ndarray, n: float) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(r, dtype=np.float64))
    return metric_from_float_ranks(spec, t, torch.tensor(float(n), dtype=torch.float64)).numpy()


def design_rule(spec: MetricSpec, n: int, m: int, prior: Prior) -> tuple[np.ndarray, np.ndarray]:
    """Real ranks r_k and weights w_k with sum_k w_k f(r_k) = sum_{r=1}^n p(r) f(r) for the integrands
    of eq. 21-26 (exact or with the measured error stated in the module docstring)."""
    k_poly, k_smooth = m + 2, m + 1 + EXTRA_NODES
    enumerable = prior.density(np.ones(1), n) is None
    if enumerable or n <= 4 * (m + 2):
        return np.arange(1, n + 1, dtype=np.float64), np.asarray(prior.weights(n), dtype=np.float64)
    kc = n if spec.k is None else min(spec.k, n)
    if prior.is_uniform:
        head = gauss_rule(1, kc, k_poly) if spec.kind in _POLY_KINDS else composite_rule(1, kc, k_smooth)
        tail = gauss_rule(kc + 1, n, k_poly)  # M = 0 there: P P' has degree 2m, exact
        r = np.concatenate([head[0], tail[0]])
        return r, np.concatenate([head[1], tail[1]]) / n
    head = composite_rule(1, kc, k_smooth)
    tail = composite_rule(kc + 1, n, k_smooth)
    r = np.concatenate([head[0], tail[0]])
    w = np.concatenate([head[1], tail[1]]) * prior.density(r, n)
    total = float(w.sum())
    if not (math.isfinite(total) and total > 0):  # a zero prior would reach LAPACK as NaN (a LinAlgError)
        raise ValueError(f"prior: its weights over the ranks 1..{n} sum to {total:g}; a prior needs a finite "
                         "positive total")
    return r, w / total


def _fill_missing(x: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Fill entries where ``ok`` is False by interpolating the others (0 if none is ok)."""
    if ok.all():
        return x
    if not ok.any():
        return np.zeros_like(x)
    idx = np.arange(x.size)
    return np.interp(idx, idx[ok], x[ok])


def _rank_estimate(spec: MetricSpec, n: int, m: int, rounding: str) -> np.ndarray:
    i = np.arange(m + 1, dtype=np.int64)  # r~ - 1
    num = (n - 1) * i  # exact in int64 (n <= 2^40, m <= 2^20)
    if rounding == "floor":
        return _metric(spec, 1.0 + (num // m), n)
    lo = 1 + num // m
    frac = (num % m) / m
    hi = np.minimum(lo + 1, n)
    return _metric(spec, lo.astype(np.float64), n) * (1 - frac) + _metric(spec, hi.astype(np.float64), n) * frac


def _check_system(rows: int, m: int) -> None:
    """The (rows x (m + 1)) system P(r~ | r) of a solved table against the one bound on arrays that grow with n or
    m (``_checks.MAX_ELEMENTS``), counting the four copies that live at once (the pmf, its weighted copy, [A b] and
    the QR's work array): a ValueError naming ``n_samples`` before allocating."""
    check_elements(4 * rows * (m + 1), "n_samples",
                   f"the system P(r~ | r) of a correction table (4 working copies of {rows} rank nodes x m + 1 = "
                   f"{m + 1}; a vector prior enumerates every rank)")


def _weighted_system(spec: MetricSpec, n: int, m: int, law: str, prior: Prior) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r, w = design_rule(spec, n, m, prior)
    _check_system(r.size, m)
    p = pmf_at_ranks(r, n, m, law)
    mv = _metric(spec, r, n)
    return p, w, mv


def _compress(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """R, y with ||R x - y||^2 = ||A x - b||^2 - const (Householder QR of [A b])."""
    cols = a.shape[1]
    if a.shape[0] <= 2 * cols:
        return a, b
    r_aug = scipy.linalg.qr(np.column_stack([a, b]), mode="r", overwrite_a=True, check_finite=False)[0]
    return r_aug[:cols, :cols], r_aug[:cols, cols]


def _svd_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Truncated-SVD least squares (singular values < LS_RCOND * max dropped): bounded coefficients."""
    try:
        return scipy.linalg.lstsq(a, b, cond=LS_RCOND, lapack_driver="gelsd", check_finite=False)[0]
    except np.linalg.LinAlgError:  # divide-and-conquer SVD can fail to converge on such matrices
        return scipy.linalg.lstsq(a, b, cond=LS_RCOND, lapack_driver="gelss", check_finite=False)[0]


def _solve_cls(r_mat: np.ndarray, y: np.ndarray) -> np.ndarray:
    m1 = r_mat.shape[1]
    z = np.cumsum(r_mat, axis=1)  # column j: sum_{i <= j} R[:, i]
    last = z[:, -1:]
    design = np.hstack([z[:, :-1], last, -last])
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    sol, _ = scipy.optimize.nnls(design / scale, y, maxiter=50 * m1)
    sol = sol / scale
    d = np.concatenate([sol[: m1 - 1], [sol[m1 - 1] - sol[m1]]])
    return np.cumsum(d[::-1])[::-1]  # x_i = sum_{j >= i} d_j


#: eq. 25 is solved from its normal equations where LAPACK's estimate of their reciprocal condition (``dpocon``, 1-norm)
#: is at least this, else by the stacked least squares (pivoted QR). Measured over n = 30..1e6, m = 10..500, gamma =
#: 1e-13..0.99, both laws, uniform and Beta priors (2,112 systems): the accepted ones agree with the QR solution to
#: 2.5e-12 relative (1e-6 would accept solutions 1e-10 apart); the uniform prior at gamma = 0.1 has ~0.08
BV_MIN_RCOND = 1e-5


def _bv_normal(p: np.ndarray, w: np.ndarray, mv: np.ndarray, c: np.ndarray, gamma: float) -> np.ndarray | None:
    """Eq. 25, ((1 - gamma) A'A + gamma diag(c)) M^ = A'b with A = sqrt(w) P, b = sqrt(w) M, by Cholesky; None
    where the system is too ill-conditioned for the normal equations (reciprocal condition below ``BV_MIN_RCOND``:
    small gamma, or a prior that leaves some c_i near 0). Refused first, before the O(rows m^2) product, where the
    diagonal alone shows it (O(rows m)): for a positive definite N, rcond_1(N) <= min_i N_ii / max_i N_ii (lambda_min
    <= min N_ii, ||N||_1 >= max N_ii), so a diagonal ratio below ``BV_MIN_RCOND`` means the true condition fails the
    test too (``bv_mle``'s fitted priors, which leave sampled ranks almost unreachable, mostly end here)."""
    cc = np.clip(c, 0.0, None)
    diag = (1.0 - gamma) * np.einsum("r,rk,rk->k", w, p, p) + gamma * cc  # no (rows, m + 1) temporary
    if not float(diag.min()) >= BV_MIN_RCOND * float(diag.max()):
        return None
    wp = w[:, None] * p
    normal = (1.0 - gamma) * (p.T @ wp)
    normal[np.diag_indices_from(normal)] += gamma * cc
    norm1 = float(np.abs(normal).sum(axis=0).max())
    try:
        factor = scipy.linalg.cholesky(normal, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return None
    rcond, info = scipy.linalg.lapack.dpocon(factor, norm1, uplo="L")
    if info != 0 or not rcond >= BV_MIN_RCOND:
        return None
    return scipy.linalg.cho_solve((factor, True), wp.T @ mv, check_finite=False)


def _posterior_mean(c: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Eq. 26, M^[i] = h[i] / c[i] (h = sum_r p(r) P(i | r) M(r), c = sum_r p(r) P(i | r)); entries no rank reaches
    (c = 0) interpolated from their neighbours."""
    ok = c > 1e-300
    return _fill_missing(np.where(ok, h / np.where(ok, c, 1.0), 0.0), ok)


def _solve(spec: MetricSpec, n: int, m: int, corr: Correction) -> np.ndarray:
    """The table of ``ls``, ``cls`` or ``bv`` (module docstring)."""
    method, gamma, law = corr.method, corr.gamma, corr.law
    if method == "bv" and gamma == 1.0:  # eq. 26, posterior mean; rows in chunks (m up to 1e4)
        r, w = design_rule(spec, n, m, corr.prior)
        mv = _metric(spec, r, n)
        c, h = np.zeros(m + 1), np.zeros(m + 1)
        step = max(1, (1 << 22) // (m + 1))
        for s in range(0, r.size, step):  # bounded memory; each chunk vectorised
            p = pmf_at_ranks(r[s : s + step], n, m, law)
            c += w[s : s + step] @ p
            h += (w[s : s + step] * mv[s : s + step]) @ p
        return _posterior_mean(c, h)
    p, w, mv = _weighted_system(spec, n, m, law, corr.prior)
    c = w @ p  # c[i] = sum_r p(r) P(i | r)
    if method == "bv":  # 0 < gamma < 1: eq. 25 by Cholesky where well conditioned
        x = _bv_normal(p, w, mv, c, gamma)
        if x is not None:
            return x
    sw = np.sqrt(w)
    r_mat, y = _compress(sw[:, None] * p, sw * mv)
    if method == "ls":
        return _svd_lstsq(r_mat, y)
    if method == "cls":
        return _solve_cls(r_mat, y)
    # bv, 0 <= gamma < 1: stacked least squares (eq. 25 are its normal equations)
    s = np.sqrt(1.0 - gamma)
    stacked = np.vstack([s * r_mat, np.diag(np.sqrt(gamma * np.clip(c, 0.0, None)))])
    rhs = np.concatenate([y / s, np.zeros(m + 1)])
    # well conditioned (~ sqrt(1/gamma)): pivoted QR is enough
    return scipy.linalg.lstsq(stacked, rhs, lapack_driver="gelsy", check_finite=False)[0]


@lru_cache(maxsize=2048)
def _table(spec: MetricSpec, n: int, m: int, corr: Correction) -> np.ndarray:
    if corr.method == "none":
        table = _metric(spec, np.arange(1, m + 2, dtype=np.float64), m + 1)
    elif corr.method == "rank_estimate":
        table = _rank_estimate(spec, n, m, corr.rounding)
    else:
        with one_blas_thread(m + 1 <= SMALL_SYSTEM):  # small systems: BLAS's threads cost more than they save
            table = _solve(spec, n, m, corr)
    table = np.ascontiguousarray(table, dtype=np.float64)
    if not np.all(np.isfinite(table)):  # pragma: no cover - guarded by construction and tests
        raise FloatingPointError(f"correction table for {spec} (n={n}, m={m}, {corr.method}) is not finite")
    table.setflags(write=False)
    return table


def clear_correction_cache() -> None:
    """Drop every cached correction table."""
    _table.cache_clear()
    _stacked.cache_clear()
    _tables_shared.cache_clear()


def table_array(metric: str | MetricSpec, n_items: Any, n_samples: Any, corr: Correction) -> np.ndarray:
    """The table of one (n, m) (float64, read-only, cached), ``n_items`` and ``n_samples`` checked for ``corr``
    (:func:`_check_sizes`; a vector prior's length against n)."""
    spec = parse_metric(metric)
    n, m = _check_sizes(spec, n_items, n_samples, corr.law, corr.method)
    as_prior(corr.prior, n)  # a vector prior's length against n
    return _table(spec, n, m, corr)


def stacked_tables(spec: MetricSpec, n_items: np.ndarray, n_samples: np.ndarray, corr: Correction) -> np.ndarray:
    """The tables of every (n, m) group (``n_items[g]``, ``n_samples[g]``) concatenated in group order
    (float64, read-only): what an estimator dots with a histogram's concatenated counts. Many distinct n
    cost a bounded number of solves (:func:`tables_by_n`). Cached as a whole, so a repeated evaluation (same groups
    every epoch) costs one lookup instead of one per group."""
    return _stacked(spec, tuple(int(v) for v in n_items), tuple(int(v) for v in n_samples), corr)


@lru_cache(maxsize=256)
def _stacked(spec: MetricSpec, n: tuple, m: tuple, corr: Correction) -> np.ndarray:
    n_arr, m_arr = np.asarray(n, dtype=np.int64), np.asarray(m, dtype=np.int64)
    out = np.empty(int((m_arr + 1).sum()))
    starts = np.cumsum(m_arr + 1) - (m_arr + 1)  # each group's first entry in the concatenation
    for mv in np.unique(m_arr).tolist():  # one table family per sample size (adaptive designs: a few)
        idx = np.flatnonzero(m_arr == mv)
        uniq, inv = np.unique(n_arr[idx], return_inverse=True)
        tabs = tables_by_n(spec, uniq, mv, corr)
        out[starts[idx][:, None] + np.arange(mv + 1)] = tabs[inv]
    out.setflags(write=False)
    return out


def tables_by_n(metric: str | MetricSpec, n_items: np.ndarray, n_samples: int, corr: Correction) -> np.ndarray:
    """Tables of one m for many candidate counts: float64 (len(n_items), m + 1), row i for ``n_items[i]``.

    Same values as :func:`table_array` row by row, at a cost that does not grow with the number of distinct
    n: ``none`` is one table, ``rank_estimate`` one vectorised formula, ``cls`` / ``bv`` tables are built at
    Chebyshev points in 1/(n - 1) and interpolated, every interpolant verified against exact tables between
    its nodes to 1e-10 (``_over_n.tables_over_n``; pieces that fail are built exactly), ``ls`` (truncated SVD:
    its tables are not continuous in n) exactly for each distinct n. A vector prior has one n (its length).
    """
    from ._over_n import tables_over_n

    spec = parse_metric(metric)
    ns = np.asarray(n_items, dtype=np.int64).reshape(-1)
    if ns.size == 0:
        return np.empty((0, int(n_samples) + 1))
    uniq, inv = np.unique(ns, return_inverse=True)
    # validity (n >= 2, m < n without replacement, k <= n, n at most MAX_SIZE) is monotone in n: check the ends
    table_array(spec, int(uniq[-1]), n_samples, corr)
    first = table_array(spec, int(uniq[0]), n_samples, corr)
    m = first.size - 1
    if uniq.size == 1 or corr.method == "none":
        out = np.broadcast_to(first, (uniq.size, m + 1))
    elif corr.method == "rank_estimate":
        out = _rank_estimate_rows(spec, uniq, m, corr.rounding)
    else:
        out, _ = tables_over_n(lambda n: table_array(spec, n, m, corr), uniq, interpolate=corr.method != "ls")
    return np.ascontiguousarray(out[inv])


def _rank_estimate_rows(spec: MetricSpec, ns: np.ndarray, m: int, rounding: str) -> np.ndarray:
    """Eq. 20 for many n at once: (len(ns), m + 1)."""
    i = np.arange(m + 1, dtype=np.int64)[None, :]
    num = (ns[:, None] - 1) * i  # exact in int64 (n <= 2^40, m <= 2^20)
    n_col = ns[:, None].astype(np.float64)
    lo = 1 + num // m
    if rounding == "floor":
        return _metric_rows(spec, lo.astype(np.float64), n_col)
    frac = (num % m) / m
    hi = np.minimum(lo + 1, ns[:, None])
    return _metric_rows(spec, lo.astype(np.float64), n_col) * (1 - frac) + _metric_rows(spec, hi.astype(np.float64), n_col) * frac


def _metric_rows(spec: MetricSpec, r: np.ndarray, n: np.ndarray) -> np.ndarray:
    return metric_from_float_ranks(spec, torch.from_numpy(np.ascontiguousarray(r)), torch.from_numpy(np.ascontiguousarray(n))).numpy()


def correction_table(
    metric: str | MetricSpec,
    n_items: int,
    n_samples: SamplingDesign | int,
    method: str | registry.Method = registry.DEFAULT_CORRECTION,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The correction table M^ (float64, length m + 1, index 0 is r~ = 1) of section 5.

    Args:
        metric: metric name (``"recall@10"``, ``"ndcg@10"``, ``"ap"``, ``"auc"``, ...), M of section 3.1.
        n_items: n, candidates per instance (the relevant item included).
        n_samples: the design: an int m (sampled irrelevant items per relevant item, drawn uniformly with
            replacement: the binomial law; r~ is in 1..m+1) or a fixed-m
            :class:`~reco_sampled_plugin.design.SamplingDesign` (``replacement=False``: the hypergeometric law).
        method: the correction, a name of :data:`METHODS` (its defaults) or the registry's method object:
            ``registry.Uncorrected()``, ``RankEstimate(rounding="floor" | "linear")`` (eq. 20), ``Ls(prior=...)``
            (eq. 21-23), ``Cls(prior=...)`` (monotone), ``Bv(gamma=0.1, prior=...)`` (eq. 24-25; gamma = 1 is the
            posterior mean, eq. 26). A prior p(r) is None (uniform), a :class:`~reco_sampled_plugin.priors.Prior`,
            ``("beta", a)``, a vector of length n (summing to 1) or a callable ``fn(r, n)``.
        device: where the returned tensor lives (tables are built on the CPU and cached).

    Raises:
        ValueError: naming the argument: unknown metric or method, gamma outside [0, 1], m >= n without
            replacement, a cut-off k > n, a bad prior (length, negative, not summing to one).
    """
    device = check_device(device)
    corr, m = as_correction(method, n_samples)
    return torch.tensor(table_array(metric, n_items, m, corr), dtype=torch.float64, device=device)


# ------------------------------------------------------------------------------ many metrics at once
@lru_cache(maxsize=16)
def _enumerated_pmf(n: int, m: int, law: str) -> np.ndarray:
    """P(r~ | r) for r = 1..n (read-only, cached: shared by every metric, method and prior)."""
    p = pmf_at_ranks(np.arange(1, n + 1, dtype=np.float64), n, m, law)
    p.setflags(write=False)
    return p


def _shared_rule(specs: tuple[MetricSpec, ...], n: int, m: int, prior: Prior) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """One rule (r, w, pmf) exact for every metric of ``specs`` at once, or None when there is none cheaply.

    Enumerated ranks when ``design_rule`` would enumerate (vector prior, n <= 4 (m + 2)); for the uniform
    prior and cut-off metrics, ranks 1..K_max enumerated plus one Gauss rule with m + 2 nodes on
    K_max + 1..n (every M is 0 there, so the rule is exact as in ``design_rule``)."""
    law_free = prior.density(np.ones(1), n) is None or n <= 4 * (m + 2)
    if law_free:
        return np.arange(1, n + 1, dtype=np.float64), np.asarray(prior.weights(n), dtype=np.float64), True
    if prior.is_uniform and all(sp.k is not None for sp in specs):
        k_max = min(max(sp.k for sp in specs if sp.k is not None), n)  # every k is set here
        head = np.arange(1, k_max + 1, dtype=np.float64)
        tail = gauss_rule(k_max + 1, n, m + 2)
        r = np.concatenate([head, tail[0]])
        return r, np.concatenate([np.ones(k_max), tail[1]]) / n, False
    return None


@lru_cache(maxsize=256)
def _tables_shared(specs: tuple[MetricSpec, ...], n: int, m: int, corr: Correction) -> np.ndarray | None:
    """The tables of ``specs`` (one row each) from one rule, one pmf matrix and one factorisation, or None where no
    rule serves them all (:func:`_shared_rule`)."""
    method, gamma, law = corr.method, corr.gamma, corr.law
    rule = _shared_rule(specs, n, m, corr.prior)
    if rule is None:
        return None
    r, w, enumerated = rule
    _check_system(r.size, m)
    p = _enumerated_pmf(n, m, law) if enumerated else pmf_at_ranks(r, n, m, law)
    mv = np.stack([_metric(sp, r, n) for sp in specs], axis=1)  # (rows, S)
    if method == "bv" and gamma == 1.0:  # eq. 26 for every metric: posterior means
        c = w @ p
        h = (w[:, None] * mv).T @ p
        return np.stack([_posterior_mean(c, hh) for hh in h])
    c = w @ p
    cols = m + 1
    if method == "bv":
        # normal equations ((1 - gamma) A'WA + gamma diag(c)) X = A'W M, Jacobi-scaled and solved by Cholesky:
        # (A'WA)_ii <= c_i (pmf values <= 1) and the matrix is >= gamma diag(c), so after scaling its
        # condition number is at most (m + 1)/gamma (5e3 at m = 500, gamma = 0.1): stable, and one Gram
        # matrix (rows x (m+1)^2 / 2 flops) is several times cheaper than a QR of [A B]
        wp = w[:, None] * p
        gram = (1.0 - gamma) * (p.T @ wp)
        gram[np.diag_indices(cols)] += gamma * np.clip(c, 0.0, None)
        rhs = wp.T @ mv  # the normal equations of the stacked problem in _solve
        d = np.sqrt(np.clip(np.diag(gram), 1e-300, None))
        scaled = gram / d[:, None] / d[None, :]
        try:
            x = scipy.linalg.cho_solve(scipy.linalg.cho_factor(scaled, check_finite=False), rhs / d[:, None], check_finite=False)
        except np.linalg.LinAlgError:  # pragma: no cover - positive definite by construction (gamma > 0)
            x = scipy.linalg.lstsq(scaled, rhs / d[:, None], check_finite=False)[0]
        return (x / d[:, None]).T
    sw = np.sqrt(w)
    a = sw[:, None] * p
    b = sw[:, None] * mv
    if a.shape[0] > 2 * (cols + len(specs)):  # Householder QR of [A B]: R and Q'B share one factorisation
        r_aug = scipy.linalg.qr(np.hstack([a, b]), mode="r", overwrite_a=True, check_finite=False)[0]
        r_mat, y = r_aug[:cols, :cols], r_aug[:cols, cols:]
    else:
        r_mat, y = a, b
    if method == "ls":
        return _svd_lstsq(r_mat, y).T
    return np.stack([_solve_cls(r_mat, y[:, j]) for j in range(y.shape[1])])  # cls


def correction_tables(
    metrics: str | MetricSpec | Iterable[str | MetricSpec],
    n_items: int,
    n_samples: SamplingDesign | int,
    method: str | registry.Method = registry.DEFAULT_CORRECTION,
) -> np.ndarray:
    """Correction tables of several metrics at once: float64 array (len(metrics), m + 1), row s for metrics[s];
    ``n_samples`` and ``method`` as in :func:`correction_table`.

    Same values as :func:`correction_table` per metric (agreement to ~1e-10, tested), but ``ls``, ``cls`` and
    ``bv`` share one quadrature rule, one pmf matrix and one factorisation across the metrics when they can
    (``bv``, 0 < gamma < 1: Jacobi-scaled normal equations, condition number <= (m + 1)/gamma)
    (cut-off metrics under the uniform prior, or any metrics when the ranks are enumerated: vector prior or
    n <= 4 (m + 2)); e.g. HR@K and NDCG@K for K = 1..50 cost about as much as one table. Cached by arguments.
    """
    specs = check_metric_names(metrics)
    corr, m = as_correction(method, n_samples)
    for sp in specs:
        n, m = _check_sizes(sp, n_items, m, corr.law, corr.method)
    if corr.solved:
        as_prior(corr.prior, n)  # a vector prior's length against n
        out = _tables_shared(specs, n, m, corr)
        if out is not None:
            out = np.ascontiguousarray(out, dtype=np.float64)
            if not np.all(np.isfinite(out)):  # pragma: no cover - guarded by construction and tests
                raise FloatingPointError(f"correction tables (n={n}, m={m}, {corr.method}) are not finite")
            return out
    return np.stack([table_array(sp, n, m, corr) for sp in specs])


def tables_for_counts(metric: str | MetricSpec, n_items: torch.Tensor, n_samples: int,
                      corr: Correction) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables for every distinct candidate count: returns (tables U x (m+1) float64 CPU tensor, inverse)."""
    n_flat = n_items.reshape(-1).to("cpu", torch.int64)
    uniq, inverse = torch.unique(n_flat, return_inverse=True)
    rows = tables_by_n(metric, uniq.numpy(), n_samples, corr)
    return torch.from_numpy(rows), inverse


def expected_corrected(
    metric: str | MetricSpec,
    exact_ranks: TensorLike,
    n_items: TensorLike,
    n_samples: SamplingDesign | int,
    method: str | registry.Method = registry.DEFAULT_CORRECTION,
) -> torch.Tensor:
    """E[M^(r~) | r] for every exact rank (float64, shaped like ``exact_ranks``; CPU computation): the mean of
    ``method``'s table over the sampled rank's law under the design ``n_samples`` (both as in
    :func:`correction_table`).

    ``n_items`` is an int or a tensor of per-instance candidate counts broadcastable against the ranks.
    """
    from .sampling_laws import log_sampled_rank_pmf_unbounded

    r = check_rank_values(exact_ranks, "exact_ranks").to("cpu")
    n = check_sizes(n_items, "n_items", 2, like=r, like_name="exact_ranks")
    r, n = torch.broadcast_tensors(r, torch.as_tensor(n, dtype=torch.int64))
    corr, m = as_correction(method, n_samples)
    check_ranks_in_range(r, n, "exact_ranks")
    if r.numel() == 0:  # an empty batch: no values; the metric is still checked
        parse_metric(metric)
        return torch.empty(r.shape, dtype=torch.float64)
    tables, _ = tables_for_counts(metric, n, m, corr)
    pairs = torch.stack([r.reshape(-1).to(torch.float64), n.reshape(-1).to(torch.float64)], dim=1)
    uniq, inv_pairs = torch.unique(pairs, dim=0, return_inverse=True)
    n_uniq = uniq[:, 1].to(torch.int64)
    t_idx = torch.searchsorted(torch.unique(n.reshape(-1)), n_uniq)
    out = torch.empty(uniq.shape[0], dtype=torch.float64)
    chunk = max(1, (1 << 22) // (m + 1))
    for s in range(0, uniq.shape[0], chunk):  # bounded memory; each chunk vectorised
        sl = slice(s, s + chunk)
        pmf = log_sampled_rank_pmf_unbounded(uniq[sl, 0], uniq[sl, 1], m, corr.law).exp()
        out[sl] = (pmf * tables[t_idx[sl]]).sum(dim=1)
    return out[inv_pairs].reshape(r.shape)


def table_bias(table: TensorLike, metric: str | MetricSpec, n_items: int, n_samples: SamplingDesign | int,
               prior: PriorLike = None) -> float:
    """Prior-weighted squared bias sum_r p(r) (E[M^(r~) | r] - M(r))^2 of a table (objective of eq. 21) under the
    design ``n_samples`` (an int m or a fixed-m uniform :class:`~reco_sampled_plugin.design.SamplingDesign`); ``prior``
    as the methods' (None: uniform)."""
    spec = parse_metric(metric)
    design = fixed_design(n_samples)
    n, m = _check_sizes(spec, n_items, design.n_samples, design.law)
    x = real_tensor(table, "table", "the m + 1 values of a correction table").to(torch.float64).cpu().numpy()
    if x.shape != (m + 1,):
        raise ValueError(f"table: expected length m + 1 = {m + 1}, got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("table: contains NaN or inf")
    p, w, mv = _weighted_system(spec, n, m, design.law, as_prior(prior, n))
    return float(w @ (p @ x - mv) ** 2)


# ------------------------------------------------------------------------------ the registry's compute functions
# vector priors up to this many ranks (the corrections enumerate them exactly); a callable beyond
VECTOR_PRIOR_MAX = 2_000_000


def table_estimate(hist: RankHistogram, values: np.ndarray) -> tuple[float, float]:
    """Mean of the per-positive table values T_g[r~] and its standard error, over all groups at once
    (``values``: the groups' tables concatenated in group order)."""
    total = hist.total
    counts = hist.flat_counts
    value = float(counts @ values) / total
    ss = float(counts @ (values - value) ** 2)
    return value, (math.sqrt(ss / (total * (total - 1.0))) if total > 1 else math.inf)


def _resolution_flags(spec: MetricSpec, hist: RankHistogram, se: float) -> tuple[list, float]:
    """``top_unresolved`` where a cut-off lies inside the first sampled bin of a group with positives at r~ = 1
    (``all_at_top`` and stderr inf when every positive is there)."""
    flags: list[str] = []
    resolution = (hist.n_items - 1.0) / (hist.n_samples + 1.0) + 1.0
    at_top = hist.top_counts > 0  # groups with positives at r~ = 1
    if spec.k is not None and np.any(spec.k < resolution[at_top]):
        flags.append("top_unresolved")
        if hist.all_at_top():
            flags.append("all_at_top")
            se = math.inf
    return flags, se


def _estimate_output(value: float, se: float, hist: RankHistogram, details: dict, flags: Iterable[str]) -> EstimatorOutput:
    from ._estimate import EstimatorOutput

    return EstimatorOutput(value, se, hist.total, details, tuple(flags))


def estimate_by_table(spec: MetricSpec, hist: RankHistogram, *, method: str, sampling: str, options: dict) -> EstimatorOutput:
    """The registry's compute function of the correction tables (``none``, ``rank_estimate``, ``ls``, ``cls``,
    ``bv``): each group's table (cached) dotted with its counts; ``options``: gamma, prior, rounding."""
    values = stacked_tables(spec, hist.n_items, hist.n_samples, correction_from_options(method, sampling, options))
    value, se = table_estimate(hist, values)
    flags, se = _resolution_flags(spec, hist, se)
    gamma = (0.1 if options.get("gamma") is None else options["gamma"]) if method == "bv" else None
    details = {"method": method, "metric": str(spec), "gamma": gamma}
    if method != "none":  # the plain sampled metric's interval is the sampled metric's (flag uncorrected)
        details["table_bias"] = plug_in_bias(spec, hist, correction_from_options(method, sampling, options),
                                             lambda: _bias_fit(hist, sampling))
    return _estimate_output(value, se, hist, details, flags)


#: The fit whose rank distribution :func:`plug_in_bias` weighs a table's bias with: ``mes`` (smooth in log rank, so
#: its mass around a cut-off moves little between draws), no bootstrap.
BIAS_FIT = registry.Mes(n_bootstrap=0)


def _bias_fit(hist: RankHistogram, sampling: str) -> "RankDistribution":
    """:data:`BIAS_FIT` on ``hist`` (cached with the histogram)."""
    from .rank_distribution import fit_rank_distribution

    return fit_rank_distribution(hist, BIAS_FIT, sampling=sampling)


def _mle_fit(hist: RankHistogram, sampling: str, fit: Mapping[str, Any]) -> "RankDistribution":
    """The ``mle`` rank distribution of ``hist`` without bootstrap (``fit``: its options), cached with the histogram."""
    from .registry import Mle
    from .rank_distribution import fit_rank_distribution

    return fit_rank_distribution(hist, Mle(**{"n_bootstrap": 0, **fit}), sampling=sampling)


def _fitted_prior(dist: "RankDistribution", n: int, m: int) -> PriorLike:
    """``dist`` as the prior of an (n, m) table: a vector (enumerated exactly) while its system fits the bound of
    :func:`_check_system`, a callable beyond."""
    small = n <= VECTOR_PRIOR_MAX and 4 * n * (m + 1) <= MAX_ELEMENTS
    return dist.prior(n) if small else dist.as_prior()


#: A table whose bias E[T(r~) | r] - M(r) is below this at every rank (relative to the metric's largest value) is
#: unbiased whatever the rank distribution (``cls`` and ``bv`` for AUC, whose M is linear in r): no fit is needed.
UNBIASED_TOL = 1e-9


def _unbiased_everywhere(spec: MetricSpec, n: int, m: int, law: str, table: np.ndarray) -> bool:
    """Whether the (n, m) table has no bias at any rank: E[T(r~) | r] - M(r) is a polynomial of degree m in r
    wherever M is (:func:`design_rule`'s uniform rule, exact for such polynomials, checks it at its nodes); a
    metric that is not polynomial on its support (NDCG, AP, RR) is never taken as unbiased here."""
    if spec.kind not in ("auc", "hit", "recall", "precision"):
        return False
    p, _, mv = _weighted_system(spec, n, m, law, UniformPrior())
    scale = max(float(np.max(np.abs(mv))), 1e-300)
    return bool(np.max(np.abs(p @ table - mv)) <= UNBIASED_TOL * scale)


def plug_in_bias(spec: MetricSpec, hist: RankHistogram, corr: Correction,
                 fit: Callable[[], "RankDistribution"]) -> float:
    """The bias of a table estimate under a fitted rank distribution P^ (``fit()``, called only where a group's
    table is biased at some rank): sum over groups g of their share of the positives times sum_r P^(r)
    (E[T_g(r~) | r] - M(r)) (the prior-weighted bias of eq. 21, signed, with P^ as the prior), on the groups pooled
    onto a 10% grid of n (``pool_by_n``) and summed by the composite quadrature of a callable prior
    (:func:`design_rule`). A correction table trades bias for variance (eq. 24-25) and its standard error measures
    the variance only: this is the shift ``Estimate.interval`` widens by (Armstrong & Kolesar's bias-aware ends),
    estimated with a fit of the same data (:data:`BIAS_FIT`); 0 where every table is unbiased at every rank."""
    from ._rank_hist import pool_by_n

    pooled = pool_by_n(hist, 0.1)
    values = stacked_tables(spec, pooled.n_items, pooled.n_samples, corr)
    tables = np.split(values, np.cumsum(pooled.n_samples + 1)[:-1])
    if all(_unbiased_everywhere(spec, int(n), int(m), corr.law, t)
           for n, m, t in zip(pooled.n_items.tolist(), pooled.n_samples.tolist(), tables)):
        return 0.0
    prior = fit().as_prior()
    total, at = 0.0, 0
    for g, (n, m) in enumerate(zip(pooled.n_items.tolist(), pooled.n_samples.tolist())):
        n, m = int(n), int(m)
        table = values[at: at + m + 1]
        at += m + 1
        if pooled.totals[g] > 0:
            p, w, mv = _weighted_system(spec, n, m, corr.law, as_prior(prior, n))
            total += float(pooled.totals[g]) * float(w @ (p @ table - mv))
    return total / pooled.total


def estimate_by_fitted_prior(spec: MetricSpec, hist: RankHistogram, *, method: str, sampling: str,
                             options: dict) -> EstimatorOutput:
    """The registry's compute function of ``bv_mle``: ``bv`` tables whose prior p(r) is the ``mle`` rank
    distribution fitted on the same histogram (its uncertainty ignored); ``options``: gamma and the fit's."""
    gamma = options.get("gamma")
    gamma = 0.1 if gamma is None else gamma
    fit = {k: v for k, v in options.items() if k != "gamma" and v is not None}  # None: the default
    dist = _mle_fit(hist, sampling, fit)
    flags = [f for f in dist.flags if f in ("not_converged", "pooled_n", "all_at_top")]
    values = np.concatenate([
        table_array(spec, int(n), int(m),
                    correction_from_options("bv", sampling, {"gamma": gamma,
                                                             "prior": _fitted_prior(dist, int(n), int(m))}))
        for n, m in zip(hist.n_items, hist.n_samples)
    ])
    value, se = table_estimate(hist, values)
    more, se = _resolution_flags(spec, hist, se)
    flags += [f for f in more if f not in flags]
    details = {"method": method, "metric": str(spec), "gamma": gamma, "prior": "mle",
               "mle_iterations": dist.iterations,
               "table_bias": plug_in_bias(spec, hist, correction_from_options("bv", sampling, {"gamma": gamma,
                                          "prior": dist.as_prior()}), lambda: _bias_fit(hist, sampling))}
    return _estimate_output(value, se, hist, details, flags)
