"""Bad options, dishonest uncertainty, adapter defaults and CLI input give a ValueError naming the
argument (or an honest result: stderr inf with a flag), never a deep TypeError, a silent NaN, a hang or a
wrong number."""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import consistency_report, estimate, paired_difference, SampledRanks, simulate_sampled_ranks
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.mapping import fit_beta, mapping
from reco_sampled_plugin.priors import BetaPrior
from reco_sampled_plugin.corrections import correction_table
from reco_sampled_plugin._options import (
    check_bool,
    check_choice,
    check_count,
    check_fraction,
    check_options,
    check_positive_float,
)
from reco_sampled_plugin.estimators import ESTIMATORS, METHOD_OPTIONS
from reco_sampled_plugin.rank_distribution import ReplicateFits, fit_rank_distribution
from reco_sampled_plugin import registry

R2 = torch.tensor([1, 2])
RANKS = torch.tensor([1, 2, 3, 5, 9, 11, 4, 2, 7, 1])


# ------------------------------------------------------------------------------------------- options
def test_unknown_option_is_named_with_the_allowed_ones():
    with pytest.raises(ValueError, match="^foo: ") as err:
        estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.Mes(foo=1))
    assert "n_bootstrap" in str(err.value) and "lam" in str(err.value)  # the allowed options are listed
    with pytest.raises(ValueError, match="^foo: .*allowed options: n_bootstrap"):
        estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.Mle(foo=1))
    with pytest.raises(ValueError, match="^foo: "):
        estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.BvMle(foo=1))
    for method in ("bound", "linear", "none", "bv", "ls"):  # methods that fit nothing
        with pytest.raises(ValueError, match=f"^n_bootstrap: method {method!r} does not use it"):
            estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.method_class(method)(n_bootstrap=3))
    # an option of another method is not silently ignored either
    with pytest.raises(ValueError, match="^lam: "):
        estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.Mle(lam=0.1))
    with pytest.raises(ValueError, match="^beta: "):
        estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.BvMle(beta=1.0))


BAD_FIT_OPTIONS = [
    ("tol", math.nan), ("tol", 0), ("tol", -1e-7), ("tol", math.inf), ("tol", "1e-7"),
    ("max_iter", 0), ("max_iter", -1), ("max_iter", 2.5), ("max_iter", True),
    ("n_bootstrap", -1), ("n_bootstrap", 1.5), ("n_bootstrap", True),
    ("seed", -1), ("seed", 1.5), ("seed", "0"),
    ("delta", 0), ("delta", math.nan), ("kappa", -1), ("kappa", math.inf),
    ("max_groups", 0), ("max_groups", 2.0), ("trace", "yes"), ("beta", math.nan),
]


@pytest.mark.parametrize("method", ["mle", "mes"])
@pytest.mark.parametrize("name,value", BAD_FIT_OPTIONS)
def test_fit_options_are_validated_at_the_entry(method, name, value):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=f"^'?{name}'?: "):  # beta for mle: 'beta': unknown option of mle
        estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.method_class(method)(**{name: value}))
    with pytest.raises(ValueError, match=f"^'?{name}'?: "):  # the method object refuses it before any fit
        fit_rank_distribution(SampledRanks.from_arrays(R2, 100, 10), registry.method_class(method)(**{name: value}))
    assert time.perf_counter() - t0 < 5  # refused before any fit (tol=nan used to run the fit to max_iter)


def test_lam_is_checked_and_only_for_mes():
    with pytest.raises(ValueError, match="^lam: "):
        estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.Mes(lam=math.nan))
    with pytest.raises(ValueError, match="^lam: "):
        estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.Mes(lam=-1.0))
    with pytest.raises(ValueError, match="^lam: method 'mle' does not use it; .*lam is an option of mes"):
        fit_rank_distribution(SampledRanks.from_arrays(R2, 100, 10), registry.Mle(lam=0.5))
    # valid options still work and give a real number
    fit = fit_rank_distribution(SampledRanks.from_arrays(RANKS, 100, 10),
                                registry.Mes(lam=0.5, n_bootstrap=0, tol=1e-6, max_iter=50))
    assert fit.details["lam"] == 0.5 and abs(fit.probs.sum() - 1) < 1e-9


def test_batched_fits_validate_their_options():
    hist = rsp.sampled_rank_histogram(RANKS, 100, 10)
    for name, value in (("tol", math.nan), ("max_iter", 0), ("delta", 0.0), ("kappa", math.nan), ("max_groups", 0)):
        with pytest.raises(ValueError, match=f"^{name}: "):
            fit_rank_distribution([hist, hist], registry.Mle(**{name: value}))
    with pytest.raises(ValueError, match="^sampling: "):
        fit_rank_distribution([hist], sampling="xyz")
    # what a list of fits (and the replicate fits) cannot give is refused, not ignored
    for name, value in (("n_bootstrap", 4), ("trace", True)):
        with pytest.raises(ValueError, match=f"^{name}: "):
            fit_rank_distribution([hist, hist], registry.Mes(**{name: value}))
        with pytest.raises(ValueError, match=f"^{name}: "):
            ReplicateFits(torch.tensor([[1, 2], [2, 1]]), 100, 10, registry.Mes(**{name: value}))
    with pytest.raises(ValueError, match="^max_rel_n_spread: "):
        ReplicateFits(torch.tensor([[1, 2], [2, 1]]), 100, 10, registry.Mes(max_rel_n_spread=0.1))
    assert len(fit_rank_distribution([hist, hist], registry.Mes(n_bootstrap=0))) == 2


