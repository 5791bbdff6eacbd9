"""g-modelling's pieces shared by ``gmod`` (``rank_distribution``) and ``pl_fit``'s spline prior
(``_popularity_fit``): each rank cell's quadrature ranks, the cubic B-spline basis on log R and the penalised
objective on any likelihood of a prior over cells (Efron, "Empirical Bayes deconvolution estimates", Biometrika
2016). numpy only (scipy.interpolate is not imported: see :func:`bspline_design`)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

__all__ = ["G_DF", "G_PENALTY", "SUBPOINTS", "bspline_design", "cell_points", "g_basis", "spline_objective",
           "softmax", "spline_penalty", "spline_probs", "spline_value"]

SUBPOINTS = 8  # quadrature ranks per cell (every rank of a narrower cell)


def cell_points(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Up to 8 ranks per cell spread evenly through it, and their weights (rows sum to 1)."""
    lo = edges[:-1]
    width = np.diff(edges)
    j = np.arange(SUBPOINTS)
    even = lo[:, None] + 1 + np.floor((j[None, :] + 0.5) * width[:, None] / SUBPOINTS).astype(np.int64)
    every = lo[:, None] + 1 + np.minimum(j[None, :], width[:, None] - 1)
    narrow = width[:, None] < SUBPOINTS
    pts = np.where(narrow, every, even)
    wts = np.where(narrow, (j[None, :] < width[:, None]) / width[:, None].astype(np.float64), 1.0 / SUBPOINTS)
    return pts, wts


# g-modelling (Efron, Biometrika 2016): log P(R) in a cubic B-spline basis of log R, second differences penalised
G_DF = 10  # basis functions, knots equally spaced in log R over 1..n (a knot per factor ~2.1 of rank at n = 1,600)
G_PENALTY = 1.0  # weight of the squared second differences of the coefficients, in log-likelihood units


def bspline_design(x: np.ndarray, knots: np.ndarray, k: int) -> np.ndarray:
    """(P, len(knots) - k - 1) B-spline basis of degree ``k`` at points ``x`` inside [knots[k], knots[-k - 1]]
    (Cox-de Boor recursion; 0/0 read as 0; a point on the right end belongs to the last non-empty interval):
    ``scipy.interpolate.BSpline.design_matrix(x, knots, k)`` densified, without importing scipy.interpolate, whose
    import (scipy.optimize with it) cost 0.3 s of a first ``gmod`` fit or plan."""
    t = np.asarray(knots, dtype=np.float64)
    n_int = len(t) - 1
    span = np.clip(np.searchsorted(t, x, side="right") - 1, k, len(t) - k - 2)
    b = np.zeros((len(x), n_int))
    b[np.arange(len(x)), span] = 1.0
    xc = np.asarray(x, dtype=np.float64)[:, None]
    for d in range(1, k + 1):
        nb = n_int - d
        left, right = t[d : d + nb] - t[:nb], t[d + 1 : d + 1 + nb] - t[1 : 1 + nb]
        with np.errstate(divide="ignore", invalid="ignore"):
            lw = np.where(left > 0, (xc - t[:nb]) / left, 0.0)
            rw = np.where(right > 0, (t[d + 1 : d + 1 + nb] - xc) / right, 0.0)
        b = lw * b[:, :nb] + rw * b[:, 1 : nb + 1]
    return b


def g_basis(edges: np.ndarray, df: int) -> np.ndarray:
    """(C, df) cubic B-spline basis at log(mean rank) of each cell, knots equally spaced on [0, log n]; a ValueError
    naming ``df`` where it exceeds both the C cells of the rank grid (coefficients the data cannot identify) and the
    default G_DF (always allowed)."""
    cells = len(edges) - 1
    if df > max(cells, G_DF):
        raise ValueError(f"df: {df} B-spline coefficients for a rank grid of {cells} cells; the data identify at "
                         f"most {max(cells, G_DF)} (one per cell; the default is {G_DF})")
    pts, wts = cell_points(edges)
    x = np.log((pts * wts).sum(1))
    hi = max(math.log(float(edges[-1])), 1e-9)
    inner = np.linspace(0.0, hi, df - 2)
    knots = np.r_[[0.0] * 3, inner, [hi] * 3]
    return bspline_design(np.clip(x, 0.0, hi), knots, 3)


def spline_objective(
    logw: np.ndarray, basis: np.ndarray, penalty: float, total: float,
    loglik: Callable[[np.ndarray], tuple[float, np.ndarray]],
) -> tuple[Callable[[np.ndarray], tuple[float, np.ndarray]], Callable[[np.ndarray], np.ndarray]]:
    """g-modelling's objective on any likelihood of a prior over cells (``gmod`` here; ``pl_fit``'s spline prior in
    ``_popularity_fit``): P(cell) proportional to exp(logw + basis @ alpha) (logw: log cell widths, so uniform over
    ranks at alpha = 0), f(alpha) = -loglik(P)/total + penalty * |D2 alpha|^2 / total and its gradient, given
    ``loglik(P) -> (value, d value / d P)``. Returns (objective, P of alpha)."""
    pen = spline_penalty(basis.shape[1], penalty)

    def pi_of(alpha: np.ndarray) -> np.ndarray:
        return spline_probs(logw, basis, alpha)

    def objective(alpha: np.ndarray) -> tuple[float, np.ndarray]:
        pi = pi_of(alpha)
        ll, dll = loglik(pi)
        f, grad = spline_value(alpha, pi, ll, dll, total, basis, pen)
        return float(f), grad

    return objective, pi_of


def spline_penalty(df: int, penalty: float) -> np.ndarray:
    """penalty x D2'D2 (df, df): |D2 alpha|^2 = alpha' D2'D2 alpha, D2 the second differences of the coefficients."""
    d2 = np.diff(np.eye(df), 2, axis=0)
    return penalty * (d2.T @ d2)


def softmax(z: np.ndarray) -> np.ndarray:
    """exp(z) normalised over the last axis (cells), shifted by its maximum first (no overflow)."""
    z = z - z.max(-1, keepdims=True)
    pi = np.exp(z)
    pi /= pi.sum(-1, keepdims=True)
    return pi


def spline_probs(logw: np.ndarray, basis: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """P(cell) proportional to exp(logw + basis @ alpha), for coefficients alpha (df,) or a batch (..., df)."""
    return softmax(logw + alpha @ basis.T)


def spline_value(alpha: np.ndarray, pi: np.ndarray, ll: Any, dll: np.ndarray, total: Any, basis: np.ndarray,
                 pen: np.ndarray) -> tuple[Any, np.ndarray]:
    """The objective -ll/total + alpha' pen alpha / total and its gradient in alpha, from the log-likelihood ``ll``
    and its gradient ``dll`` in P at ``pi = spline_probs(.., alpha)``; alpha (df,) with a scalar total, or a batch
    (A, df) with totals (A,). The softmax's chain rule: d/dz = pi (g - pi . g)."""
    t = np.asarray(total, dtype=np.float64)
    grad_pi = -dll / t[..., None]
    grad_z = pi * (grad_pi - (pi * grad_pi).sum(-1, keepdims=True))
    ap = alpha @ pen
    f = -ll / t + (ap * alpha).sum(-1) / t
    return f, grad_z @ basis + 2.0 * ap / t[..., None]
