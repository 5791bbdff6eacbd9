"""Every interval any function returns lies inside the metric's range and is never NaN, for every
registered method and many metrics; the flags are explained in words, in one place (``explain_flags``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

import reco_sampled_plugin as rsp
from reco_sampled_plugin import registry
from reco_sampled_plugin._estimate import FLAG_TEXT, SAME_INTERVAL_NOTE, Estimate, explain_flags
from reco_sampled_plugin.metrics import metric_bounds
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.simulate import draw_sampled_ranks

METRICS = ("hit@1", "hit@10", "recall@10", "ndcg@10", "precision@10", "mrr", "ap", "auc")
OPTIONS = {"beta": {"a": 1.0}}  # the one method with a required option
FITTED = {n for n in registry.names() if registry.get(n).fits_distribution}


def _inside(interval: tuple[float, float], bounds: tuple[float, float]) -> bool:
    lo, hi = interval
    return bounds[0] <= lo <= hi <= bounds[1]


def _check(est: Estimate, bounds: tuple[float, float]) -> None:
    assert not math.isnan(est.value)
    for level in (0.5, 0.95, 0.999):
        for interval in (est.interval(level), est.sampling_interval(level)):
            assert not any(math.isnan(x) for x in interval), (est, interval)
            assert _inside(interval, bounds), (est, level, interval, bounds)
            assert interval[0] <= est.value <= interval[1], (est, level, interval)  # no point outside its interval


@pytest.fixture(scope="module")
def sampled():
    """Sampled ranks of a realistic model on n = 1000, m = 20 (resolution ~48: cut-off 10 is unresolved)."""
    rng = np.random.default_rng(3)
    exact = np.minimum(np.ceil(rng.pareto(0.7, size=400) * 20), 1000).astype(np.int64)
    return torch.from_numpy(exact), draw_sampled_ranks(exact, 1000, 20, seed=5)[0]


@pytest.fixture(scope="module")
def sample(sampled):
    """``sampled``'s ranks as one SampledRanks (n = 1000, m = 20) for every method and metric: what estimation
    derives from them (histogram, identified intervals) is kept on it and shared, as in one evaluation."""
    return rsp.SampledRanks.from_arrays(sampled[1], 1000, 20)


@pytest.fixture(scope="module")
def sample_per_instance_n(sampled):
    """``sampled``'s ranks with per-instance n = 1000 - (i mod 3), one SampledRanks for every method and metric."""
    ranks = sampled[1]
    return ranks, rsp.SampledRanks.from_arrays(ranks, torch.full_like(ranks, 1000) - torch.arange(ranks.numel()) % 3, 20)


@pytest.mark.parametrize("method", registry.names())
def test_every_method_and_metric_keeps_its_intervals_in_range(sample, method):
    opts = {**OPTIONS.get(method, {}), **({"n_bootstrap": 0} if method in FITTED else {})}
    for metric in METRICS:
        if not registry.get(method).takes_metric(parse_metric(metric).kind):  # hh: AUC only; the others refused
            with pytest.raises(ValueError, match="^metric: "):
                rsp.estimate(metric, sample, rsp.registry.method_class(method)(**opts))
            continue
        est = rsp.estimate(metric, sample, rsp.registry.method_class(method)(**opts))
        bounds = metric_bounds(parse_metric(metric), [1000])
        _check(est, bounds)
        if metric == "ndcg@10":  # the cut-off lies inside the first sampled bin: the widened interval
            assert "top_unresolved" in est.flags


