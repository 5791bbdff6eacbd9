"""``auto``, the default estimator: gmod where the design resolves the top, mes elsewhere; under popularity designs
hh for AUC, pl_fit for the others (registry.AUTO_CHOICES)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import registry
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.simulate import simulate_sampled_ranks

N = 1700


def _exact(seed: int = 0, size: int = 2000) -> torch.Tensor:
    r = np.arange(1, N + 1, dtype=np.float64)
    p = r**-0.9
    return torch.from_numpy(np.random.default_rng(seed).choice(np.arange(1, N + 1), size=size, p=p / p.sum()))


def _fixed(m: int, seed: int = 0) -> rsp.SampledRanks:
    exact = _exact(seed)
    s = simulate_sampled_ranks(exact, float(N), m, "binomial", torch.Generator().manual_seed(seed))
    return rsp.SampledRanks(s, torch.full_like(exact, N), None, rsp.SamplingDesign(m))


@pytest.mark.parametrize(
    "m, metric, chosen",
    [
        (500, "hit@10", "gmod"),  # b = 1699/501 + 1 = 4.4 <= K = 10: resolved
        (500, "ndcg@5", "gmod"),  # b = 4.4 <= 5
        (500, "hit@3", "mes"),  # K = 3 < b
        (100, "hit@10", "mes"),  # b = 17.8 > K
        (100, "ndcg@20", "gmod"),  # b = 17.8 <= 20
        (500, "mrr", "mes"),  # no cut-off: depends on the top's shape
        (100, "auc", "none"),  # linear in the rank: the sampled AUC is unbiased (AUTO_CHOICES["auc"])
    ],
)
def test_auto_runs_gmod_where_the_cut_off_is_resolved(m, metric, chosen):
    sampled = _fixed(m)
    est = rsp.estimate(metric, sampled)  # the default method
    assert registry.DEFAULT_ESTIMATOR == "auto"
    assert est.details["auto"]["method"] == chosen
    same = rsp.estimate(metric, sampled, method=chosen)
    assert est.value == same.value and est.stderr == same.stderr and est.flags == same.flags
    assert est.interval(0.95) == same.interval(0.95)
    b = (N - 1) / (m + 1) + 1
    assert (f"{b:.3g}" in est.details["auto"]["reason"]) == (metric not in ("mrr", "auc"))


@pytest.mark.parametrize("users, p", [(20, 0.2), (50, 0.05), (400, 0.02)])
def test_auto_auc_of_few_users_at_the_top_covers_the_truth(users, p):
    """AUC of a strong model on few users (geometric exact ranks, n = 1,000, m = 100: most positives sampled first):
    the default's interval (the sampled AUC's) holds the exact AUC in 19 of 20 draws or more (mes, which auto ran here
    before, gave 0.75 [0.73, 0.76] for a true 0.996 on 20 users)."""
    g = torch.Generator().manual_seed(users)
    held = 0
    for _ in range(20):
        u = torch.rand(users, generator=g, dtype=torch.float64)
        exact = torch.clamp((torch.log1p(-u) / np.log1p(-p)).long() + 1, max=1000)  # geometric, seeded
        truth = float(((1000 - exact) / 999.0).mean())
        sampled = rsp.SampledRanks.from_arrays(simulate_sampled_ranks(exact, 1000, 100, generator=g), 1000, 100)
        est = rsp.estimate("auc", sampled)
        lo, hi = est.interval(0.95)
        held += lo <= truth <= hi
    assert est.details["auto"]["method"] == "none" and held >= 19, held


@pytest.mark.parametrize("metric", ["ndcg", "mrr", "ap"])
@pytest.mark.parametrize("n, m, replacement", [(100, 99, False), (100, 10_000, True), (2, 3, True)])
def test_auto_reads_a_first_bin_of_rank_1_alone_as_resolved(metric, n, m, replacement):
    """Where every first sampled bin holds rank 1 alone (b = (n - 1)/(m + 1) + 1 < 2: a census without replacement,
    m far above n, n = 2), r~ = 1 is rank 1: auto runs gmod, whose interval holds the exact metric of 20 draws of 10
    users in 20 (it ran mes, whose smoothing is all bias there and whose interval said nothing: an NDCG of 1 on 20
    users all first gave 0.56 [0.56, 0.56], a 10-user MRR held in 0 of 20)."""
    design = rsp.SamplingDesign(m, replacement=replacement)
    first = rsp.estimate(metric, rsp.SampledRanks.from_arrays(torch.ones(20, dtype=torch.long), n, m, design))
    assert first.details["auto"]["method"] == "gmod" and "b = " in first.details["auto"]["reason"]
    lo, hi = first.interval(0.95)
    assert first.value == pytest.approx(1.0, abs=1e-9) and lo <= 1.0 <= hi
    g = torch.Generator().manual_seed(n + m)
    held = 0
    for _ in range(20):
        u = torch.rand(10, generator=g, dtype=torch.float64)
        exact = torch.clamp((torch.log1p(-u) / np.log(0.5)).long() + 1, max=n)  # geometric(1/2), seeded
        sampled = simulate_sampled_ranks(exact, n, m, design.law, generator=g)
        est = rsp.estimate(metric, rsp.SampledRanks.from_arrays(sampled, n, m, design))
        lo, hi = est.interval(0.95)
        held += lo <= float(rsp.metric_values(metric, exact, n).double().mean()) <= hi
    assert held == 20, held


def test_auto_runs_gmod_on_adaptive_designs_and_takes_fit_options_only():
    exact = _exact(1)
    sampled = adaptive_sampled_ranks_from_exact(exact, N, rsp.SamplingDesign(100, adaptive_max=3200),
                                                generator=torch.Generator().manual_seed(2))
    est = rsp.estimate("hit@10", sampled, rsp.registry.Auto(n_bootstrap=4, seed=3))
    assert est.details["auto"] == {"method": "gmod", "reason": "adaptive design"}
    same = rsp.estimate("hit@10", sampled, rsp.registry.Gmod(n_bootstrap=4, seed=3))
    assert est.value == same.value and est.stderr == same.stderr
    assert "adaptive" in est.details  # the adaptive cost is reported as for gmod itself
    with pytest.raises(ValueError, match="lam"):
        rsp.estimate("hit@10", sampled, rsp.registry.Auto(lam=0.1))  # an option of one choice only: name the method
    with pytest.raises(ValueError, match="method"):
        rsp.estimate("hit@10", _fixed(100), rsp.registry.Auto(gamma=0.2))


def test_auto_on_bare_ranks_and_histograms_matches_the_sampled_ranks_path():
    sampled = _fixed(500, seed=5)
    via_object = rsp.estimate("hit@10", sampled, rsp.registry.Auto(n_bootstrap=0))
    bare = rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(sampled.ranks, N, 500), rsp.registry.Auto(n_bootstrap=0))
    hist = rsp.sampled_rank_histogram(sampled.ranks, N, 500)
    via_hist = rsp.estimate("hit@10", hist, rsp.registry.Auto(n_bootstrap=0))
    assert via_object.value == bare.value == via_hist.value
    assert bare.details["auto"]["method"] == "gmod"


def test_auto_under_popularity_runs_hh_for_auc_and_pl_fit_otherwise():
    """Popularity designs: auto runs registry.popularity_auto's choice (AUTO_CHOICES["popularity"]: hh where it
    estimates the metric, AUC; pl_fit for the others), its value, interval and flags those of the choice."""
    weights = torch.rand(300) + 0.1
    scores = torch.randn(50, 300, generator=torch.Generator().manual_seed(0))
    positives = torch.randint(0, 300, (50, 1), generator=torch.Generator().manual_seed(1))
    sampled = rsp.sampled_ranks(scores, positives, rsp.SamplingDesign(20, popularity=weights), generator=torch.Generator().manual_seed(2))
    for metric, chosen in (("auc", "hh"), ("hit@10", "pl_fit"), ("ndcg@10", "pl_fit"), ("mrr", "pl_fit")):
        auto, direct = rsp.estimate(metric, sampled), rsp.estimate(metric, sampled, method=chosen)
        assert auto.details["auto"]["method"] == chosen == registry.popularity_auto(metric)
        assert auto.value == direct.value and auto.stderr == direct.stderr and auto.flags == direct.flags
        assert auto.interval(0.95) == direct.interval(0.95)
    # auto's fit options are validated as auto's and reported where its choice takes none
    got = rsp.estimate("auc", sampled, rsp.registry.Auto(n_bootstrap=4))
    assert got.value == rsp.estimate("auc", sampled, method="hh").value
    assert got.details["auto"]["options_unused"] == ["n_bootstrap"]
    with pytest.raises(ValueError, match="^n_bootstrap: "):
        rsp.estimate("auc", sampled, rsp.registry.Auto(n_bootstrap=-1))


def test_auto_refuses_designs_its_choices_cannot_read():
    """What the choice cannot read is refused with the choice's own message, naming the argument."""
    weights = torch.rand(300) + 0.1
    scores = torch.randn(50, 300, generator=torch.Generator().manual_seed(0))
    positives = torch.randint(0, 300, (50, 1), generator=torch.Generator().manual_seed(1))
    without = rsp.sampled_ranks(scores, positives, rsp.SamplingDesign(20, replacement=False, popularity=weights),
                                generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="^method: 'auto' does not support .*without replacement are not independent"):
        rsp.estimate("auc", without, method="auto")  # hh: no Hansen-Hurwitz weights without replacement
    with pytest.raises(ValueError, match="method"):
        rsp.estimate("hit@10", without, method="auto")  # pl_fit models draws with replacement
    sampled = rsp.sampled_ranks(scores, positives, rsp.SamplingDesign(20, popularity=weights), generator=torch.Generator().manual_seed(2))
    stripped = dataclasses.replace(sampled, popularity_stats=dataclasses.replace(
        sampled.popularity_stats, profile=None, beat_bins=None, miss_bins=None))  # as a rank file reads back
    with pytest.raises(ValueError, match=r"^sampled_ranks: pl_fit reads each positive's popularity-class counts"):
        rsp.estimate("hit@10", stripped, method="auto")
    assert rsp.estimate("auc", stripped).value == rsp.estimate("auc", sampled, method="hh").value  # hh needs none


def test_auto_reads_exact_completion_at_the_cap_as_its_choice_does():
    """exact_at_cap designs: auto passes the completed positives' exact ranks to gmod (no cap_reached)."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(300, 1000, generator=g)
    held_out = torch.randint(0, 1000, (300,), generator=g)
    design = rsp.SamplingDesign(8, adaptive_max=64, exact_at_cap=True)
    result = rsp.adaptive_sampled_ranks(scores, held_out, design, generator=torch.Generator().manual_seed(1))
    assert int((result.exact_ranks > 0).sum()) > 0
    auto = rsp.estimate("ndcg@10", result)
    gmod = rsp.estimate("ndcg@10", result, method="gmod")
    assert auto.details["auto"]["method"] == "gmod" and "cap_reached" not in auto.flags
    assert auto.value == gmod.value and auto.flags == gmod.flags
