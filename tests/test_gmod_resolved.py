"""gmod where an adaptive design resolves the top: synthetic worlds with a known irregular
top (spikes and holes at given ranks), the users' exact metric computed by brute force (every positive's exact
rank through ``metric_values``), over seeded repeats.

The world: n = 200 candidates, P(R) proportional to 1/(2R) + 1/(2n) (smooth on the log-rank scale) times factors
at given ranks; 800 positives; adaptive sampling 800 -> 6,400 (with replacement). The design's resolution at rank
R, 1 / sqrt(Fisher information of Binomial(r~ - 1; M, (R - 1)/(n - 1))), is about 1.5 ranks at R = 10 (every
positive of the top ranks has M >= 800), against 7.3 ranks for adaptive 100 -> 3,200 on ml-100k and 5.4 at m = 500
(docs/research-notes.md, "The first pass: basis, penalty, and the oracle").

Tolerances (measured with seeds 0-5; 12 more seeds gave at most 1.3%): smooth world and a world with spikes inside
the top K, gmod's largest relative error 2.0% / 1.1% (HR@10), 1.3% / 1.1% (NDCG@10); asserted below 3.5%, 3.5 times the
largest relative standard error that ``estimate()`` reports there (0.6-1.0%, mostly the users' posterior
variance; seed 0). The world with a spike just below K (rank 11) and holes at 9-10 is the known limit
(docs/estimators.md, "Where the top is resolved"; docs/research-notes.md, "The twin margin"): gmod's smooth prior leaks
the spike into the top 10
(+4-6% on HR@10, interval missing), where ``mes`` stays within about 5%: pinned here so that a change is seen.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact

N, USERS, M0, CAP = 200, 800, 800, 6400
SEEDS = range(4)
# 0-based rank index -> factor on P(R): spikes (x3, x4) and holes (x0.1, x0.2) at given exact ranks
WORLDS = {
    "smooth": {},
    "inner": {1: 3.0, 4: 3.0, 6: 3.0, 3: 0.2, 5: 0.2},  # spikes at ranks 2, 5, 7; holes at 4, 6: all inside K = 10
    "boundary": {2: 4.0, 6: 4.0, 10: 4.0, 4: 0.1, 8: 0.1, 9: 0.1},  # a spike at rank 11 = K + 1, holes at 9, 10
}


def _world(kind: str, seed: int) -> torch.Tensor:
    """USERS exact ranks drawn from the world's P(R) (seeded)."""
    r = np.arange(1, N + 1, dtype=np.float64)
    w = 0.5 / r + 0.5 / N
    for i, f in WORLDS[kind].items():
        w[i] *= f
    return torch.from_numpy(np.random.default_rng(seed).choice(np.arange(1, N + 1), size=USERS, p=w / w.sum()))


def _runs(kind: str, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per seed: gmod's relative error, whether its interval(0.95) covers the users' exact metric, and mes's
    relative error (estimate() at the defaults, adaptive sampled ranks drawn from the exact ones)."""
    err, cover, err_mes = [], [], []
    for seed in SEEDS:
        exact = _world(kind, seed)
        sampled = adaptive_sampled_ranks_from_exact(exact, N, rsp.SamplingDesign(M0, adaptive_max=CAP),
                                                    generator=torch.Generator().manual_seed(seed))
        truth = float(rsp.metric_values(metric, exact, N).double().mean())  # brute force: these users' metric
        est = rsp.estimate(metric, sampled, method="gmod")
        assert "top_unresolved" not in est.flags  # (n - 1)/(m + 1) + 1 < 2 <= K: the design resolves the top
        lo, hi = est.interval(0.95)
        err.append(est.value / truth - 1.0)
        cover.append(lo <= truth <= hi)
        err_mes.append(rsp.estimate(metric, sampled, method="mes").value / truth - 1.0)
    return np.array(err), np.array(cover), np.array(err_mes)


@pytest.mark.parametrize("metric", ["hit@10", "ndcg@10"])
@pytest.mark.parametrize("kind", ["smooth", "inner"])
def test_resolved_top_within_tolerance(kind, metric):
    """Smooth world and spikes/holes inside the top K: gmod's users' value within 3.5% of the exact metric in
    every seed, no systematic bias beyond 2%, its interval covering in at least 3 of 4 seeds, and on average no
    worse than mes."""
    err, cover, err_mes = _runs(kind, metric)
    assert np.abs(err).max() < 0.035, err
    assert abs(err.mean()) < 0.02, err
    assert cover.sum() >= 3, (err, cover)
    assert np.abs(err).mean() <= np.abs(err_mes).mean() + 0.005, (err, err_mes)


def test_spike_just_below_k_is_the_known_limit():
    """A spike at rank K + 1 with holes at K - 1 and K, resolved to about 1.5 ranks: gmod's smooth prior moves part
    of the spike into the top K, HR@10 high by 2-8% in every seed (docs/estimators.md), while mes's value stays
    within 6%. If gmod learns to follow such tops, this pin must move with the docs."""
    err, _, err_mes = _runs("boundary", "hit@10")
    assert np.all((err > 0.02) & (err < 0.08)), err
    assert np.abs(err_mes).max() < 0.06, err_mes
    assert np.abs(err_mes).mean() < np.abs(err).mean(), (err, err_mes)
