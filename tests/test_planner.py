"""The planner: forecasts that match simulation on real recommenders, the default family, the
recommendation, the table, bad input and the ``plan`` subcommand."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import torch

from reco_sampled_plugin import SampledRanks, SamplingDesign, estimate, registry
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.metrics import metric_values
from reco_sampled_plugin.cli import add_plan_parser, run_plan
from reco_sampled_plugin.planner import DEFAULT_FAMILY, DesignForecast, Plan, PlanExecution, default_designs, plan
from reco_sampled_plugin.simulate import simulate_sampled_ranks

DESIGNS = [SamplingDesign(100), SamplingDesign(100, adaptive_max=3200)]
PILOT = SamplingDesign(100, adaptive_max=6400)  # one adaptive draw: m = 100 doubling up to 6400
REPEATS = 40  # Monte Carlo repeats, both for the plan and for the simulation
TOLERANCE = 0.30
# designs whose forecast misses the tolerance for a reason investigated (see the reason): reported as xfail, any other
# miss fails
KNOWN_MISSES = {
    ("ml-latest-small", "Popularity", "hit@10"): {
        "adaptive 100->3200": (
            "over-predicted (ratio 1.55: forecast 0.207, simulated 0.134) since the forecast runs auto's gmod on "
            "adaptive designs: the same bump at ranks 6-11 of the mes pilot fit as for ndcg@10 below, which gmod "
            "smooths across K = 10 in the simulated world only; with a gmod pilot fit the ratio is 1.02, but that "
            "fit under-forecasts ItemKNN(q=3) (0.58-0.69), the worse direction, so the pilot fit stays mes"
        ),
    },
    ("ml-latest-small", "Popularity", "ndcg@10"): {
        "adaptive 100->3200": (
            "over-predicted in 4 of 4 pilot draws (ratio 1.3-1.65): 25 of 610 users rank in the top 10 of n ~ 9,700, "
            "and the adaptive pilot cannot resolve ranks near K (positives there stop doubling at m = 100-800, 12-100 "
            "exact ranks per sampled rank); its fit has a bump at ranks 6-11 that the real, flat top lacks, and mes "
            "is ~14% low on data drawn from the bump but unbiased on the real data"
        ),
    },
}


# ------------------------------------------------------------------------------------ real recommenders
@pytest.fixture(scope="module")
def exact_rank_sets(ml100k_knn_pop_held_out, ml_latest_small_held_out):
    """Exact ranks of the held-out item (leave-last-out) for two cheap recommenders of different shape on each data
    set: ItemKNN(q=3) (Krichene & Rendle's Y) and popularity (the session's shared fixtures, tests/conftest.py)."""
    out = {}
    for name, (ranks, n_u) in (("ml-100k", ml100k_knn_pop_held_out), ("ml-latest-small", ml_latest_small_held_out)):
        for model in ("ItemKNN(q=3)", "Popularity"):
            out[(name, model)] = (ranks[model], n_u)
    return out


METRICS = ("ndcg@10", "hit@10")


def simulated_errors(r: np.ndarray, n_u: np.ndarray, metrics: tuple[str, ...], m: int, cap, repeats: int, seed: int,
                     resample_users: bool) -> dict[str, tuple[float, float]]:
    """Relative RMSE (and its Monte Carlo standard error) of ``mes`` on sampled ranks drawn from the real exact ranks,
    for each of ``metrics``.

    Each repeat draws the design's sampled ranks and compares the estimate with the exact metric of that repeat's
    users: the real users (``resample_users=False``) or the real users resampled with replacement (True: the
    expectation over user sets that the plan forecasts, since its truth is each drawn set's exact metric). The draws
    do not depend on the metric (the estimates draw nothing): every metric is estimated from the same SampledRanks,
    which fit once for all of them (``RankHistogram._derived``), so each metric's numbers are those of a run for that
    metric alone."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    err = {metric: np.empty(repeats) for metric in metrics}
    truths = {metric: np.empty(repeats) for metric in metrics}
    for j in range(repeats):
        idx = rng.integers(0, len(r), len(r)) if resample_users else np.arange(len(r))
        rt, nt = torch.from_numpy(r[idx]), torch.from_numpy(n_u[idx])
        if cap is None:
            s = simulate_sampled_ranks(rt, nt, m, "binomial", gen)
            sample = SampledRanks.from_arrays(s, nt, m)
        else:
            drawn = adaptive_sampled_ranks_from_exact(rt, nt, SamplingDesign(m, adaptive_max=cap), gen)
            s, sizes = drawn.ranks, drawn.n_samples
            sample = SampledRanks.from_arrays(s, nt, sizes, SamplingDesign(m, adaptive_max=cap))
        for metric in metrics:
            truths[metric][j] = float(metric_values(metric, rt, nt).mean())
            value = estimate(metric, sample, registry.Auto(n_bootstrap=0)).value
            err[metric][j] = value - truths[metric][j]
    out = {}
    for metric in metrics:
        scale = truths[metric].mean()
        mse = err[metric].mean() ** 2 + err[metric].var(ddof=1)
        se = np.std(err[metric] ** 2, ddof=1) / math.sqrt(repeats) / (2.0 * math.sqrt(mse))
        out[metric] = (math.sqrt(mse) / scale, se / scale)
    return out


@pytest.fixture(scope="module")
def simulated(exact_rank_sets):
    """``simulated_errors`` of a (data set, recommender, design), every metric of METRICS from the same draws (seed
    7), made on first use and kept for the module: the two metrics' cases of one data set and recommender share
    them."""
    kept: dict = {}

    def get(dataset: str, model: str, design: SamplingDesign, metric: str) -> tuple[float, float]:
        key = (dataset, model, design.n_samples, design.adaptive_max)
        if key not in kept:
            r, n_u = exact_rank_sets[(dataset, model)]
            kept[key] = simulated_errors(r, n_u, METRICS, design.n_samples, design.adaptive_max, REPEATS, seed=7,
                                         resample_users=True)
        return kept[key][metric]

    return get


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("model", ["ItemKNN(q=3)", "Popularity"])
@pytest.mark.parametrize("dataset", ["ml-100k", "ml-latest-small"])
def test_prediction_matches_simulation(exact_rank_sets, simulated, dataset, model, metric):
    """Predicted (a plan from one adaptive pilot drawn from the exact ranks) and simulated relative errors agree
    within 30% for fixed m = 100 and adaptive 100 -> 3200.

    The simulation resamples the users in every repeat: the plan's error is over fresh sets of users (its truth is
    each set's exact metric), and a fixed set's error differs from that expectation by the luck of that set (at
    K below the resolution, how its first-bin positives split around K), which no plan can know (the fixed-set
    numbers are in the planner's report)."""
    r, n_u = exact_rank_sets[(dataset, model)]
    gen = torch.Generator().manual_seed(2024)
    pilot = adaptive_sampled_ranks_from_exact(torch.from_numpy(r), torch.from_numpy(n_u), PILOT, generator=gen)
    result = plan(n_u, len(n_u), metric, 0.1, pilot=pilot, designs=DESIGNS, repeats=REPEATS, seed=1,
                  execution=PlanExecution(screen=False, forecast_all=True))
    assert result.shape_source.startswith("pilot")
    assert [f.design for f in result.forecasts] == DESIGNS
    misses = {}
    for forecast, design in zip(result.forecasts, DESIGNS):
        sim, sim_se = simulated(dataset, model, design, metric)
        ratio = forecast.rel_error / sim
        print(f"{dataset} {model} {metric} {forecast.label}: predicted {forecast.rel_error:.3f} "
              f"(+- {forecast.rel_error_se:.3f}), simulated {sim:.3f} (+- {sim_se:.3f}), ratio {ratio:.2f}")
        if abs(ratio - 1.0) > TOLERANCE:
            misses[forecast.label] = (round(float(forecast.rel_error), 3), round(float(sim), 3))
    known = KNOWN_MISSES.get((dataset, model, metric), {})
    assert set(misses) <= set(known), misses
    if misses:
        pytest.xfail("; ".join(f"{label} {misses[label]}: {known[label]}" for label in misses))


# ------------------------------------------------------------------------------------------- default family
def test_default_family_truth_and_source():
    n, users, repeats = 10_000, 2000, 10
    result = plan(n, users, "hit@10", 0.05, designs=[SamplingDesign(100), SamplingDesign(2000)], repeats=repeats,
                  seed=3, execution=PlanExecution(forecast_all=True))
    assert result.shape_source == DEFAULT_FAMILY
    harmonic = np.cumsum(1.0 / np.arange(1, n + 1))
    expected = 0.5 * harmonic[9] / harmonic[-1] + 0.5 * 10 / n  # HR@10 of the 50/50 mixture
    se = math.sqrt(expected * (1 - expected) / (users * repeats))
    assert abs(result.truth - expected) <= 4 * se
    coarse, fine = result.forecasts
    # m = 100 cannot resolve K = 10 (b = 100): mes is biased low; m = 2000 (b = 6) much less so
    assert coarse.rel_bias < 0 and abs(coarse.rel_bias) > abs(fine.rel_bias)
    assert coarse.resolution == pytest.approx((n - 1) / 101 + 1)
    for f in result.forecasts:
        assert f.rel_error == pytest.approx(math.hypot(f.rel_bias, f.rel_sd))
        assert f.mean_samples == f.n_samples and f.adaptive_max is None


def _pairs(designs: list[SamplingDesign]) -> list[tuple[int, int | None]]:
    assert all(d.replacement and d.popularity is None and not d.exact_at_cap for d in designs)
    return [(d.n_samples, d.adaptive_max) for d in designs]


def test_default_designs_grid():
    tops = {}

    def plain(n, **kw):  # the grid without its active exact shares (tests/test_planner_share.py)
        grid = default_designs(n, **kw)
        shared = [d for d in grid if d.exact_share is not None]
        last = [d for d in grid if d.adaptive_max is not None and not d.exact_at_cap and d.exact_share is None]
        assert [(d.n_samples, d.adaptive_max) for d in shared] == [(d.n_samples, d.adaptive_max) for d in last[-1:]] * 3
        top = [d for d in grid if d.adaptive_top != 1]  # the threshold designs: completed at the cap, after the rest
        assert all(d.adaptive_top == 3 and d.exact_at_cap and d.exact_share is None for d in top)
        assert grid[len(grid) - len(shared) - len(top):len(grid) - len(shared)] == top
        tops[n, kw.get("method")] = [(d.n_samples, d.adaptive_max) for d in top]
        return _pairs([d for d in grid if d.exact_share is None and d.adaptive_top == 1])

    assert plain(10_000) == [(50, None), (100, None), (200, None), (500, None), (1000, None),
                             (2000, None), (100, 800), (100, 3200), (100, 12800)]
    # up to the first cap >= n - 1; fixed m < n - 1
    assert plain(1000) == [(50, None), (100, None), (200, None), (500, None), (100, 800), (100, 3200)]
    # small catalogues start adaptive sampling lower (m0 = (n - 1) // 8), caps rounded down to m0 2^s
    assert plain(300) == [(50, None), (100, None), (200, None), (37, 592)]
    assert plain(10_000, method="bv") == [(m, None) for m in (50, 100, 200, 500, 1000, 2000)]
    # the threshold designs: caps m0 2^s from max(8 m0, n / 16) up to n / 3, drawn while r~ <= 3 and completed there
    assert tops == {(10_000, None): [(100, 800), (100, 1600), (100, 3200)], (1000, None): [], (300, None): [],
                    (10_000, "bv"): []}
    assert [(d.adaptive_max, d.adaptive_top) for d in default_designs(50_000) if d.adaptive_top > 1] == [
        (3200, 3), (6400, 3), (12800, 3)]


def test_adaptive_cost_and_pilot_rescaling():
    """An adaptive design's cost is its mean final m; a pilot on another catalogue is rescaled on the p scale (a
    uniform pilot stays uniform: AUC 0.5)."""
    gen = torch.Generator().manual_seed(5)
    exact = torch.randint(1, 1001, (3000,), generator=gen)
    pilot = SampledRanks(simulate_sampled_ranks(exact, 1000, 100, "binomial", gen), torch.tensor(1000),
                         design=SamplingDesign(100))
    result = plan(20_000, 1000, "auc", 0.05, pilot=pilot, designs=[SamplingDesign(100), SamplingDesign(50, adaptive_max=400)], repeats=4, seed=0)
    assert result.shape_source.startswith("pilot")
    assert result.truth == pytest.approx(0.5, abs=0.03)
    fixed, adaptive = result.forecasts
    assert fixed.mean_samples == 100
    assert 50 <= adaptive.mean_samples < 100  # few positives rank first among 50 when ranks are uniform
    assert adaptive.adaptive_max == 400


# ----------------------------------------------------------------------------------------- recommendation
@pytest.fixture(scope="module")
def small_plan():
    return plan(5000, 1500, "ndcg@10", 0.10,
                designs=[SamplingDesign(50), SamplingDesign(1000), SamplingDesign(100, adaptive_max=3200)], repeats=6,
                seed=2, execution=PlanExecution(forecast_all=True))


def _with_target(p: Plan, target: float, forecast_all: bool = True) -> Plan:
    """``p`` replanned at the point target ``target`` (the interval target out of the way: 1000%)."""
    return plan(p.n_items, p.n_users, p.metric, target, designs=[f.design for f in p.forecasts],
                repeats=p.repeats, seed=p.seed, target_rel_halfwidth=10.0,
                execution=PlanExecution(forecast_all=forecast_all))


def test_recommended_is_cheapest_meeting_target(small_plan):
    generous = _with_target(small_plan, 10.0)  # every design's replicates and interval: at_target re-picks any target
    assert all(f.meets_target for f in generous.forecasts)
    assert generous.recommended == min(generous.forecasts, key=lambda f: f.mean_samples)
    assert generous.recommended.label == "m = 50"
    # by default the designs costlier than a design found to meet the target are not forecast: the same pick
    pruned = _with_target(small_plan, 10.0, forecast_all=False)
    assert pruned.recommended == generous.recommended
    assert [f.pruned for f in pruned.forecasts] == [False, True, True]
    assert all(math.isnan(f.rel_error) and not f.meets_target and f.repeats == 0 for f in pruned.forecasts[1:])
    assert [f.pairs for f in pruned.forecasts] == [f.pairs for f in generous.forecasts]  # the costs stay
    assert pruned.format().count("not forecast: costlier than the pick") == 2
    # a middle target: the recommendation meets it and nothing cheaper does (re-picked from the generous plan's
    # replicates: what _with_target gives there, bit for bit, tests/test_planner_prune.py)
    errors = sorted(f.rel_error for f in small_plan.forecasts)
    middle = generous.at_target((errors[0] + errors[1]) / 2, target_rel_halfwidth=10.0)
    rec = middle.recommended
    assert rec is not None and rec.meets_target and rec.rel_error == errors[0]
    assert not any(f.meets_target for f in middle.forecasts if f.mean_samples < rec.mean_samples)
    # same seed, same forecasts whatever the target
    assert [f.rel_error for f in middle.forecasts] == [f.rel_error for f in small_plan.forecasts]


def test_none_meets_target(small_plan):
    # re-picked from small_plan's replicates (a tighter target: every forecast there ran), what
    # _with_target(small_plan, 1e-6) gives bit for bit (tests/test_planner_prune.py)
    strict = small_plan.at_target(1e-6, target_rel_halfwidth=10.0)
    assert strict.recommended is None
    assert not any(f.meets_target for f in strict.forecasts)
    assert "no sampled design meets" in strict.format()
    assert "rank all items" in strict.format()


def test_format_contents(small_plan):
    text = small_plan.format()
    for needle in ("ndcg@10", "5,000", "1,500 users", "10.0%", DEFAULT_FAMILY, "m = 50", "m = 1000",
                   "adaptive 100->3200", "full ranking", "rel.error", "Recommendation:"):
        assert needle in text, needle
    assert text.splitlines()[-1].startswith("Recommendation:")
    assert len([line for line in text.splitlines() if line.startswith(("m = ", "adaptive "))]) == 3
    assert isinstance(small_plan.forecasts[0], DesignForecast)


# -------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_items=1), "n_items"),
        (dict(n_items=0), "n_items"),
        (dict(n_users=0), "n_users"),
        (dict(target_rel_error=0.0), "target_rel_error"),
        (dict(target_rel_error=-0.1), "target_rel_error"),
        (dict(target_rel_error=float("nan")), "target_rel_error"),
        (dict(metric="foo@10"), "metric"),
        (dict(metric="hit@10", n_items=8), "cut-off"),
        (dict(designs=lambda: [SamplingDesign(100, adaptive_max=50)]), "adaptive_max"),  # the cap
        (dict(designs=[SamplingDesign(1999)]), "rank all items"),
        (dict(designs=lambda: [SamplingDesign(0)]), "n_samples"),  # m
        (dict(designs=[100]), "designs"),
        (dict(designs=[(50, 400)]), "^designs: each design is a SamplingDesign"),
        (dict(designs=[]), "no candidate design"),
        (dict(designs=SamplingDesign(50)), "^designs: expected a list of SamplingDesigns"),  # one design, not a list
        (dict(designs=100), "^designs: expected a list of SamplingDesigns"),
        (dict(designs="100:3200"), "^designs: expected a list of SamplingDesigns"),
        (dict(designs=[SamplingDesign(50, adaptive_max=400)], method="bv"), "adaptive"),
        (dict(method="nope"), "method"),
        (dict(repeats=1), "repeats"),
        (dict(n_items=np.full(10, 2000)), "per-user"),
        (dict(pilot=np.array([1, 2, 3])), "^pilot: expected the SampledRanks"),
        (dict(pilot=SampledRanks(torch.tensor([1, 2, 3]), torch.tensor(2000))),
         "^pilot: these SampledRanks carry no design"),
        # an adaptive pilot whose positive ranks first below the cap cannot come from that design
        (dict(pilot=SampledRanks(torch.tensor([1, 3]), torch.tensor(2000), design=SamplingDesign(50, adaptive_max=400),
                                 n_samples=torch.tensor([50, 50]))), "stopped below the cap"),
    ],
)
def test_bad_input(kwargs, match):
    args = dict(n_items=2000, n_users=100, metric="hit@10", target_rel_error=0.1, designs=[SamplingDesign(50)],
                repeats=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        if callable(args["designs"]):  # a design refused when it is built
            args["designs"] = args["designs"]()
        plan(args.pop("n_items"), args.pop("n_users"), args.pop("metric"), args.pop("target_rel_error"), **args)


# ------------------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reco-sampled")
    add_plan_parser(parser.add_subparsers(dest="command"))
    return parser


def test_cli_plan(capsys):
    args = _parser().parse_args(["plan", "--n-items", "3000", "--n-users", "400", "--metric", "ndcg@10",
                                 "--target-rel-error", "0.5", "--repeats", "3", "--design", "100",
                                 "--design", "50:800"])
    assert args.func is run_plan
    assert run_plan(args) == 0
    out = capsys.readouterr().out
    assert "m = 100" in out and "adaptive 50->800" in out and DEFAULT_FAMILY in out
    assert out.strip().splitlines()[-1].startswith("Recommendation:")


def test_cli_plan_with_adaptive_pilot(tmp_path, capsys):
    gen = torch.Generator().manual_seed(11)
    n = 3000
    exact = torch.randint(1, 301, (500,), generator=gen)  # a recommender that ranks every positive in the top 10%
    drawn = adaptive_sampled_ranks_from_exact(exact, n, SamplingDesign(50, adaptive_max=800), generator=gen)
    ranks, sizes = drawn.ranks, drawn.n_samples
    path = tmp_path / "pilot.csv"
    path.write_text("rank,n_candidates,n_samples\n" + "".join(f"{r},{n},{m}\n" for r, m in zip(ranks.tolist(),
                                                                                               sizes.tolist())))
    args = _parser().parse_args(["plan", "--n-items", "6000", "--n-users", "300", "--metric", "hit@10",
                                 "--target-rel-error", "0.2", "--pilot", str(path), "--pilot-n-samples", "50",
                                 "--pilot-adaptive-max", "800", "--repeats", "3", "--design", "200"])
    assert run_plan(args) == 0
    out = capsys.readouterr().out
    assert "pilot: mes fit on 500 sampled ranks" in out and "adaptive m = 50->800" in out


def test_cli_plan_errors(tmp_path):
    parser = _parser()
    args = parser.parse_args(["plan", "--n-items", "3000", "--n-users", "400", "--metric", "ndcg@10",
                              "--target-rel-error", "0.1", "--pilot-adaptive-max", "800"])
    with pytest.raises(ValueError, match="without --pilot"):
        run_plan(args)
    with pytest.raises(SystemExit):  # argparse rejects a malformed design
        parser.parse_args(["plan", "--n-items", "3000", "--n-users", "400", "--metric", "ndcg@10",
                           "--target-rel-error", "0.1", "--design", "a:b"])
    bad = tmp_path / "bad.csv"
    bad.write_text("0\n")
    args = parser.parse_args(["plan", "--n-items", "3000", "--n-users", "400", "--metric", "ndcg@10",
                              "--target-rel-error", "0.1", "--pilot", str(bad), "--pilot-n-samples", "100"])
    with pytest.raises(ValueError):
        run_plan(args)


def test_a_world_whose_exact_metric_is_zero_says_why_errors_are_inf():
    """Two simulated users of 5,000 items: their exact NDCG@10 is 0, every relative error inf, no design
    recommended; the plan's notes say why (the CLI prints them), instead of an unexplained inf%."""
    p = plan(5000, 2, "ndcg@10", 0.05, designs=[SamplingDesign(10)], repeats=2)
    assert p.truth == 0.0 and math.isinf(p.forecasts[0].rel_error) and p.recommended is None
    assert any("exact ndcg@10 is 0" in note and "relative errors are undefined" in note for note in p.notes)
    assert not plan(5000, 400, "ndcg@10", 0.05, designs=[SamplingDesign(10)], repeats=2).notes


def test_sets_of_few_users_whose_metric_is_zero_give_inf_widths_and_say_why():
    """Five simulated users of 1,000 items: two of three sets have an exact NDCG@10 of 0. Their relative widths are
    inf, not NaN (a NaN width failed every design that met the point target, with no word why): full ranking's
    median width is inf, every design meeting the point target has a width (inf), and the notes count the sets."""
    p = plan(1000, 5, "ndcg@10", 0.2, repeats=3)
    assert math.isinf(p.full_rel_width) and p.recommended is None
    met = [f for f in p.forecasts if f.rel_error <= 0.2]
    assert met and all(math.isinf(f.rel_width) and not f.meets_target for f in met)
    assert any(note.startswith("2 of 3 simulated sets of 5 users have an exact ndcg@10 of 0") for note in p.notes)
