"""Compatibility: the module paths users import keep working, and results pickled by an older version load.

The import lists were collected from README.md, docs/*.md, examples/, benchmarks/ and tests/ at commit b143a75
(before issue 24's refactor): every ``from reco_sampled_plugin.X import Y`` and ``rsp.X.Y`` of a public name from
a public module (underscore modules and names are internal and may move). Names that move keep their old path
(a re-export) and gain the new one; both are checked.

The pickles under tests/data/pickles were made by tests/data/make_pickles.py with the code of b143a75.
"""

from __future__ import annotations

import importlib
import json
import math
import pickle
from pathlib import Path

import pytest

import reco_sampled_plugin as rsp

# ``__all__`` of reco_sampled_plugin at b143a75: every one stays exported.
TOP_LEVEL_B143A75 = (
    "AdaptiveCost", "AdaptiveDesign", "BetaFit", "BetaPrior", "CallablePrior", "DEFAULT_METRICS", "ESTIMATORS",
    "Estimate", "FactorEvaluation", "IdentifiedInterval", "METHODS", "MetricSpec", "Prior", "RankDistribution",
    "RankHistogram", "SampledRanks", "TopShape", "UniformPrior", "VectorPrior", "adaptive_cost",
    "adaptive_sampled_ranks", "adaptive_sampled_ranks_from_exact", "candidate_counts", "clear_correction_cache",
    "consistency_report", "corrected_metric", "corrected_values", "correction_table", "dataset_beta",
    "draw_sampled_ranks", "empirical_prior", "estimate", "estimate_rank_distribution", "evaluate_factors",
    "exact_ranks", "exact_ranks_from_factors", "expected_corrected", "expected_sampled", "fit_beta",
    "fit_beta_prior", "identified_interval", "leave_last_out_split", "log_sampled_rank_pmf", "mapped_points",
    "mapping", "mapping_estimate", "mean_metrics", "metric_curve", "metric_values", "ordering_agreement",
    "paired_difference", "parse_metric", "per_user_metrics", "per_user_metrics_from_factors",
    "sampled_hit_rate_curve", "sampled_rank_histogram", "sampled_rank_pmf", "sampled_ranks",
    "simulate_sampled_ranks", "split_train_test", "table_bias", "user_metric_values",
)

# Added to the top level by issue 24.
TOP_LEVEL_NEW = ("SamplingDesign", "as_design", "registry", "Estimator", "register", "DEFAULT_ESTIMATOR")