@pytest.mark.parametrize("method", registry.names(family=("none", "correction"), fits_distribution=False))
def test_correction_intervals_in_range_with_per_instance_n(sample_per_instance_n, method):
    """``estimate(...).interval(0.95)`` of a correction table (and its sampling interval) never leave the metric's
    range: ls with its huge alternating table entries included (then flagged ``outside_metric_range``); ``none``'s
    range is the sampled metric's own, over m + 1 candidates."""
    ranks, sample = sample_per_instance_n
    n = torch.full_like(ranks, 1000) - torch.arange(ranks.numel()) % 3  # per-instance n
    for metric in METRICS:
        est = rsp.estimate(metric, sample, method)
        counts = np.array([sample.design.n_samples + 1]) if method == "none" else n.numpy()
        bounds = metric_bounds(parse_metric(metric), counts)
        assert est.metric_range == bounds
        _check(est, bounds)
        raw = est.details.get("unclipped_value", est.value)
        # a raw value outside the range is flagged, and the point is the range's nearest end
        assert ("outside_metric_range" in est.flags) == (not bounds[0] <= raw <= bounds[1])
        assert est.value == min(max(raw, bounds[0]), bounds[1])


def test_sampling_interval_is_clipped():
    """A Wald interval of NDCG@10 reached (-0.130, 0.395): the sampling interval is clipped to the range too; the
    unclipped ends are what value +- z stderr gives."""
    est = Estimate(0.1325, 0.1340, 3.0, metric_range=(0.0, 1.0))
    lo, hi = est.sampling_interval(0.95)
    assert lo == 0.0 and hi == pytest.approx(0.1325 + 1.959964 * 0.1340, rel=1e-6)
    assert Estimate(0.5, math.inf, 1.0, metric_range=(0.0, 1.0)).sampling_interval() == (0.0, 1.0)
    assert Estimate(0.5, 0.2, 10.0).sampling_interval(0.95)[0] < 0.2  # no known range: not clipped


def test_paired_difference_interval_in_the_range_of_a_difference():
    d = rsp.paired_difference("hit@10", torch.tensor([1]), torch.tensor([2]), 100, 10)
    assert d.metric_range == (-1.0, 1.0) and d.sampling_interval() == (-1.0, 1.0) == d.interval()


@settings(max_examples=examples(40), deadline=None)
@given(
    ranks=st.lists(st.integers(1, 11), min_size=1, max_size=30),
    metric=st.sampled_from(("hit@3", "ndcg@5", "mrr", "recall@20", "auc", "precision@2")),
    method=st.sampled_from(("none", "rank_estimate", "ls", "cls", "bv", "linear", "bound")),
    n=st.integers(20, 500),  # K <= n: a cut-off above the catalogue is refused (test_input_checks)
)
def test_random_histograms_keep_intervals_in_range(ranks, metric, method, n):
    est = rsp.estimate(metric, rsp.SampledRanks.from_arrays(torch.tensor(ranks), n, 10), method)
    _check(est, metric_bounds(parse_metric(metric), [n]))


@settings(max_examples=examples(40), deadline=None)
@given(
    value=st.floats(-2.0, 3.0),
    stderr=st.one_of(st.floats(0.0, 2.0), st.just(math.inf)),
    bounds=st.one_of(st.none(), st.tuples(st.floats(-1.0, 0.5), st.floats(0.0, 1.5))),
    gap=st.one_of(st.none(), st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0))),
    level=st.floats(0.01, 0.999),
)
def test_any_estimate_holds_its_point(value, stderr, bounds, gap, level):
    """No point outside its own interval, however the Estimate was built (a value outside its metric range, a
    twin gap or table bias, an infinite standard error): both intervals hold the value."""
    if bounds is not None and bounds[0] > bounds[1]:
        bounds = (bounds[1], bounds[0])
    est = Estimate(value, stderr, 10.0, metric_range=bounds, twin_gap=gap)
    for lo, hi in (est.interval(level), est.sampling_interval(level)):
        assert lo <= value <= hi, (est, lo, hi)


