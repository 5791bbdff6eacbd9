"""Shared data of the popularity tests: a small factor model with a popularity design; a popularity sample's positives
as one canonical table (the torchmetrics state's order)."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from reco_sampled_plugin.design import SamplingDesign


def canonical_rows(sampled: Any) -> np.ndarray:
    """A popularity-sampled SampledRanks' positives (``ranks > 0``) as rows (r~, n, S1, S2, beating, unreachable,
    pl_fit's class counts, the positive's weight; with an exact share R and pi), sorted by every column: the
    positives as a multiset, in the order ``SampledRankingMetrics.popularity_ranks`` reads its state in."""
    valid = sampled.ranks > 0
    st = sampled.popularity_stats.select(valid)
    cols = [sampled.ranks[valid], sampled.candidates()[valid], st.inv_q, st.inv_q2, st.beating, st.unreachable]
    parts = [torch.stack([c.to(torch.float64) for c in cols], 1), st.profile.double(), st.beat_bins.double(),
             st.miss_bins.double(), st.positive_weight.double().unsqueeze(1)]
    if sampled.share_ranks is not None:
        parts += [sampled.share_ranks[valid].double().unsqueeze(1), sampled.inclusion[valid].double().unsqueeze(1)]
    t = torch.cat(parts, 1).numpy()
    return t[np.lexsort(t.T[::-1])]


def factor_world(m: int = 40) -> tuple[Any, Any, np.ndarray, np.ndarray, SamplingDesign]:
    """(train, test, user factors, item factors, design): 150 users x 250 items, random interactions (test items
    outside each user's training row), Gaussian factors of rank 8, and m popularity-sampled negatives with weights
    1 + the items' counts over both phases."""
    rng = np.random.default_rng(0)
    users, items = 150, 250
    train = sp.random(users, items, density=0.05, random_state=1, format="csr")
    train.data[:] = 1
    test = sp.random(users, items, density=0.02, random_state=2, format="csr")
    test.data[:] = 1
    test = (test - test.multiply(train)).tocsr()
    test.eliminate_zeros()
    a, b = rng.normal(size=(users, 8)), rng.normal(size=(items, 8))
    counts = torch.tensor(np.asarray(train.sum(0)).ravel() + np.asarray(test.sum(0)).ravel() + 1.0)
    return train, test, a, b, SamplingDesign(m, popularity=counts)


def tilted_world(seed: int, beta_top: Any, beta_deep: Any, users: int = 200,
                 n: int = 300) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores, positives, weights): Zipf counts as weights; each user's ranking drawn position by position
    (Gumbel-max over the items left, a loop over the n ranks, vectorised over users) with weights w^beta(r), beta(r)
    linear in log r from ``beta_top`` at r = 1 to ``beta_deep`` at r = ``DEEP_RANK`` (pl_fit's parametrisation;
    scalars, or one value per user); the positive at rank ceil(6 Pareto(0.8)).

    The Gumbel noise is ``rng.gumbel``'s, value for value and from the same stream: numpy draws U = 1 - u from each
    uniform u (redrawing u = 0) and returns 0 - 1 log(-log U) with the C library's log. Here the stream's uniforms
    are read in one block (``_gumbel_argmax``) and the logs taken vectorised (a few units in the last place off
    libm's); wherever an item's noisy score comes within 1e-9 of the row's best, the candidates are recomputed with
    libm's log (``math.log``), so the ranking is the one of numpy's own draws (a step holding u = 0 is drawn by
    ``rng.gumbel`` itself)."""
    import math

    from reco_sampled_plugin._popularity_fit import DEEP_RANK

    rng = np.random.default_rng(seed)
    w = np.floor(2000.0 / np.arange(1, n + 1) ** 0.9) + 1.0
    lw = np.log(w)
    top = np.broadcast_to(np.asarray(beta_top, dtype=np.float64), (users,))
    deep = np.broadcast_to(np.asarray(beta_deep, dtype=np.float64), (users,))
    taken = np.zeros((users, n))  # 0 for the items left, -inf for those ranked already
    order = np.empty((users, n), dtype=np.int64)
    rows = np.arange(users)
    for r in range(1, n + 1):
        b = top + (deep - top) * min(math.log(r) / math.log(DEEP_RANK), 1.0)
        bl = b[:, None] * lw[None, :]
        j = _gumbel_argmax(rng, bl, taken)
        order[:, r - 1] = j
        taken[rows, j] = -np.inf
    exact = np.minimum(np.ceil(rng.pareto(0.8, size=users) * 6.0), n - 1).astype(np.int64)
    pos = order[rows, exact - 1]
    scores = np.empty((users, n))
    scores[rows[:, None], order] = -np.arange(n, dtype=np.float64)[None, :]
    return torch.from_numpy(scores), torch.from_numpy(pos).view(-1, 1), torch.from_numpy(w)


def _gumbel_argmax(rng: np.random.Generator, bl: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """Per row, the argmax of ``bl + rng.gumbel(size=bl.shape) + taken`` (``taken``: 0 for the items left, -inf
    for those ranked already; x + 0 = x) (the first index among equal maxima, as ``argmax``), consuming the stream as
    that call does (row blocks of 128 read the stream in the same order: one block's arrays stay in cache); see
    :func:`tilted_world`."""
    import math

    out = np.empty(bl.shape[0], dtype=np.int64)
    for r0 in range(0, bl.shape[0], 128):
        blk, tk = bl[r0:r0 + 128], taken[r0:r0 + 128]
        state = rng.bit_generator.state
        u = rng.random(size=blk.shape)
        if not u.all():  # numpy's gumbel redraws a uniform of 0: let it draw this block
            rng.bit_generator.state = state
            g = blk + rng.gumbel(size=blk.shape)
            g += tk
            out[r0:r0 + 128] = g.argmax(1)
            continue
        # numpy's U, then g = bl - log(-log U) + taken in place (bl + (0 - 1 x) = bl - x, up to a zero's sign)
        g = 1.0 - u
        np.log(g, out=g)
        np.negative(g, out=g)
        np.log(g, out=g)
        np.subtract(blk, g, out=g)
        g += tk
        j = g.argmax(1)
        rows = np.arange(len(j))
        best = g[rows, j]
        g[rows, j] = -np.inf
        for i in np.flatnonzero(g.max(1) >= best - 1e-9):  # a near tie: libm's values decide, as in rng.gumbel
            g[i, j[i]] = best[i]
            cand = np.flatnonzero(g[i] >= best[i] - 1e-9)  # within 1e-9: the only items that can be the maximum
            vals = [float(blk[i, c]) + (0.0 - 1.0 * math.log(-math.log(1.0 - float(u[i, c])))) for c in cand]
            j[i] = cand[vals.index(max(vals))]  # the first of equal maxima, as argmax
        out[r0:r0 + 128] = j
    return out
