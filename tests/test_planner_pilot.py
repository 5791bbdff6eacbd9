"""The planner's pilot advice: the resolution a pilot needs for a metric, the pilot design that reaches it, and the
plan's note when a pilot is coarser (a pilot that does not resolve the top forecasts small metrics too
pessimistically)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.planner import PlanExecution, _check_workers, pilot_design, pilot_resolution, plan
from reco_sampled_plugin.ranking import SampledRanks


def _b(n: int, top: int) -> float:
    return (n - 1) / (top + 1) + 1


@pytest.mark.parametrize("metric, expected", [("ndcg@10", 5.0), ("hit@20", 10.0), ("recall@3", 2.0), ("hit@1", 2.0),
                                              ("mrr", 2.0), ("ndcg", 2.0), ("ap", 2.0), ("auc", None)])
def test_pilot_resolution(metric, expected):
    assert pilot_resolution(metric) == expected


def test_pilot_design_scorer_world():
    # the scorer benchmark's catalogue: 50,000 items, NDCG@10 -> adaptive 100 -> 12,800 (b = 4.9; 6,400 gives 8.8)
    assert pilot_design(50_000, "ndcg@10") == SamplingDesign(100, adaptive_max=12_800)
    assert pilot_design(50_000, "auc") == SamplingDesign(100)
    assert pilot_design(400, "hit@50") == SamplingDesign(49)  # m0 = (n - 1) // 8 already resolves b = 25
    with pytest.raises(ValueError, match="n_samples"):
        pilot_design(100, "ndcg@10", n_samples=99)
    with pytest.raises(ValueError, match="metric"):
        pilot_design(1000, "nope@3")


@settings(max_examples=examples(200), deadline=None)
@given(n=st.integers(3, 10**7), k=st.integers(1, 200), m=st.integers(1, 500))
def test_pilot_design_is_the_smallest_doubling_that_resolves(n, k, m):
    """Brute force: the cap is m 2^s for the first s whose resolution reaches max(2, K / 2) (fixed m if s = 0)."""
    if m >= n - 1:
        with pytest.raises(ValueError, match="n_samples"):
            pilot_design(n, f"hit@{k}", n_samples=m)
        return
    need = max(2.0, k / 2.0)
    d = pilot_design(n, f"hit@{k}", n_samples=m)
    assert d.n_samples == m
    s = 0
    while _b(n, m * 2**s) > need:
        s += 1
    if s == 0:
        assert d.adaptive_max is None
    else:
        assert d.adaptive_max == m * 2**s and _b(n, d.adaptive_max // 2) > need >= _b(n, d.adaptive_max)


def _pilot(cap: int, seed: int = 0) -> SampledRanks:
    """An adaptive pilot of 1,000 users at n = 20,000 from a Zipf-like top (HR@10 about 0.2)."""
    rng = np.random.default_rng(seed)
    n = 20_000
    exact = np.minimum(np.floor(np.exp(rng.uniform(0, math.log(n), 1000))).astype(np.int64), n)
    n_u = np.full(1000, n)
    return adaptive_sampled_ranks_from_exact(torch.from_numpy(exact), torch.from_numpy(n_u),
                                             SamplingDesign(100, adaptive_max=cap),
                                             generator=torch.Generator().manual_seed(seed))


def test_plan_notes_a_coarse_pilot():
    coarse_pilot = _pilot(800)  # b = 19,999 / 801 + 1 = 26.0 > 5
    p = plan(20_000, 2000, "ndcg@10", 0.1, pilot=coarse_pilot, designs=[SamplingDesign(100, adaptive_max=3200)],
             repeats=2, seed=0)
    assert len(p.notes) == 1
    assert "b = 26.0" in p.notes[0] and "adaptive 100->6400" in p.notes[0]
    assert "pilot_design(20000, 'ndcg@10')" in p.notes[0]
    assert p.format().splitlines()[-1] == f"Note: {p.notes[0]}"
    p = plan(20_000, 2000, "ndcg@10", 0.1, pilot=_pilot(6400), designs=[SamplingDesign(100, adaptive_max=3200)],
             repeats=2, seed=0)
    assert p.notes == () and "Note:" not in p.format()
    # AUC needs no resolved top; the default family (no pilot) has no pilot to judge
    coarse = plan(20_000, 2000, "auc", 0.1, pilot=coarse_pilot, designs=[SamplingDesign(100)], repeats=2, seed=0)
    assert coarse.notes == ()
    assert plan(20_000, 2000, "ndcg@10", 0.1, designs=[SamplingDesign(100)], repeats=2, seed=0).notes == ()


def test_plan_notes_a_fixed_pilot():
    rng = np.random.default_rng(3)
    exact = torch.from_numpy(rng.integers(1, 5001, 600))
    from reco_sampled_plugin.simulate import simulate_sampled_ranks
    pilot = SampledRanks(simulate_sampled_ranks(exact, 5000, 100, "binomial", torch.Generator().manual_seed(1)),
                         torch.tensor(5000), design=SamplingDesign(100))
    p = plan(5000, 1000, "hit@10", 0.2, pilot=pilot, designs=[SamplingDesign(200)], repeats=2, seed=0)
    assert "b = 50.5" in p.notes[0] and "adaptive 100->1600" in p.notes[0]
    # a HR@10 near 0.002 on 1,000 users: one of the two simulated sets has no hit, whose relative width is inf
    zero = int(np.count_nonzero(p._replicates.truths == 0))
    assert zero == 1 and p.notes[1:] == (f"{zero} of 2 simulated sets of 1000 users have an exact hit@10 of 0, whose "
                                         "relative interval widths are inf (a median of inf where they are half or "
                                         "more): forecast for more users (n_users; --n-users), or a metric with a "
                                         "larger cut-off",)


# ----------------------------------------------------------------------------------------------- screening
def test_screening_settles_far_designs_and_leaves_the_others_unchanged():
    """``PlanExecution(screen=True)``: a design whose first SCREEN_REPEATS replicates all miss the target stops
    there (reported with those replicates, still missing the target); every other design's forecast is the
    unscreened one (the same draws; its fits in two batches instead of one, equal up to the fits' tolerance), so the
    recommendation is the same."""
    from reco_sampled_plugin.planner import SCREEN_REPEATS

    designs = [SamplingDesign(50), SamplingDesign(2000), SamplingDesign(100, adaptive_max=12_800)]
    fast = plan(20_000, 3000, "hit@10", 0.05, designs=designs, repeats=12, seed=4,
                execution=PlanExecution(forecast_all=True))
    full = plan(20_000, 3000, "hit@10", 0.05, designs=designs, repeats=12, seed=4,
                execution=PlanExecution(screen=False, forecast_all=True))
    by_label = {f.label: f for f in full.forecasts}
    screened = [f for f in fast.forecasts if f.screened]
    assert [f.label for f in screened] == ["m = 50"]  # b = 393 at K = 10: biased in every replicate
    far = screened[0]
    assert far.repeats == SCREEN_REPEATS and not far.meets_target and far.rel_error > 0.05
    assert not by_label["m = 50"].meets_target and by_label["m = 50"].repeats == 12
    for f in fast.forecasts:
        if not f.screened:
            g = by_label[f.label]
            assert f.repeats == g.repeats == 12 and f.meets_target == g.meets_target and f.pairs == g.pairs
            for name in ("rel_bias", "rel_sd", "rel_error", "rel_error_se"):
                assert getattr(f, name) == pytest.approx(getattr(g, name), rel=1e-6, abs=1e-9), name
    assert fast.recommended is not None and full.recommended is not None
    assert fast.recommended.label == full.recommended.label
    assert "no (screened: 5 repeats)" in fast.format() and "screened" not in full.format()


def test_screen_option_checked():
    with pytest.raises(ValueError, match="^screen"):
        plan(2000, 100, "hit@10", 0.1, designs=[SamplingDesign(50)], repeats=2,
             execution=PlanExecution(screen="no"))  # type: ignore[arg-type]


def test_screening_rules_on_known_errors():
    """``_screens``: every replicate misses the tolerance, or their RMSE exceeds SCREEN_FACTOR x it; one lucky
    replicate inside the tolerance no longer keeps a design that far off the target."""
    from reco_sampled_plugin.planner import SCREEN_FACTOR, _screens

    assert SCREEN_FACTOR == 2.5
    assert _screens(np.array([1.1, -1.2, 1.5, -1.01, 1.3]), 1.0)  # all miss, RMSE 1.23
    assert not _screens(np.array([0.5, -2.0, 2.0, -2.0, 2.0]), 1.0)  # one inside, RMSE 1.81 <= 2.5
    assert _screens(np.array([0.5, -4.0, 4.0, -4.0, 4.0]), 1.0)  # one inside, RMSE 3.59 > 2.5
    assert not _screens(np.array([0.0, 0.0, 0.0, 0.0, 5.5]), 1.0)  # RMSE 2.46: an outlier alone does not settle it
    assert _screens(np.array([0.0, 0.0, 0.0, 0.0, 5.6]), 1.0)  # RMSE 2.504


def test_screening_rates_match_the_documented_simulation():
    """The rates in SCREEN_FACTOR's comment, on 20,000 sets of 5 Gaussian errors (fixed seed): a design at the
    target is screened with probability 0.3% (all-miss rule, 0.317^5 = 0.00318, binomial sd 0.0004 here); one at
    4x the target 87%."""
    from reco_sampled_plugin.planner import _screens

    rng = np.random.default_rng(11)
    at = np.mean([_screens(e, 1.0) for e in rng.standard_normal((20_000, 5))])
    assert 0.00318 - 4 * 0.0004 < at < 0.00318 + 4 * 0.0004
    far = np.mean([_screens(e, 1.0) for e in 4.0 * rng.standard_normal((20_000, 5))])
    assert abs(far - 0.870) < 4 * math.sqrt(0.87 * 0.13 / 20_000)


def test_cli_screen_help_states_the_planner_rules():
    """The CLI's --screen help (written without importing the planner, which imports torch) quotes the planner's
    constants."""
    import argparse

    from reco_sampled_plugin.cli import add_plan_parser
    from reco_sampled_plugin.planner import SCREEN_FACTOR, SCREEN_REPEATS

    sub = argparse.ArgumentParser().add_subparsers()
    add_plan_parser(sub)
    text = " ".join(next(iter(sub.choices.values())).format_help().split())
    assert f"first {SCREEN_REPEATS} repeats" in text and f"above {SCREEN_FACTOR}x the target" in text


# ------------------------------------------------------------------------------------------------- workers
def test_workers_give_the_same_plan_bit_for_bit():
    """Designs forecast on several threads (``workers``) equal the one-at-a-time plan exactly, in design order,
    screened designs included, and with a pilot; None (the default) picks DEFAULT_WORKERS."""
    gen = torch.Generator().manual_seed(3)
    pilot = SampledRanks(torch.randint(1, 40, (400,), generator=gen), torch.tensor(20_000), design=SamplingDesign(100))
    designs = [SamplingDesign(50), SamplingDesign(400), SamplingDesign(100, adaptive_max=1600),
               SamplingDesign(100, adaptive_max=6400), SamplingDesign(200, replacement=False)]
    kw = dict(designs=designs, repeats=8, seed=5)
    one = plan(20_000, 800, "ndcg@10", 0.1, execution=PlanExecution(workers=1), **kw)
    # None resolves to DEFAULT_WORKERS' count (_check_workers: 1 or 2 here) before any design runs, and the plan
    # runs with it from there: the explicit count None stands for is not planned a second time
    default = _check_workers(None, len(designs))
    assert default in (1, 2)
    for workers in [w for w in (2, 3) if w != default] + [None]:
        many = plan(20_000, 800, "ndcg@10", 0.1, execution=PlanExecution(workers=workers), **kw)
        assert many.forecasts == one.forecasts and many.recommended == one.recommended
    assert any(f.screened for f in one.forecasts) and any(not f.screened for f in one.forecasts)
    piloted = [plan(20_000, 800, "hit@10", 0.2, pilot=pilot, execution=PlanExecution(workers=w), **kw).forecasts
               for w in (1, 4)]
    assert piloted[0] == piloted[1]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_workers_checked(bad):
    with pytest.raises(ValueError, match="^workers"):
        plan(2000, 100, "hit@10", 0.1, designs=[SamplingDesign(50)], repeats=2, execution=PlanExecution(workers=bad))


@pytest.mark.parametrize("bad", [{"workers": 1}, None, 2])
def test_execution_checked(bad):
    with pytest.raises(ValueError, match="^execution: expected a planner.PlanExecution"):
        plan(2000, 100, "hit@10", 0.1, designs=[SamplingDesign(50)], repeats=2, execution=bad)


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_a_failing_design_raises_and_the_plan_is_not_returned(monkeypatch, workers):
    """An exception in a design's thread reaches the caller: the first failing design in design order (here the
    second and fourth designs fail; the larger, m = 700, starts first on the threads); no plan thread outlives the
    call, and the torch thread count is restored."""
    import threading

    import reco_sampled_plugin.planner as planner_mod
    from reco_sampled_plugin import simulate

    real = simulate.simulate_sampled_ranks

    def flaky(exact, n, m, law, gen):
        if m in (400, 700):
            raise RuntimeError(f"design m = {m} failed")
        return real(exact, n, m, law, gen)

    monkeypatch.setattr(simulate, "simulate_sampled_ranks", flaky)
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="m = 400"):
        planner_mod.plan(20_000, 300, "ndcg@10", 0.1,
                         designs=[SamplingDesign(50), SamplingDesign(400), SamplingDesign(100, adaptive_max=1600),
                                  SamplingDesign(700)], repeats=3, execution=PlanExecution(workers=workers))
    assert torch.get_num_threads() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("reco-sampled-plan")]


def test_cli_workers_reaches_the_plan(capsys, monkeypatch):
    """``--workers N`` reaches ``planner.plan(execution=PlanExecution(workers=N))`` (recorded by a wrapper around
    the real plan) and the printed plan is the same for 1 and 3 threads."""
    import argparse

    import reco_sampled_plugin.planner as planner_mod
    from reco_sampled_plugin.cli import add_plan_parser, run_plan

    real, seen = planner_mod.plan, []

    def recording(*args, **kwargs):
        seen.append(kwargs["execution"].workers)
        return real(*args, **kwargs)

    monkeypatch.setattr(planner_mod, "plan", recording)
    parser = argparse.ArgumentParser(prog="reco-sampled")
    add_plan_parser(parser.add_subparsers(dest="command"))
    outs = []
    for w in ("1", "3"):
        args = parser.parse_args(["plan", "--n-items", "3000", "--n-users", "400", "--metric", "ndcg@10",
                                  "--target-rel-error", "0.5", "--repeats", "3", "--design", "100",
                                  "--design", "50:800", "--workers", w])
        run_plan(args)
        outs.append(capsys.readouterr().out)
    assert seen == [1, 3]
    assert outs[0] == outs[1] and "Recommendation:" in outs[0]
    args = parser.parse_args(["plan", "--n-items", "3000", "--n-users", "400", "--metric", "ndcg@10",
                              "--target-rel-error", "0.5", "--workers", "0"])
    with pytest.raises(ValueError, match="^workers"):
        run_plan(args)


def test_default_workers_without_threadpoolctl_is_one(monkeypatch):
    """Without threadpoolctl BLAS keeps its threads in every design's thread: the default falls back to one design
    at a time; with it, DEFAULT_WORKERS (at most the CPUs available and one per design); an explicit number is
    kept either way."""
    import builtins
    import os

    from reco_sampled_plugin.planner import _check_workers

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    import importlib.util

    have = importlib.util.find_spec("threadpoolctl") is not None
    assert _check_workers(None, 50) == (min(cpus, 2) if have else 1) and _check_workers(None, 1) == 1
    assert _check_workers(16, 50) == 16 and _check_workers(16, 3) == 3
    real = builtins.__import__

    def no_threadpoolctl(name, *args, **kwargs):
        if name == "threadpoolctl":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_threadpoolctl)
    assert _check_workers(None, 50) == 1 and _check_workers(3, 50) == 3


def test_a_completed_pilot_reads_its_exact_ranks():
    """A pilot drawn with exact_at_cap (and the threshold rule) fits its completed positives as exact groups: the
    planner's world then puts NDCG@10 and HR@10 within 10% of the pilot's own exact values on known log-uniform ranks
    (n = 20,000; measured -7% / -5%: the log-rank smoothing spreads the exact top), and NDCG@10 less than half as far
    off as the same draws read without the exact ranks, whose top (a bin of ~25 ranks at the cap 800) rests on the
    fit's shape."""
    n, size = 20_000, 3000
    u = np.random.default_rng(7).uniform(0.0, 1.0, size)
    exact = torch.as_tensor(np.minimum(np.floor(np.exp(u * math.log(n + 1.0))), n).astype(np.int64))
    design = SamplingDesign(50, adaptive_max=800, adaptive_top=3, exact_at_cap=True)
    pilot = adaptive_sampled_ranks_from_exact(exact, n, design, generator=torch.Generator().manual_seed(3))
    assert int((pilot.exact_ranks > 0).sum()) > 300
    stripped = SampledRanks.from_arrays(pilot.ranks, n, pilot.n_samples,
                                        SamplingDesign(50, adaptive_max=800, adaptive_top=3))
    from reco_sampled_plugin import metric_values

    for metric in ("ndcg@10", "hit@10"):
        truth = float(metric_values(metric, exact, n).mean())
        read = plan(n, 2000, metric, 0.05, pilot=pilot, designs=[SamplingDesign(100)], repeats=4, seed=0).truth
        blind = plan(n, 2000, metric, 0.05, pilot=stripped, designs=[SamplingDesign(100)], repeats=4, seed=0).truth
        assert abs(read - truth) <= 0.1 * truth, (metric, truth, read, blind)
        if metric == "ndcg@10":  # the shape inside the first bins: what the exact ranks resolve
            assert abs(read - truth) < 0.5 * abs(blind - truth), (truth, read, blind)
