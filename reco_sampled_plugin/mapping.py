"""Mapping functions between sampled and global top-k hit rates (Li, Jin et al., KDD 2020).

Li et al. show that SHR@k, the hit rate among a relevant item and its sampled items, approximates the
global hit rate HR@f(k) at a location f(k) on the catalogue scale. Their notation differs from ours:
their ``n`` is the sample-set size ``m + 1`` and their ``N`` the catalogue size; here
``n_items`` = n (candidates, relevant item included) and ``n_samples`` = m (sampled irrelevant items),
as in the rest of the package. Written in our symbols (k = 1..m+1):

* ``linear`` (eq. 9):  f(k) = (k - 1)(n - 1)/m + 1;
* ``bound`` (eq. 13):  f(k) = floor((k - 1/2)(n - 1)/m + 1/2), clipped to 1..n;
* ``beta`` (eq. 16-17) with shape a of the Beta(a, 1) model of the rank distribution:
  [(f(k) - 1)/(n - 1)]^a = G(k) = sum_{j=0}^{k-1} t_j,  t_j = a C(m, j) B(a + j, m + 1 - j),
  i.e. t_0 = a B(a, m + 1) (eq. 17) and t_{j+1} / t_j = (a + j)/(j + 1) (eq. 16). Computed in log space
  (``betaln`` and a cumulative sum of ``log1p``), finite for n = 1e8 and m = 1e4. ``a = 1`` is eq. 18,
  f(k) = k (n - 1)/(m + 1) + 1; G(m + 1) = 1 gives Lemma 3.1, f(m + 1) = n, for every a;
* ``beta_fit``: ``beta`` with the algorithm-specific a of the fixed point of eq. 19 (:func:`fit_beta`).

Estimating a global metric: the mapped points (f(k), SHR@k), k = 0..m+1 with the anchor f(0) = 0,
SHR@0 = 0, are joined by straight lines, so the estimated HR@K is piecewise linear in K and equals
SHR@k exactly at K = f(k). Equivalently each positive with sampled rank i is spread uniformly over the
global ranks (f(i-1), f(i)]; so any metric (not only HR) is estimated as the mean over positives of the
metric averaged over that interval, a table of m + 1 numbers looked up at r~. Its standard error is the
sample standard deviation of those per-positive values over sqrt(#positives): it covers the sampling
noise and the spread of users, not the bias of the mapping (nor the uncertainty of a fitted a).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
from scipy import special

from ._checks import MAX_SAMPLES, check_size, check_without_replacement
from .sampling_laws import check_law
from ._options import BETA_SHAPE_RANGE, check_beta_shape, check_count, check_metric_names, check_positive_float
from ._rank_hist import RankHistogram, as_histogram, interval_mean_metrics
from .metric_names import MetricSpec, parse_metric

if TYPE_CHECKING:
    from ._types import TensorLike

__all__ = [
    "MAPPING_METHODS",
    "mapping",
    "fit_beta",
    "BetaFit",
    "sampled_hit_rate_curve",
    "mapped_points",
    "MappedPoints",
    "mapping_table",
    "mapping_tables",
    "mapping_estimate",
    "MappedEstimate",
    "dataset_beta",
    "DatasetBeta",
]

MAPPING_METHODS = ("linear", "bound", "beta", "beta_fit")


def _check_nm(n_items: Any, n_samples: Any) -> tuple[int, int]:
    """n >= 2 and m >= 1 (:func:`~reco_sampled_plugin._checks.check_size`: whole numbers, no str, bool or None)."""
    return check_size(n_items, "n_items", 2), check_size(n_samples, "n_samples", 1, MAX_SAMPLES)


def _check_a(method: str, a: Any) -> float | None:
    """The Beta shape ``a`` (None, or a finite number > 0), refused for mappings that do not use it; ``method``
    checked first (a name of :data:`MAPPING_METHODS`)."""
    if not isinstance(method, str) or method not in MAPPING_METHODS:
        raise ValueError(f"method: unknown mapping {method!r}; use one of {MAPPING_METHODS}")
    if a is None:
        return None
    a = check_beta_shape(a)
    if not isinstance(method, str) or method not in ("beta", "beta_fit"):
        raise ValueError(f"a: only method 'beta' (and 'beta_fit', as its start value) uses the Beta shape a, "
                         f"but the method is {method!r}")
    return a


def _log_beta_g(m: int, a: float) -> np.ndarray:
    """log G(k), k = 1..m+1, for the Beta(a, 1) mapping (G(m + 1) = 1 up to rounding)."""
    j = np.arange(m, dtype=np.float64)  # ratios t_{j+1}/t_j for j = 0..m-1
    log_t0 = math.log(a) + float(special.betaln(a, m + 1.0))
    log_t = log_t0 + np.concatenate([[0.0], np.cumsum(np.log1p((a - 1.0) / (j + 1.0)))])
    return np.logaddexp.accumulate(log_t)


def _full_mapping(n: int | np.ndarray, m: int, method: str, a: float | None) -> np.ndarray:
    """f(k) for k = 1..m+1 (float64): shape (m + 1,) for one n, (len(n), m + 1) for an array of n (every
    mapping is 1 + (n - 1) g(k), rounded for ``bound``, so many n cost one broadcast)."""
    k = np.arange(1, m + 2, dtype=np.float64)
    n1 = np.asarray(n, dtype=np.float64)[..., None] - 1.0  # (..., 1)
    if method == "linear":
        out = (k - 1.0) * n1 / m + 1.0
    elif method == "bound":
        out = np.clip(np.floor((k - 0.5) * n1 / m + 0.5), 1.0, n1 + 1.0)
    elif method == "beta":
        a = check_beta_shape(a)
        out = 1.0 + n1 * np.exp(_log_beta_g(m, a) / a)
    elif method == "beta_fit":
        raise ValueError("method: 'beta_fit' needs sampled ranks; call fit_beta(...) and pass its a to method='beta'")
    else:
        raise ValueError(f"method: unknown mapping {method!r}; use one of {MAPPING_METHODS}")
    return out.reshape(-1) if np.ndim(n) == 0 else out


def mapping(k: TensorLike, n_items: int, n_samples: int, method: str = "bound", a: float | None = None) -> float | np.ndarray:
    """Global location f(k) of the sampled cut-off k (Li et al., eq. 9, 13, 16-18).

    Args:
        k: sampled cut-off(s), whole numbers in 1..m+1 (int or array).
        n_items: n, candidates per instance (Li et al.'s N).
        n_samples: m, sampled irrelevant items (Li et al.'s n is m + 1).
        method: ``"linear"`` (eq. 9), ``"bound"`` (eq. 13), ``"beta"`` (eq. 16-17 with shape ``a``).
        a: Beta shape for ``"beta"`` (a = 1 gives eq. 18).

    Returns:
        f(k) as float64 (a float for scalar k, else an array shaped like k), on the scale 1..n.
    """
    n, m = _check_nm(n_items, n_samples)
    a = _check_a(method, a)
    karr = np.asarray(k)
    if karr.dtype.kind not in "iuf" or (karr.size and not np.all(np.mod(karr, 1) == 0)):
        raise ValueError(f"k: sampled cut-offs must be whole numbers, got {k!r}")
    if karr.size and (karr.min() < 1 or karr.max() > m + 1):
        raise ValueError(f"k: sampled cut-offs must lie in 1..m+1 = 1..{m + 1}")
    f = _full_mapping(n, m, method, a)
    out = f[karr.astype(np.int64) - 1]
    return float(out) if out.ndim == 0 else out


# ------------------------------------------------------------------------------------------- eq. 19
@dataclass(frozen=True)
class BetaFit:
    """Algorithm-specific Beta shape (eq. 19 fixed point).

    Attributes:
        a: fitted shape (the last iterate when not converged).
        iterations: fixed-point iterations run.
        converged: |a_{i+1} - a_i| <= tol * a_i reached within ``max_iter`` with a finite a.
        history: every iterate, starting value first.
        a0: the starting value.
    """

    a: float
    iterations: int
    converged: bool
    history: tuple[float, ...]
    a0: float


def _counts_by_m(hist: RankHistogram) -> list[tuple[int, np.ndarray]]:
    """The histogram's counts summed over the groups of each distinct m (what eq. 19 depends on: n cancels)."""
    out: dict[int, np.ndarray] = {}
    for m, c in zip(hist.n_samples.tolist(), hist.counts):  # one pass over the groups, before the iterations
        out[m] = out[m] + c if m in out else np.asarray(c, dtype=np.float64).copy()
    return list(out.items())


def _sum_log_g(by_m: list[tuple[int, np.ndarray]], a: float) -> float:
    """sum over positives of log G(r~; a) = a * sum ln((f(r~; a) - 1)/(n - 1)) (the n cancels), from
    :func:`_counts_by_m`."""
    total = 0.0
    for m, c in by_m:  # distinct m: one, or a few for adaptive sampling
        lg = _log_beta_g(int(m), a)
        lg[-1] = 0.0  # G(m + 1) = 1 exactly (Lemma 3.1); removes rounding
        total += float(np.dot(c, lg))
    return total


def fit_beta(
    sampled_ranks: TensorLike | RankHistogram,
    n_items: TensorLike | None = None,
    n_samples: TensorLike | None = None,
    a0: float = 1.0,
    tol: float = 1e-10,
    max_iter: int = 200,
) -> BetaFit:
    """Algorithm-specific a by the fixed point of eq. 19: a <- -M / sum_u ln((f(r~_u; a) - 1)/(n - 1)).

    With f from eq. 16-17, ln((f(r~; a) - 1)/(n - 1)) = ln G(r~; a)/a, so the update is
    a <- -M a / sum_u ln G(r~_u; a) and does not depend on n. Works on the histogram (any mix of n and m).

    Args:
        sampled_ranks: sampled ranks (any shape; 0 = padding) or a :class:`RankHistogram`.
        n_items, n_samples: n and m (ints or per-positive values); unused for a histogram.
        a0: starting value (Li et al. suggest 1 or 0.5).
        tol: relative change at which the iteration stops.
        max_iter: iteration cap; reaching it gives ``converged=False`` (no exception).

    Raises:
        ValueError: empty histogram, or every positive at the last sampled rank (the likelihood grows without
            bound in a: no fixed point); ``a0`` or ``tol`` not a finite number > 0, ``max_iter`` not an integer >= 1.
    """
    a = check_beta_shape(a0, "a0")
    tol = check_positive_float(tol, "tol")
    max_iter = check_count(max_iter, "max_iter", 1)
    hist = as_histogram(sampled_ranks, n_items, n_samples)
    hist.check_nonempty()
    if all(c[:-1].sum() == 0 for c in hist.counts):
        raise ValueError("sampled_ranks: every positive is at the last sampled rank m+1; eq. 19 has no fixed point")
    total = hist.total
    history = [a]
    converged = False
    it = 0
    by_m = _counts_by_m(hist)
    for it in range(1, max_iter + 1):  # scalar fixed point; each step is O(sum of distinct m)
        s = _sum_log_g(by_m, a)
        a_new = -total * a / s if s < 0 else math.nan  # sum ln G < 0; 0 where G rounds to 1: no fixed point
        history.append(a_new)
        if not math.isfinite(a_new) or a_new <= 0 or a_new > 1e6:
            break
        if abs(a_new - a) <= tol * a:
            a = a_new
            converged = True
            break
        a = a_new
    if not converged:
        a = history[-1]
    return BetaFit(a=float(a), iterations=it, converged=converged, history=tuple(history), a0=float(a0))


# ------------------------------------------------------------------------------------ SHR and points
def _single_group(hist: RankHistogram) -> tuple[int, int, np.ndarray]:
    hist.check_nonempty()
    if hist.n_groups != 1:
        raise ValueError(
            "sampled_ranks: SHR@k curves need one (n_items, n_samples) pair; got "
            f"{hist.n_groups} groups (use mapping_estimate, which handles per-positive n and m)"
        )
    return int(hist.n_items[0]), int(hist.n_samples[0]), hist.counts[0]


def sampled_hit_rate_curve(sampled_ranks: TensorLike | RankHistogram, n_items: TensorLike | None = None,
                           n_samples: TensorLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """SHR@k for k = 1..m+1 and its binomial standard error sqrt(SHR (1 - SHR)/M) (eq. 3 and 5).

    Returns:
        (shr, stderr), two float64 arrays of length m + 1 (index 0 is k = 1).
    """
    _, _, c = _single_group(as_histogram(sampled_ranks, n_items, n_samples))
    total = c.sum()
    shr = np.cumsum(c) / total
    return shr, np.sqrt(shr * (1.0 - shr) / total)


@dataclass(frozen=True)
class MappedPoints:
    """The sampled hit-rate curve placed on the global scale: HR@f(k) ~ SHR@k.

    Attributes: k (1..m+1), f (global locations), shr, stderr (binomial), method, a (None unless beta).
    """

    k: np.ndarray
    f: np.ndarray
    shr: np.ndarray
    stderr: np.ndarray
    method: str
    a: float | None


def _resolve_a(method: str, a: Any, hist: RankHistogram) -> tuple[str, float | None, BetaFit | None]:
    a = _check_a(method, a)
    if method == "beta_fit":
        fit = fit_beta(hist, a0=1.0 if a is None else check_beta_shape(a))
        lo, hi = BETA_SHAPE_RANGE  # a fit that runs off to a -> 0 or infinity (no interior maximum) maps at the bound
        return "beta", min(max(fit.a, lo), hi), fit
    if method == "beta":
        return "beta", check_beta_shape(a), None
    if not isinstance(method, str) or method not in MAPPING_METHODS:
        raise ValueError(f"method: unknown mapping {method!r}; use one of {MAPPING_METHODS}")
    return method, None, None


def mapped_points(sampled_ranks: TensorLike | RankHistogram, n_items: TensorLike | None = None, n_samples: TensorLike | None = None,
                  method: str = "bound", a: float | str | None = None) -> MappedPoints:
    """The mapped points (f(k), SHR@k), k = 1..m+1 (one (n, m) pair; ``beta_fit`` fits a first)."""
    hist = as_histogram(sampled_ranks, n_items, n_samples)
    n, m, _ = _single_group(hist)
    shr, se = sampled_hit_rate_curve(hist)
    base, a_used, _ = _resolve_a(method, a, hist)
    f = _full_mapping(n, m, base, a_used)
    return MappedPoints(np.arange(1, m + 2), f, shr, se, method, a_used)


# ------------------------------------------------------------------------------------- estimation
def mapping_table(metric: str | MetricSpec, n_items: int, n_samples: int, method: str = "bound", a: float | None = None) -> np.ndarray:
    """Per-sampled-rank estimate T[i - 1], i = 1..m+1: the mean of M over the global ranks (f(i-1), f(i)].

    With f(0) = 0 this is the piecewise-linear interpolation of the mapped points described in the module
    docstring; for HR@K, sum_i h_i T_i / M equals SHR@k at K = f(k). A fresh float64 array (tables are
    cached by arguments).
    """
    return mapping_tables([metric], n_items, n_samples, method, a)[0].copy()


def mapping_tables(metrics: Iterable[str | MetricSpec], n_items: int, n_samples: int, method: str = "bound",
                   a: float | None = None) -> np.ndarray:
    """:func:`mapping_table` for several metrics from one mapping: float64 (len(metrics), m + 1), read-only
    (cached by arguments: the estimators reuse the tables of every (n, m) group across calls)."""
    specs = check_metric_names(metrics)
    n, m = _check_nm(n_items, n_samples)
    a = _check_a(method, a)
    for spec in specs:
        if spec.k is not None and spec.k > n:
            raise ValueError(f"metric: cut-off K = {spec.k} is larger than the catalogue (n_items = {n})")
    return _mapping_tables(specs, n, m, method, None if a is None else float(a))


@lru_cache(maxsize=256)
def _stacked_mapping(spec: MetricSpec, n: tuple, m: tuple, method: str, a: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Every (n, m) group's table concatenated in group order, and each group's first mapped point f(1)
    (both read-only; cached as a whole: a repeated evaluation has the same groups). One broadcast per distinct
    m, whatever the number of distinct n."""
    n_arr, m_arr = np.asarray(n, dtype=np.int64), np.asarray(m, dtype=np.int64)
    if spec.k is not None and n_arr.size and spec.k > int(n_arr.min()):
        raise ValueError(f"metric: cut-off K = {spec.k} is larger than the catalogue (n_items = {int(n_arr.min())})")
    values = np.empty(int((m_arr + 1).sum()))
    starts = np.cumsum(m_arr + 1) - (m_arr + 1)  # each group's first entry in the concatenation
    first = np.empty(len(n), dtype=np.float64)
    for mv in np.unique(m_arr).tolist():
        idx = np.flatnonzero(m_arr == mv)
        _check_nm(int(n_arr[idx].min()), mv)
        f = _full_mapping(n_arr[idx], mv, method, a)  # (G_m, m + 1)
        edges = np.concatenate([np.zeros((len(idx), 1)), f], axis=1)
        if np.any(np.diff(edges, axis=1) <= 0):
            raise ValueError(
                f"method {method!r}: the mapping is not strictly increasing (n_items - 1 < n_samples = {mv}?)"
            )
        tabs = interval_mean_metrics((spec,), edges[:, :-1], edges[:, 1:], n_arr[idx][:, None])[0]  # (G_m, m + 1)
        first[idx] = f[:, 0]
        values[starts[idx][:, None] + np.arange(mv + 1)] = tabs
    values.setflags(write=False)
    first.setflags(write=False)
    return values, first


@lru_cache(maxsize=1024)
def _mapping_tables(specs: tuple, n: int, m: int, method: str, a: float | None) -> np.ndarray:
    edges = np.concatenate([[0.0], _full_mapping(n, m, method, a)])
    if np.any(np.diff(edges) <= 0):
        raise ValueError(
            f"method {method!r}: the mapping is not strictly increasing (n_items - 1 = {n - 1} < n_samples = {m}?)"
        )
    out = interval_mean_metrics(specs, edges[:-1], edges[1:], n)
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class MappedEstimate:
    """A global metric estimated through a mapping function.

    Attributes:
        value: the estimate (float64).
        stderr: standard error (math.inf when the estimate is not identified, see ``flags``).
        n_instances: number (total weight) of positives.
        details: method, a, the BetaFit for ``beta_fit``, the first mapped point per group, and more.
        flags: explicit warnings, e.g. ``"top_unresolved"`` (the cut-off lies below the first mapped point
            f(1) of a group with positives at r~ = 1, where the estimate interpolates towards HR@0 = 0) and ``"all_at_top"`` (every
            positive at r~ = 1: the top is not resolved, stderr is inf), ``"fit_not_converged"``.
    """

    value: float
    stderr: float
    n_instances: float
    details: dict = field(default_factory=dict)
    flags: tuple[str, ...] = ()


def mapping_estimate(
    metric: str | MetricSpec,
    sampled_ranks: TensorLike | RankHistogram,
    n_items: TensorLike | None = None,
    n_samples: TensorLike | None = None,
    method: str = "bound",
    a: float | None = None,
    weights: TensorLike | None = None,
) -> MappedEstimate:
    """Estimate a global metric (HR@K for any K, or any metric of the catalogue) from sampled ranks by mapping.

    Each positive with sampled rank i and its own (n, m) contributes the mean of M over (f(i-1), f(i)];
    the estimate is their (weighted) mean, the standard error their sample standard deviation over
    sqrt(M). For ``beta_fit`` one a is fitted on all positives (eq. 19) and its uncertainty is ignored.

    Raises:
        ValueError: unknown method or metric, empty histogram, cut-off K above n, n - 1 < m.
    """
    spec = parse_metric(metric)
    hist = as_histogram(sampled_ranks, n_items, n_samples, weights)
    hist.check_nonempty(weights)
    base, a_used, fit = _resolve_a(method, a, hist)
    flags: list[str] = []
    if fit is not None and not fit.converged:
        flags.append("fit_not_converged")
    values, first = _stacked_mapping(spec, tuple(int(v) for v in hist.n_items), tuple(int(v) for v in hist.n_samples), base, a_used)
    total = hist.total
    counts = hist.flat_counts
    value = float(counts @ values) / total
    ss = float(counts @ (values - value) ** 2)
    stderr = math.sqrt(ss / (total * (total - 1.0))) if total > 1 else math.inf
    first_points = first.tolist()
    occupied = hist.top_counts > 0  # groups with positives at r~ = 1
    if spec.k is not None and bool(np.any(spec.k < first[occupied])):
        flags.append("top_unresolved")
        if hist.all_at_top():
            flags.append("all_at_top")
            stderr = math.inf
    details = {
        "method": method,
        "a": a_used,
        "beta_fit": fit,
        "first_mapped_point": first_points,
        "n_groups": hist.n_groups,
        "metric": str(spec),
    }
    return MappedEstimate(value=value, stderr=stderr, n_instances=total, details=details, flags=tuple(flags))


# ------------------------------------------------------------------------------------ section 4.2
@dataclass(frozen=True)
class DatasetBeta:
    """Dataset-specific Beta shape (section 4.2): a fitted per recommender and their spread.

    Attributes: a (mean of the per-recommender fits), per_model, spread (max - min), std, fits.
    """

    a: float
    per_model: dict
    spread: float
    std: float
    fits: dict


def dataset_beta(sampled_ranks_by_model: Mapping[str, Any], n_items: TensorLike | None = None, n_samples: TensorLike | None = None,
                 a0: float = 1.0) -> DatasetBeta:
    """Fit eq. 19 on several recommenders of one data set and summarise (Li et al., section 4.2, Table 2).

    Args:
        sampled_ranks_by_model: {name: sampled ranks or RankHistogram}, at least one entry.
        n_items, n_samples: shared n and m (or per-positive values matching every model's ranks).
    """
    if not isinstance(sampled_ranks_by_model, Mapping) or len(sampled_ranks_by_model) == 0:
        raise ValueError("sampled_ranks_by_model: need a non-empty mapping {model name: sampled ranks}")
    fits = {name: fit_beta(r, n_items, n_samples, a0=a0) for name, r in sampled_ranks_by_model.items()}
    values = np.array([f.a for f in fits.values()], dtype=np.float64)
    return DatasetBeta(
        a=float(values.mean()),
        per_model={k: f.a for k, f in fits.items()},
        spread=float(values.max() - values.min()),
        std=float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        fits=fits,
    )


def estimate_by_mapping(spec: MetricSpec, hist: RankHistogram, *, method: str, sampling: str,
                        options: dict) -> MappedEstimate:
    """The registry's compute function of the mapping family (``registry.py``): :func:`mapping_estimate` on the
    histogram; the mappings assume no sampling law, so ``sampling`` only refuses ranks no law can produce (draws
    without replacement of more items than a user's irrelevant candidates)."""
    check_without_replacement(hist.n_items, hist.n_samples, check_law(sampling))
    return mapping_estimate(spec, hist, method=method, a=options.get("a"))
