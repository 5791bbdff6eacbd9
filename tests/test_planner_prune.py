"""``PlanExecution(forecast_all=False)``, the default: designs costlier than one found to meet the target are not
forecast.

Oracle: the same plan with ``forecast_all=True`` (every design forecast, each on its own generator): the pick and every
forecast of a design up to the pick's cost must be equal to it, bit for bit, whatever the threads; the designs
costlier than the pick are reported as pruned (their costs kept, their errors NaN), and nothing is pruned when no
design meets the target. The oracle at each target is one such plan (per screening setting and thread count) made
at the loosest target and re-picked with ``Plan.at_target``, itself checked here against fresh plans (bit for bit,
at a target no design meets, at a middle one and with an interval target that bites) and for what it refuses.
"""

from __future__ import annotations

import math

import pytest
import torch

from reco_sampled_plugin import planner
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.ranking import SampledRanks
from reco_sampled_plugin.simulate import simulate_sampled_ranks

DESIGNS = [SamplingDesign(50), SamplingDesign(200), SamplingDesign(1000), SamplingDesign(50, adaptive_max=800),
           SamplingDesign(50, adaptive_max=3200), SamplingDesign(50, adaptive_max=800, exact_at_cap=True),
           SamplingDesign(50, replacement=False)]  # a tie in pairs with m = 50 (51 each): never pruned by it


@pytest.fixture(scope="module")
def pilot():
    gen = torch.Generator().manual_seed(5)
    exact = (torch.rand(1200, generator=gen) ** 3 * 4999).long() + 1
    return SampledRanks(simulate_sampled_ranks(exact, 5000, 100, "binomial", gen), torch.tensor(5000),
                        design=SamplingDesign(100))


LOOSE = 10.0  # a target every design meets (relative RMSE 1000%), looser than every target of _targets


def _plan(pilot, target: float, **execution) -> planner.Plan:
    """The plan of ``pilot`` at ``target``; ``execution``: PlanExecution's fields (screen, forecast_all, workers)."""
    return planner.plan(5000, 1200, "ndcg@10", target, pilot=pilot, designs=DESIGNS, repeats=8, seed=3,
                        seconds_per_pair=1e-6, execution=planner.PlanExecution(progress=False, **execution))


@pytest.fixture(scope="module")
def plans(pilot):
    """``plans(target, **execution)``: ``_plan(pilot, target, **execution)``, made on first use and kept for the
    module (a Plan is frozen): the tests that need the very plan of the same target and execution (defaults
    spelled out: ``PlanExecution``'s screen=True, forecast_all=False) read one run of it; ``plans.fits(target,
    **execution)``: the replicate fits that run made (``_counted_plan``)."""
    kept: dict = {}

    class Plans:
        def _get(self, target: float, screen: bool, forecast_all: bool, workers: int) -> tuple[planner.Plan, list]:
            key = (target, screen, forecast_all, workers)
            if key not in kept:
                kept[key] = _counted_plan(pilot, target, screen=screen, forecast_all=forecast_all, workers=workers)
            return kept[key]

        def __call__(self, target: float, *, screen: bool = True, forecast_all: bool = False,
                     workers: int) -> planner.Plan:
            return self._get(target, screen, forecast_all, workers)[0]

        def fits(self, target: float, *, screen: bool = True, forecast_all: bool = False, workers: int) -> list[int]:
            return self._get(target, screen, forecast_all, workers)[1]

    return Plans()


@pytest.fixture(scope="module")
def every(plans):
    """Every design forecast on every replicate: its errors do not depend on the target (screening would); at a
    target every design meets (every interval estimated), on one thread: ``full_plans(False, 1)``."""
    return plans(LOOSE, forecast_all=True, screen=False, workers=1)


def _targets(every: planner.Plan) -> list[float]:
    """Targets between the forecasts' errors (each design in turn the cheapest meeting one), and one below all."""
    errors = sorted({f.rel_error for f in every.forecasts})
    return [errors[0] / 2] + [(a + b) / 2 for a, b in zip(errors, errors[1:])] + [errors[-1] * 2]


@pytest.fixture(scope="module")
def full_plans(plans):
    """``full(screen, workers)``: the plan with ``forecast_all=True`` at ``LOOSE`` (``plans``: made on first use and
    kept for the module; ``every`` is the one without screening on one thread); ``Plan.at_target`` gives it at every
    target of ``_targets`` (each tighter: every replicate and interval a forecast there reads ran), what ``plan()``
    there gives bit for bit (test_at_target_is_a_fresh_plan)."""

    def full(screen: bool, workers: int) -> planner.Plan:
        return plans(LOOSE, forecast_all=True, workers=workers, screen=screen)

    return full