# module -> public names imported from it in README, docs, examples, benchmarks and tests at b143a75, plus the
# method lists that are now views of the registry.
IMPORTED_B143A75 = {
    "reco_sampled_plugin": (
        "MetricSpec", "RankHistogram", "baselines", "cli", "consistency_report", "corrected_metric",
        "correction_table", "corrections", "counting", "datasets", "estimate", "estimate_rank_distribution",
        "estimators", "exact_ranks", "exact_ranks_from_factors", "expected_sampled", "factor_ranks", "fit_beta",
        "mapping", "mean_metrics", "metric_values", "ordering_agreement", "paired_difference", "parse_metric",
        "per_user_metrics", "per_user_metrics_from_factors", "rank_distribution", "rank_files", "sampled_rank_pmf",
        "sampled_ranks", "simulate_sampled_ranks",
    ),
    "reco_sampled_plugin.adaptive": (
        "AdaptiveDesign", "adaptive_cost", "adaptive_design", "adaptive_sampled_ranks",
        "adaptive_sampled_ranks_from_exact", "stage_event_cdf", "ADAPTIVE_METHODS",
    ),
    "reco_sampled_plugin.baselines": ("EASE", "ImplicitALS", "ItemKNN", "Popularity", "held_out_ranks", "train_all"),
    "reco_sampled_plugin.cli": ("main",),
    "reco_sampled_plugin.consistency": ("consistency_report", "ordering_agreement", "parse_method"),
    "reco_sampled_plugin.corrections": (
        "clear_correction_cache", "correction_table", "correction_tables", "design_rule", "expected_corrected",
        "stacked_tables", "table_bias", "METHODS",
    ),
    "reco_sampled_plugin.counting": ("item_keys", "set_backend"),
    "reco_sampled_plugin.datasets": (
        "Interactions", "binarize", "leave_last_out", "load_interactions", "load_ml100k", "load_ml_latest_small",
        "ml100k_path", "ml_latest_small_path",
    ),
    "reco_sampled_plugin.estimate": ("Estimate",),
    "reco_sampled_plugin.estimators": ("ESTIMATORS", "METHOD_OPTIONS", "estimate"),
    "reco_sampled_plugin.factor_ranks": ("TILE_ELEMENTS", "check_finite_factors", "factor_ranks_padded",
                                         "positive_scores", "tile_shape"),
    "reco_sampled_plugin.factors": ("FactorEvaluation", "evaluate_factors"),
    "reco_sampled_plugin.identification": ("TopShape", "identified_interval", "top_sensitive"),
    "reco_sampled_plugin.mapping": (
        "dataset_beta", "fit_beta", "mapped_points", "mapping", "mapping_estimate", "mapping_table",
        "mapping_tables", "sampled_hit_rate_curve", "MAPPING_METHODS",
    ),
    "reco_sampled_plugin.metric_names": ("parse_metric",),
    "reco_sampled_plugin.metrics": ("metric_curve", "metric_values"),
    "reco_sampled_plugin.planner": ("DEFAULT_FAMILY", "DesignForecast", "Plan", "add_plan_parser",
                                    "default_designs", "plan", "run_plan"),
    "reco_sampled_plugin.priors": ("BetaPrior", "CallablePrior", "UniformPrior", "as_prior", "empirical_prior",
                                   "fit_beta_prior"),
    "reco_sampled_plugin.quadrature": ("composite_rule", "gauss_discrete_uniform", "gauss_rule", "pmf_at_ranks"),
    "reco_sampled_plugin.rank_distribution": (
        "adaptive_sampled_ranks", "adaptive_sampled_ranks_from_exact", "dense_likelihood",
        "estimate_rank_distribution", "estimate_rank_distributions", "pool_groups", "rank_grid",
        "simulate_sampled_ranks", "RANK_DISTRIBUTION_METHODS",
    ),
    "reco_sampled_plugin.rank_files": ("read_ncf", "read_rank_file"),
    "reco_sampled_plugin.ranking": ("exact_ranks", "prepare_index", "TIES"),
    "reco_sampled_plugin.report": ("write_report",),
    "reco_sampled_plugin.reproduce": ("ReproduceConfig", "run_reproduce"),
    "reco_sampled_plugin.sampling_laws": ("sampled_rank_pmf",),
    "reco_sampled_plugin.simulate": ("draw_sampled_ranks",),
    "reco_sampled_plugin.splits": ("leave_last_out_split", "split_train_test"),
    "reco_sampled_plugin.tie_expectation": ("expected_metric_values", "expected_single_item_values"),
    "reco_sampled_plugin.toy": ("TABLE1_N_ITEMS", "TABLE1_RANKS", "toy_table"),
    "reco_sampled_plugin.uncertainty": ("corrected_metric", "corrected_values", "paired_difference"),
    "reco_sampled_plugin.user_metrics": ("user_metric_values",),
    "reco_sampled_plugin.adapters": ("lightning", "recbole", "torchmetrics"),
}

# The adapters' public names (their ``__all__`` at b143a75); each needs its framework installed.
ADAPTERS_B143A75 = {
    "reco_sampled_plugin.adapters.torchmetrics": ("torchmetrics", ("ExactRankingMetrics", "SampledRankingMetrics")),
    "reco_sampled_plugin.adapters.lightning": ("lightning", (
        "RankingMetricsCallback", "PLRankingMetricsCallback", "RankingBatch", "FactorBatch", "callback_class",
        "NAMESPACES",
    )),
    "reco_sampled_plugin.adapters.recbole": ("recbole", (
        "register", "registered", "run_recbole", "validate_config", "metric_classes", "positive_table", "COLUMNS",
        "PLUGIN_KEY", "CONFIG_DEFAULTS", "FAMILIES",
    )),
}

