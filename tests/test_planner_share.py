"""The planner on designs with an exact share: forecasts that match simulation on real exact ranks, the share's
pairs in the cost, the default grid's active shares, the refusals, and a planned share design taken wherever a
design is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import SampledRanks, SamplingDesign, estimate, registry
from reco_sampled_plugin._design_based import share_inclusion
from reco_sampled_plugin._share import with_share_arrays
from reco_sampled_plugin.design import ExactShare
from reco_sampled_plugin.metrics import metric_values
from reco_sampled_plugin.planner import DEFAULT_SHARES, PlanExecution, default_designs, plan
from reco_sampled_plugin.simulate import simulate_sampled_ranks

REPEATS = 10  # Monte Carlo repeats, of the plan and of the simulation
RATIO = 1.5  # forecast / simulated relative error within [1 / RATIO, RATIO]


def simulated_error(r: np.ndarray, n_u: np.ndarray, metric: str, design: SamplingDesign, seed: int) -> float:
    """Relative RMSE of ``estimate`` (auto: diff) on ``design``'s draws from the real exact ranks, the users resampled
    in every repeat (the plan's truth is each drawn set's exact metric): the sampled ranks drawn from the exact
    ones, the share's pi from the draw (an active share: the model's fit of it), each positive chosen when a
    uniform < pi, its exact rank its real one."""
    gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    err, truths = np.empty(REPEATS), np.empty(REPEATS)
    for j in range(REPEATS):
        idx = rng.integers(0, len(r), len(r))
        rt, nt = torch.from_numpy(r[idx]), torch.from_numpy(n_u[idx])
        truths[j] = float(metric_values(metric, rt, nt).mean())
        drawn = SampledRanks.from_arrays(simulate_sampled_ranks(rt, nt, design.n_samples, "binomial", gen), nt,
                                         design.n_samples, design)
        pi = share_inclusion(drawn, design.exact_share)
        chosen = torch.rand(len(pi), generator=gen, dtype=torch.float64) < torch.from_numpy(pi)
        err[j] = estimate(metric, with_share_arrays(drawn, torch.where(chosen, rt, 0), pi)).value - truths[j]
    return math.sqrt(np.mean(err**2)) / truths.mean()


@pytest.mark.parametrize("share", [ExactShare(0.2), ExactShare(0.1, choice="active")], ids=["uniform", "active"])
def test_share_forecast_matches_simulation(ml100k_knn_pop_held_out, share):
    """ml-100k, ItemKNN(q=3), NDCG@10: the plan from a pilot (m = 100 drawn from the real exact ranks) forecasts
    the relative error of m = 50 with an exact share within 1.5x of simulation on the real exact ranks (the check
    that puts the active shares in the default grid; benchmarks/bench_share_plan.py measures the pick at scale)."""
    ranks, n_u = ml100k_knn_pop_held_out
    r = ranks["ItemKNN(q=3)"]
    design = SamplingDesign(50, exact_share=share)
    nt = torch.from_numpy(n_u)
    pilot = SampledRanks.from_arrays(simulate_sampled_ranks(torch.from_numpy(r), nt, 100, "binomial",
                                                            torch.Generator().manual_seed(2024)), nt, 100)
    got = plan(n_u, len(n_u), "ndcg@10", 0.1, pilot=pilot, designs=[design], repeats=REPEATS, seed=0,
               execution=PlanExecution(screen=False, forecast_all=True)).forecasts[0]
    assert got.method == "diff" and got.design == design and got.repeats == REPEATS
    sim = simulated_error(r, n_u, "ndcg@10", design, seed=7)
    print(f"{got.label}: forecast {got.rel_error:.3f} (+- {got.rel_error_se:.3f}), simulated {sim:.3f}")
    assert 1.0 / RATIO <= got.rel_error / sim <= RATIO


def test_share_cost_label_and_the_pick_taken_everywhere():
    """A share's pairs (share x (n - 1) per user) are in the forecast's cost and the pick; the plan recommending a
    share design is taken by every entry point that draws one (the matrix, the scorer loop, adaptive draws)."""
    n, users = 400, 200
    designs = [SamplingDesign(20, exact_share=0.25), SamplingDesign(10, adaptive_max=80,
                                                                    exact_share=ExactShare(0.1, choice="active"))]
    result = plan(n, users, "hit@10", 5.0, designs=designs, repeats=4, seed=1,
                  execution=PlanExecution(forecast_all=True))
    fixed, adaptive = result.forecasts
    assert fixed.share_pairs == pytest.approx(0.25 * (n - 1)) and fixed.pairs == pytest.approx(1 + 20 + 0.25 * (n - 1))
    assert adaptive.share_pairs == pytest.approx(0.1 * (n - 1)) and adaptive.method == "diff"
    assert fixed.label == "m = 20 + exact 0.25 uniform" and adaptive.label == "adaptive 10->80 + exact 0.1 active"
    assert [f.design for f in result.forecasts] == designs
    assert result.recommended is adaptive and "adaptive 10->80 + exact 0.1 active" in result.format()
    scores = torch.randn(30, n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    pos = torch.arange(30).view(30, 1)
    for drawn in (rsp.sampled_ranks(scores, pos, fixed), rsp.adaptive_sampled_ranks(scores, pos, result),
                  rsp.sampled_ranks_from_scorer(lambda u, i: scores[u.unsqueeze(1), i], pos, n, result)):
        assert drawn.design.exact_share is not None and drawn.share_ranks is not None
        assert estimate("hit@10", drawn).details["method"] == "diff"


def test_default_grid_shares_and_refusals():
    grid = default_designs(50_000)
    shares = [d for d in grid if d.exact_share is not None]
    assert [(d.n_samples, d.adaptive_max, d.exact_share) for d in shares] == [
        (100, 12800, ExactShare(s, choice="active")) for s in DEFAULT_SHARES]
    assert not any(d.exact_share is not None for d in default_designs(50_000, method="mes"))
    # the active share's spread is the planned metric's (it was NDCG@10's whatever the plan)
    assert {d.exact_share.metric for d in default_designs(50_000, metric="recall@20") if d.exact_share} == {"recall@20"}
    planned = plan(5000, 300, "recall@20", 0.1, repeats=3)
    assert {f.exact_share.metric for f in planned.forecasts if f.exact_share is not None} == {"recall@20"}
    with pytest.raises(ValueError, match="^designs: .*only 'diff'"):
        plan(2000, 100, "hit@10", 0.1, designs=[SamplingDesign(50, exact_share=0.1)], method="gmod")
    popular = SamplingDesign(50, popularity=torch.ones(2000), exact_share=0.1)
    with pytest.raises(ValueError, match="^designs: .*popularity with an exact share"):
        plan(2000, 100, "hit@10", 0.1, designs=[popular])
    assert registry.get("diff").supports(shares[0])


def test_cli_plan_takes_a_share(capsys):
    """``reco-sampled plan --design M[:CAP]+SHARE[:active]``: the share's designs forecast (and a bad one named)."""
    import argparse

    from reco_sampled_plugin.cli import add_plan_parser, run_plan

    parser = argparse.ArgumentParser()
    add_plan_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", "--n-items", "2000", "--n-users", "200", "--metric", "hit@10",
                              "--target-rel-error", "5", "--repeats", "3", "--design", "20:160+0.1:active",
                              "--design", "20+0.2", "--forecast-all"])
    assert run_plan(args) == 0
    out = capsys.readouterr().out
    assert "adaptive 20->160 + exact 0.1 active" in out and "m = 20 + exact 0.2 uniform" in out
    assert "SamplingDesign(20, adaptive_max=160, exact_share=ExactShare(share=0.1, choice='active'" in out
    for bad, why in (("20+x", "expected a design spec"), ("20+1.5", "share: expected a number in (0, 1]")):
        with pytest.raises(SystemExit):  # argparse names the flag and the spec's reader the reason
            parser.parse_args(["plan", "--design", bad])
        assert f"argument --design: {why}" in capsys.readouterr().err