def test_the_law_comes_from_the_design_and_sampling_must_agree():
    """A histogram's or SampledRanks' design gives the law; ``sampling`` names it for a histogram without one and
    is refused where the design says otherwise (a hypergeometric fit of binomial draws, or the reverse)."""
    without = SamplingDesign(10, replacement=False)
    hist = rsp.sampled_rank_histogram(RANKS, 100, 10)
    a = fit_rank_distribution(hist.with_design(without), registry.Mle(n_bootstrap=0))
    b = fit_rank_distribution(hist, registry.Mle(n_bootstrap=0), sampling="hypergeometric")
    c = fit_rank_distribution(SampledRanks.from_arrays(RANKS, 100, 10, without), registry.Mle(n_bootstrap=0))
    plain = fit_rank_distribution(hist, registry.Mle(n_bootstrap=0))
    assert a.details["sampling"] == b.details["sampling"] == c.details["sampling"] == "hypergeometric"
    np.testing.assert_array_equal(a.probs, b.probs)
    np.testing.assert_array_equal(a.probs, c.probs)
    assert plain.details["sampling"] == "binomial" and not np.array_equal(plain.probs, a.probs)
    with pytest.raises(ValueError, match="^sampling: 'binomial' contradicts the sample's design"):
        fit_rank_distribution(hist.with_design(without), sampling="binomial")
    with pytest.raises(ValueError, match="^sample: the histograms were drawn under different laws"):
        fit_rank_distribution([hist, hist.with_design(without)])
    with pytest.raises(ValueError, match="^sample: expected a RankHistogram or SampledRanks"):
        fit_rank_distribution(RANKS)
    with pytest.raises(ValueError, match="^sample: these SampledRanks carry no design"):
        fit_rank_distribution(SampledRanks(RANKS, torch.tensor(100)))


@pytest.mark.parametrize("method", ["bv", "bv_mle", "none", "mes", "bound"])
def test_gamma_must_be_a_finite_fraction(method):
    for gamma in (math.nan, -0.1, 1.5, math.inf, "0.1"):
        with pytest.raises(ValueError, match="^gamma: "):
            estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.method_class(method)(gamma=gamma))
    ok = estimate("hit@10", SampledRanks.from_arrays(RANKS, 100, 10), registry.Bv(gamma=1.0))
    assert 0.0 <= ok.value <= 1.0 and ok.details["gamma"] == 1.0


def test_mapping_gives_the_documented_value():
    # the documented mapping value (both positives above f(k) of HR@10)
    assert estimate("hit@10", SampledRanks.from_arrays(torch.tensor([1, 2]), 100, 10), "bound").value == 0.75


def test_rounding_is_validated():
    with pytest.raises(ValueError, match="^rounding: "):
        estimate("hit@10", SampledRanks.from_arrays(R2, 100, 10), registry.RankEstimate(rounding="ceil"))


def test_method_objects_check_their_options_without_data():
    from reco_sampled_plugin import registry

    assert registry.method_class("bv")(gamma=0.2).given() == {"gamma": 0.2}
    assert registry.Bv(gamma=0.2).options() == {"gamma": 0.2, "prior": None}
    with pytest.raises(ValueError, match="^a: .*allowed options: gamma, prior"):
        registry.Bv(a=0.5)
    with pytest.raises(ValueError, match="^sampling: "):
        registry.Mle(sampling="binomial")
    with pytest.raises(ValueError, match="^tol: "):
        registry.BvMle(tol=math.nan)
    with pytest.raises(ValueError, match="^a: "):
        registry.Beta(a=-1)
    with pytest.raises(ValueError, match="^max_rel_n_spread: "):
        registry.Uncorrected(max_rel_n_spread=math.nan)
    with pytest.raises(ValueError, match="^top_shape: "):
        registry.Bv(top_shape="flat")
    with pytest.raises(ValueError, match="^method: "):
        registry.method_class("nope")
    assert set(METHOD_OPTIONS) == set(ESTIMATORS)


def test_mapping_options():
    with pytest.raises(ValueError, match="^tol: "):
        fit_beta(RANKS, 100, 10, tol=math.nan)
    with pytest.raises(ValueError, match="^max_iter: "):
        fit_beta(RANKS, 100, 10, max_iter=2.5)
    with pytest.raises(ValueError, match="^max_iter: "):
        fit_beta(RANKS, 100, 10, max_iter=-1)
    with pytest.raises(ValueError, match="^a0: "):
        fit_beta(RANKS, 100, 10, a0="x")
    with pytest.raises(ValueError, match="^a: "):
        mapping(1, 100, 10, "beta", a="x")
    with pytest.raises(ValueError, match="^a: "):
        estimate("hit@10", SampledRanks.from_arrays(RANKS, 100, 10), registry.BetaFit(a=math.nan))
    fit = fit_beta(RANKS, 100, 10, tol=1e-10, max_iter=200)
    assert fit.converged and 0 < fit.a < 10


