"""Corrected metrics with standard errors, paired differences, the Table 4 experiment and the report."""

import math

import numpy as np
import pytest
import torch

from reco_sampled_plugin.consistency import consistency_report, parse_method
from reco_sampled_plugin.corrections import correction_table, expected_corrected
from reco_sampled_plugin._estimate import Estimate
from reco_sampled_plugin.priors import BetaPrior, empirical_prior, fit_beta_prior
from reco_sampled_plugin.simulate import draw_sampled_ranks
from reco_sampled_plugin.uncertainty import paired_difference
from reco_sampled_plugin import registry, SampledRanks, SamplingDesign, estimate

TABLE1 = {
    "A": [100, 100, 100, 100, 100],
    "B": [40, 40, 8437, 9266, 4482],
    "C": [212, 2, 743, 5342, 1548],
}


def test_estimate_dataclass():
    e = Estimate.from_values(torch.tensor([1.0, 2.0, 3.0, 4.0]), {"k": 1})
    assert e.value == 2.5 and e.n_instances == 4
    assert math.isclose(e.stderr, np.std([1, 2, 3, 4], ddof=1) / 2)
    lo, hi = e.interval(0.95)
    assert math.isclose(hi - e.value, 1.959963984540054 * e.stderr)
    with pytest.raises(AttributeError):
        e.value = 3.0  # frozen
    one = Estimate.from_values([7.0])  # one instance: no spread to measure, never an exactly known value
    assert one.value == 7.0 and math.isinf(one.stderr) and one.flags == ("few_instances",)


def test_corrected_metric_is_table_lookup_mean(gen):
    n, m = 5_000, 50
    r = torch.randint(1, m + 2, (1000,), generator=gen)
    table = correction_table("ndcg@10", n, m, registry.Bv(gamma=0.1))
    est = estimate("ndcg@10", SampledRanks.from_arrays(r, n, m), registry.Bv(gamma=0.1))
    vals = table[r - 1]
    assert math.isclose(est.value, float(vals.mean()), rel_tol=1e-12)
    assert math.isclose(est.stderr, float(vals.std() / math.sqrt(1000)), rel_tol=1e-12)
    assert est.n_instances == 1000 and est.details["method"] == "bv" and est.details["gamma"] == 0.1


def test_per_instance_candidate_counts_are_honoured_exactly(gen):
    m = 30
    n = torch.randint(400, 460, (300,), generator=gen)
    r = torch.randint(1, m + 2, (300,), generator=gen)
    design = SamplingDesign(m, replacement=False)
    got = estimate("ap", SampledRanks.from_arrays(r, n, m, design), registry.Bv(gamma=0.01))
    want = torch.stack(
        [correction_table("ap", int(ni), design, registry.Bv(gamma=0.01))[int(ri) - 1] for ni, ri in zip(n, r)]
    )
    # 60 distinct n: the tables come from the verified interpolation over n (_over_n, tolerance 1e-10)
    assert got.value == pytest.approx(float(want.mean()), rel=0, abs=1e-9)
    assert got.stderr == pytest.approx(float(want.std() / math.sqrt(300)), rel=0, abs=1e-9)
    # 2-D ranks with per-row n broadcast
    got2 = estimate("ap", SampledRanks.from_arrays(r.reshape(30, 10), n.reshape(30, 10), m, design),
                    registry.Bv(gamma=0.01))
    assert (got2.value, got2.stderr) == (got.value, got.stderr)  # the same tables whatever the shape