@pytest.mark.parametrize("screen", [True, False])
@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("k", range(8))
def test_pruned_plan_equals_the_full_plan_up_to_the_pick(plans, every, full_plans, workers, k, screen):
    target = _targets(every)[k]
    full = full_plans(screen, workers).at_target(target)
    fast = plans(target, workers=workers, screen=screen)
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


def _assert_same_plan(got: planner.Plan, want: planner.Plan) -> None:
    assert got.forecasts == want.forecasts and got.recommended == want.recommended
    assert (got.target, got.target_halfwidth, got.truth, got.full_rel_width) == (
        want.target, want.target_halfwidth, want.truth, want.full_rel_width)
    assert got.format() == want.format()


@pytest.mark.parametrize("screen", [True, False])
def test_at_target_is_a_fresh_plan(pilot, plans, every, full_plans, screen):
    """``Plan.at_target`` re-picks from the plan's own replicates exactly what ``plan()`` at that target gives (every
    forecast, its screening, widths and the pick, bit for bit): at a target no design meets and at a middle one (with
    screening on, some designs screened there, none at ``LOOSE``), from the plan at ``LOOSE``; and with an interval
    target given that some designs meeting the point target miss."""
    base = full_plans(screen, 1)
    targets = _targets(every)
    for k in (0, 3):
        fresh = plans(targets[k], forecast_all=True, workers=1, screen=screen)
        _assert_same_plan(base.at_target(targets[k]), fresh)
        assert (fresh.recommended is None) == (k == 0)
        screened = sum(f.screened for f in fresh.forecasts)  # screening on: screened and unscreened designs
        assert 0 < screened < len(DESIGNS) if screen else screened == 0
    _assert_same_plan(base.at_target(), base)  # its own targets: itself
    # an interval target between the forecasts' half-widths: some designs meeting the point target miss it
    halves = sorted(f.rel_halfwidth for f in base.forecasts)
    half = (halves[2] + halves[3]) / 2
    fresh = planner.plan(5000, 1200, "ndcg@10", targets[5], pilot=pilot, designs=DESIGNS, repeats=8, seed=3,
                         seconds_per_pair=1e-6, target_rel_halfwidth=half,
                         execution=planner.PlanExecution(progress=False, forecast_all=True, workers=1, screen=screen))
    assert any(f.rel_error <= targets[5] and not f.meets_target for f in fresh.forecasts)
    _assert_same_plan(base.at_target(targets[5], target_rel_halfwidth=half), fresh)


def test_at_target_refuses_what_the_plan_did_not_run(plans, every, full_plans):
    """A forecast the new pick depends on that the plan did not run is refused, naming the design: pruned designs
    (a default plan at a generous target, re-picked at a strict one), screened ones (screened at a strict target,
    needed at a generous one) and intervals never estimated; bad targets; a Plan not made by plan(). A re-picked
    plan re-picks from the replicates of the plan it came from."""
    targets = _targets(every)
    pruned = plans(targets[-1], workers=1)  # the oracle test's plan at that target (its k = 7, one thread)
    assert any(f.pruned for f in pruned.forecasts)
    with pytest.raises(ValueError, match=r"^at_target: .* the forecast of .*m = 1000.* plan again at that target"):
        pruned.at_target(targets[0])
    # where none meets the target: every design screened but the last but one, which ran every replicate and
    # estimated no interval (it missed the point target); at the loosest target all of them are needed
    screened = plans(targets[0], forecast_all=True, workers=1)  # test_at_target_is_a_fresh_plan's (k = 0)
    assert [f.screened for f in screened.forecasts] == [True] * 5 + [False, True]
    assert screened.forecasts[5].repeats == 8 and math.isnan(screened.forecasts[5].rel_width)
    with pytest.raises(ValueError, match=r"^at_target: .* the forecast of m = 50, m = 200, m = 1000, adaptive 50->800, "
                                         r"adaptive 50->3200, adaptive 50->800 exact, m = 50 \(no repl.\) needs "):
        screened.at_target(targets[-1])
    # a re-picked plan keeps the replicates it was re-picked from: back at LOOSE, the plan made there
    loosest = full_plans(True, 1)
    _assert_same_plan(loosest.at_target(targets[0]).at_target(LOOSE), loosest)
    for bad in (0.0, -0.1, math.nan, "0.1", True):
        with pytest.raises(ValueError, match="^target_rel_error"):
            every.at_target(bad)
        with pytest.raises(ValueError, match="^target_rel_halfwidth"):
            every.at_target(0.1, target_rel_halfwidth=bad)
    bare = planner.Plan(metric="ndcg@10", n_items=5000, n_users=1200, target=0.1, shape_source="x", truth=0.1,
                        forecasts=every.forecasts, recommended=None)
    with pytest.raises(ValueError, match="^at_target: this Plan holds no replicates"):
        bare.at_target(0.2)