@pytest.mark.parametrize("a", [1e-300, 1e-20, 1e-7, 2e6, 2.0**40, 1e300], ids=lambda a: f"{a:g}")
@pytest.mark.parametrize("method", ["beta", "beta_fit"])
def test_beta_shapes_outside_the_mappings_float64_range_are_refused(method, a):
    """a in [1e-6, 1e6] (BETA_SHAPE_RANGE): beyond, the mapping collapses in float64 (eq. 19's update divided by 0 at
    a = 1e-300, a ZeroDivisionError) or says its m is too large; at the bounds both methods give a finite value."""
    sample = SampledRanks.from_arrays(RANKS, 100, 10)
    with pytest.raises(ValueError, match=r"^a: the Beta shape must be a number in \[1e-06, 1e\+06\]"):
        estimate("ndcg@10", sample, registry.method_class(method)(a=a))
    for edge in (1e-6, 1e6):
        assert math.isfinite(estimate("ndcg@10", sample, registry.method_class(method)(a=edge)).value)


def test_simulate_generator_is_checked():
    with pytest.raises(ValueError, match="^generator: "):
        simulate_sampled_ranks(RANKS, 100, 10, generator="x")
    draws = simulate_sampled_ranks(RANKS, 100, 10, generator=torch.Generator().manual_seed(0))
    assert draws.shape == RANKS.shape and int(draws.min()) >= 1 and int(draws.max()) <= 11


def test_option_helpers():
    with pytest.raises(ValueError, match="'foo', 'bar': unknown option"):
        check_options({"foo": 1, "bar": 2, "a": 3}, ("a",), "f()")
    assert check_positive_float(np.float32(0.5), "x") == 0.5
    for bad in (math.nan, 0, -1, "1", None, True):
        with pytest.raises(ValueError, match="^x: "):
            check_positive_float(bad, "x")
    assert check_fraction(torch.tensor(0.25), "g") == 0.25
    assert check_count(np.int64(3), "n", 1) == 3 and check_count(torch.tensor(3), "n", 1) == 3
    for bad in (2.5, 3.0, True, "3", torch.tensor(3.0), torch.tensor([3]), None):
        with pytest.raises(ValueError, match="^n: "):
            check_count(bad, "n", 1)
    assert check_bool(np.bool_(True), "b") is True
    with pytest.raises(ValueError, match="^b: "):
        check_bool(1, "b")
    assert check_choice(True, (True, False, "positives"), "c") is True
    with pytest.raises(ValueError, match="^c: "):
        check_choice(1, (True, False, "positives"), "c")


# ---------------------------------------------------------------------------- honesty of uncertainty
def test_paired_difference_on_one_instance_is_not_certain():
    d = paired_difference("hit@10", torch.tensor([1]), torch.tensor([2]), 100, 10)
    assert math.isinf(d.stderr) and "few_instances" in d.flags and d.n_instances == 1
    assert d.details["prob_a_better"] == 0.5 and d.details["prob_ordering_holds"] == 0.5
    assert math.isfinite(d.value) and d.value > 0  # the point difference itself is still reported
    lo, hi = d.sampling_interval()
    assert lo == -1.0 and hi == 1.0  # the range of a difference of two hit rates: no knowledge, not an infinity
    # two instances: a measured spread, a real probability
    d2 = paired_difference("hit@10", torch.tensor([1, 3]), torch.tensor([2, 9]), 100, 10)
    table = correction_table("hit@10", 100, 10, "bv")
    va, vb = table[torch.tensor([1, 3]) - 1], table[torch.tensor([2, 9]) - 1]
    diff = (va - vb).numpy()
    assert d2.stderr == pytest.approx(diff.std(ddof=1) / math.sqrt(2), rel=1e-12)
    assert 0.5 < d2.details["prob_a_better"] < 1.0 and d2.flags == ()


def test_corrected_metric_on_one_instance_is_flagged():
    e = rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(torch.tensor([3]), 100, 10), "bv")
    assert math.isinf(e.stderr) and e.n_instances == 1
    # bv's value at r~ = 3 is negative: flagged as estimate() flags it (the range is known)
    assert e.flags == ("few_instances", "outside_metric_range") == rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays([3], 100, 10),
        "bv",
    ).flags
    e2 = rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(torch.tensor([3, 5]), 100, 10), "bv")
    assert math.isfinite(e2.stderr) and e2.stderr > 0 and "few_instances" not in e2.flags
    assert e2.flags == rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays([3, 5], 100, 10), "bv").flags


TWO = {"a": torch.tensor([1, 5, 30, 2]), "b": torch.tensor([2, 3, 40, 9])}


@pytest.mark.parametrize("repeats", [1, -3, 2.5, True, "10", None])
def test_consistency_report_repeats(repeats):
    with pytest.raises(ValueError, match="^repeats: "):
        consistency_report(TWO, 100, 10, ["hit@10"], ["none"], repeats=repeats)


