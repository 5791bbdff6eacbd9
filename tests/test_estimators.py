"""``estimate``'s dispatch (estimators.py) under popularity designs and weights: per-row weights that would
broadcast the ranks, a popularity pilot file given to the planner, auto under popularity draws without replacement, options auto cannot pass on under
popularity designs, pooling flags where nothing is pooled."""

from __future__ import annotations

import warnings

import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin.design import SamplingDesign


def _uniform(b: int = 400, n: int = 500, m: int = 50):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(b, n, generator=g)
    pos = torch.randint(0, n, (b,), generator=g)
    return rsp.sampled_ranks(scores, pos, m, generator=g), b


def test_per_row_weights_of_shape_b_refused_not_broadcast():
    s, b = _uniform()
    assert s.ranks.shape == (b, 1)
    with pytest.raises(ValueError, match=r"^weights: shape \(400,\) would broadcast .* given as shape \(400, 1\)"):
        rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(s.ranks, s.candidates(), 50), weights=torch.ones(b))
    ok = rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(s.ranks, s.candidates(), 50),
        rsp.registry.Mes(n_bootstrap=0),
        weights=torch.ones(b, 1),
    )
    plain = rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(s.ranks, s.candidates(), 50),
        rsp.registry.Mes(n_bootstrap=0),
    )
    assert ok.value == pytest.approx(plain.value, rel=1e-9)


def _popularity(replacement: bool = True):
    g = torch.Generator().manual_seed(1)
    n, b = 600, 300
    w = torch.rand(n, generator=g) * 10 + 0.5
    scores = torch.randn(b, n, generator=g)
    pos = torch.randint(0, n, (b,), generator=g)
    return rsp.sampled_ranks(scores, pos, SamplingDesign(40, popularity=w, replacement=replacement), generator=g)


def test_auto_under_popularity_warns_about_options_it_cannot_pass_on():
    s = _popularity()
    with pytest.warns(UserWarning, match="n_bootstrap.*pl_fit"):
        e = rsp.estimate("ndcg@10", s, rsp.registry.Auto(n_bootstrap=50))
    assert e.details["auto"]["options_unused"] == ["n_bootstrap"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rsp.estimate("ndcg@10", s)  # nothing given, nothing to warn about
        rsp.estimate("auc", s)


def test_pooling_not_flagged_where_popularity_estimators_pool_nothing():
    g = torch.Generator().manual_seed(2)
    n, b = 600, 300
    w = torch.rand(n, generator=g) * 10 + 0.5
    scores = torch.randn(b, n, generator=g)
    pos = torch.randint(0, 300, (b,), generator=g)
    k = torch.arange(b) % 150  # 150 distinct candidate counts: items 300.. excluded, k per row
    cols = torch.arange(150)
    exclude = torch.where(cols < k[:, None], 300 + cols, torch.full_like(cols, -1))
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(40, popularity=w), exclude=exclude, generator=g)
    assert len(torch.unique(s.candidates())) == 150
    a = rsp.estimate("auc", s, method="hh")
    b = rsp.estimate("auc", s, rsp.registry.Hh(max_rel_n_spread=0.5))
    assert a.value == b.value and "pooled_n" not in b.flags


def test_auto_under_popularity_without_replacement_names_what_runs():
    s = _popularity(replacement=False)
    for metric in ("ndcg@10", "auc"):
        with pytest.raises(ValueError, match=r"^method: 'auto' does not support .*without replacement.*use one of "
                                             r"\('none',\).*draw with replacement") as info:
            rsp.estimate(metric, s)
        assert "use one of ('auto'" not in str(info.value)
    assert rsp.registry.names(design=s.design) == ("none",)


def test_cli_plan_refuses_a_popularity_pilot_file(tmp_path, capsys):
    from reco_sampled_plugin import cli
    from reco_sampled_plugin.rank_files import write_rank_file

    path = tmp_path / "pop.csv"
    write_rank_file(path, _popularity())
    rc = cli.main(["plan", "--n-items", "600", "--n-users", "300", "--metric", "ndcg@10", "--target-rel-error", "0.1",
                   "--pilot", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "--pilot: " in err and "pop.csv holds popularity-sampled ranks" in err
    assert cli.main(["estimate", str(path), "--metric", "ndcg@10"]) == 0
    out = capsys.readouterr().out
    assert "reco-sampled plan" in out and "--pilot" not in out  # the plan it suggests takes no popularity pilot


def test_the_plain_sampled_metric_is_flagged_uncorrected_where_it_estimates_nothing():
    """``none`` is the sampled metric itself: flagged ``uncorrected`` (its interval covers the sampled metric only),
    but for AUC at a fixed uniform m, where the sampled AUC is unbiased for the full-catalogue one (auto's choice):
    there no flag, as under ``auto``. AUC under popularity sampling or adaptive sizes is flagged."""
    s, _ = _uniform()
    assert "uncorrected" in rsp.estimate("ndcg@10", s, "none").flags
    assert "uncorrected" not in rsp.estimate("auc", s, "none").flags
    auto = rsp.estimate("auc", s)
    assert auto.details["auto"]["method"] == "none" and "uncorrected" not in auto.flags
    assert "uncorrected" not in rsp.estimate("ndcg@10", s, "mes").flags
    assert "uncorrected" in rsp.estimate("auc", _popularity(), "none").flags
    g = torch.Generator().manual_seed(3)
    adaptive = rsp.adaptive_sampled_ranks(torch.randn(100, 300, generator=g), torch.randint(0, 300, (100,), generator=g),
                                          SamplingDesign(10, adaptive_max=80), generator=g)
    assert "uncorrected" in rsp.estimate("auc", adaptive, "none").flags


def test_the_plain_sampled_metric_keeps_its_own_range():
    """``none`` is the sampled metric over m + 1 candidates: with m + 1 > n (draws with replacement from 2
    irrelevant items) its AP is the mean of 1/r~ (0.2595 here, brute force), inside [1/(m + 1), 1], not clipped to
    the full catalogue's [1/n, 1] (0.3333, flagged outside_metric_range before); its interval inside the same."""
    r = torch.tensor([1, 21, 11, 21, 9])
    e = rsp.estimate("ap", rsp.SampledRanks.from_arrays(r, 3, 20), "none")
    assert e.value == pytest.approx(float((1.0 / r.double()).mean()), rel=1e-12)
    assert "outside_metric_range" not in e.flags and e.metric_range == pytest.approx((1 / 21, 1.0))
    lo, hi = e.interval()
    assert 1 / 21 - 1e-12 <= lo <= e.value <= hi <= 1.0