def test_the_targets_move_the_pick_across_the_designs(every):
    """The parametrised targets make different designs the pick (and none): the oracle test covers pruning after
    fixed and adaptive picks, with and without completion at the cap."""
    picks = []
    for target in _targets(every):
        ok = [f for f in every.forecasts if f.rel_error <= target and f.pairs < every.full_pairs]
        picks.append(min(ok, key=lambda f: f.pairs).label if ok else None)
    assert None in picks and len(set(picks)) >= 4, picks


def _counted_plan(pilot, target: float, **kw) -> tuple[planner.Plan, list[int]]:
    """The plan, and the replicate fits it ran: one count per replicate, through every fitting path (the joint
    fits of a design's repeats, and the per-repeat fits of exact_at_cap designs)."""
    from reco_sampled_plugin import rank_distribution

    fits: list[int] = []
    joint, single = rank_distribution.ReplicateFits.fit, rank_distribution.fit_rank_distribution

    def count_joint(self, js):
        fits.append(len(js))
        return joint(self, js)

    def count_single(sample, *a, **k):
        if isinstance(sample, list):  # a design's repeats (not the pilot's one fit)
            fits.append(len(sample))
        return single(sample, *a, **k)

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(rank_distribution.ReplicateFits, "fit", count_joint)
        monkeypatch.setattr(rank_distribution, "fit_rank_distribution", count_single)
        result = _plan(pilot, target, **kw)
    return result, fits


def test_pruning_happens_and_saves_fits(pilot, plans, every):
    """At a generous target every design meets it: only the cheapest two (a tie) are forecast, and on one thread
    the designs costlier than them are never fitted (2 x 8 replicate fits against 7 x 8 with forecast_all: the
    fits ``every``, that plan at LOOSE = 10.0, ran)."""
    assert LOOSE == 10.0
    fast, fast_fits = _counted_plan(pilot, 10.0, workers=1)
    full_fits = plans.fits(LOOSE, forecast_all=True, screen=False, workers=1)
    assert fast.recommended is not None and fast.recommended.label == "m = 50"
    assert [f.pruned for f in fast.forecasts] == [False] + [True] * (len(DESIGNS) - 2) + [False]
    assert fast.forecasts[-1].pairs == fast.recommended.pairs and fast.forecasts[-1].meets_target
    assert sum(fast_fits) == 16 and sum(full_fits) == 8 * len(DESIGNS)
    # a strict target: nothing meets it, nothing is pruned, every design fitted (screened ones 5 replicates)
    none, none_fits = _counted_plan(pilot, 1e-6, workers=1)
    assert none.recommended is None and not any(f.pruned for f in none.forecasts)
    assert sum(none_fits) == sum(f.repeats for f in none.forecasts) >= 5 * len(DESIGNS)


def test_forecast_all_is_checked(pilot):
    with pytest.raises(ValueError, match="^forecast_all"):
        _plan(pilot, 0.1, forecast_all="yes")


def test_cli_forecast_all_reaches_the_plan(capsys):
    """``reco-sampled plan --forecast-all``: every design forecast; without it the costlier designs are listed as
    not forecast (a generous target: the cheapest design meets it)."""
    from reco_sampled_plugin.cli import build_parser, run_plan
    argv = ["plan", "--n-items", "3000", "--n-users", "400", "--metric", "ndcg@10", "--target-rel-error", "5",
            "--repeats", "3", "--design", "50", "--design", "100", "--design", "50:800", "--workers", "1"]
    assert run_plan(build_parser().parse_args(argv)) == 0
    pruned = capsys.readouterr().out
    assert run_plan(build_parser().parse_args(argv + ["--forecast-all"])) == 0
    every = capsys.readouterr().out
    assert pruned.count("not forecast: costlier than the pick") == 2 and "--forecast-all" in pruned
    assert "not forecast" not in every and every.count("%") > pruned.count("%")
    assert pruned.strip().splitlines()[-1] == every.strip().splitlines()[-1]  # the same recommendation