def test_corrected_metric_unbiased_for_auc_and_stderr_calibrated():
    """Statistical: 400 evaluations, each of 500 users with exact ranks drawn from a Beta(0.5, 1)-like
    population and then sampled: the mean corrected AUC (cls) is the population AUC within 4 standard
    errors, and the reported stderr matches the spread of the estimates within 15%."""
    n, m, reps, users = 3_000, 40, 400, 500
    rng = np.random.default_rng(7)
    p = BetaPrior(0.5).weights(n)
    exact = torch.from_numpy(rng.choice(np.arange(1, n + 1), size=(reps, users), p=p))
    draws = draw_sampled_ranks(exact, n, m, "binomial", repeats=1, seed=11)[0]
    estimates = [estimate("auc", SampledRanks.from_arrays(draws[i], n, m), "cls") for i in range(reps)]
    values = np.array([e.value for e in estimates])
    truth = float(p @ ((n - np.arange(1, n + 1)) / (n - 1)))
    spread = values.std(ddof=1)
    assert abs(values.mean() - truth) < 4 * spread / math.sqrt(reps)
    assert abs(np.mean([e.stderr for e in estimates]) / spread - 1) < 0.15


def test_expected_corrected_matches_monte_carlo():
    n, m = 10_000, 99
    exact = torch.tensor(TABLE1["C"])
    draws = draw_sampled_ranks(exact, n, m, "hypergeometric", repeats=4000, seed=3)
    design = SamplingDesign(m, replacement=False)
    for method in ("none", registry.Bv(gamma=0.1), "cls"):
        table = correction_table("ndcg", n, design, method)
        values = table[draws - 1]  # (R, 5)
        mc = values.mean(0)
        se = values.std(0) / math.sqrt(4000)
        want = expected_corrected("ndcg", exact, n, design, method)
        assert torch.all(torch.abs(mc - want) < 4.5 * se + 1e-12), method


@pytest.mark.parametrize("law", ["binomial", "hypergeometric"])
def test_draws_follow_the_law(law):
    n, m = 1_000, 20
    r = torch.tensor([1, 2, 500, 999, 1000])
    d = draw_sampled_ranks(r, n, m, law, repeats=20_000, seed=5).double()
    assert int(d[:, 0].max()) == 1 and int(d[:, -1].min()) == m + 1
    p = (r - 1).double() / (n - 1)
    mean = 1 + m * p
    var = m * p * (1 - p) * (1.0 if law == "binomial" else (n - 1 - m) / (n - 2))
    se = torch.sqrt(var / 20_000)
    assert torch.all(torch.abs(d.mean(0) - mean) <= 4 * se + 1e-12)
    centred_sq = (d - d.mean(0)) ** 2
    se_var = torch.sqrt(centred_sq.var(0) / 20_000)  # standard error of the sample variance
    assert torch.all(torch.abs(d.var(0) - var) <= 4 * se_var + 1e-12)


def test_paired_difference(gen):
    """Recall@50 at n = 2,000, m = 50 (the first sampled bin holds ranks 1..~40: the cut-off is resolved): the
    paired mean and standard error of the table values, the normal probability of the ordering, no flag."""
    n, m = 2_000, 50
    a = torch.randint(1, 12, (800,), generator=gen)
    b = torch.randint(1, 40, (800,), generator=gen)
    est = paired_difference("recall@50", a, b, n, m, registry.Bv(gamma=0.1))
    table = correction_table("recall@50", n, m, registry.Bv(gamma=0.1))
    va, vb = table[a - 1], table[b - 1]
    d = va - vb
    assert math.isclose(est.value, float(d.mean()), rel_tol=1e-12)
    assert math.isclose(est.stderr, float(d.std() / math.sqrt(800)), rel_tol=1e-12)
    assert est.value > 0 and est.details["prob_a_better"] > 0.99 and est.flags == ()
    assert est.details["prob_ordering_holds"] == est.details["prob_a_better"]
    same = paired_difference("recall@50", a, a, n, m)
    assert same.value == 0 and same.stderr == 0 and same.details["prob_a_better"] == 0.5
    with pytest.raises(ValueError, match="sampled_ranks_b"):
        paired_difference("recall@50", a, b[:10], n, m)