def test_consistency_report_real_spread_and_skip():
    rep = consistency_report(TWO, 100, 10, ["hit@10"], ["none"], repeats=2, seed=0)
    sds = [row["none sd"] for row in rep["table3"]]
    assert all(math.isfinite(s) and s >= 0 for s in sds)
    skipped = consistency_report(TWO, 100, 10, ["hit@10"], ["none"], repeats=0)
    assert skipped["table4"] == [] and "none sd" not in skipped["table3"][0]
    with pytest.raises(ValueError, match="^repeats: "):
        consistency_report(TWO, 100, 10, ["hit@10"], ["none"], repeats=1)
    with pytest.raises(ValueError, match="^seed: "):
        consistency_report(TWO, 100, 10, ["hit@10"], ["none"], repeats=5, seed=1.5)


# ------------------------------------------------------------------------------------------- adapters
def _scores_with_nan_irrelevant():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(4, 50, generator=g)
    pos = torch.tensor([[0], [1], [2], [3]])
    bad = s.clone()
    bad[0, 30] = math.nan  # an irrelevant item
    return s, bad, pos


def test_torchmetrics_default_refuses_a_nan_irrelevant_score():
    from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics

    s, bad, pos = _scores_with_nan_irrelevant()
    assert ExactRankingMetrics().settings.check_finite is True and SampledRankingMetrics().settings.check_finite is True
    with pytest.raises(ValueError, match="scores: NaN or inf in 1 of 4 rows"):
        ExactRankingMetrics(("auc",)).update(bad, pos)
    with pytest.raises(ValueError, match="scores: NaN or inf"):
        SampledRankingMetrics(("auc",), n_samples=10).update(bad, pos)
    # the checked counting pass gives exactly the unchecked result on finite scores
    a, b = ExactRankingMetrics(("auc", "ndcg@10")), ExactRankingMetrics(("auc", "ndcg@10"), check_finite=False)
    a.update(s, pos)
    b.update(s, pos)
    assert torch.equal(a.sums, b.sums)
    # the fast check is an explicit opt-in (and documented to miss irrelevant scores)
    fast = ExactRankingMetrics(("auc",), check_finite="positives")
    fast.update(bad, pos)
    assert math.isfinite(float(fast.compute()["auc/exact"]))


def test_torchmetrics_options_are_checked_at_construction():
    from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics

    from reco_sampled_plugin import registry

    # an estimator's options: its method object's, checked when it is built (before any batch)
    with pytest.raises(ValueError, match="^gamma: "):
        SampledRankingMetrics("hit@10", 10, (registry.Bv(gamma=math.nan),))
    with pytest.raises(ValueError, match="^foo: "):
        SampledRankingMetrics("hit@10", 10, (registry.Mle(foo=1),))
    with pytest.raises(ValueError, match="^sampling: "):  # set by the design, not an estimator option
        SampledRankingMetrics("hit@10", 10, (registry.Mle(sampling="binomial"),))
    with pytest.raises(ValueError, match="^tol: "):
        SampledRankingMetrics("hit@10", 10, (registry.Mes(tol=math.nan),))
    with pytest.raises(ValueError, match="^estimators: expected a list of estimator names"):  # not {name: options}
        SampledRankingMetrics("hit@10", 10, {"bv": {"gamma": 0.2}})
    with pytest.raises(ValueError, match="^estimators: expected estimator names"):
        SampledRankingMetrics("hit@10", 10, ("bv", ("mes", {"tol": 1e-6})))
    with pytest.raises(ValueError, match="^estimators: two estimators with the label 'mes_tol-1e-06'"):
        SampledRankingMetrics("hit@10", 10, (registry.Mes(tol=1e-6), registry.Mes(tol=1e-6)))
    # a metric none of the estimators takes had no output at all (hh: AUC only), silently
    with pytest.raises(ValueError, match=r"^estimators: none of \('hh',\) estimates ndcg@10 \(its estimators: "):
        SampledRankingMetrics(("ndcg@10", "auc"), 5, estimators=("hh",))
    assert sorted(SampledRankingMetrics(("ndcg@10", "auc"), 5, estimators=("hh", "mes")).settings.metric_names) == [
        "auc", "ndcg@10"]  # each metric taken by one of them
    from reco_sampled_plugin.adapters._shared import RankingSettings

    both = RankingSettings(("auc", "ndcg@10"), 100, ("hh",), exact=True)  # NDCG@10 still reported, exact
    assert both.labels == ("hh",) and both.exact
    with pytest.raises(ValueError, match="^check_finite: "):
        ExactRankingMetrics(check_finite=1)
    with pytest.raises(ValueError, match="^count_other_positives: "):
        ExactRankingMetrics(count_other_positives="no")
    with pytest.raises(ValueError, match="^replacement: "):
        SampledRankingMetrics(n_samples=rsp.SamplingDesign(10, replacement="no"))
    with pytest.raises(ValueError, match="^seed: "):
        SampledRankingMetrics(seed=1.5)
    with pytest.raises(ValueError, match="^max_n_groups: "):
        SampledRankingMetrics(max_n_groups=True)