# Names that move in issue 24: (old module, new module, name). The old path stays a re-export.
MOVED = (
    ("reco_sampled_plugin.adaptive", "reco_sampled_plugin.design", "AdaptiveDesign"),
    ("reco_sampled_plugin.rank_distribution", "reco_sampled_plugin.simulate", "simulate_sampled_ranks"),
)

_PAIRS = [(mod, name) for mod, names in IMPORTED_B143A75.items() for name in names]


def _import(module: str, name: str):
    """``from module import name``, as user code writes it (submodules included)."""
    ns: dict = {}
    exec(f"from {module} import {name}", ns)  # noqa: S102 - the statement users write, names from the lists above
    return ns[name]


def test_top_level_names_of_b143a75_stay_exported():
    missing = [n for n in TOP_LEVEL_B143A75 if n not in rsp.__all__ or not hasattr(rsp, n)]
    assert not missing, f"names exported at b143a75 no longer exported: {missing}"


def test_new_top_level_names():
    for n in TOP_LEVEL_NEW:
        assert n in rsp.__all__ and hasattr(rsp, n), n
    assert rsp.registry is importlib.import_module("reco_sampled_plugin.registry")
    assert rsp.DEFAULT_ESTIMATOR in rsp.ESTIMATORS


def test_all_is_unique_and_resolves():
    assert len(rsp.__all__) == len(set(rsp.__all__))
    ns: dict = {}
    exec("from reco_sampled_plugin import *", ns)  # noqa: S102
    assert set(rsp.__all__) <= set(ns)
    assert {"ESTIMATORS", "METHODS"} <= set(dir(rsp))


def test_catalogue_lists_every_exported_name():
    """The package docstring's catalogue (one ``name -- summary`` line per public name) covers ``__all__``."""
    listed = {line.split(" -- ")[0].strip() for line in rsp.__doc__.splitlines() if " -- " in line}
    assert set(rsp.__all__) <= listed, sorted(set(rsp.__all__) - listed)
    assert listed <= set(rsp.__all__), sorted(listed - set(rsp.__all__))


@pytest.mark.parametrize("module, name", _PAIRS, ids=[f"{m}:{n}" for m, n in _PAIRS])
def test_documented_import_paths_resolve(module, name):
    _import(module, name)  # raises ImportError (or KeyError) where a documented path no longer resolves


@pytest.mark.parametrize("module", sorted(ADAPTERS_B143A75))
def test_adapter_names_resolve(module):
    framework, names = ADAPTERS_B143A75[module]
    importlib.import_module(framework)  # a declared test dependency: never skipped
    mod = importlib.import_module(module)
    for name in names:
        assert getattr(mod, name, None) is not None, f"{module}.{name}"


def test_attribute_paths_resolve():
    """``rsp.X.Y`` as README and the docs write them (submodules bound on the package once imported)."""
    importlib.import_module("reco_sampled_plugin.planner")
    assert rsp.adaptive.AdaptiveDesign is rsp.AdaptiveDesign
    assert callable(rsp.counting.set_backend)
    assert set(rsp.ranking.TIES) == {"pessimistic", "optimistic", "average", "random"}  # the README's tie policies
    # ``rsp.mapping`` is the mapping function (the module is reco_sampled_plugin.mapping, imported by path)
    assert callable(importlib.import_module("reco_sampled_plugin.mapping").mapping_tables)
    assert callable(rsp.planner.plan)


