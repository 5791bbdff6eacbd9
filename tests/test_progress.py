"""Progress bars: on stderr when asked (``progress=True``), off by default where stderr is not a
terminal, and never a change in results (planner, CLI ``estimate``, torchmetrics ``estimates()``, benchmarks)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from reco_sampled_plugin._progress import progress_bar, progress_enabled
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.planner import PlanExecution, plan
from reco_sampled_plugin.registry import Mle

ROOT = Path(__file__).resolve().parents[1]


def test_progress_bar_writes_to_stderr_only_when_enabled(capsys):
    assert list(progress_bar(range(5), desc="work", enabled=True)) == [0, 1, 2, 3, 4]
    out = capsys.readouterr()
    # tqdm redraws at most every 0.1 s and clears the bar when done (leave=False): the total is what stays visible
    assert out.out == "" and "work" in out.err and "/5" in out.err
    assert list(progress_bar(range(5), desc="work", enabled=False)) == [0, 1, 2, 3, 4]
    assert list(progress_bar(range(5), desc="work", enabled=None)) == [0, 1, 2, 3, 4]  # captured: not a terminal
    assert capsys.readouterr().err == ""
    assert progress_enabled(None) is False and progress_enabled(True) is True
    with pytest.raises(ValueError, match="progress"):
        progress_enabled(1)


def test_progress_bar_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    bar = progress_bar(total=3, desc="manual", enabled=True)
    for _ in range(3):
        bar.update()
    bar.close()
    assert list(progress_bar([7, 8], desc="plain", enabled=True)) == [7, 8]
    err = capsys.readouterr().err
    assert "manual: 3/3" in err and "plain: 2/2" in err


def test_plan_progress_same_plan(capsys):
    kw = dict(designs=[SamplingDesign(50), SamplingDesign(20, adaptive_max=200)], repeats=3, seed=1)
    quiet = plan(2000, 300, "ndcg@10", 0.2, execution=PlanExecution(forecast_all=True, progress=False), **kw)
    assert capsys.readouterr().err == ""
    loud = plan(2000, 300, "ndcg@10", 0.2, execution=PlanExecution(forecast_all=True, progress=True), **kw)
    err = capsys.readouterr().err
    assert "plan ndcg@10" in err and "/6" in err
    assert loud.forecasts == quiet.forecasts and loud.truth == quiet.truth
    assert 0 < quiet.truth < 1 and all(math.isfinite(f.rel_error) for f in quiet.forecasts)


def test_cli_estimate_progress_same_output(tmp_path, capsys):
    from reco_sampled_plugin.cli import main

    rng = np.random.default_rng(0)
    f = tmp_path / "ranks.csv"
    f.write_text("".join(f"{r},1000\n" for r in rng.integers(1, 102, size=400)))
    args = ["estimate", str(f), "-m", "100", "--metric", "recall@10", "--method", "none", "--method", "bv"]
    assert main(args + ["--no-progress"]) == 0
    quiet = capsys.readouterr()
    assert main(args + ["--progress"]) == 0
    loud = capsys.readouterr()
    assert loud.out == quiet.out and quiet.err == ""
    assert "estimate" in loud.err and "/2" in loud.err
    rows = [line.split() for line in quiet.out.splitlines() if line.startswith("recall@10")]
    assert [r[1] for r in rows] == ["none", "bv"]


def test_torchmetrics_estimates_progress_same_values(capsys):
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 300, generator=gen)
    positives = torch.randint(0, 300, (64, 1), generator=gen)
    metric = SampledRankingMetrics(("ndcg@10", "hit@10"), n_samples=50, estimators=("none", "bv", Mle(n_bootstrap=4)),
                                   seed=3)
    metric.update(scores, positives)
    quiet = metric.estimates(progress=False)
    assert capsys.readouterr().err == ""
    loud = metric.estimates(progress=True)
    err = capsys.readouterr().err
    assert "ranking metrics" in err and "/6" in err
    assert quiet.keys() == loud.keys() and len(quiet) == 6
    for key in quiet:
        assert (quiet[key].value, quiet[key].stderr) == (loud[key].value, loud[key].stderr), key
    assert 0 <= quiet["hit@10/sampled"].value <= 1


def test_benchmark_progress_same_values(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from accuracy_ml100k import run_experiment
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rng = np.random.default_rng(0)
    n_u = rng.integers(800, 1000, size=300)
    ranks = {"A": np.minimum(rng.geometric(0.01, size=300), n_u), "B": np.minimum(rng.geometric(0.02, size=300), n_u)}
    kw = dict(ms=(50,), repeats=2, ks=[10], estimators=("none", "bv(0.1)"), log=lambda s: None)
    quiet = run_experiment(ranks, n_u, progress=False, **kw)
    assert capsys.readouterr().err == ""
    loud = run_experiment(ranks, n_u, progress=True, **kw)
    assert "/2" in capsys.readouterr().err
    assert quiet["values"].keys() == loud["values"].keys() and quiet["values"]
    for key, value in quiet["values"].items():
        np.testing.assert_array_equal(value, loud["values"][key])
