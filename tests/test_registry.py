"""The estimator registry: one contract every registered method meets, the lists derived from the one table, and
the cost of adding an estimator (a throw-away one, registered here, reaches every entry point with no other edit).

A new estimator joins the contract with its registry entry alone: ``test_contract`` runs over ``registry.names()``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from reco_sampled_plugin import corrections, estimators, registry
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin._estimate import EstimatorOutput
from reco_sampled_plugin.metric_names import METRIC_KINDS
from reco_sampled_plugin.simulate import draw_sampled_ranks

N, M = 1000, 50


@pytest.fixture(scope="module")
def uniform_ranks():
    """Exact ranks uniform on 1..N (true AUC 0.5 in expectation) and their sampled ranks at m = M."""
    exact = torch.randint(1, N + 1, (4000,), generator=torch.Generator().manual_seed(0))
    return exact, draw_sampled_ranks(exact, N, M, seed=1)[0]


def _kwargs(entry: registry.Estimator) -> dict:
    """The least a method needs: ``beta`` its shape a; fitting methods a small bootstrap (speed)."""
    kw = {"a": 1.0} if entry.name == "beta" else {}
    if entry.fits_distribution:
        kw["n_bootstrap"] = 4
    return kw


def _draw(design: SamplingDesign, seed: int = 0):
    """SampledRanks of a small score matrix under ``design`` (adaptive designs through their draw)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(300, 400, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 400, (300, 1), generator=g)
    if design.adaptive_max is not None:
        return rsp.adaptive_sampled_ranks(scores, pos, design, generator=g)
    return rsp.sampled_ranks(scores, pos, design, generator=g)


def check_contract(name: str, uniform_ranks) -> None:
    """The contract of a registered estimator (run for every built-in one and for the throw-away one below)."""
    entry = registry.get(name)
    exact, sampled = uniform_ranks
    kw = _kwargs(entry)
    # 1. values on a known histogram: AUC is linear in r, so every estimator (the sampled AUC is unbiased too)
    #    lands on the exact AUC of these positives within its standard error
    truth = float(((N - exact) / (N - 1.0)).double().mean())
    est = rsp.estimate("auc", rsp.SampledRanks.from_arrays(sampled, N, M), rsp.registry.method_class(name)(**kw))
    assert math.isfinite(est.value) and est.stderr > 0 and est.n_instances == len(exact)
    assert abs(est.value - truth) <= 4 * est.stderr + 0.01, (name, est.value, truth)
    lo, hi = est.interval(0.95)
    assert 0.0 <= lo <= hi <= 1.0
    # 2. options: one another method takes is refused naming it; each own option refuses a wrong-typed value
    foreign = sorted({o for e in registry.entries() for o in e.option_names} - set(entry.option_names))
    for opt in foreign[:3]:
        with pytest.raises(ValueError, match=f"{opt}"):
            rsp.estimate(
                "auc",
                rsp.SampledRanks.from_arrays(sampled, N, M),
                rsp.registry.method_class(name)(**{**kw, opt: 0.5}),
            )
    for o in entry.options:
        bad = object() if o.kind in ("prior",) else "not-a-value"
        with pytest.raises(ValueError, match=f"^{o.name}: "):
            rsp.estimate(
                "auc",
                rsp.SampledRanks.from_arrays(sampled, N, M),
                rsp.registry.method_class(name)(**{**kw, o.name: bad}),
            )
    # 3. designs: every design it claims works from SampledRanks alone, every other one is refused naming it
    designs = {
        "fixed": (SamplingDesign(20), True),
        "without_replacement": (SamplingDesign(20, replacement=False), entry.without_replacement),
        "adaptive": (SamplingDesign(10, adaptive_max=80), entry.adaptive),
        "popularity": (SamplingDesign(20, popularity=torch.linspace(1.0, 2.0, 400)), entry.popularity),
    }
    for label, (design, claimed) in designs.items():
        ranks = _draw(design)
        assert ranks.design == design
        assert entry.supports(design) == claimed, (name, label)
        if claimed:
            e = rsp.estimate("auc", ranks, rsp.registry.method_class(name)(**kw))
            assert math.isfinite(e.value), (name, label)
        else:
            with pytest.raises(ValueError, match=f"method: {name!r} does not support"):
                rsp.estimate("auc", ranks, rsp.registry.method_class(name)(**kw))