def test_method_lists_match_the_registry():
    from reco_sampled_plugin import adaptive, corrections, estimators, rank_distribution, registry

    mapping = importlib.import_module("reco_sampled_plugin.mapping")  # the package's ``mapping`` is the function

    assert tuple(estimators.ESTIMATORS) == registry.names() == rsp.ESTIMATORS
    assert set(estimators.METHOD_OPTIONS) == set(registry.names())
    assert tuple(corrections.METHODS) == rsp.METHODS
    assert tuple(mapping.MAPPING_METHODS) == registry.names(family="mapping")
    assert tuple(rank_distribution.RANK_DISTRIBUTION_METHODS) == registry.names(family="rank_distribution")
    assert set(adaptive.ADAPTIVE_METHODS) == set(registry.names(adaptive=True))


def test_registry_views_are_live():
    from reco_sampled_plugin.registry import Estimator, register, unregister

    assert "compat_probe" not in rsp.ESTIMATORS
    register(Estimator("compat_probe", "correction", "a probe", ".corrections:estimate_by_table"))
    try:
        assert "compat_probe" in rsp.ESTIMATORS
        assert "compat_probe" in rsp.METHODS
        from reco_sampled_plugin import ESTIMATORS

        assert "compat_probe" in ESTIMATORS
    finally:
        unregister("compat_probe")
    assert "compat_probe" not in rsp.ESTIMATORS and "compat_probe" not in rsp.METHODS
    with pytest.raises(AttributeError):
        rsp.NO_SUCH_NAME  # noqa: B018


@pytest.mark.parametrize("old, new, name", MOVED, ids=[m[2] for m in MOVED])
def test_moved_names_keep_their_old_path(old, new, name):
    assert _import(old, name) is _import(new, name)  # the old path is the moved object, not a copy or a stub


def test_adaptive_design_new_path():
    from reco_sampled_plugin.design import AdaptiveDesign

    assert AdaptiveDesign(10, 40).cap == 40


def test_adaptive_design_is_one_class():
    """adaptive.py re-exports design.py's AdaptiveDesign (one class, whichever path a user imports)."""
    from reco_sampled_plugin.adaptive import AdaptiveDesign as old
    from reco_sampled_plugin.design import AdaptiveDesign as new

    assert old is new is rsp.AdaptiveDesign


def test_simulate_sampled_ranks_new_path():
    from reco_sampled_plugin.simulate import simulate_sampled_ranks

    assert simulate_sampled_ranks is rsp.simulate_sampled_ranks


def test_no_heavy_optional_imports():
    """``import reco_sampled_plugin`` needs torch, numpy and scipy only."""
    import subprocess
    import sys

    code = ("import sys, reco_sampled_plugin; "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'lightning', 'pytorch_lightning', 'recbole', "
            "'torchmetrics') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# ------------------------------------------------------------------------------------------------- pickles
PICKLES = Path(__file__).resolve().parent / "data" / "pickles"
EXPECTED = json.loads((PICKLES / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_pickles_of_b143a75_load(name):
    with open(PICKLES / f"{name}.pkl", "rb") as f:
        obj = pickle.load(f)  # noqa: S301 - fixtures of this repository
    want = EXPECTED[name]
    if name == "rank_distribution":
        assert isinstance(obj, rsp.RankDistribution)
        est = obj.metric("hit@10")
        assert est.value == pytest.approx(want["value"], abs=1e-12, rel=0)
        assert est.stderr == pytest.approx(want["stderr"], abs=1e-12, rel=0)
        assert list(obj.flags) == want["flags"]
        assert [float(x) for x in obj.cdf([1, 10, 100, 1000, 2000])] == pytest.approx(want["cdf"], abs=1e-12, rel=0)
        return
    assert isinstance(obj, rsp.Estimate)
    assert obj.value == want["value"]
    assert obj.stderr == want["stderr"]
    assert list(obj.flags) == want["flags"]
    lo, hi = obj.interval(0.95)  # recomputed after loading (the identified part too)
    assert math.isclose(lo, want["interval"][0], rel_tol=0, abs_tol=1e-12)
    assert math.isclose(hi, want["interval"][1], rel_tol=0, abs_tol=1e-12)
