"""benchmarks/studies/gmod_oracle.py's two-point bound (docs/research-notes.md, "What no estimator can do: a
two-point bound"): its ingredients against independent computations.

* E[draws | R] of the adaptive design against the plugin's own adaptive sampler (simulation);
* the sequence's KL, E[draws] KL(Bernoulli), against the exact KL of the observed (r~, M) under the adaptive law,
  enumerated (the stopping factor is free of R, so the two laws differ only through the binomial);
* the bound itself: the second world's ranks are the first's with the moved users one to ``reach`` ranks away
  (inside 1..n), its metric change and KL are what the description says, and the bound is
  |theta_1 - theta_2| (1 - TV) / 2 / max(theta_1, theta_2) (a relative error valid in either world).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from reco_sampled_plugin import metric_values
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.design import SamplingDesign

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
try:
    import gmod_oracle as go
finally:
    sys.path.remove(str(ROOT / "benchmarks" / "studies"))


def test_expected_draws_match_the_adaptive_sampler():
    n = 1500
    ranks = np.array([1, 2, 5, 10, 30, 100])
    exp = go.expected_draws(ranks.astype(float), np.full(len(ranks), float(n)), "adaptive")
    reps = 4000
    r = torch.from_numpy(np.repeat(ranks, reps))
    s = adaptive_sampled_ranks_from_exact(r, torch.full_like(r, n), SamplingDesign(100, adaptive_max=3200),
                                          generator=torch.Generator().manual_seed(0))
    sizes = s.n_samples.double().reshape(len(ranks), reps).numpy()
    se = sizes.std(1) / math.sqrt(reps)
    assert exp[0] == 3200.0  # rank 1 never loses: drawn up to the cap
    np.testing.assert_array_less(np.abs(sizes.mean(1) - exp), 4 * se + 1e-9)
    assert np.all(np.diff(exp) < 0)  # deeper positives stop earlier
    assert np.all(go.expected_draws(ranks.astype(float), np.full(len(ranks), float(n)), "500") == 500.0)


def _adaptive_law(p: float) -> dict[tuple[int, int], float]:
    """P(r~ - 1 = k, M = m) of the adaptive design 100 -> 3,200 by enumeration: stage s is drawn when the previous
    stages had no beating draw; the last stage's draws are all kept."""
    stages = [100 * 2**k for k in range(6)]
    law: dict[tuple[int, int], float] = {}
    reach, prev = 1.0, 0
    for i, m in enumerate(stages):
        new = m - prev
        if i < len(stages) - 1:  # stop here: at least one beating draw among this stage's new draws
            for k in range(1, new + 1):
                law[(k, m)] = reach * stats.binom.pmf(k, new, p)
            reach *= (1 - p) ** new
        else:
            for k in range(0, new + 1):
                law[(k, m)] = reach * stats.binom.pmf(k, new, p)
        prev = m
    return law


def test_wald_kl_equals_the_observed_law_kl():
    n = 1600.0
    for r1, r2 in ((11, 10), (10, 11), (4, 6)):
        p, q = (r1 - 1) / (n - 1), (r2 - 1) / (n - 1)
        a, b = _adaptive_law(p), _adaptive_law(q)
        assert abs(sum(a.values()) - 1) < 1e-9 and abs(sum(b.values()) - 1) < 1e-9
        exact = sum(v * math.log(v / b[k]) for k, v in a.items() if v > 0)
        wald = float(go.expected_draws(np.array([float(r1)]), np.array([n]), "adaptive")[0]
                     * go.kl_bernoulli(np.array(p), np.array(q)))
        assert abs(exact - wald) <= 1e-6 * max(exact, 1e-12), (r1, r2, exact, wald)


def test_the_bound_is_what_its_second_world_gives():
    rng = np.random.default_rng(0)
    n = np.full(900, 1500)
    r = np.concatenate([rng.integers(1, 10, 60), np.full(25, 11), rng.integers(12, 1400, 805), np.full(10, 1500)])
    for metric, design in (("hit@10", "500"), ("ndcg@10", "adaptive"), ("mrr", "500")):  # mrr: rank n can move
        bound, what, world = go.two_point_bound(r, n, metric, design, reach=3)
        moved = np.flatnonzero(world != r)
        assert len(moved) > 0 and np.all(np.abs(world[moved] - r[moved]) <= 3)
        assert np.all(world >= 1) and np.all(world <= n)
        v1 = metric_values(metric, torch.from_numpy(r), torch.from_numpy(n)).numpy()
        v2 = metric_values(metric, torch.from_numpy(world), torch.from_numpy(n)).numpy()
        change = v2[moved] - v1[moved]
        assert np.all(change > 0) or np.all(change < 0)  # every move pushes the metric the same way
        theta, gap = v1.mean(), abs(v2.mean() - v1.mean())
        draws = go.expected_draws(r[moved].astype(float), n[moved].astype(float), design)
        kl = float((draws * go.kl_bernoulli((r[moved] - 1) / (n[moved] - 1), (world[moved] - 1) / (n[moved] - 1))).sum())
        tv = min(math.sqrt(kl / 2), math.sqrt(1 - math.exp(-kl)))
        assert abs(bound - gap * (1 - tv) / 2 / max(theta, v2.mean())) < 1e-12
        assert f"KL {kl:.2f} nats" in what and f"{gap / theta:.1%}" in what
        assert sum(int(c) for c in re.findall(r"(\d+) at \d+ ->", what)) == len(moved)
    # HR@10 with 25 users at rank 11: moving them to 10 is the cheapest change of HR@10, upwards, so the bound is
    # relative to the second world's (larger) value
    bound, _, world = go.two_point_bound(r, n, "hit@10", "500", reach=3)
    assert np.all(world[r == 11] == 10)
    t1, t2 = (float(metric_values("hit@10", torch.from_numpy(x), torch.from_numpy(n)).mean()) for x in (r, world))
    assert t2 > t1 and bound < (t2 - t1) / 2 / t1


def test_the_second_world_stays_inside_the_catalogue():
    n = np.full(40, 300)
    r = np.r_[np.full(20, 300), np.full(20, 299)]  # at and next to the last rank: moves beyond n are not allowed
    bound, _, world = go.two_point_bound(r, n, "mrr", "500", reach=3)
    assert np.isfinite(bound) and bound > 0
    assert np.all(world <= n) and np.any(world != r)


def test_draw_sampled_carries_the_design_and_its_seed():
    """``gmod_oracle.draw_sampled`` (``--coverage``, ``--user-sets``): the sampled ranks of one draw, with the design
    ``estimate()`` reads; the same seed gives the same draw."""
    r = torch.tensor([1, 3, 10, 40, 200])
    n = torch.full_like(r, 400)
    fixed = go.draw_sampled(r, n, "500", 7)
    assert fixed.design.n_samples == 500 and fixed.design.adaptive_max is None
    assert torch.equal(fixed.ranks, go.draw_sampled(r, n, "500", 7).ranks)
    assert torch.all((fixed.ranks >= 1) & (fixed.ranks <= 501))
    adaptive = go.draw_sampled(r, n, "adaptive", 7)
    assert adaptive.design.n_samples == 100 and adaptive.design.adaptive_max == 3200
    assert torch.equal(adaptive.ranks, go.draw_sampled(r, n, "adaptive", 7).ranks)
    assert torch.all(adaptive.n_samples[r == 1] == 3200)  # a positive ranked first by every draw reaches the cap
    wider = go.draw_sampled(r, n, "50-6400", 7)
    assert wider.design.n_samples == 50 and wider.design.adaptive_max == 6400
    assert torch.all(wider.n_samples[r == 1] == 6400)