@pytest.mark.parametrize("name", registry.names())
def test_contract(name, uniform_ranks):
    check_contract(name, uniform_ranks)


# --------------------------------------------------------------------------------------- derived lists
def test_lists_are_views_of_the_registry():
    assert estimators.ESTIMATORS == registry.names()
    assert estimators.METHOD_OPTIONS == registry.method_options()
    assert rsp.adaptive.ADAPTIVE_METHODS == registry.names(adaptive=True) == ("mle", "mes", "gmod", "auto", "none", "diff")
    from reco_sampled_plugin import mapping as mapping_module
    from reco_sampled_plugin import rank_distribution

    assert rank_distribution.RANK_DISTRIBUTION_METHODS == registry.names(family="rank_distribution")
    # the mappings the mapping module computes are exactly the registry's mapping entries
    mapped = tuple(e.name for e in registry.entries() if e.compute == ".mapping:estimate_by_mapping")
    assert mapped == mapping_module.MAPPING_METHODS == registry.recbole_choices("mapped")
    # the tables the corrections module solves are exactly the registry's table entries
    tables = tuple(e.name for e in registry.entries() if e.compute == ".corrections:estimate_by_table")
    assert tables == corrections.METHODS
    # RecBole's Corrected*: the default auto, the tables, bv with its fitted prior and the per-positive hh
    assert registry.recbole_choices("corrected") == ("auto",) + tables + ("bv_mle", "hh")
    assert registry.get(registry.DEFAULT_ESTIMATOR).name == "auto"
    assert registry.recbole_choices("rankdist") == tuple(
        e.name for e in registry.entries() if e.family in ("auto", "rank_distribution"))
    with pytest.raises(ValueError, match="^family: no RecBole metric family 'rsp_correction'"):
        registry.recbole_choices("rsp_correction")
    # auto's choices are registered methods that take every design auto claims
    for key, choice in registry.AUTO_CHOICES.items():
        if key == "popularity":  # popularity designs: corrected estimators of them, every metric kind covered
            for name in choice:
                assert registry.get(name).supports(SamplingDesign(10, popularity=torch.ones(5)))
                assert registry.get(name).family not in ("none", "auto")
            assert all(registry.popularity_auto(kind) in choice for kind in METRIC_KINDS)
            continue
        if key == "auc":  # AUC at a fixed uniform m: an estimator of AUC under both uniform laws
            entry = registry.get(choice)
            assert entry.takes_metric("auc") and entry.supports(SamplingDesign(10))
            assert entry.supports(SamplingDesign(10, replacement=False))
            continue
        assert registry.get(choice).adaptive and registry.get(choice).family == "rank_distribution"
        assert registry.get(choice).exact_groups or not registry.get("auto").exact_groups


def test_registry_refuses_bad_entries():
    with pytest.raises(ValueError, match="^family: "):
        registry.Estimator("x", "nope", "s", ".corrections:estimate_by_table")
    with pytest.raises(ValueError, match="^fitter: "):
        registry.Estimator("x", "rank_distribution", "s", ".rank_distribution:estimate_by_fit")
    with pytest.raises(ValueError, match="^options: the rank-distribution method 'x' takes the fit options"):
        registry.Estimator("x", "rank_distribution", "s", ".rank_distribution:estimate_by_fit",
                           fitter=".rank_distribution:EM_FITTER")
    with pytest.raises(ValueError, match="^kind: "):
        registry.Option("x", "integer-ish")
    with pytest.raises(ValueError, match="^name: .*registered already"):
        registry.register(registry.get("bv"))
    with pytest.raises(ValueError, match="^method: unknown estimator 'nope'"):
        registry.get("nope")


def test_rank_distribution_dispatches_to_its_fitter():
    """Any method other than mle used to run MES silently: now an unknown one is refused and each runs its own
    fitter (the registry's ``fitter``)."""
    hist = rsp.sampled_rank_histogram(torch.tensor([1, 2, 3, 1, 5]), 100, 10)
    with pytest.raises(ValueError, match="^method: unknown estimator 'em'"):
        fit_rank_distribution(hist, "em")
    with pytest.raises(ValueError, match="^method: 'bv' does not fit a rank distribution; use one of"):
        fit_rank_distribution(hist, registry.Bv())
    assert fit_rank_distribution(hist, registry.Mle(n_bootstrap=0)).method == "mle"
    assert "lam" in fit_rank_distribution(hist, registry.Mes(n_bootstrap=0)).details