@pytest.mark.parametrize("metric", ["recall@10", "ndcg@10"])
def test_paired_difference_of_an_unresolved_top_says_so(metric):
    """Where the cut-off lies inside the first sampled bin (n = 2,000, m = 50: ranks 1..~40 share r~ = 1) the sampled
    ranks hardly say how each model's top is shaped. Two worlds within the documented shape assumption (30% of the
    positives in ranks 1..80, one model's as r^-1, the other's uniform, then swapped) have opposite true
    differences; in each, the difference is flagged ``top_unresolved``, its interval holds the truth and the
    identified range of the two models' own intervals, no probability of the ordering is given (the range holds
    0), and the sampling interval alone (value +- 1.96 stderr) misses the truth."""
    from reco_sampled_plugin.metrics import metric_values
    from reco_sampled_plugin.simulate import simulate_sampled_ranks

    n, m, users, top = 2_000, 50, 4_000, 80
    g = torch.Generator().manual_seed(4)

    def exact(steep: bool) -> torch.Tensor:
        shape = 1.0 / torch.arange(1, top + 1, dtype=torch.float64) if steep else torch.ones(top, dtype=torch.float64)
        in_top = torch.multinomial(shape, users, replacement=True, generator=g) + 1
        return torch.where(torch.rand(users, generator=g) < 0.3, in_top, torch.randint(top + 1, n + 1, (users,), generator=g))

    truths = []
    for steep_a in (True, False):
        ra, rb = exact(steep_a), exact(not steep_a)
        truth = float((metric_values(metric, ra.double(), n) - metric_values(metric, rb.double(), n)).mean())
        sa, sb = (simulate_sampled_ranks(r, n, m, generator=torch.Generator().manual_seed(s)) for r, s in ((ra, 1), (rb, 2)))
        d = paired_difference(metric, sa, sb, n, m)
        lo, hi = d.interval(0.95)
        ident = d.details["identified_difference"]
        assert "top_unresolved" in d.flags and d.details["prob_a_better"] is None and d.details["prob_ordering_holds"] is None
        assert lo <= ident[0] < 0.0 < ident[1] <= hi and lo <= truth <= hi, (lo, hi, ident, truth)
        assert abs(truth - d.value) > 1.96 * d.stderr
        truths.append(truth)
    assert truths[0] > 0.05 and truths[1] < -0.05  # the orderings are opposite


@pytest.mark.parametrize("bad", [[-1, 1], [1, 52], [1.5, 2.0]])  # 0 marks padding (SampledRanks.from_arrays)
def test_sampled_ranks_out_of_range(bad):
    with pytest.raises(ValueError, match="sampled_ranks"):
        estimate("ndcg@10", SampledRanks.from_arrays(torch.tensor(bad), 1000, 50), "bv")


@pytest.mark.parametrize("a, b, error", [
    ([0, 1], [1, 2], r"^sampled_ranks_a: values must lie in 1\.\.m\+1 = 1\.\.51 \(1-based\), found 0 \(0 pads"),
    ([1, 2], [1, 52], r"^sampled_ranks_b: values must lie in 1\.\.m\+1 = 1\.\.51 \(1-based\), found 52$"),
])
def test_paired_difference_names_the_ranks_out_of_range(a, b, error):
    """Each argument named (``sampled_ranks`` before, a name neither has); a 0 (a SampledRanks' padding) said so."""
    with pytest.raises(ValueError, match=error):
        paired_difference("ndcg@10", torch.tensor(a), torch.tensor(b), 1000, 50)


def test_ordering_agreement_on_running_example():
    out = consistency_report(TABLE1, 10_000, 99, ["auc", "recall@10"], ["none", "bv:0.001"], repeats=60, seed=1)
    assert out["repeats"] == 60
    # sampled AUC keeps A ahead of B and C in every run (large gaps, unbiased)
    assert out["counts"]["auc"]["none"]["A vs B"] == 60
    # uncorrected Recall@10 in expectation ranks A first though C is best: mostly wrong
    assert out["counts"]["recall@10"]["none"]["A vs C"] < 10
    assert out["counts"]["recall@10"]["bv:0.001"]["A vs C"] > out["counts"]["recall@10"]["none"]["A vs C"]
    again = consistency_report(TABLE1, 10_000, 99, ["auc", "recall@10"], ["none", "bv:0.001"], repeats=60, seed=1)
    assert again["counts"] == out["counts"]  # seeded


