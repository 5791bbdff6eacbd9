"""Tables for many candidate counts n at once: verified barycentric interpolation in x = 1/(n - 1).

Real evaluations exclude each user's training items, so the candidate count n differs per user and one
evaluation meets hundreds of distinct n. A correction table T_n (m + 1 numbers, an O(m^3) solve) depends on n
through the sampling law P(r~ | r), a function of t = (r - 1)/(n - 1): for the smooth methods (``bv``,
``cls`` on cut-off metrics, ``bv_mle``) every entry is an analytic function of x = 1/(n - 1) on the range
of the data, and polynomial interpolation at Chebyshev points converges geometrically (measured on
n = 946..1663 and 1e3..1e5, m = 100: 17 nodes reach 1e-14 relative for bv / cls HR@10 and NDCG@10).

:func:`tables_over_n` builds T exactly at Chebyshev points of x (rounded to whole n), interpolates every other
n of the data (barycentric form, Berrut & Trefethen 2004, stable at any node set), and **verifies** the
result: the exact tables at ``CHECKS`` data points between nodes (where the interpolant's largest errors lie)
must agree to ``tol`` x max(1, max |T|). Nine nodes (degree 8) are tried first, then the 17 that contain
them: a narrow range of n (ml-100k: 946..1663) needs 9 + 4 exact tables. A piece that still fails is halved
in x (at most ``MAX_DEPTH`` times, and again only while halving cuts the error ``SPLIT_GAIN``-fold); where
halving gains little the tables are not smooth in n (``cls`` without a cut-off: its active set changes with
n) and that piece is built exactly. So every row is exact or verified; smooth tables cost at most
(NODES + CHECKS) x (2^(MAX_DEPTH + 1) - 1) = 147 solves per m whatever the number of distinct n (13 on a
narrow range), the others one solve per distinct n as before. Fewer than ``MIN_INTERPOLATED`` distinct n: every table is exact.
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["tables_over_n", "NODES", "CHECKS", "MAX_DEPTH", "MIN_INTERPOLATED", "SPLIT_GAIN", "TOL"]

#: Chebyshev points (extrema, endpoints included) per piece: degree 16 in x, tried after the nested 9 (degree 8)
NODES = 17
#: exact tables at data points between nodes that every interpolated piece must match
CHECKS = 4
#: halvings of a piece whose verification fails before its tables are built exactly
MAX_DEPTH = 2
#: a failed piece is halved again only if halving cut the error by this factor (else: exact tables)
SPLIT_GAIN = 100.0
#: a piece with fewer distinct n is built exactly: 25, the most exact tables one verified piece takes (9 nodes + 4
#: checks, then 8 more nodes + 4 checks); from there interpolation costs at most as much and usually 13 (ml-100k)
MIN_INTERPOLATED = NODES + 2 * CHECKS
#: verification tolerance, relative to max(1, max |T|) (tables of metrics in [0, 1] are O(1))
TOL = 1e-10


def _bary_weights(s: np.ndarray) -> np.ndarray:
    """Barycentric weights 1 / prod_{k != j} (s_j - s_k) for distinct nodes s in [-1, 1]."""
    diff = s[:, None] - s[None, :]
    np.fill_diagonal(diff, 1.0)
    return 1.0 / np.prod(diff, axis=1)


def _interpolate(s_nodes: np.ndarray, t_nodes: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Barycentric interpolation of the rows ``t_nodes`` (K x W) at the points s (exact at the nodes)."""
    w = _bary_weights(s_nodes)
    d = s[:, None] - s_nodes[None, :]
    hit = d == 0.0
    d[hit] = 1.0
    k = w[None, :] / d
    out = (k @ t_nodes) / k.sum(axis=1, keepdims=True)
    rows, cols = np.nonzero(hit)
    out[rows] = t_nodes[cols]
    return out


