"""``weights_concentrated`` read from the design's weights (``popularity.rare_share``), not only from the drawn items:
the share of the catalogue in popularity classes that all the evaluation's draws are expected to hit fewer than
RARE_DRAWS times. Oracles: the closed form of two-level weights (k heavy items, the rest light), over concentrations
from uniform to one item; a fixed-seed world with known exact ranks where ``hh`` (and ``auto``) is far off and flagged,
and ordinary designs that are not flagged (the study: benchmarks/studies/hh_concentration.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

import reco_sampled_plugin as rsp
from reco_sampled_plugin import popularity
from reco_sampled_plugin.design import SamplingDesign


def _two_level(n: int, k: int, heavy: float) -> torch.Tensor:
    w = torch.ones(n, dtype=torch.float64)
    w[:k] = heavy
    return w[torch.randperm(n, generator=torch.Generator().manual_seed(k))]


def _oracle(n: int, k: int, heavy: float, draws: float) -> float:
    """rare_share of two-level weights: each level is one popularity class (both when heavy = 1), hit draws x its
    mass share times in expectation; a level below RARE_DRAWS counts its items."""
    if math.log(heavy) < 1e-12:  # one popularity class (weight_bins' smallest width)
        return 0.0 if draws >= popularity.RARE_DRAWS else 1.0
    total = k * heavy + (n - k)
    light = (n - k) / n if draws * (n - k) / total < popularity.RARE_DRAWS else 0.0
    heavy_rare = k / n if draws * k * heavy / total < popularity.RARE_DRAWS else 0.0
    return light + heavy_rare


@settings(max_examples=examples(40), deadline=None)
@given(n=st.integers(20, 400), k=st.integers(1, 10), log_heavy=st.floats(0, 12), draws=st.integers(1, 10**6))
def test_rare_share_matches_the_two_level_closed_form(n, k, log_heavy, draws):
    """Concentration from uniform (heavy = 1) to nearly one item (heavy = 10^12)."""
    heavy = 10.0 ** log_heavy
    assert popularity.rare_share(_two_level(n, k, heavy), float(draws)) == pytest.approx(
        _oracle(n, k, heavy, float(draws)), abs=1e-12)


def _world(w: torch.Tensor, seed: int, users: int = 200, m: int = 20, positives: int | None = None):
    """Random scores, one positive per user at a known exact rank (among the first ``positives`` items, default
    all): the popularity draw, and the exact AUC."""
    n = w.numel()
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(users, n, generator=g, dtype=torch.float64)
    pos = torch.randint(0, n if positives is None else positives, (users, 1), generator=g)
    sampled = rsp.sampled_ranks(scores, pos, SamplingDesign(m, popularity=w), generator=g)
    exact = (scores > scores.gather(1, pos)).sum(1).double() + 1.0
    return sampled, float(((n - exact) / (n - 1)).mean())


@settings(max_examples=examples(12), deadline=None)
@given(k=st.integers(1, 8), log_heavy=st.floats(0, 9), seed=st.integers(0, 2**16))
def test_hh_flags_concentrated_designs_by_their_weights(k, log_heavy, seed):
    """From uniform to a few items holding nearly all the mass: hh (and auto on AUC) flags exactly where the design's
    rarely drawn classes hold more than RARE_SHARE_FLAG of the catalogue (or the drawn weights are concentrated),
    and whatever it does not flag is within 5 standard errors of the exact AUC."""
    n, users, m = 300, 200, 20
    w = _two_level(n, k, 10.0 ** log_heavy)
    sampled, truth = _world(w, seed, users, m)
    hh = rsp.estimate("auc", sampled, method="hh")
    rare = _oracle(n, k, 10.0 ** log_heavy, float(users * m))
    assert hh.details["rare_share"] == pytest.approx(rare, abs=1e-12)
    if rare > popularity.RARE_SHARE_FLAG:
        assert "weights_concentrated" in hh.flags
    if "weights_concentrated" not in hh.flags:
        assert abs(hh.value - truth) <= 5 * hh.stderr
    assert ("weights_concentrated" in rsp.estimate("auc", sampled).flags) == ("weights_concentrated" in hh.flags)


def test_far_off_value_is_flagged_and_ordinary_designs_are_not():
    """Known truth, fixed seeds: four items holding 1 - 3e-4 of the mass leave hh's AUC many standard errors from the
    exact one (the light items are hardly ever drawn), and it is flagged though the drawn weights look even; uniform
    and Zipf weights are not flagged and cover the truth."""
    n = 300
    sampled, truth = _world(_two_level(n, 4, 1e6), seed=3)
    hh = rsp.estimate("auc", sampled, method="hh")
    assert abs(hh.value - truth) > 4 * hh.stderr  # the silent wrong number of the old check
    assert hh.details["ess_share"] >= popularity.ESS_SHARE_FLAG  # the drawn items alone look even
    assert "weights_concentrated" in hh.flags and hh.details["rare_share"] == pytest.approx((n - 4) / n)
    assert "weights_concentrated" in rsp.estimate("auc", sampled).flags
    zipf = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
    for w in (torch.ones(n, dtype=torch.float64), zipf, zipf.sqrt()):
        sampled, truth = _world(w, seed=4)
        hh = rsp.estimate("auc", sampled, method="hh")
        assert not hh.flags and hh.details["rare_share"] == 0.0
        assert abs(hh.value - truth) <= 4 * hh.stderr


def test_rank_files_carry_no_design_weights():
    """A popularity rank file keeps only the Hansen-Hurwitz sums: no rare_share (its law is unknown), the Kish
    check alone."""
    sampled, _ = _world(torch.ones(50, dtype=torch.float64), seed=5, users=30, m=5)
    from reco_sampled_plugin.rank_files import RankFile

    r = sampled.ranks.reshape(-1).numpy()
    st_ = sampled.popularity_stats
    assert st_ is not None
    f = RankFile(r, sampled.candidates().reshape(-1).numpy(), r * 0 + 5, st_.inv_q.reshape(-1).numpy(),
                 st_.inv_q2.reshape(-1).numpy())
    est = rsp.estimate("auc", f.sampled(), method="hh")
    assert "rare_share" not in est.details and math.isfinite(est.value)


@pytest.mark.parametrize("weights", ["one item among 1e-300", "1e-300..1e300"])
def test_weights_beyond_float64s_tilt_range_fit_and_are_flagged(weights):
    """Weights spanning more than e^150: pl_fit's tilt v^beta at beta = -2 overflowed (a ValueError 'math domain
    error' from deep inside, auto on NDCG included); now every estimate is finite, its interval inside [0, 1] and
    holding the exact AUC or flagged (hh: weights_concentrated; pl_fit: top_unresolved). (The heavy item is no
    user's positive: its row would leave 1e-298 of the weight to draw from, which the draws refuse.)"""
    n = 60
    w = {"one item among 1e-300": torch.tensor([1e-300] * (n - 1) + [1.0], dtype=torch.float64),
         "1e-300..1e300": torch.logspace(-300, 300, n, dtype=torch.float64)}[weights]
    sampled, truth = _world(w, seed=6, users=40, m=8, positives=n - 1)
    for metric, method in (("auc", "auto"), ("ndcg@10", "auto")):  # hh, then pl_fit
        est = rsp.estimate(metric, sampled, method=method)
        lo, hi = est.interval()
        assert math.isfinite(est.value) and 0.0 <= lo <= hi <= 1.0, (metric, method, est)
        if metric == "auc":
            assert lo <= truth <= hi or est.flags, (method, est, truth)


def test_the_tilt_keeps_ordinary_weights_bits_and_bounds_extreme_ones():
    """``_popularity_fit._tilted``: exp(beta (log v - max)) itself while the smallest class's tilt stays below e^300
    (the fits' numbers unchanged), else the same ratios scaled down by a common factor (which lambda absorbs)."""
    from reco_sampled_plugin._popularity_fit import BETAS, _tilted

    ordinary = np.log(np.array([1e-20, 1e-3, 1.0, 7.0, 1e30]))  # a range of e^115: beta = -2 tilts it to e^230
    for beta in BETAS:
        assert np.array_equal(_tilted(ordinary, beta), np.exp(beta * (ordinary - ordinary.max())))
    extreme = np.log(np.array([1e-300, 1e-100, 1.0, 1e300]))
    for beta in (-2.0, -1.0, -0.5):
        v = _tilted(extreme, beta)
        assert np.all(np.isfinite(v)) and v.max() == pytest.approx(math.exp(300.0))
        normal = np.flatnonzero(v > 1e-300)  # the others underflow, as the heaviest do at a large positive beta
        i, j = normal[0], normal[-1]
        assert len(normal) >= 2
        assert np.log(v[i]) - np.log(v[j]) == pytest.approx(beta * (extreme[i] - extreme[j]), rel=1e-12)