def test_consistency_report_structure():
    rep = consistency_report(TABLE1, 10_000, 99, ["ap", "auc"], ["none", "cls", "bv:0.1"], repeats=20)
    assert len(rep["table3"]) == 6 and len(rep["table4"]) == 6
    row = next(r for r in rep["table3"] if r["metric"] == "auc" and r["recommender"] == "B")
    assert math.isclose(row["exact"], row["none"], rel_tol=1e-12)  # sampled AUC is unbiased
    assert math.isclose(row["exact"], row["cls"], rel_tol=1e-9)
    # Krichene & Rendle's Table 2 computed analytically (tests/test_sampling_laws.py): expected sampled AP of A is .637
    row_a = next(r for r in rep["table3"] if r["metric"] == "ap" and r["recommender"] == "A")
    assert abs(row_a["none"] - 0.637) < 5e-4 and row_a["none sd"] > 0
    import pandas as pd

    frames = consistency_report(TABLE1, 10_000, 99, ["ap"], ["none"], repeats=0, as_frame=True)
    assert isinstance(frames["table3"], pd.DataFrame) and frames["table4"].empty


def test_consistency_methods_by_label_carry_their_options():
    """A mapping of labels to method objects: each column is that correction's expected value (a prior travels in its
    method object); the design's law serves the draws and the tables; a method that is no correction is refused."""
    design = SamplingDesign(99, replacement=False)
    methods = {"bv beta": registry.Bv(prior=("beta", 0.5)), "monotone": "cls"}
    rep = consistency_report(TABLE1, 10_000, design, ["ndcg@10"], methods, repeats=0)
    row = next(r for r in rep["table3"] if r["recommender"] == "C")
    for label, method in methods.items():
        want = expected_corrected("ndcg@10", torch.tensor(TABLE1["C"]), 10_000, design, method).mean()
        assert row[label] == float(want)
    out = consistency_report(TABLE1, 10_000, design, ["ndcg@10"], methods, repeats=4, seed=2)
    assert set(out["counts"]["ndcg@10"]) == set(methods)
    for bad in ({"fit": "mes"}, {1: "cls"}, {}, {"x": registry.Bv(max_rel_n_spread=0.1)}):
        with pytest.raises(ValueError, match="^methods: "):
            consistency_report(TABLE1, 10_000, 99, ["ndcg@10"], bad, repeats=0)
    with pytest.raises(ValueError, match="^n_samples: "):
        consistency_report(TABLE1, 10_000, SamplingDesign(99, adaptive_max=400), ["ndcg@10"], ["cls"], repeats=0)


def test_parse_method():
    assert parse_method("bv:0.01") == registry.Bv(gamma=0.01)
    assert parse_method("bv") == registry.Bv() and registry.Bv().gamma == 0.1
    assert parse_method("rank_estimate:linear") == registry.RankEstimate(rounding="linear")
    assert parse_method("cls") == registry.Cls() and parse_method("none") == registry.Uncorrected()
    for bad in ("bv:2", "cls:1", "magic"):
        with pytest.raises(ValueError):
            parse_method(bad)


def test_prior_helpers():
    sampled = draw_sampled_ranks(torch.full((4000,), 300), 1000, 99, seed=2)[0]
    fitted = fit_beta_prior(sampled, 99)
    # E[(r - 1)/(n - 1)] = 0.2995 -> a = mu / (1 - mu) ~ 0.43
    assert abs(fitted.a - 0.2995 / 0.7005) < 0.02
    emp = empirical_prior(torch.tensor([1, 1, 2, 5]), 5, smoothing=0.0)
    np.testing.assert_allclose(emp.weights(5), [0.5, 0.25, 0, 0, 0.25])
    np.testing.assert_allclose(BetaPrior(1.0).weights(50), np.full(50, 1 / 50), rtol=1e-12)
    with pytest.raises(ValueError, match="sampled_ranks"):
        fit_beta_prior(torch.tensor([0, 3]), 10)