def test_torchmetrics_nothing_kept_is_flagged_not_a_silent_nan():
    from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics

    s, _, pos = _scores_with_nan_irrelevant()
    none_kept = torch.zeros(4, dtype=torch.bool)
    sm = SampledRankingMetrics("hit@10", 10, ("none", "bv"))
    sm.update(s, pos, keep=none_kept)
    ex = ExactRankingMetrics("hit@10")
    ex.update(s, pos, keep=none_kept)
    for metric in (sm, ex):
        assert all(math.isnan(float(v)) for v in metric.compute().values())  # as before any update
        for e in metric.estimates().values():
            assert math.isnan(e.value) and e.flags == ("no_instances",) and e.n_instances == 0


def test_torchmetrics_one_instance_and_failed_estimator_are_flagged():
    from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics

    s, _, pos = _scores_with_nan_irrelevant()
    ex = ExactRankingMetrics("hit@10")
    ex.update(s[:1], pos[:1])
    e = ex.estimates()["hit@10/exact"]
    assert e.value in (0.0, 1.0) and math.isinf(e.stderr) and e.flags == ("few_instances",)
    sm = SampledRankingMetrics(("hit@60", "hit@10"), 10, ("bound",))  # hit@60: cut-off above the 50 items
    sm.update(s, pos)
    with pytest.warns(RuntimeWarning, match="estimator failed"):
        est = sm.estimates()
    assert math.isnan(est["hit@60/bound"].value) and est["hit@60/bound"].flags == ("estimator_failed",)
    assert math.isfinite(est["hit@10/bound"].value) and "estimator_failed" not in est["hit@10/bound"].flags


def test_lightning_callback_options():
    import lightning  # noqa: F401  (a test dependency in pyproject: never skipped)
    from reco_sampled_plugin import registry
    from reco_sampled_plugin.adapters.lightning import RankingSettings, callback_class

    cb_cls = callback_class()
    assert cb_cls().settings.check_finite is True
    assert cb_cls(stages="validate").stages == ("validate",)  # one stage by name, not its letters
    for kw, name in ((dict(plot_every_n_epochs=1.5), "plot_every_n_epochs"), (dict(log_stderr="no"), "log_stderr"),
                     (dict(log_interval="x"), "log_interval"), (dict(dedup_padding=None), "dedup_padding"),
                     (dict(progress="yes"), "progress"), (dict(prefix=3), "prefix"), (dict(score_fn=3), "score_fn"),
                     (dict(headline="ndcg@10"), "headline"), (dict(settings=("ndcg@10",)), "settings")):
        with pytest.raises(ValueError, match=name):
            cb_cls(**kw)
    # the metric settings: checked once, when the RankingSettings the callback takes is built
    for kw, name in ((dict(exact="no"), "exact"), (dict(estimators=("bv", registry.Bv())), "estimators"),
                     (dict(estimators=("mes", {"tol": 1e-6})), "estimators"),
                     (dict(check_finite="all"), "check_finite")):
        with pytest.raises(ValueError, match=name):
            RankingSettings(**kw)


# ------------------------------------------------------------------------------------------------ CLI
def _main(argv, capsys):
    from reco_sampled_plugin.cli import main

    rc = main(argv)
    return rc, capsys.readouterr().err


def test_cli_directory_and_unreadable_files(tmp_path, capsys):
    rc, err = _main(["estimate", str(tmp_path)], capsys)
    assert rc == 2 and err.startswith("reco-sampled: error:") and "is a directory" in err and "Traceback" not in err
    f = tmp_path / "bin.txt"
    f.write_bytes(b"1,100,10\n2,100,10\n3,100,\xff10\n")
    rc, err = _main(["estimate", str(f)], capsys)
    assert rc == 2 and f"{f}:3: not UTF-8 text" in err  # the line of the bad byte, not the block's first


def test_cli_permission_and_os_errors(tmp_path, capsys, monkeypatch):
    from reco_sampled_plugin import cli, rank_files

    f = tmp_path / "r.txt"
    f.write_text("1,100,10\n")

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(f))

    monkeypatch.setattr(rank_files, "open", denied, raising=False)
    rc, err = _main(["estimate", str(f)], capsys)
    assert rc == 2 and f"{f}: permission denied" in err
    monkeypatch.undo()
    # OS errors from elsewhere (e.g. --out is a folder) and overflow are one line too
    rc, err = _main(["table", "hit@10", "--n-items", "100", "-m", "10", "--out", str(tmp_path)], capsys)
    assert rc == 2 and err.strip() == f"reco-sampled: error: {tmp_path}: Is a directory"

    def overflow(args):
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(cli, "_cmd_table", overflow)
    rc, err = _main(["table", "hit@10", "--n-items", "100", "-m", "10"], capsys)
    assert rc == 2 and "too large" in err and "Traceback" not in err


@pytest.mark.parametrize("field,column", [("1e20", "n_candidates"), ("9223372036854775808", "n_candidates"),
                                          ("-9223372036854775809", "n_candidates")])