def test_table_bias_widens_the_correction_interval():
    """bv where K lies above the resolution and its table's bias is larger than its standard error: the sampling
    interval misses the exact value, ``interval()`` widens by the plug-in bias (``details["table_bias"]``,
    Armstrong & Kolesar's ends) and holds it; a mapping's interval says it leaves its bias out."""
    rng = np.random.default_rng(11)
    exact = np.minimum(np.ceil(rng.pareto(0.6, size=4000) * 3), 2000).astype(np.int64)  # a recommender's ranks
    ranks = torch.as_tensor(draw_sampled_ranks(exact, 2000, 100, seed=2)[0])
    truth = float((exact <= 50).mean())  # HR@50 at n = 2000, m = 100: resolution b ~ 21, K resolved
    est = rsp.estimate("hit@50", rsp.SampledRanks.from_arrays(ranks, 2000, 100), "bv")
    lo, hi = est.sampling_interval()
    assert not lo <= truth <= hi and abs(est.details["table_bias"]) > est.stderr
    wide = est.interval()
    assert wide[0] <= truth <= wide[1] and wide[1] - wide[0] > hi - lo
    assert "top_unresolved" not in est.flags and est.twin_gap == (abs(est.details["table_bias"]),) * 2
    mapped = rsp.estimate("hit@50", rsp.SampledRanks.from_arrays(ranks, 2000, 100), "bound")
    assert "interval_omits_bias" in mapped.flags


def test_flags_are_explained_in_words_with_the_planner_command():
    lines = explain_flags(("top_unresolved", "pooled_n", "made_up"), metric="ndcg@10", n_items=1682, n_samples=100,
                          users=943, pilot="ranks.txt")
    assert lines[0] == (
        "top_unresolved: top of the ranking not resolved by m = 100 samples: the 95% interval spans every value the "
        "data allow under the top-shape assumption, whatever the estimator; rank exactly or sample adaptively "
        "(reco-sampled plan --n-items 1682 --n-users 943 --metric ndcg@10 --target-rel-error 0.05 --pilot ranks.txt)")
    assert lines[1].startswith("pooled_n: candidate counts pooled") and lines[2] == "made_up: made_up"
    # without context: placeholders, still a runnable shape
    assert "reco-sampled plan --n-items N --n-users U --metric METRIC" in explain_flags(["top_unresolved"])[0]
    assert explain_flags(()) == [] and explain_flags(["few_instances", "few_instances"]) == [
        "few_instances: " + FLAG_TEXT["few_instances"]]
    assert "the same for every estimator" in SAME_INTERVAL_NOTE
    assert rsp.explain_flags is explain_flags


def test_top_unresolved_advice_fits_the_design():
    """A run already adaptive is told to raise its cap (m shown as first..cap), a popularity design (which adaptive
    sampling does not take) to rank exactly or raise m; a fixed uniform m keeps the advice to sample adaptively."""
    from reco_sampled_plugin.design import SamplingDesign

    def advice(design):
        return explain_flags(["top_unresolved"], metric="ndcg@10", n_items=1682, users=943, design=design)[0]

    adaptive = advice(SamplingDesign(100, adaptive_max=800))
    assert "not resolved by m = 100..800 samples" in adaptive and "raise the adaptive cap" in adaptive
    assert "sample adaptively" not in adaptive
    popular = advice(SamplingDesign(100, popularity=torch.ones(1682, dtype=torch.float64)))
    assert "m = 100 samples" in popular and "adaptive" in popular and "sample adaptively" not in popular
    assert "rank exactly or sample adaptively" in advice(SamplingDesign(100))
    assert advice(SamplingDesign(100)) == advice(None).replace("by m samples", "by m = 100 samples")


