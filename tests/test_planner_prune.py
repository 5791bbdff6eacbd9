"""``plan(forecast_all=False)``, the default: designs costlier than one found to meet the target are not forecast.

Oracle: the same plan with ``forecast_all=True`` (every design forecast, each on its own generator): the pick and every
forecast of a design up to the pick's cost must be equal to it, bit for bit, whatever the threads; the designs
costlier than the pick are reported as pruned (their costs kept, their errors NaN), and nothing is pruned when no
design meets the target.
"""

from __future__ import annotations

import math

import pytest
import torch

from reco_sampled_plugin import planner
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.simulate import simulate_sampled_ranks

DESIGNS = [(50, None), (200, None), (1000, None), (50, 800), (50, 3200), SamplingDesign(50, adaptive_max=800,
                                                                                          exact_at_cap=True)]


@pytest.fixture(scope="module")
def pilot():
    gen = torch.Generator().manual_seed(5)
    exact = (torch.rand(1200, generator=gen) ** 3 * 4999).long() + 1
    return simulate_sampled_ranks(exact, 5000, 100, "binomial", gen)


def _plan(pilot, target: float, **kw) -> planner.Plan:
    return planner.plan(5000, 1200, "ndcg@10", target, pilot=pilot, pilot_n_items=5000, pilot_n_samples=100,
                        designs=DESIGNS, repeats=8, seed=3, progress=False, seconds_per_pair=1e-6, **kw)


@pytest.fixture(scope="module")
def every(pilot):
    """Every design forecast on every replicate: its errors do not depend on the target (screening would)."""
    return _plan(pilot, 0.1, forecast_all=True, screen=False)


def _targets(every: planner.Plan) -> list[float]:
    """Targets between the forecasts' errors (each design in turn the cheapest meeting one), and one below all."""
    errors = sorted({f.rel_error for f in every.forecasts})
    return [errors[0] / 2] + [(a + b) / 2 for a, b in zip(errors, errors[1:])] + [errors[-1] * 2]


@pytest.mark.parametrize("screen", [True, False])
@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("k", range(7))
def test_pruned_plan_equals_the_full_plan_up_to_the_pick(pilot, every, workers, k, screen):
    target = _targets(every)[k]
    full = _plan(pilot, target, forecast_all=True, workers=workers, screen=screen)
    fast = _plan(pilot, target, workers=workers, screen=screen)
    assert fast.recommended == full.recommended
    if not screen:  # each design the cheapest meeting the target in turn: the fixture's forecasts (no draw changes)
        assert [f.rel_error for f in full.forecasts] == [f.rel_error for f in every.forecasts]
    limit = math.inf if full.recommended is None else full.recommended.pairs
    for f, g in zip(fast.forecasts, full.forecasts):
        assert f.pairs == g.pairs and f.label == g.label and f.method == g.method
        if g.pairs <= limit:
            assert f == g
        else:
            assert f.pruned and not f.meets_target and f.repeats == 0 and not f.screened
            assert math.isnan(f.rel_error) and math.isnan(f.rel_bias) and math.isnan(f.rel_error_se)
            assert f.scoring_seconds == g.scoring_seconds > 0
    n_pruned = sum(f.pruned for f in fast.forecasts)
    assert n_pruned == sum(g.pairs > limit for g in full.forecasts)
    if full.recommended is None:
        assert n_pruned == 0 and "not forecast" not in fast.format()
    elif n_pruned:
        assert fast.format().count("not forecast: costlier than the pick") == n_pruned
        assert "--forecast-all" in fast.format()
    assert not any(g.pruned for g in full.forecasts)


def test_the_targets_move_the_pick_across_the_designs(every):
    """The parametrised targets make different designs the pick (and none): the oracle test covers pruning after
    fixed and adaptive picks, with and without completion at the cap."""
    picks = []
    for target in _targets(every):
        ok = [f for f in every.forecasts if f.rel_error <= target and f.pairs < every.full_pairs]
        picks.append(min(ok, key=lambda f: f.pairs).label if ok else None)
    assert None in picks and len(set(picks)) >= 4, picks


def test_pruning_happens_and_saves_fits(pilot, every):
    """At a generous target every design meets it: only the cheapest is forecast."""
    fast = _plan(pilot, 10.0, workers=1)
    assert fast.recommended is not None and fast.recommended.label == "m = 50"
    assert [f.pruned for f in fast.forecasts] == [False, True, True, True, True, True]


def test_forecast_all_is_checked(pilot):
    with pytest.raises(ValueError, match="^forecast_all"):
        _plan(pilot, 0.1, forecast_all="yes")