def test_cli_rank_file_fields_within_int64(tmp_path, capsys, field, column):
    f = tmp_path / "r.txt"
    f.write_text(f"1,100,10\n1,{field},10\n")
    rc, err = _main(["estimate", str(f)], capsys)
    assert rc == 2 and f"{f}:2: {column} '{field}' is out of range" in err


def test_rank_file_integers_are_read_exactly(tmp_path):
    from reco_sampled_plugin.rank_files import read_rank_file

    f = tmp_path / "r.txt"
    f.write_text("9007199254740993,100,10\n")  # 2**53 + 1: a float would read ...992
    with pytest.raises(ValueError, match="sampled rank 9007199254740993 outside"):
        read_rank_file(f)
    f.write_text("3.0,1e3,10\n2,1000,10\r4,1000,10\r\n")  # whole floats still accepted; all line ends
    data = read_rank_file(f)
    assert data.ranks.tolist() == [3, 2, 4] and data.n_items.tolist() == [1000] * 3


def test_cli_integer_and_option_arguments(tmp_path, capsys):
    f = tmp_path / "r.txt"
    f.write_text("1\n2\n")
    for argv, name in ((["estimate", str(f), "--n-items", str(10**20), "-m", "10"], "--n-items: "),
                       (["table", "hit@10", "--n-items", "100", "-m", str(-(2**63) - 1)], "--n-samples: "),
                       (["estimate", str(f), "--n-items", "100", "-m", "10", "--method", "bv", "--option",
                         "gamma=.nan"], "gamma: "),
                       (["table", "hit@10", "--n-items", "100", "-m", "10", "--gamma", "2"], "gamma: ")):
        rc, err = _main(argv, capsys)
        assert rc == 2 and err.startswith("reco-sampled: error: ") and name in err and "Traceback" not in err
    from reco_sampled_plugin.cli import main

    assert main(["estimate", str(f), "--n-items", "100", "-m", "10", "--method", "bv", "--option", "gamma=.nan"]) == 2
    assert capsys.readouterr().out == ""  # refused before the table header is printed


def test_seed_generator_groups_and_smoothing_are_named():
    """Siblings found by the options pass: a float seed, a non-generator, max_groups = 0, negative smoothing."""
    import reco_sampled_plugin as rsp
    from reco_sampled_plugin.priors import empirical_prior

    with pytest.raises(ValueError, match="seed"):
        rsp.draw_sampled_ranks(torch.tensor([1, 2]), 100, 10, seed=1.5)
    with pytest.raises(ValueError, match="generator"):
        adaptive_sampled_ranks_from_exact(torch.tensor([1, 2]), 100, rsp.SamplingDesign(10, adaptive_max=40),
                                          generator="x")
    with pytest.raises(ValueError, match="max_groups"):
        rsp.identified_interval("hit@5", torch.tensor([1, 2, 3]), 1000, 10, max_groups=0)
    for bad in (-5.0, float("nan")):
        with pytest.raises(ValueError, match="smoothing"):
            empirical_prior(torch.tensor([1, 2]), 10, smoothing=bad)
    prior = empirical_prior(torch.tensor([1, 1, 2]), 4, smoothing=0.0)
    assert list(prior.p) == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])