def tables_over_n(
    build: Callable[[int], np.ndarray],
    ns: np.ndarray,
    *,
    tol: float = TOL,
    interpolate: bool = True,
) -> tuple[np.ndarray, dict]:
    """T_n for every n of ``ns`` (distinct whole numbers >= 2, ascending) as a (len(ns), W) float64 array.

    Args:
        build: the exact table of one n (a 1-D float64 array of width W; the same W for every n).
        ns: the distinct candidate counts, ascending.
        tol: verification tolerance relative to max(1, max |T|) of the piece's node tables.
        interpolate: False builds every table exactly (methods whose tables are not smooth in n).

    Returns:
        (tables, info): ``info`` holds ``built`` (exact tables computed), ``interpolated`` (rows filled by a
        verified interpolant) and ``max_check_error`` (the largest verification error accepted, relative).
    """
    ns = np.asarray(ns, dtype=np.int64)
    info = {"built": 0, "interpolated": 0, "max_check_error": 0.0}
    cache: dict[int, np.ndarray] = {}

    def exact(n: int) -> np.ndarray:
        if n not in cache:
            cache[n] = np.asarray(build(int(n)), dtype=np.float64)
            info["built"] += 1
        return cache[n]

    out: np.ndarray | None = None
    rows: dict[int, np.ndarray] = {}
    work = [(0, ns.size, 0, np.inf)] if ns.size else []
    while work:  # pieces of the sorted ns: [lo, hi), depth, the parent's error (a handful of pieces, not per n)
        lo, hi, depth, parent_err = work.pop()
        piece = ns[lo:hi]
        if not interpolate or piece.size < MIN_INTERPOLATED:
            for i, n in enumerate(piece.tolist()):
                rows[lo + i] = exact(n)
            continue
        x = 1.0 / (piece - 1.0)  # descending in n
        xa, xb = float(x[-1]), float(x[0])
        s_piece = (2.0 * x - (xa + xb)) / (xb - xa)  # x onto [-1, 1]
        for k_nodes in (NODES // 2 + 1, NODES):  # nested Chebyshev extrema: the 9 nodes are among the 17
            cheb = np.cos(np.pi * np.arange(k_nodes) / (k_nodes - 1))
            n_nodes = np.rint(1.0 + 1.0 / (0.5 * (xa + xb) + 0.5 * (xb - xa) * cheb)).astype(np.int64)
            n_nodes = np.unique(np.clip(n_nodes, int(piece[0]), int(piece[-1])))
            s_nodes = (2.0 / (n_nodes - 1.0) - (xa + xb)) / (xb - xa)
            t_nodes = np.stack([exact(int(n)) for n in n_nodes])
            # check points: the data n nearest to the midpoints of the first, last and two inner gaps between nodes
            gaps = np.unique(np.linspace(0, len(n_nodes) - 2, CHECKS).round().astype(np.int64))
            mids = 0.5 * (s_nodes[gaps] + s_nodes[gaps + 1])
            check_idx = np.unique(np.abs(s_piece[None, :] - mids[:, None]).argmin(axis=1))
            approx = _interpolate(s_nodes, t_nodes, s_piece[check_idx])
            truth = np.stack([exact(int(piece[i])) for i in check_idx])
            scale = max(1.0, float(np.abs(t_nodes).max()))
            err = float(np.abs(approx - truth).max()) / scale
            if np.isfinite(err) and err <= tol:
                break
        if not np.isfinite(err) or err > tol:
            # halve a piece whose error is the width of its range (analytic: halving gains orders of magnitude);
            # where halving gained little the tables are not smooth in n there (an active set that changes):
            # build them exactly
            if depth < MAX_DEPTH and err < parent_err / SPLIT_GAIN:
                mid = lo + piece.size // 2
                work += [(lo, mid, depth + 1, err), (mid, hi, depth + 1, err)]
            else:
                for i, n in enumerate(piece.tolist()):
                    rows[lo + i] = exact(n)
            continue
        info["max_check_error"] = max(info["max_check_error"], err)
        vals = _interpolate(s_nodes, t_nodes, s_piece)
        known = np.isin(piece, np.fromiter(cache.keys(), dtype=np.int64))  # nodes and check points: exact
        vals[known] = np.stack([cache[int(n)] for n in piece[known]])
        info["interpolated"] += int((~known).sum())
        if out is None:
            out = np.empty((ns.size, vals.shape[1]))
        out[lo:hi] = vals
    if rows:
        width = next(iter(rows.values())).shape[0]
        if out is None:
            out = np.empty((ns.size, width))
        idx = np.fromiter(rows.keys(), dtype=np.int64)
        out[idx] = np.stack(list(rows.values()))
    if out is None:
        out = np.empty((0, 0))
    logger.debug("tables over %d candidate counts: %d built exactly, %d interpolated (largest check error %.1e)",
                 ns.size, info["built"], info["interpolated"], info["max_check_error"])
    return out, info
