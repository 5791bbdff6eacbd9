"""One sampling design and one estimator registry, wired once through every entry point.

For each entry point (``evaluate_factors``, ``SampledRankingMetrics``, the Lightning callback, RecBole's settings,
the CLI, the planner):

(a) ``SamplingDesign(m)`` gives what the int ``m`` gives (same seed);
(b) an adaptive ``SamplingDesign(m, adaptive_max=cap)`` is taken;
(c) a design the chosen estimator does not support is refused with a ValueError naming the estimator;
(d) an estimator registered at run time (``registry.register``) is accepted without any other edit, and runs.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from reco_sampled_plugin import registry
from reco_sampled_plugin.design import SamplingDesign

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


@pytest.fixture
def bv_copy():
    """``bv`` registered again as ``bv_copy`` for the test (unregistered afterwards): its own compute function
    runs the ``bv`` tables (the correction module solves the tables it knows by name)."""
    from reco_sampled_plugin.corrections import estimate_by_table

    def compute(spec, hist, *, method, sampling, options):
        return estimate_by_table(spec, hist, method="bv", sampling=sampling, options=options)

    entry = registry.register(dataclasses.replace(registry.get("bv"), name="bv_copy", compute=compute))
    try:
        yield entry
    finally:
        registry.unregister("bv_copy")


def test_the_fixture_registers_live():
    assert "bv_copy" not in registry.names()
    entry = registry.register(dataclasses.replace(registry.get("bv"), name="bv_copy"))
    try:
        assert "bv_copy" in registry.names() and entry.supports(SamplingDesign(10))
        assert not entry.supports(SamplingDesign(10, adaptive_max=40))
    finally:
        registry.unregister("bv_copy")
    assert "bv_copy" not in registry.names()


# -------------------------------------------------------------------------------------------- evaluate_factors
def _factor_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    ones = lambda k: np.ones(k)  # noqa: E731
    train = sp.random(30, 80, density=0.15, format="csr", random_state=rng, data_rvs=ones)
    test = sp.random(30, 80, density=0.05, format="csr", random_state=rng, data_rvs=ones)
    test = test - test.multiply(train)
    test.eliminate_zeros()
    return train, test, rng.standard_normal((30, 4)), rng.standard_normal((80, 4))


def _same_factor_results(a, b):
    for name in ("users", "items", "sampled_ranks", "exact_ranks", "n_candidates", "sample_sizes"):
        assert torch.equal(getattr(a.sampled, name), getattr(b.sampled, name)), name
    assert a.sampled.n_samples == b.sampled.n_samples and a.sampled.adaptive_max == b.sampled.adaptive_max
    assert a.summary.equals(b.summary)


def test_evaluate_factors_design():
    from reco_sampled_plugin import evaluate_factors

    train, test, u, v = _factor_data()
    kw = dict(k=5, metrics=["ndcg@5", "hit@5"], seed=3)
    # (a) SamplingDesign(m) is the int m
    _same_factor_results(evaluate_factors(train, test, u, v, n_samples=10, method="bv", **kw),
                         evaluate_factors(train, test, u, v, n_samples=SamplingDesign(10), method="bv", **kw))
    without = evaluate_factors(train, test, u, v, n_samples=SamplingDesign(10, replacement=False), method="cls",
                               **kw)
    assert without.sampled.n_samples == 10 and without.sampled.adaptive_max is None and without.estimates
    # (b) an adaptive design
    adaptive = evaluate_factors(train, test, u, v, n_samples=SamplingDesign(10, adaptive_max=40), method="none",
                                **kw)
    assert adaptive.sampled.adaptive_max == 40 and int(adaptive.sampled.sample_sizes.max()) <= 40
    # (c) an estimator that does not support the design, named
    with pytest.raises(ValueError, match="^method: 'bv' assumes one fixed m"):
        evaluate_factors(train, test, u, v, n_samples=SamplingDesign(10, adaptive_max=40), method="bv", **kw)
    # a design is one SamplingDesign or an int m: the 0.1 pair (m, cap) is refused
    with pytest.raises(ValueError, match="^n_samples: expected a SamplingDesign or an int m"):
        evaluate_factors(train, test, u, v, n_samples=(10, 40), **kw)


def test_evaluate_factors_registered_estimator_is_known(bv_copy):
    from reco_sampled_plugin import evaluate_factors

    train, test, u, v = _factor_data()
    # known (not "unknown estimator"), its design support and its gamma option read from its entry
    with pytest.raises(ValueError, match="^method: 'bv_copy' assumes one fixed m"):
        evaluate_factors(train, test, u, v, n_samples=SamplingDesign(10, adaptive_max=40), method="bv_copy")
    with pytest.raises(ValueError, match="^gamma: method 'ls' does not use it.*option of bv, bv_mle, bv_copy"):
        evaluate_factors(train, test, u, v, n_samples=10, method=registry.Ls(gamma=0.2))


def test_evaluate_factors_runs_a_registered_estimator(bv_copy):
    from reco_sampled_plugin import evaluate_factors

    train, test, u, v = _factor_data()
    kw = dict(k=5, metrics=["ndcg@5"], seed=3, n_samples=SamplingDesign(10))
    a = evaluate_factors(train, test, u, v, method=registry.Bv(gamma=0.2), **kw).summary
    b = evaluate_factors(train, test, u, v, method=registry.method_class("bv_copy")(gamma=0.2), **kw).summary
    assert a.equals(b)


# ------------------------------------------------------------------------------------------ SampledRankingMetrics
def _batch(seed: int = 0, b: int = 24, n: int = 300):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g)
    pos = torch.randint(0, n, (b, 1), generator=g)
    scores[torch.arange(b), pos[:, 0]] += 2.0  # positives near the top: adaptive stages are used
    return scores, pos


def _torchmetrics_run(**kw):
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    metric = SampledRankingMetrics(("ndcg@10", "hit@10"), max_n_groups=None, seed=5, **kw)
    scores, pos = _batch()
    metric.update(scores, pos, ids=torch.arange(scores.shape[0]))
    return metric, metric.compute()


def test_torchmetrics_design():
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    # (a) SamplingDesign(m) is the int m
    a, ra = _torchmetrics_run(n_samples=20, estimators=("none", "bv"))
    b, rb = _torchmetrics_run(n_samples=SamplingDesign(20), estimators=("none", "bv"))
    assert torch.equal(a.hist, b.hist) and ra.keys() == rb.keys()
    assert all(torch.equal(ra[k], rb[k]) for k in ra)
    assert a.settings.design == b.settings.design == SamplingDesign(20)
    w, _ = _torchmetrics_run(n_samples=SamplingDesign(20, replacement=False), estimators=("none", "bv"))
    d = w.settings.design
    assert (d.n_samples, d.replacement, d.law) == (20, False, "hypergeometric")
    # (b) an adaptive design; settings.design is the SamplingDesign
    a, ra = _torchmetrics_run(n_samples=SamplingDesign(4, adaptive_max=32),
                              estimators=("none", registry.Mes(n_bootstrap=0)))
    assert a.settings.design == SamplingDesign(4, adaptive_max=32) and a.settings.design.adaptive_max == 32
    assert a.hist.shape[1] > 5  # the adaptive state (every stage's columns)
    # (c) an estimator that does not support the design, named
    with pytest.raises(ValueError, match=r"^estimators: \['bv'\] assume one fixed m"):
        SampledRankingMetrics("hit@10", SamplingDesign(4, adaptive_max=32), ("none", "bv"))
    with pytest.raises(ValueError, match="^n_samples: expected a SamplingDesign or an int m"):
        SampledRankingMetrics("hit@10", (4, 32), ("none",))
    # popularity designs are drawn by keyed inverse cdf, or without replacement by a keyed race
    # (tests/test_popularity_entry_points.py, tests/test_torchmetrics_adapter.py)
    pw = SamplingDesign(4, popularity=torch.ones(300), replacement=False)
    assert SampledRankingMetrics("hit@10", pw, ("none",)).settings.design == pw


def test_torchmetrics_registered_estimator_is_accepted(bv_copy):
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    metric = SampledRankingMetrics("hit@10", 20, ("bv_copy",))  # (its options: checked by estimators.py, see below)
    assert metric.settings.estimators == ("bv_copy",)
    with pytest.raises(ValueError, match=r"^estimators: \['bv_copy'\] assume one fixed m"):
        SampledRankingMetrics("hit@10", SamplingDesign(4, adaptive_max=32), ("bv_copy",))


def test_torchmetrics_checks_a_registered_estimators_options(bv_copy):
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    method = registry.method_class("bv_copy")(gamma=0.2)  # its options: the registered entry's, checked when built
    metric = SampledRankingMetrics("hit@10", 20, (method,))
    assert metric.settings.methods == (method,) and metric.settings.labels == ("bv_copy_gamma-0.2",)
    with pytest.raises(ValueError, match="^gamma: "):
        SampledRankingMetrics("hit@10", 20, (registry.method_class("bv_copy")(gamma=math.nan),))


def test_torchmetrics_runs_a_registered_estimator(bv_copy):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an estimator that fails warns: fail here instead
        _, copy = _torchmetrics_run(n_samples=20, estimators=("bv_copy",))
    _, ref = _torchmetrics_run(n_samples=20, estimators=("bv",))
    assert math.isfinite(float(copy["ndcg_at_10/bv_copy"]))
    assert float(copy["ndcg_at_10/bv_copy"]) == float(ref["ndcg_at_10/bv"])


# ---------------------------------------------------------------------------------------------- Lightning
def _validate(callbacks, tmp_path):
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    import _lightning_helpers as H

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=False, default_root_dir=str(tmp_path),
                         callbacks=callbacks)
    trainer.validate(H.SyntheticModule(), DataLoader(H.UserDataset(), batch_size=8), verbose=False)
    return [cb.results["validate"] for cb in callbacks]


def _same_results(a: dict, b: dict, prefix_a: str, prefix_b: str):
    assert [k[len(prefix_a):] for k in a] == [k[len(prefix_b):] for k in b]
    for (ka, ea), (kb, eb) in zip(a.items(), b.items()):
        assert (ea.value, ea.stderr, ea.n_instances) == (eb.value, eb.stderr, eb.n_instances) or (
            math.isnan(ea.value) and math.isnan(eb.value)), (ka, kb)


def test_lightning_callback_design(tmp_path):
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    fixed = dict(estimators=("none", "bv"), max_n_groups=None, exact=False)
    adaptive = dict(estimators=("none", registry.Mes(n_bootstrap=0)), max_n_groups=None, exact=False)
    callbacks = [
        RankingMetricsCallback(RankingSettings(("ndcg@10", "hit@5"), n_samples=20, **fixed), prefix="int_"),
        RankingMetricsCallback(RankingSettings(("ndcg@10", "hit@5"), n_samples=SamplingDesign(20), **fixed),
                               prefix="design_"),
        RankingMetricsCallback(RankingSettings(("ndcg@10",), n_samples=SamplingDesign(5, adaptive_max=40), **adaptive),
                               prefix="ad_"),
    ]
    assert callbacks[1].settings.design == SamplingDesign(20) and callbacks[1].settings.n_samples == SamplingDesign(20)
    assert callbacks[2].settings.design == SamplingDesign(5, adaptive_max=40)  # (b)
    r_int, r_design, r_ad = _validate(callbacks, tmp_path)
    _same_results(r_int, r_design, "int_", "design_")  # (a)
    assert any(k.endswith("/bv") for k in r_design) and any(k.endswith("/mes_n_bootstrap-0") for k in r_ad)
    # (c) refused when the callback is built, naming the estimator
    with pytest.raises(ValueError, match=r"^estimators: \['bv'\] assume one fixed m"):
        RankingSettings(n_samples=SamplingDesign(5, adaptive_max=40), estimators=("none", "bv"))
    with pytest.raises(ValueError, match="^n_samples: expected a SamplingDesign or an int m"):
        RankingSettings(n_samples=(5, 40))


def test_lightning_callback_registered_estimator_is_accepted(bv_copy):
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    cb = RankingMetricsCallback(RankingSettings(n_samples=SamplingDesign(20), estimators=("none", "bv_copy")))
    assert "bv_copy" in cb.labels


def test_lightning_callback_runs_a_registered_estimator(bv_copy, tmp_path):
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    cbs = [RankingMetricsCallback(RankingSettings(("ndcg@10",), n_samples=SamplingDesign(20), estimators=("bv_copy",),
                                                  exact=False, max_n_groups=None), prefix="a_"),
           RankingMetricsCallback(RankingSettings(("ndcg@10",), n_samples=SamplingDesign(20), estimators=("bv",),
                                                  exact=False, max_n_groups=None), prefix="b_")]
    copy, ref = _validate(cbs, tmp_path)
    assert not any("estimator_failed" in e.flags for e in copy.values())
    assert [e.value for e in copy.values()] == [e.value for e in ref.values()]


# ------------------------------------------------------------------------------------------------ RecBole
def _recbole_settings(yaml_file=None, **extra):
    import recbole
    from recbole.config import Config

    from reco_sampled_plugin.adapters import recbole as _plugin  # noqa: F401  (registers the plugin)
    from reco_sampled_plugin.adapters._recbole_settings import validate_config

    base = {"data_path": os.path.join(os.path.dirname(recbole.__file__), "dataset_example"), "device": "cpu",
            "use_gpu": False, "show_progress": False, "topk": [10], "seed": 2020}
    config = Config(model="BPR", dataset="ml-100k", config_dict={**base, **extra},
                    config_file_list=None if yaml_file is None else [str(yaml_file)])
    return validate_config(config)


def test_recbole_settings_design():
    # (a) rsp_m (and rsp_replacement) are one SamplingDesign; the old fields agree with it
    s = _recbole_settings(metrics=["Recall", "CorrectedRecall"], rsp_m=100)
    assert s.design == SamplingDesign(100) and (s.m, s.replacement, s.adaptive_max) == (100, True, None)
    s = _recbole_settings(metrics=["CorrectedRecall"], rsp_m=100, rsp_replacement=False, rsp_estimators=["cls"])
    assert s.design == SamplingDesign(100, replacement=False) and s.replacement is False
    # RecBole's uniN: the design draws N (rsp_m unset)
    s = _recbole_settings(metrics=["CorrectedRecall"], eval_args={"mode": "uni100"})
    assert s.design == SamplingDesign(100) and s.m is None
    # (b) rsp_adaptive_max is the adaptive design
    s = _recbole_settings(metrics=["RankDistRecall"], rsp_m=100, rsp_adaptive_max=800)
    assert s.design == SamplingDesign(100, adaptive_max=800) and s.design.adaptive.stages.tolist() == [100, 200, 400, 800]
    # rsp_adaptive_top: the threshold rule (rsp_design's ":top3" the same), only with rsp_adaptive_max, in 1..m
    s = _recbole_settings(metrics=["RankDistRecall"], rsp_m=100, rsp_adaptive_max=800, rsp_adaptive_top=3)
    assert s.design == SamplingDesign(100, adaptive_max=800, adaptive_top=3)
    assert _recbole_settings(metrics=["RankDistRecall"], rsp_design="100:800:top3").design == s.design
    for extra, match in ((dict(rsp_m=100, rsp_adaptive_top=3), r"^rsp_adaptive_top: .*set rsp_adaptive_max"),
                         (dict(rsp_m=100, rsp_adaptive_max=800, rsp_adaptive_top=0), r"^rsp_adaptive_top: "),
                         (dict(rsp_m=100, rsp_adaptive_max=800, rsp_adaptive_top=101), r"^rsp_adaptive_top: "),
                         (dict(rsp_design="100:800", rsp_adaptive_top=3), r"^rsp_design: given together with "
                                                                           r"rsp_adaptive_top")):
        with pytest.raises(ValueError, match=match):
            _recbole_settings(metrics=["RankDistRecall"], **extra)
    # (c) an estimator that does not support the design, named with its key
    with pytest.raises(ValueError, match=r"^rsp_adaptive_max: 'correctedrecall' \(rsp_estimators: bv\) assumes one fixed m.*"
                                         r"the Corrected\* metrics take auto or none \(rsp_estimators\), as do the RankDist\*"):
        _recbole_settings(metrics=["CorrectedRecall"], rsp_m=100, rsp_adaptive_max=800, rsp_estimators=["bv"])
    _recbole_settings(metrics=["CorrectedRecall"], rsp_m=100, rsp_adaptive_max=800, rsp_estimators=["auto"])  # taken
    with pytest.raises(ValueError, match=r"^rsp_adaptive_max: 'mappedhit' \(rsp_estimators: bound\) assumes one fixed m.*"
                                         r"use the RankDist\* metrics \(mle or mes or gmod or auto\)"):
        _recbole_settings(metrics=["MappedHit"], rsp_m=100, rsp_adaptive_max=800)
    # the choices are the registry's
    with pytest.raises(ValueError, match=r"^rsp_estimators: unknown estimator 'magic'; use some of "
                                         + repr(registry.names()).replace("(", r"\(").replace(")", r"\)")):
        _recbole_settings(metrics=["CorrectedRecall"], rsp_m=100, rsp_estimators=["magic"])
    # each metric family runs the one estimator of its family listed (registry.recbole_choices)
    with pytest.raises(ValueError, match=r"^rsp_estimators: the Corrected\* metrics need one of "
                                         + repr(registry.recbole_choices("corrected")).replace("(", r"\(")
                                         .replace(")", r"\)")):
        _recbole_settings(metrics=["CorrectedRecall"], rsp_m=100, rsp_estimators=["mes"])


def test_recbole_registered_estimator_is_accepted(bv_copy):
    s = _recbole_settings(metrics=["CorrectedRecall"], rsp_m=100, rsp_estimators=["bv_copy"],
                          rsp_estimator_options={"bv_copy": {"gamma": 0.3}})
    assert s.methods["corrected"] == registry.method_class("bv_copy")(gamma=0.3)  # its gamma: read from its entry
    with pytest.raises(ValueError, match=r"\(rsp_estimators: bv_copy\) assumes one fixed m"):
        _recbole_settings(metrics=["CorrectedRecall"], rsp_m=100, rsp_estimators=["bv_copy"], rsp_adaptive_max=800)


# ---------------------------------------------------------------------------------------------------- CLI
def _rank_file(tmp_path, with_m: bool = True):
    gen = torch.Generator().manual_seed(4)
    exact = torch.randint(1, 2001, (400,), generator=gen)
    from reco_sampled_plugin.simulate import simulate_sampled_ranks

    ranks = simulate_sampled_ranks(exact, 2000, 50, "binomial", gen)
    path = tmp_path / ("ranks_m.csv" if with_m else "ranks.csv")
    path.write_text("".join(f"{r},2000" + (",50" if with_m else "") + "\n" for r in ranks.tolist()))
    return path


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("hit@", "ndcg@", "recall@"))]


def test_cli_estimate_design(tmp_path, capsys):
    from reco_sampled_plugin.cli import main

    # (a) the design built from --n-samples (and --sampling) gives what the file's m column gives
    assert main(["estimate", str(_rank_file(tmp_path)), "--metric", "hit@10", "--method", "none", "--method", "bv",
                 "--method", "mes"]) == 0
    from_file = _table_lines(capsys.readouterr().out)
    assert main(["estimate", str(_rank_file(tmp_path, with_m=False)), "--n-samples", "50", "--metric", "hit@10",
                 "--method", "none", "--method", "bv", "--method", "mes"]) == 0
    assert _table_lines(capsys.readouterr().out) == from_file and len(from_file) == 3
    # (c) an estimator that does not support the design, named (before anything is printed)
    assert main(["estimate", str(_rank_file(tmp_path)), "--n-samples", "50", "--adaptive-max", "400",
                 "--method", "bv"]) == 2
    captured = capsys.readouterr()
    assert "--method: ['bv'] assume one fixed m" in captured.err and captured.out == ""


def test_cli_help_lists_the_registry(tmp_path, capsys, bv_copy):
    from reco_sampled_plugin.cli import main

    for command in ("estimate", "plan"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        for name in registry.names():  # every method with its one-line summary, bv_copy included
            assert f"  {name} " in out and registry.get(name).summary in " ".join(out.split()), (command, name)
    # (d) a registered method passes the CLI's own check (not '--method: unknown'); running it is the next test's
    main(["estimate", str(_rank_file(tmp_path)), "--metric", "hit@10", "--method", "bv_copy"])
    assert "--method: unknown" not in capsys.readouterr().err


def test_cli_runs_a_registered_estimator(tmp_path, capsys, bv_copy):
    from reco_sampled_plugin.cli import main

    f = _rank_file(tmp_path)
    assert main(["estimate", str(f), "--metric", "hit@10", "--method", "bv"]) == 0
    ref = _table_lines(capsys.readouterr().out)
    assert main(["estimate", str(f), "--metric", "hit@10", "--method", "bv_copy"]) == 0
    out = _table_lines(capsys.readouterr().out)
    assert [line.replace("bv_copy", "bv     ") for line in out] == ref


# ------------------------------------------------------------------------------------------------- planner
def _forecasts(result):
    return [(f.n_samples, f.adaptive_max, f.mean_samples, f.rel_bias, f.rel_sd, f.rel_error) for f in result.forecasts]


def test_planner_design():
    from reco_sampled_plugin.planner import plan

    kw = dict(n_items=3000, n_users=300, metric="hit@10", target_rel_error=0.3, repeats=3, seed=1)
    # (a) and (b): fixed and adaptive SamplingDesign objects, forecast in order
    designs = plan(**kw, designs=[SamplingDesign(100), SamplingDesign(50, adaptive_max=800)])
    assert [f.design for f in designs.forecasts] == [SamplingDesign(100), SamplingDesign(50, adaptive_max=800)]
    assert (designs.forecasts[1].n_samples, designs.forecasts[1].adaptive_max) == (50, 800)
    with pytest.raises(ValueError, match="^designs: each design is a SamplingDesign"):  # the 0.1 pairs
        plan(**kw, designs=[(100, None)])
    # without replacement: the hypergeometric law, labelled
    hyper = plan(**kw, designs=[SamplingDesign(100, replacement=False)], method="cls")
    assert hyper.forecasts[0].label == "m = 100 (no repl.)" and math.isfinite(hyper.forecasts[0].rel_error)
    # (c) an estimator that does not support the design, named
    with pytest.raises(ValueError, match="adaptive sampling needs one of the methods .* not 'bv'"):
        plan(**kw, designs=[SamplingDesign(50, adaptive_max=800)], method="bv")
    with pytest.raises(ValueError, match="^method: unknown estimator 'nope'"):
        plan(**kw, method="nope")


def test_planner_registered_estimator_is_known(bv_copy):
    from reco_sampled_plugin.planner import default_designs, plan

    assert default_designs(10_000, "bv_copy") == default_designs(10_000, "bv")
    with pytest.raises(ValueError, match="not 'bv_copy'"):  # known: refused for its design, not as unknown
        plan(3000, 300, "hit@10", 0.3, designs=[SamplingDesign(50, adaptive_max=800)], method="bv_copy", repeats=2)


def test_planner_runs_a_registered_estimator(bv_copy):
    from reco_sampled_plugin.planner import plan

    kw = dict(n_items=3000, n_users=300, metric="hit@10", target_rel_error=0.3, repeats=3, seed=1,
              designs=[SamplingDesign(100)])
    assert _forecasts(plan(**kw, method="bv_copy")) == _forecasts(plan(**kw, method="bv"))


# ------------------------------------------------------------------------------------------- planner results
@pytest.fixture(scope="module")
def planned():
    """A real plan on a 300-item catalogue: a fixed-m, an adaptive and an adaptive exact_at_cap forecast (as the default
    grid holds), the fixed one recommended."""
    from reco_sampled_plugin.planner import PlanExecution, plan

    result = plan(300, 100, "hit@10", 0.9, designs=[SamplingDesign(20), SamplingDesign(10, adaptive_max=80),
                                                    SamplingDesign(10, adaptive_max=80, exact_at_cap=True)],
                  target_rel_halfwidth=10.0, repeats=2, seed=1, execution=PlanExecution(forecast_all=True))
    assert result.recommended is not None and result.recommended.design == SamplingDesign(20)
    return result


def test_planner_results_pass_to_every_entry_point(planned, tmp_path, capsys):
    """(e) ``plan(...)``, its ``recommended`` and each of its ``forecasts`` stand for their SamplingDesign wherever a
    design is taken (``design.as_design``, the one coercion): the draws, the scorer loop, evaluate_factors, the
    adapters' settings (RecBole's ``rsp_design``), the reproduction's config and SampledRanks; and their spec
    (``DesignForecast.spec``) wherever a string is: the CLI's ``--design``, RecBole's ``rsp_design``. An
    ``exact_at_cap`` forecast runs in evaluate_factors, SampledRankingMetrics and the Lightning callback and sets
    RecBole's ``rsp_exact_at_cap`` in full mode."""
    from reco_sampled_plugin import evaluate_factors, sampled_ranks_from_scorer
    from reco_sampled_plugin.adaptive import adaptive_sampled_ranks
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics
    from reco_sampled_plugin.corrections import fixed_design
    from reco_sampled_plugin.design import as_design
    from reco_sampled_plugin.ranking import SampledRanks, sampled_ranks
    from reco_sampled_plugin.reproduce import ReproduceConfig

    fixed, adaptive, at_cap = planned.forecasts
    assert as_design(planned) == as_design(fixed) == fixed.design == SamplingDesign(20)
    assert as_design(adaptive) == SamplingDesign(10, adaptive_max=80)
    assert as_design(at_cap) == SamplingDesign(10, adaptive_max=80, exact_at_cap=True)
    scores, pos = _batch(n=300)
    # the draws: the same ranks as the design itself (same seed)
    for given in (planned, fixed):
        a = sampled_ranks(scores, pos, given, generator=torch.Generator().manual_seed(3))
        b = sampled_ranks(scores, pos, SamplingDesign(20), generator=torch.Generator().manual_seed(3))
        assert torch.equal(a.ranks, b.ranks) and a.design == SamplingDesign(20)
    a = adaptive_sampled_ranks(scores, pos, adaptive, generator=torch.Generator().manual_seed(3))
    b = adaptive_sampled_ranks(scores, pos, adaptive.design, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.ranks, b.ranks) and a.design == adaptive.design

    def scorer(users, items):
        return scores[users.unsqueeze(1).expand_as(items), items]

    users = torch.arange(scores.shape[0])
    for given, design in ((planned, fixed.design), (adaptive, adaptive.design)):
        a = sampled_ranks_from_scorer(scorer, pos, 300, given, users=users, generator=torch.Generator().manual_seed(4))
        b = sampled_ranks_from_scorer(scorer, pos, 300, design, users=users, generator=torch.Generator().manual_seed(4))
        assert torch.equal(a.ranks, b.ranks) and a.design == design
    train, test, u, v = _factor_data()
    kw = dict(k=5, metrics=["hit@5"], seed=3, method="none")
    _same_factor_results(evaluate_factors(train, test, u, v, n_samples=fixed, **kw),
                         evaluate_factors(train, test, u, v, n_samples=SamplingDesign(20), **kw))
    assert evaluate_factors(train, test, u, v, n_samples=adaptive, **kw).sampled.adaptive_max == 80
    cap_kw = dict(kw, method=registry.Mes(n_bootstrap=0))  # completed from the exact pass: some exact groups read
    done = evaluate_factors(train, test, u, v, n_samples=at_cap, **cap_kw)
    _same_factor_results(done, evaluate_factors(train, test, u, v, n_samples=at_cap.design, **cap_kw))
    completed = done.sampled.completed_ranks
    assert completed is not None and bool((completed > 0).any()) and math.isfinite(done.estimates["Hit@5"].value)
    # the adapters' settings and the reproduction's config hold the design
    assert SampledRankingMetrics("hit@10", planned, ("none",)).settings.design == SamplingDesign(20)
    assert RankingSettings(n_samples=adaptive, estimators=("none",)).design == adaptive.design
    metric = SampledRankingMetrics("hit@10", at_cap, ("none", registry.Mes(n_bootstrap=0)), seed=5)
    metric.update(scores, pos, ids=torch.arange(scores.shape[0]))  # the positives near the top: some completed
    assert metric.settings.design == at_cap.design and metric.completed.shape[0] > 0
    assert all(math.isfinite(float(v)) for v in metric.compute().values())
    (result,) = _validate([RankingMetricsCallback(RankingSettings(("hit@10",), n_samples=at_cap, exact=False,
                                                                  estimators=("none", registry.Mes(n_bootstrap=0))))],
                          tmp_path)
    assert all(math.isfinite(e.value) for e in result.values()) and any(k.endswith("/mes_n_bootstrap-0") for k in result)
    assert ReproduceConfig(n_samples=fixed).design == SamplingDesign(20) and fixed_design(planned) == fixed.design
    drawn = SampledRanks.from_arrays(torch.tensor([1, 3]), 300, design=fixed)
    assert drawn.design == SamplingDesign(20)
    # the CLI's --design and RecBole's rsp_design: the spec the plan prints, and (RecBole) the result itself
    from reco_sampled_plugin.cli import main

    assert [f.spec for f in planned.forecasts] == ["20", "10:80", "10:80:exact"]
    assert f'rsp_design: "{fixed.spec}"' in planned.recommendation()
    assert main(["plan", "--n-items", "300", "--n-users", "100", "--metric", "hit@10", "--target-rel-error", "0.9",
                 "--target-rel-halfwidth", "10", "--repeats", "2", "--seed", "1", "--forecast-all",
                 *(a for f in planned.forecasts for a in ("--design", f.spec))]) == 0
    assert planned.recommendation() in capsys.readouterr().out  # the same plan from the printed specs
    uni = {"metrics": ["CorrectedRecall"], "eval_args": {"mode": "uni20"}}
    for given in (planned, fixed, fixed.design, fixed.spec):  # the settings of the keys the design sets
        s = _recbole_settings(**uni, rsp_design=given)
        assert s.planned == SamplingDesign(20)
        assert dataclasses.replace(s, planned=None) == _recbole_settings(**uni, rsp_m=20)
    full = {"metrics": ["RankDistRecall"]}
    yaml_file = tmp_path / "run.yaml"  # the printed spec pasted into a YAML file, quoted as printed
    yaml_file.write_text(f'rsp_design: "{adaptive.spec}"\n')
    for s in (_recbole_settings(**full, rsp_design=adaptive), _recbole_settings(**full, rsp_design=adaptive.spec),
              _recbole_settings(yaml_file, **full)):
        assert dataclasses.replace(s, planned=None) == _recbole_settings(**full, rsp_m=10, rsp_adaptive_max=80)
        assert s.design == s.planned == adaptive.design
    for given in (at_cap, at_cap.spec):  # full mode completes at the cap from the scores at hand
        s = _recbole_settings(**full, rsp_design=given)
        assert dataclasses.replace(s, planned=None) == _recbole_settings(**full, rsp_m=10, rsp_adaptive_max=80,
                                                                         rsp_exact_at_cap=True)
        assert s.design == s.planned == at_cap.design


def test_a_plan_recommending_full_ranking_is_refused_by_name(planned):
    import dataclasses as dc

    from reco_sampled_plugin.ranking import sampled_ranks

    none = dc.replace(planned, recommended=None)
    scores, pos = _batch(n=300)
    with pytest.raises(ValueError, match="^n_samples: the plan recommends no sampled design"):
        sampled_ranks(scores, pos, none)