def test_sampled_ranks_carry_their_design(uniform_ranks):
    """estimate(metric, sampled) alone equals the same ranks built from plain arrays with the same design."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(50, 200, generator=g)
    pos = torch.randint(0, 200, (50, 2), generator=g)
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(30, replacement=False), generator=g)
    ranks, n_cand = s.ranks, s.n_candidates
    loose = rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(ranks, n_cand.unsqueeze(1).expand(ranks.shape), 30,
                                     rsp.SamplingDesign(30, replacement=False)),
        "bv",
    )
    alone = rsp.estimate("ndcg@10", s, method="bv")
    assert alone.value == loose.value and alone.stderr == loose.stderr
    a = rsp.adaptive_sampled_ranks(scores, pos, SamplingDesign(10, adaptive_max=80), generator=g)
    ranks, sizes = a.ranks, a.n_samples
    loose = rsp.estimate(
        "hit@10",
        rsp.SampledRanks.from_arrays(ranks, a.candidates(), sizes, rsp.SamplingDesign(10, adaptive_max=80)),
        rsp.registry.Mes(n_bootstrap=0),
    )
    alone = rsp.estimate("hit@10", a, rsp.registry.Mes(n_bootstrap=0))
    assert alone.value == loose.value and alone.details["adaptive"] == loose.details["adaptive"]


# --------------------------------------------------------------------------- adding an estimator: one file
def _half_compute(spec, hist, *, method, sampling, options):
    """A throw-away estimator: the sampled metric shrunk towards 1/2 by ``weight`` (its one option)."""
    values = corrections.stacked_tables(spec, hist.n_items, hist.n_samples,
                                       corrections.correction_from_options("none", sampling, {}))
    value, se = corrections.table_estimate(hist, values)
    w = options["weight"]
    return EstimatorOutput((1 - w) * value + w * 0.5, (1 - w) * se, hist.total, {"method": method}, ())


@pytest.fixture
def throwaway():
    entry = registry.register(registry.Estimator(
        "half", "correction", "the sampled metric shrunk towards 1/2", _half_compute,
        options=(registry.Option("weight", "fraction", 0.0, "shrinkage"),), adaptive=True,
    ))
    try:
        yield entry
    finally:
        registry.unregister("half")


def test_a_new_estimator_touches_one_file_and_reaches_every_list(throwaway, uniform_ranks, tmp_path):
    """Everything below comes from the entry registered in the fixture (module, entry and test in this file;
    docs/estimators.md's row is the fourth file, checked by tests/test_registry_docs.py for real entries)."""
    check_contract("half", uniform_ranks)
    exact, sampled = uniform_ranks
    assert rsp.estimate(
        "hit@10",
        rsp.SampledRanks.from_arrays(sampled, N, M),
        rsp.registry.method_class("half")(weight=1.0),
    ).value == 0.5
    assert "half" in registry.names() and "half" in estimators.ESTIMATORS
    assert estimators.METHOD_OPTIONS["half"] == ("weight",)
    assert "half" in rsp.adaptive.ADAPTIVE_METHODS
    assert registry.method_class("half")(weight=0.3).weight == 0.3  # its options: the method class's fields
    assert registry.method_class("half")(weight=0.3).options() == {"weight": 0.3}
    with pytest.raises(ValueError, match="^lam: .*allowed options: weight"):
        registry.method_class("half")(lam=1.0)
    a = adaptive_sampled_ranks_from_exact(exact[:500], N, SamplingDesign(10, adaptive_max=80),
                                          torch.Generator().manual_seed(0))
    assert np.isfinite(rsp.estimate("hit@10", a, method="half").value)
    assert "half" in registry.names(family="correction")


def test_registry_reading_imports_no_torch():
    """The table is plain data: listing the methods (``reco-sampled --help``) imports neither torch nor scipy."""
    import subprocess
    import sys

    # the package __init__ imports torch: load registry.py on its own, as the CLI's --help path can
    src = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('reg', "
           f"{registry.__file__!r}); m = importlib.util.module_from_spec(spec); sys.modules['reg'] = m; "
           "spec.loader.exec_module(m); print(len(m.names()), 'torch' in sys.modules, 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(len(registry.names())), "False", "False"]
