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
    scalars, or one value per user); the positive at rank ceil(6 Pareto(0.8))."""
    import math

    from reco_sampled_plugin._popularity_fit import DEEP_RANK

    rng = np.random.default_rng(seed)
    w = np.floor(2000.0 / np.arange(1, n + 1) ** 0.9) + 1.0
    lw = np.log(w)
    top = np.broadcast_to(np.asarray(beta_top, dtype=np.float64), (users,))
    deep = np.broadcast_to(np.asarray(beta_deep, dtype=np.float64), (users,))
    taken = np.zeros((users, n), dtype=bool)
    order = np.empty((users, n), dtype=np.int64)
    for r in range(1, n + 1):
        b = top + (deep - top) * min(math.log(r) / math.log(DEEP_RANK), 1.0)
        g = np.where(taken, -np.inf, b[:, None] * lw[None, :] + rng.gumbel(size=(users, n)))
        j = g.argmax(1)
        order[:, r - 1] = j
        taken[np.arange(users), j] = True
    exact = np.minimum(np.ceil(rng.pareto(0.8, size=users) * 6.0), n - 1).astype(np.int64)
    pos = order[np.arange(users), exact - 1]
    scores = np.empty((users, n))
    scores[np.arange(users)[:, None], order] = -np.arange(n, dtype=np.float64)[None, :]
    return torch.from_numpy(scores), torch.from_numpy(pos).view(-1, 1), torch.from_numpy(w)

