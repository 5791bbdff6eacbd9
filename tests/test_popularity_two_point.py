"""benchmarks/studies/popularity_two_point.py (docs/research-notes.md, "What the draws and the design
allow"; its figures: docs/popularity.md, "Limits"): its ingredients against independent computations.

* the KL of a move, per draw, against the KL of the two worlds' laws of one draw enumerated item by item and
  reduced to what a draw shows (weight class, beats or not), for every prefix of the moves, up and down;
* the moves never make the worlds distinguishable for sure (finite KL: a class keeps an item on each side that it
  had there), and the least popular items move first;
* the second world's score matrix puts exactly the moved items on the other side of the positive;
* :func:`gmod_oracle.best_prefix`, which both bounds share, against a hand computation.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
try:
    import gmod_oracle as go
    import popularity_two_point as tp
finally:
    sys.path.remove(str(ROOT / "benchmarks" / "studies"))


def _draw_law(w: np.ndarray, above: np.ndarray) -> dict[tuple[float, bool], float]:
    """P(a draw shows weight class c and beats / misses the positive), summed item by item."""
    q = w / w.sum()
    law: dict[tuple[float, bool], float] = {}
    for wi, qi, a in zip(w, q, above):
        law[(float(wi), bool(a))] = law.get((float(wi), bool(a)), 0.0) + float(qi)
    return law


def _kl(p: dict, q: dict) -> float:
    out = 0.0
    for k, pk in p.items():
        if pk > 0:
            qk = q.get(k, 0.0)
            if qk == 0:
                return math.inf
            out += pk * math.log(pk / qk)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_move_kl_matches_the_enumerated_laws(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 60))
    w = rng.choice([1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 5.0, 8.0, 13.0], size=n) ** rng.choice([0.5, 1.0])
    r = int(rng.integers(2, n))  # the positive's exact rank: the first r - 1 items beat it
    moves = tp.user_moves(w, r, reach=n)
    above = np.arange(n) < r - 1
    law1 = _draw_law(w, above)
    for kind, (pos, kl) in moves.items():
        assert len(pos) == len(kl)
        assert np.all(np.isfinite(kl)) and np.all(np.diff(kl) >= -1e-15)  # each further item costs something
        assert np.all(np.diff(w[pos]) >= 0)  # the least popular first
        assert np.all(above[pos] == (kind == "up"))
        for j in range(1, len(pos) + 1):
            above2 = above.copy()
            above2[pos[:j]] = kind == "down"
            law2 = _draw_law(w, above2)
            want = _kl(law2, law1) if kind == "up" else _kl(law1, law2)
            assert kl[j - 1] == pytest.approx(want, rel=1e-9, abs=1e-15), (kind, j)
    # no move takes a class's last item below (down) or an item whose class has none below (up)
    classes_below = {float(x) for x in w[~above]}
    assert all(float(x) in classes_below for x in w[moves["up"][0]])
    taken = w[moves["down"][0]]
    for c in set(taken.tolist()):
        assert (taken == c).sum() < (w[~above] == c).sum()


def test_a_niche_item_costs_about_its_expected_draws():
    # 1 popular item (weight 100) and 50 niche ones (weight 1); the positive below 3 niche items and the popular one
    w = np.array([100.0, 1.0, 1.0, 1.0] + [1.0] * 47)
    moves = tp.user_moves(w, r=5, reach=10)
    pos, kl = moves["up"]
    assert list(pos) == [1, 2, 3]  # the niche items
    q_niche = 1.0 / w.sum()
    # all 3 niche items above put below: per draw about 3 q, the draws that would have hit them
    assert kl[2] == pytest.approx(3 * q_niche, rel=0.1)
    # one of them: much less than q, since a draw shows the class, not which of its items sit above (3 -> 2 of 50)
    assert kl[0] == pytest.approx(q_niche * (2 * math.log(2 / 3) + 48 * math.log(48 / 47)), rel=1e-9)
    assert kl[0] < 0.25 * q_niche
    # the popular item is the only one of its weight: put below, its draws would show that weight missing, which
    # they never do in the first world (infinite KL), so it is not a candidate
    assert len(pos) == 3 and 0 not in pos


def test_second_world_moves_exactly_the_planned_items():
    torch.manual_seed(0)
    U, n = 6, 40
    sc = torch.randn(U, n, dtype=torch.float64)
    test = torch.randint(0, n, (U, 1))
    exc = torch.full((U, 1), -1, dtype=torch.int64)
    exact = rsp.exact_ranks(sc, test, exc, count_other_positives=False).view(-1)
    order, dmask = tp.ordered_world(sc, test, exc, exact)
    plan, want = {}, exact.clone()
    for u in range(U):
        r = int(exact[u])
        if r > 3:
            plan[u] = ("up", np.array([0, r - 2]))  # the top item and the one just above the positive
            want[u] = r - 2
        else:
            plan[u] = ("down", np.array([r - 1, n - 3]))  # the item just below and a deep one
            want[u] = r + 2
    sc2 = tp.second_world(sc, test, order, dmask, plan)
    got = rsp.exact_ranks(sc2, test, exc, count_other_positives=False).view(-1)
    assert torch.equal(got, want)
    changed = (sc2 != sc).sum(1)
    assert torch.equal(changed, torch.full((U,), 2))  # nothing else moved


def test_best_prefix_by_hand():
    users = np.array([0, 0, 1, 2])
    gain = np.array([0.02, 0.03, 0.01, 0.05])
    cost = np.array([0.01, 0.10, 0.05, 0.50])  # ratios 2, 0.3, 0.2, 0.1: user 0's first move, then 1, then 2
    theta = 0.2
    pick = go.best_prefix(users, gain, cost, theta, raises=False)

    def bound(g, kl):
        tv = min(math.sqrt(kl / 2), math.sqrt(1 - math.exp(-kl)))
        return g * (1 - tv) / 2 / theta

    cands = [bound(0.02, 0.01), bound(0.03, 0.06), bound(0.08, 0.56)]
    k = int(np.argmax(cands))
    assert pick.bound == pytest.approx(cands[k])
    assert list(pick.moves) == [0, 2, 3][: k + 1]
    raised = go.best_prefix(users, gain, cost, theta, raises=True)  # relative to the larger, second world
    assert raised.bound == pytest.approx(raised.gap * (1 - raised.tv) / 2 / (theta + raised.gap))
    assert go.best_prefix(users, gain, np.full(4, np.inf), theta, raises=True) is None
    capped = go.best_prefix(users, gain, cost, theta, raises=False, max_gap=0.03 / theta)  # gaps 0.02, 0.03 allowed
    assert capped.gap <= 0.03 + 1e-12 and capped.bound == pytest.approx(max(cands[:2]))
    assert go.best_prefix(users, gain, cost, theta, raises=False, max_gap=0.01 / theta) is None