def test_interaction_files_that_cannot_be_read_name_the_path(tmp_path):
    from reco_sampled_plugin.datasets import load_interactions

    bad = tmp_path / "latin1.csv"
    bad.write_bytes("1,2,5,\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.csv.*UTF-8"):
        load_interactions(str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        load_interactions(str(tmp_path))


# --- options a method does not use are refused, not ignored ---------------------------------------------------


@pytest.mark.parametrize(
    "method, option, value",
    [("linear", "a", 2.0), ("bound", "a", 0.5), ("mes", "a", 1.0), ("mes", "gamma", 0.3), ("ls", "gamma", 0.3),
     ("bv_mle", "prior", "uniform"), ("mle", "prior", None), ("bv", "rounding", "linear"), ("none", "rounding", "floor"),
     ("rank_estimate", "prior", BetaPrior(0.5) if hasattr(rsp, "BetaPrior") else "uniform")],
)
def test_an_option_the_method_does_not_use_is_named(method, option, value):
    with pytest.raises(ValueError, match=f"^{option}: method {method!r} does not use it") as info:
        registry.method_class(method)(**{option: value})  # refused at construction, before any data
    users = [m for m, opts in METHOD_OPTIONS.items() if option in opts]
    assert users and all(m in str(info.value) for m in users)  # the message says which methods do take it


def test_each_named_option_still_reaches_its_method():
    base = estimate("ndcg@10", SampledRanks.from_arrays(RANKS, 100, 10), "bv").value
    sample = SampledRanks.from_arrays(RANKS, 100, 10)
    assert estimate("ndcg@10", sample, registry.Bv(gamma=0.1)).value == base  # the default, explicit
    assert estimate("ndcg@10", SampledRanks.from_arrays(RANKS, 100, 10), registry.Bv(gamma=1.0)).value != base
    assert estimate("hit@10", SampledRanks.from_arrays(RANKS, 100, 10), registry.Beta(a=3.0)).value != estimate(
        "hit@10",
        SampledRanks.from_arrays(RANKS, 100, 10),
        registry.Beta(a=1.0),
    ).value
    floor = estimate("ndcg@10", SampledRanks.from_arrays(RANKS, 100, 10), "rank_estimate").value
    assert estimate("ndcg@10", sample, registry.RankEstimate(rounding="linear")).value != floor


@pytest.mark.parametrize(
    "extra, key, fixed",
    [
        ({"metrics": ["CorrectedRecall"], "rsp_estimators": ["ls"], "rsp_estimator_options": {"ls": {"gamma": 0.3}}},
         "rsp_estimator_options: ls: gamma: method 'ls' does not use it",
         {"rsp_estimators": ["bv"], "rsp_estimator_options": {"bv": {"gamma": 0.3}}}),
        ({"metrics": ["CorrectedRecall"], "rsp_estimators": ["none"],
          "rsp_estimator_options": {"none": {"prior": ["beta", 0.5]}}}, "rsp_estimator_options: none: prior: ",
         {"rsp_estimators": ["ls"], "rsp_estimator_options": {"ls": {"prior": ["beta", 0.5]}}}),
        ({"metrics": ["MappedHit"], "rsp_estimators": ["bound"], "rsp_estimator_options": {"bound": {"a": 2.0}}},
         "rsp_estimator_options: bound: a: ",
         {"rsp_estimators": ["beta"], "rsp_estimator_options": {"beta": {"a": 2.0}}}),
        ({"metrics": ["MappedHit"], "rsp_estimators": ["bound"], "rsp_estimator_options": {"beta": {"a": 2.0}}},
         "rsp_estimator_options: given for 'beta', which rsp_estimators does not list",
         {"rsp_estimators": ["beta"]}),
    ],
)
def test_recbole_options_unused_by_the_chosen_method_are_refused(extra, key, fixed):
    from recbole.config import Config

    from reco_sampled_plugin.adapters import recbole as _plugin  # noqa: F401  (registers the metrics)
    from test_recbole_adapter import BASE

    with pytest.raises(ValueError, match=f"^{key}"):
        Config(model="BPR", dataset="ml-100k", config_dict={**BASE, "rsp_m": 100, **extra})
    # the same option with a method that uses it is fine
    Config(model="BPR", dataset="ml-100k", config_dict={**BASE, "rsp_m": 100, **extra, **fixed})


def test_evaluate_factors_method_is_checked_before_any_work():
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    ones = lambda k: np.ones(k)  # noqa: E731
    train = sp.random(20, 30, density=0.2, format="csr", random_state=rng, data_rvs=ones)
    test = sp.random(20, 30, density=0.1, format="csr", random_state=rng, data_rvs=ones)
    test = test - test.multiply(train)
    test.eliminate_zeros()
    u, v = rng.standard_normal((20, 4)), rng.standard_normal((30, 4))
    for kwargs, match in (({"n_samples": 5, "method": "magic"}, "^method: unknown estimator 'magic'"),
                          ({"method": "bv"}, "^method: needs n_samples"),
                          ({"n_samples": 5, "method": 3}, "^method: expected a registered name")):
        with pytest.raises(ValueError, match=match):
            rsp.evaluate_factors(train, test, u, v, **kwargs)
    for kwargs, match in (({"gamma": 0.3}, "^gamma: method 'ls' does not use it"), ({"gamma": math.nan}, "^gamma: ")):
        with pytest.raises(ValueError, match=match):  # the method object checks its options once, when built
            (rsp.registry.Ls if "ls" in match else rsp.registry.Bv)(**kwargs)
    # a whole-float n_samples is a size like any other; gamma reaches bv
    a = rsp.evaluate_factors(train, test, u, v, n_samples=5.0, method=rsp.registry.Bv(gamma=1.0), seed=3).summary
    b = rsp.evaluate_factors(train, test, u, v, n_samples=5, method="bv", seed=3).summary
    assert (a["sampled"] == b["sampled"]).all() and (a["corrected"] != b["corrected"]).any()


def test_intervals_never_leave_the_metric_range():
    # found by the long fuzzing profile: evaluate_factors' summary reported lo < 0 for HR@3 (a Wald interval of a
    # small proportion); the estimate's interval is now clipped to the metric's range in every branch
    ranks = torch.tensor([1] + [30] * 39)  # one hit in 40: HR@10 near 0, identified (n = 50, m = 30: b < 10)
    est = estimate("hit@10", SampledRanks.from_arrays(ranks, 50, 30), "none")
    assert est.identification is None and est.metric_range == (0.0, 1.0)
    lo, hi = est.interval(0.95)
    raw_lo, raw_hi = est.value - 1.959963984540054 * est.stderr, est.value + 1.959963984540054 * est.stderr
    assert raw_lo < 0.0 == lo and hi == pytest.approx(raw_hi)  # the raw interval left the range; the honest one not
    assert est.sampling_interval(0.95) == (lo, hi)  # the sampling interval is clipped too
    few = estimate("hit@10", SampledRanks.from_arrays(torch.tensor([1]), 50, 30), "none")  # one instance: stderr inf
    assert few.interval(0.95) == (0.0, 1.0)
    # an interval wholly below the range (around a hand-built negative value; estimate() itself moves such a point
    # to the range's end) clamps to the range, never lo > hi, and still holds its point
    from reco_sampled_plugin._estimate import Estimate

    below = Estimate(-0.05, 0.01, 100.0, flags=("outside_metric_range",), metric_range=(0.0, 1.0))
    assert below.interval(0.95) == (-0.05, 0.0)


# ----------------------------------------------------------------------------- option sizes up to 2^40 and beyond
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from _profiles import examples  # noqa: E402

from reco_sampled_plugin import _options  # noqa: E402
from reco_sampled_plugin._checks import MAX_ELEMENTS, MAX_INT  # noqa: E402

#: The documented bound of each integer option kind (None: only what an int64 holds).
_KIND_BOUND = {"bootstrap": _options.MAX_BOOTSTRAP, "iterations": _options.MAX_ITERATIONS,
               "spline_df": _options.MAX_SPLINE_DF, "count": None, "count0": None, "seed": None}
_INT_OPTIONS = sorted({(e.name, o.name, o.kind) for e in registry.entries() for o in e.options if o.kind in _KIND_BOUND})


@settings(max_examples=examples(60), deadline=None)
@given(case=st.sampled_from(_INT_OPTIONS), size=st.one_of(st.integers(0, 40).map(lambda k: 2**k),
                                                          st.integers(0, 2**41), st.sampled_from([2**63 - 1, 2**63, 2**70])))
def test_integer_option_sizes_up_to_2_40_are_bounded_naming_the_option(case, size):
    """Every integer option of every registered method, at sizes from 1 to 2^40 and past int64: accepted up to its
    kind's documented bound (n_bootstrap 2,000, max_iter 10^6, df 4,096; others 2^63 - 1), else a ValueError that
    starts with the option's name, at construction, before anything is allocated."""
    method, option, kind = case
    bound = _KIND_BOUND[kind] or MAX_INT
    lowest = {"count0": 0, "bootstrap": 0, "seed": 0, "spline_df": 4}.get(kind, 1)
    if lowest <= size <= bound:
        assert getattr(registry.method_class(method)(**{option: size}), option) == size
    else:
        with pytest.raises(ValueError, match=f"^{option}: "):
            registry.method_class(method)(**{option: size})


@pytest.mark.parametrize("value", ["10", 10.0, 1e3, 2.5, True, np.float64(4), "abc", b"4", [4], None])
def test_integer_options_of_the_wrong_type_are_type_errors_naming_the_option(value):
    """One checker (``_checks.check_int``) for every integer option: a string, a float, a bool or a list is an
    ArgumentTypeError (a ValueError and a TypeError) that names the option."""
    for method, option, kind in _INT_OPTIONS:
        if value is None and kind in ("count0", "bootstrap"):
            continue  # None is their default
        with pytest.raises(TypeError, match=f"^{option}: expected an integer"):
            registry.method_class(method)(**{option: value})


def test_spline_df_is_bounded_by_the_rank_grid():
    """df above the cells of the rank grid (what the data identify) is refused at the fit, naming df; up to it the
    fit runs (default 10 always)."""
    ranks = SampledRanks.from_arrays(torch.tensor([1, 2, 3, 5, 1, 2, 11] * 20), 60, 10)
    cells = fit_rank_distribution(ranks.histogram(), registry.Gmod(n_bootstrap=0)).probs.size
    with pytest.raises(ValueError, match=rf"^df: {cells + 1} B-spline coefficients for a rank grid of {cells} cells"):
        estimate("ndcg@10", ranks, registry.Gmod(df=cells + 1, n_bootstrap=0))
    assert math.isfinite(estimate("ndcg@10", ranks, registry.Gmod(df=max(cells, 4), n_bootstrap=0)).value)


def test_bootstrap_replicates_are_bounded_by_the_memory_rule(monkeypatch):
    """The replicates x cells table of a bootstrap obeys MAX_ELEMENTS (checked before drawing; the bound lowered
    here so that a small fit meets it)."""
    import reco_sampled_plugin._checks as checks

    ranks = SampledRanks.from_arrays(torch.tensor([1, 2, 3, 5, 1, 2, 11] * 20), 1000, 10)
    monkeypatch.setattr(checks, "MAX_ELEMENTS", 1000)  # above the fit's likelihood (110 cells x 5 ranks)
    with pytest.raises(ValueError, match=r"^n_bootstrap: the bootstrap's redrawn counts"):
        estimate("ndcg@10", ranks, registry.Mes(n_bootstrap=2000))
    assert MAX_ELEMENTS == 1 << 27


@pytest.mark.parametrize("kwargs, named", [(dict(n_users=2**40), "n_users"), (dict(n_users=2**70), "n_users"),
                                           (dict(n_users=10**6, repeats=1000), "repeats"),
                                           (dict(n_users="100"), "n_users"), (dict(repeats=2**40), "repeats")])
def test_plan_sizes_are_bounded_naming_the_argument(kwargs, named):
    args = dict(n_users=100, repeats=20) | kwargs
    with pytest.raises(ValueError, match=f"^{named}: "):
        rsp.plan(1000, args.pop("n_users"), "auc", 0.1, **args)
