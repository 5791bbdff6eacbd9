"""The plan's interval forecast (``DesignForecast.rel_width``): the median width of the 95% interval the user
reads, against the same design run on fresh draws of a known world (the default family, drawn here from its
closed form), and the interval target's part in the pick. The study on real recommenders (ml-100k,
ml-latest-small) is benchmarks/bench_plan_width.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reco_sampled_plugin import SampledRanks, SamplingDesign, estimate
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.metrics import metric_values
from reco_sampled_plugin.planner import PlanExecution, plan
from reco_sampled_plugin.simulate import simulate_sampled_ranks

N, USERS, METRIC = 2000, 400, "ndcg@10"
COMPLETED = SamplingDesign(50, adaptive_max=400, exact_at_cap=True)


def _default_family(rng: np.random.Generator, size: int) -> np.ndarray:
    """P(R) = 1/2 (1/R)/H_n + 1/2 (1/n) on 1..n, from its probabilities."""
    r = np.arange(1, N + 1)
    p = 0.5 * (1.0 / r) / np.sum(1.0 / r) + 0.5 / N
    return rng.choice(r, size=size, p=p / p.sum())


def _measured_width(design: SamplingDesign, draws: int, seed: int) -> float:
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    widths = []
    for _ in range(draws):
        exact = torch.from_numpy(_default_family(rng, USERS))
        truth = float(metric_values(METRIC, exact, torch.tensor(N)).double().mean())
        if design.adaptive_max is None:
            drawn = SampledRanks.from_arrays(simulate_sampled_ranks(exact, N, design.n_samples, "binomial", gen), N,
                                             design.n_samples, design)
        else:
            d = adaptive_sampled_ranks_from_exact(exact, torch.full((USERS,), N), design, generator=gen)
            drawn = SampledRanks.from_arrays(d.ranks, N, d.n_samples, design, exact_ranks=d.exact_ranks)
        lo, hi = estimate(METRIC, drawn).interval(0.95)
        widths.append((hi - lo) / truth)
    return float(np.median(widths))


@pytest.fixture(scope="module")
def width_plan():
    return plan(N, USERS, METRIC, 0.5, designs=[SamplingDesign(100), COMPLETED], target_rel_halfwidth=0.4, repeats=5,
                seed=4, execution=PlanExecution(forecast_all=True, screen=False))


def test_forecast_width_matches_fresh_draws(width_plan):
    """m = 100 leaves the top unresolved (b = 20.8 > K: the identified interval, about +-80%); adaptive 50 -> 400
    with exact completion resolves it (about +-8%): each forecast within 1.5x of the median width measured on 8
    fresh draws (the widths vary over draws by about 10%, so 1.5x is some 4 standard errors of the ratio)."""
    unresolved, resolved = width_plan.forecasts
    assert unresolved.rel_width > 3 * resolved.rel_width  # what the flags cost the reader
    for f in width_plan.forecasts:
        assert math.isfinite(f.rel_width) and f.rel_halfwidth == f.rel_width / 2
        measured = _measured_width(f.design, 8, seed=11)
        assert 1 / 1.5 < f.rel_width / measured < 1.5, (f.label, f.rel_width, measured)


def test_interval_target_decides_the_pick(width_plan):
    """Both designs meet the loose point target; the interval target (+-40%) passes over the cheaper, unresolved
    one. By default the target is full ranking's own half-width combined with 1.96 x the point target."""
    unresolved, resolved = width_plan.forecasts
    assert unresolved.rel_error <= 0.5 and resolved.rel_error <= 0.5 and unresolved.pairs < resolved.pairs
    assert unresolved.rel_halfwidth > width_plan.target_halfwidth == 0.4 >= resolved.rel_halfwidth
    assert width_plan.recommended == resolved and not unresolved.meets_target
    text = width_plan.format()
    assert f"+-{unresolved.rel_halfwidth:.1%}" in text and f"+-{width_plan.full_rel_width / 2:.1%}" in text
    assert f"n_samples={COMPLETED!r}" in width_plan.recommendation()
    default = plan(N, USERS, METRIC, 0.5, designs=[SamplingDesign(100)], method="bv", repeats=5, seed=4)
    # full ranking's interval: 2 x 1.96 sd / sqrt(U) / T of each set's per-user metric (the same sets: same seed)
    assert default.full_rel_width == width_plan.full_rel_width
    assert 0.3 < default.full_rel_width < 0.6  # NDCG@10 about 0.12 with per-user sd about 0.29 over 400 users
    assert default.target_halfwidth == pytest.approx(math.hypot(default.full_rel_width / 2, 1.959964 * 0.5), rel=1e-6)


def test_kept_widths_change_no_bit(monkeypatch):
    """The replicate widths a plan estimated are kept (``planner._WIDTHS``) for plans of the same draws: the same
    plan again estimates none and equals the first bit for bit, as does the plan after the kept widths are
    dropped; another metric, seed or thread count estimates its own."""
    from collections import OrderedDict

    from reco_sampled_plugin import estimators, planner

    monkeypatch.setattr(planner, "_WIDTHS", OrderedDict())
    calls: list[int] = []
    real = estimators.estimate

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(estimators, "estimate", counted)

    def run(metric: str = METRIC, seed: int = 4, workers: int = 1):
        before = len(calls)
        p = plan(N, USERS, metric, 5.0, designs=[SamplingDesign(100)], repeats=2, seed=seed, target_rel_halfwidth=10.0,
                 execution=PlanExecution(workers=workers))
        return p, len(calls) - before

    first, estimated = run()
    assert estimated == 2 and math.isfinite(first.forecasts[0].rel_width)  # both replicates' intervals
    again, estimated = run()
    assert estimated == 0 and again.forecasts == first.forecasts
    planner._WIDTHS.clear()
    fresh, estimated = run()
    assert estimated == 2 and fresh.forecasts == first.forecasts
    assert [run(metric="hit@10")[1], run(seed=5)[1], run(workers=2)[1]] == [2, 2, 2]


def test_kept_widths_follow_the_registry_and_skip_options_held_by_identity():
    """A width kept for a method is not read once ``register(..., replace=True)`` redefines what ``auto`` runs (the
    plan equals one with nothing kept, bit for bit), and a method holding an option by identity (a tensor prior,
    which can change in place) keeps none: a prior changed in place gives the width of the new prior."""
    import dataclasses

    from reco_sampled_plugin import planner, registry

    def run(method=None) -> float:
        kwargs = {} if method is None else {"method": method}
        return plan(N, USERS, "recall@50", 5.0, designs=[SamplingDesign(100)], repeats=2, seed=4,
                    target_rel_halfwidth=10.0, execution=PlanExecution(workers=1), **kwargs).forecasts[0].rel_width

    run()
    orig = registry.get("gmod")
    opts = tuple(dataclasses.replace(o, default=50.0) if o.name == "penalty" else o for o in orig.options)
    registry.register(dataclasses.replace(orig, options=opts), replace=True)
    try:
        replaced = run()
        planner._WIDTHS.clear()
        assert replaced == run()
    finally:
        registry.register(orig, replace=True)
    assert replaced != run()  # the replacement changes the width (else this test could not fail)

    prior = torch.full((N,), 1.0 / N, dtype=torch.float64)
    method = registry.method_class("bv")(prior=prior)
    uniform = run(method)
    r = torch.arange(1, N + 1, dtype=torch.float64)
    prior.copy_((1 / r) / (1 / r).sum())
    changed = run(method)
    planner._WIDTHS.clear()
    assert changed == run(method) and changed != uniform
