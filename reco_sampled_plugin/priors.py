"""Priors p(r) over exact ranks r = 1..n, used to weight the bias of a correction (Krichene & Rendle
eq. 21-26; Li et al. section 3.2 for the Beta prior).

A prior is anything that yields p(r) weights. The contract (:class:`Prior`) has two parts:

* ``weights(n)``: the exact probabilities p(1..n) (float64, >= 0, summing to 1), used when the
  correction is built by enumerating every rank (small n, or a :class:`VectorPrior`);
* ``density(r, n)``: p at *real* ranks r >= 1 (unnormalised is fine), smooth in r away from the head,
  or ``None`` when the prior can only be enumerated. For large n the correction enumerates the head
  exactly and integrates the tail with composite Gauss rules (quadrature.py) on ``density``; the
  rule's total mass renormalises it.

The uniform prior is special-cased (``is_uniform``): its sums are exact Gauss quadrature at any n.
A non-uniform prior breaks that polynomial exactness; the composite rule's measured relative error is
below 1e-10 for the Beta prior (tests/test_corrections.py), and a VectorPrior is always enumerated
(O(n m^2), exact). Later estimators (MLE priors) plug in by subclassing :class:`Prior`; ``key`` makes
correction tables cacheable.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Hashable, Union

import numpy as np
import torch

from ._checks import MAX_SAMPLES, check_elements, check_rank_values, check_ranks_in_range, check_size, real_tensor
from ._options import check_nonnegative_float, check_positive_float
from ._types import TensorLike

__all__ = [
    "Prior",
    "UniformPrior",
    "BetaPrior",
    "VectorPrior",
    "CallablePrior",
    "as_prior",
    "fit_beta_prior",
    "empirical_prior",
]


def prior_ranks(n: int) -> np.ndarray:
    """The ranks 1..n (float64) of a prior vector p(1..n): ``n`` checked as a size (``n_items``) and against the
    one bound on arrays that grow with n (``_checks.MAX_ELEMENTS``), before allocating."""
    n = check_size(n, "n_items", 1)
    check_elements(n, "n_items", "the prior vector p(1..n)")
    return np.arange(1, n + 1, dtype=np.float64)


class Prior:
    """Base class: a distribution p(r) over exact ranks 1..n (see the module docstring)."""

    is_uniform: bool = False

    @property
    def key(self) -> Hashable:  # pragma: no cover - abstract
        raise NotImplementedError

    def weights(self, n: int) -> np.ndarray:  # pragma: no cover - abstract
        """Exact p(1..n) as a float64 array summing to 1."""
        raise NotImplementedError

    def density(self, r: np.ndarray, n: int) -> np.ndarray | None:
        """p at real ranks ``r`` (unnormalised), or None when only :meth:`weights` is available."""
        return None

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Prior) and self.key == other.key


class UniformPrior(Prior):
    """p(r) = 1/n (the paper's default)."""

    is_uniform = True

    @property
    def key(self) -> Hashable:
        return ("uniform",)

    def weights(self, n: int) -> np.ndarray:
        r = prior_ranks(n)
        return np.full(r.shape, 1.0 / r.size)

    def density(self, r: np.ndarray, n: int) -> np.ndarray:
        return np.full(np.shape(r), 1.0 / n)

    def __repr__(self) -> str:
        return "UniformPrior()"


class BetaPrior(Prior):
    """Beta(a, 1) over the normalised rank (Li et al. eq. 14): p(r) = (r/n)^a - ((r-1)/n)^a.

    The density a x^(a-1) is integrated over the cell ((r-1)/n, r/n], so p sums to 1 exactly and is
    finite at r = 1 even for a < 1 (Li et al. write ((r-1)/(n-1))^(a-1) / (n-1), infinite at r = 1;
    the two agree to O(1/n) elsewhere). a < 1 puts mass at the top; a = 1 is the uniform prior.
    """

    def __init__(self, a: float) -> None:
        try:
            a = check_positive_float(a, "a")
        except ValueError:
            raise ValueError(f"prior: Beta parameter a must be a positive finite number, got {a!r}") from None
        self.a = a

    @property
    def key(self) -> Hashable:
        return ("beta", self.a)

    def density(self, r: np.ndarray, n: int) -> np.ndarray:
        r = np.asarray(r, dtype=np.float64)
        # (r/n)^a (1 - (1 - 1/r)^a), computed without cancellation (log1p(-1) = -inf at r = 1 is exact)
        with np.errstate(divide="ignore"):
            return np.exp(self.a * (np.log(r) - np.log(n))) * -np.expm1(self.a * np.log1p(-1.0 / r))

    def weights(self, n: int) -> np.ndarray:
        r = prior_ranks(n)
        p = self.density(r, r.size)
        return p / p.sum()

    def __repr__(self) -> str:
        return f"BetaPrior(a={self.a:g})"


class VectorPrior(Prior):
    """A user-given vector p(1..n) (index 0 is r = 1); always enumerated exactly."""

    def __init__(self, p: TensorLike, atol: float = 1e-8) -> None:
        atol = check_nonnegative_float(atol, "atol")
        arr = real_tensor(p, "prior", "a vector of probabilities over ranks").detach().cpu().numpy()
        arr = np.asarray(arr, dtype=np.float64).reshape(-1)
        if arr.size == 0 or not np.all(np.isfinite(arr)):
            raise ValueError("prior: the vector must be non-empty and finite")
        if np.any(arr < 0):
            raise ValueError(f"prior: probabilities must be >= 0, found {arr.min():g}")
        if abs(arr.sum() - 1.0) > atol:
            raise ValueError(f"prior: probabilities must sum to one, got {arr.sum():.12g}")
        self.p = arr / arr.sum()
        self.p.setflags(write=False)
        self._key = ("vector", arr.size, hashlib.sha1(self.p.tobytes()).hexdigest())

    @property
    def key(self) -> Hashable:
        return self._key

    def weights(self, n: int) -> np.ndarray:
        if n != self.p.size:
            raise ValueError(f"prior: vector has length {self.p.size} but n_items = {n}; give one entry per exact rank")
        return self.p

    def __repr__(self) -> str:
        return f"VectorPrior(n={self.p.size})"


class CallablePrior(Prior):
    """p(r) ∝ fn(r, n) for real ranks r (float64 array) and an int n; normalised over the ranks.

    ``fn`` must return finite values >= 0 and be smooth in r beyond the first few hundred ranks
    (the tail is integrated by composite Gauss rules).
    """

    def __init__(self, fn: Callable[[np.ndarray, int], np.ndarray]) -> None:
        if not callable(fn):
            raise ValueError("prior: expected a callable fn(r, n)")
        self.fn = fn

    @property
    def key(self) -> Hashable:
        return ("callable", self.fn)

    def density(self, r: np.ndarray, n: int) -> np.ndarray:
        try:
            out = np.asarray(self.fn(np.asarray(r, dtype=np.float64), n), dtype=np.float64)
            out = np.broadcast_to(out, np.shape(r))
        except (TypeError, ValueError) as exc:  # a callable of one argument, a non-numeric or mis-shaped result
            raise ValueError(f"prior: the callable must map (r, n) to one weight per rank, but it failed ({exc})") from None
        if not np.all(np.isfinite(out)) or np.any(out < 0):
            raise ValueError("prior: the callable returned negative or non-finite values")
        return out

    def weights(self, n: int) -> np.ndarray:
        r = prior_ranks(n)
        p = self.density(r, r.size)
        if p.sum() <= 0:
            raise ValueError("prior: the callable's values sum to zero")
        return p / p.sum()

    def __repr__(self) -> str:
        return f"CallablePrior({getattr(self.fn, '__name__', self.fn)!r})"


# what a ``prior`` argument accepts (:func:`as_prior`): None or "uniform", a Prior, ("beta", a), a vector of
# weights over the ranks 1..n, or a callable fn(r, n) -> weights
PriorLike = Union[None, str, Prior, "tuple[str, float]", TensorLike, Callable[..., Any]]


def as_prior(prior: PriorLike, n_items: int | None = None) -> Prior:
    """Normalise ``prior``: None / "uniform" -> UniformPrior; a Prior; ("beta", a) -> BetaPrior;
    an array / tensor -> VectorPrior (length must be n_items); a callable -> CallablePrior."""
    if prior is None or (isinstance(prior, str) and prior.lower() == "uniform"):
        return UniformPrior()
    if isinstance(prior, Prior):
        if type(prior).weights is Prior.weights or type(prior).key is Prior.key:  # the abstract base itself
            raise ValueError(f"prior: {type(prior).__name__} is the abstract base (no weights(n) or key); use "
                             "UniformPrior, BetaPrior(a), VectorPrior(p) or CallablePrior(fn)")
        result = prior
    elif isinstance(prior, tuple) and len(prior) == 2 and prior[0] == "beta":
        result = BetaPrior(prior[1])
    elif isinstance(prior, str):
        raise ValueError(f"prior: unknown name {prior!r}; use 'uniform', ('beta', a), a vector or a callable")
    elif callable(prior):
        result = CallablePrior(prior)
    else:
        try:
            result = VectorPrior(prior)
        except (TypeError, ValueError) as exc:
            if str(exc).startswith("prior"):
                raise
            raise ValueError(f"prior: expected 'uniform', ('beta', a), a vector of probabilities over ranks, a "
                             f"callable or a Prior, got {type(prior).__name__}") from None
    if n_items is not None and isinstance(result, VectorPrior) and result.p.size != n_items:
        raise ValueError(f"prior: vector has length {result.p.size} but n_items = {n_items}")
    return result


def fit_beta_prior(sampled_ranks: TensorLike, n_samples: int) -> BetaPrior:
    """A Beta(a, 1) prior fitted to sampled ranks by the method of moments.

    Under either law E[(r~ - 1) / m] = E[(r - 1) / (n - 1)], and under Beta(a, 1) that mean is
    a / (a + 1); so a = mu / (1 - mu) with mu the mean of (r~ - 1)/m, clipped to [1e-3, 1e3].
    A simple hook: maximum-likelihood priors (next issue) return a :class:`Prior` the same way.
    """
    m = check_size(n_samples, "n_samples", 1, MAX_SAMPLES)
    r = check_rank_values(sampled_ranks, "sampled_ranks").to(torch.float64).reshape(-1)  # NaN, bool, str refused
    if r.numel() == 0:
        raise ValueError("sampled_ranks: empty")
    if bool((r < 1).any()) or bool((r > m + 1).any()):
        raise ValueError(f"sampled_ranks: values must lie in 1..m+1 = 1..{m + 1}")
    mu = float(((r - 1) / m).mean())
    mu = min(max(mu, 1e-6), 1 - 1e-6)
    return BetaPrior(float(np.clip(mu / (1 - mu), 1e-3, 1e3)))


def empirical_prior(exact_ranks: TensorLike, n_items: int, smoothing: float = 1.0) -> VectorPrior:
    """Histogram of exact ranks with additive smoothing ``smoothing`` per rank, as a VectorPrior.

    Raises:
        ValueError: naming the argument: ranks that are not whole numbers in 1..n_items, a bad size, or an
            ``n_items`` whose vector p(1..n) would exceed ``_checks.MAX_ELEMENTS`` (2^27) values.
    """
    from ._options import check_nonnegative_float

    r_grid = prior_ranks(n_items)
    n = r_grid.size
    r = check_rank_values(exact_ranks, "exact_ranks", whole=True).reshape(-1).cpu()
    check_ranks_in_range(r, n, "exact_ranks")
    smoothing = check_nonnegative_float(smoothing, "smoothing")
    counts = np.bincount(r.to(torch.int64).numpy() - 1, minlength=n).astype(np.float64) + smoothing
    if counts.sum() <= 0:
        raise ValueError("smoothing: with no exact ranks, smoothing must be > 0 (the prior would be empty)")
    return VectorPrior(counts / counts.sum())