@pytest.mark.parametrize("at", ["top", "bottom"])
@pytest.mark.parametrize("method", ["auto", "none", "gmod"])
def test_an_auc_whose_draws_all_fall_on_one_side_keeps_a_width(at, method):
    """Every positive at r~ = 1 (or every one at m + 1): the per-positive values are all equal, so their spread is
    0 and the interval was [1, 1] ([0, 0]). The draws bound the AUC no tighter than N = 2,000 Bernoulli draws all on
    one side do: Agresti & Coull's interval, from 0.99862 (lower end at the top: Clopper-Pearson's exact 0.99816);
    the point stays."""
    r = torch.full((20,), 1 if at == "top" else 101)
    e = rsp.estimate("auc", rsp.SampledRanks.from_arrays(r, 1000, 100), method)
    lo, hi = e.interval()
    p = 2002 / 2004  # (K + 2) / (N + 4)
    width = 1.959964 * math.sqrt(p * (1 - p) / 2004)
    assert e.stderr >= math.sqrt(p * (1 - p) / 2004) * (1 - 1e-9)
    if at == "top":
        assert e.value == pytest.approx(1.0, abs=1e-6) and hi == 1.0 and lo <= e.value - width + 1e-9
        if method != "gmod":  # gmod's own stderr (its model part) is wider than the floor here
            assert lo == pytest.approx(e.value - width, abs=1e-9)
    else:
        assert e.value == pytest.approx(0.0, abs=3e-3) and lo == pytest.approx(0.0, abs=3e-3) and hi >= width - 1e-4


def test_auc_intervals_cover_near_the_top():
    """Known truth: 50 positives at exact rank 2 of n = 1,000 (AUC 0.998999), m = 100, 400 draws: most draws put
    every positive at r~ = 1 or one at 2, whose spread understated the noise (the default interval covered 0.86);
    with the binomial floor it covers 0.95 or more (0.9575 at this seed; the standard error of a coverage of 0.95
    over 400 draws is 0.011)."""
    n, m = 1000, 100
    r = torch.full((50,), 2)
    truth = (n - 2) / (n - 1)
    covered = 0
    for d in draw_sampled_ranks(r, n, m, "binomial", repeats=400, seed=0):
        lo, hi = rsp.estimate("auc", rsp.SampledRanks.from_arrays(d, n, m)).interval()
        covered += lo <= truth <= hi
    assert covered / 400 >= 0.935


def test_the_auc_floor_counts_only_uniform_draws():
    """Without replacement the floor carries the finite-population factor (n - 1 - m) / (n - 2): 20 positives at
    r~ = 1 with m = 100 of n = 300 keep a width, narrower than with replacement; exact groups (ranked, not drawn)
    add no draws (a histogram of exact groups alone: floor 0); popularity draws get no floor (their estimators
    weigh draws by 1/q: not N equal Bernoulli draws)."""
    from reco_sampled_plugin.design import SamplingDesign
    from reco_sampled_plugin.estimators import auc_stderr_floor

    top = torch.full((20,), 1)
    without = rsp.estimate("auc", rsp.SampledRanks.from_arrays(top, 300, 100, SamplingDesign(100, replacement=False)))
    p = 2002 / 2004
    assert without.stderr == pytest.approx(math.sqrt(p * (1 - p) / 2004 * 199 / 298), rel=1e-9)
    assert without.interval()[0] < 1.0
    sampled = rsp.RankHistogram(np.array([1000]), np.array([100]), (np.eye(101)[0] * 20,))
    mixed = rsp.RankHistogram(np.array([50, 1000]), np.array([49, 100]), (np.eye(50)[0] * 7, np.eye(101)[0] * 20),
                              exact=np.array([True, False]))
    assert auc_stderr_floor(mixed) == pytest.approx(auc_stderr_floor(sampled), rel=1e-12)
    exact_only = rsp.RankHistogram(np.array([50]), np.array([49]), (np.eye(50)[0] * 7,), exact=np.array([True]))
    assert auc_stderr_floor(exact_only) == 0.0
    g = torch.Generator().manual_seed(0)
    w = torch.rand(300, generator=g) + 0.5
    scores, pos = torch.randn(50, 300, generator=g), torch.randint(0, 300, (50,), generator=g)
    scores[torch.arange(50), pos] = 10.0  # every positive first: a spread of 0, where a floor would bind
    pop = rsp.sampled_ranks(scores, pos, SamplingDesign(40, popularity=w), generator=g)
    assert bool((pop.ranks == 1).all())
    assert all("stderr_floor" not in rsp.estimate("auc", pop, method).details for method in ("none", "auto"))
