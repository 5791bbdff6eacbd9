"""The table of public entry points and their options that tests/test_option_types.py fuzzes.

Each entry is a *valid* call (the callable, its positional data, its data keywords). The options it is fuzzed on
are read from ``inspect.signature``: every parameter with a default that is not data (:data:`DATA`), of the kind
its annotation says (:func:`option_kind`: ``bool``, ``float``, ``int``, ``size``, ``str``, ``bool|str``), ``None``
allowed where the annotation says ``| None``. :data:`KINDS` names the few kinds the annotation cannot give.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin.corrections import correction_table, expected_corrected, table_bias
from reco_sampled_plugin.design import as_design
from reco_sampled_plugin.mapping import dataset_beta, fit_beta, mapped_points, mapping, mapping_estimate, sampled_hit_rate_curve
from reco_sampled_plugin.metrics import metric_curve
from reco_sampled_plugin.priors import BetaPrior, VectorPrior, empirical_prior, fit_beta_prior
from reco_sampled_plugin import registry
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from reco_sampled_plugin.sampling_laws import expected_sampled, log_sampled_rank_pmf, sampled_rank_pmf

#: Parameters that are data (tensors, arrays, priors, callables, designs), not options: another suite fuzzes them.
DATA = {
    "exclude", "relevance", "item_bias", "item_biases", "weights", "popularity", "prior", "generator", "negatives",
    "top_shape", "shape", "adaptive", "score_fn", "pilot", "designs",
    "kwargs", "options", "n_candidates", "user_factors", "item_factors", "design", "dtype", "device",
    "headline", "log", "cfg", "fn", "p", "X_train", "X_test", "flags",
    "scorer", "users",
}

#: Options whose kind the annotation does not give (unannotated, a size that may arrive as a whole float, or a
#: list of names where one string alone is one name).
KINDS: dict[str, str] = {
    "n_items": "size", "n_samples": "size", "adaptive_max": "size",
    "metrics": "names", "methods": "names", "estimators": "names", "stages": "names",
}


def option_kind(param: inspect.Parameter) -> tuple[str | None, bool]:
    """(kind, None allowed) of one option from its annotation (or default), ``None`` kind: not fuzzed."""
    if param.name in KINDS:
        kind = KINDS[param.name]
    else:
        ann = param.annotation
        if ann is inspect.Parameter.empty:
            d = param.default
            ann = {bool: "bool", float: "float", int: "int", str: "str"}.get(type(d), "")
        tokens = {t.strip() for t in str(ann).split("|")} - {"None"}
        kind = {frozenset({"bool"}): "bool", frozenset({"float"}): "float", frozenset({"int"}): "int",
                frozenset({"str"}): "str", frozenset({"bool", "str"}): "bool|str"}.get(frozenset(tokens))
    ann = str(param.annotation)
    none_ok = param.default is None or "None" in ann.split("|") or " None" in ann
    return kind, none_ok


#: Wrong-typed values per kind: each must give a ValueError naming the option.
WRONG: dict[str, list] = {
    "bool": ["False", "no", "true", 0, 1, 1.0, [True], np.array([True]), torch.tensor([True])],
    "float": ["0.5", "1", True, False, [0.5], np.array([0.5, 0.5]), 0.5j, b"0.5", np.bool_(True), torch.tensor(True),
              np.complex128(1)],
    "int": [2.0, 3.5, "3", True, [3], np.array([3, 3]), np.float64(3.0), 1j, np.bool_(True), torch.tensor(3.0)],
    "size": ["3", True, [3, 4], 2.5, 1j, "many"],
    "str": [1, True, 0.5, ["pessimistic"], b"x"],
    "bool|str": ["False", "yes", 1, 0, 0.5, [True]],
    "names": [3, 3.5, True, b"ndcg@5", [3], ["ndcg@5", 2], {"ndcg@5": 1}],
}


@dataclass
class Entry:
    """A valid call of a public entry point: ``fn(*args, **kwargs)``; ``skip``: options not fuzzed here, with why."""

    name: str
    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    skip: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # option -> kind ("kind?": None allowed) beyond the signature's

    def options(self) -> dict[str, tuple[str, bool]]:
        sig = inspect.signature(self.fn)
        out = {}
        for name, p in sig.parameters.items():
            if p.default is inspect.Parameter.empty or name in DATA or name in self.skip:
                continue
            kind, none_ok = option_kind(p)
            if kind is not None:
                out[name] = (kind, none_ok)
        for name, kind in self.extra.items():  # "kind?": None allowed (the default)
            out[name] = (kind.rstrip("?"), kind.endswith("?"))
        return out

    def call(self, **override):
        """The valid call with ``override`` (keyword options, or positional arguments by name) in place."""
        sig = inspect.signature(self.fn)
        params = list(sig.parameters)
        args = list(self.args)
        kwargs = {**self.kwargs}
        for name, value in override.items():
            if name in params and params.index(name) < len(args):
                args[params.index(name)] = value
            else:
                kwargs[name] = value
        return self.fn(*args, **kwargs)


class _Config(dict):
    """A RecBole-like config: missing keys read as None (what ``Config[...]`` does)."""

    def __missing__(self, key):
        return None


def entries(tmp: str) -> list[Entry]:
    """Every public entry point with options, as a valid call (``tmp``: a folder for the files some read)."""
    from reco_sampled_plugin import baselines, datasets, planner, rank_files, toy
    from reco_sampled_plugin.adapters import lightning, torchmetrics as tm
    from reco_sampled_plugin.adapters._recbole_settings import validate_config

    g = torch.Generator().manual_seed(0)
    scores = torch.rand(4, 30, generator=g)
    pos = torch.tensor([[1, 2], [3, -1], [5, 6], [7, -1]])
    pos1 = torch.tensor([1, 3, 5, 7])
    exact = torch.tensor([1, 3, 10, 25, 2, 7])
    sranks = torch.tensor([1, 2, 1, 4, 3, 1, 6, 2])
    u, v = torch.rand(4, 3, generator=g), torch.rand(30, 3, generator=g)
    X = sp.random(40, 30, density=0.3, format="csr", random_state=0, dtype=np.float64)
    X.data[:] = 1.0
    grid = np.add.outer(np.arange(20), np.arange(30))
    x_train, x_test = sp.csr_matrix((grid % 3 == 0) * 1.0), sp.csr_matrix((grid % 3 == 1) * 1.0)
    rng = np.random.default_rng(0)
    ranks_by_model = {"a": rng.integers(1, 200, 30), "b": rng.integers(1, 200, 30)}
    path = os.path.join(tmp, "ratings.csv")
    with open(path, "w") as f:
        f.write("".join(f"{i % 5},{i % 7},{1 + i % 5},{1000 + i}\n" for i in range(40)))
    rank_path = os.path.join(tmp, "ranks.txt")
    with open(rank_path, "w") as f:
        f.write("1\n3\n2\n")
    config = _Config(metrics=["CorrectedRecall", "RankDistNDCG"], eval_args={"mode": "uni100"}, topk=[10], seed=0)
    est_extra = {"tol": "float?", "max_iter": "int?", "n_bootstrap": "int?", "seed": "int?", "max_groups": "int?",
                 "delta": "float?", "kappa": "float?", "trace": "bool?", "beta": "float?"}

    from reco_sampled_plugin import reproduce

    def reproduce_config(**options):  # the config is checked where run_reproduce starts, before any data is read
        return reproduce._checked_config(reproduce.ReproduceConfig(**options))

    reproduce_config.__signature__ = inspect.signature(reproduce.ReproduceConfig)

    def recbole(**keys):
        return validate_config(_Config({**config, **keys}))

    sample = rsp.SampledRanks.from_arrays(sranks, 100, 10)
    est = rsp.estimate("hit@3", sample)
    fit = fit_rank_distribution(sample)
    out = [
        Entry("Estimate.interval", est.interval),
        Entry("Estimate.sampling_interval", est.sampling_interval),
        Entry("RankDistribution.metric", fit.metric, ("ndcg@5",)),
        Entry("RankDistribution.metrics", fit.metrics, (["ndcg@5"],)),
        Entry("estimate_values", tm.estimate_values, ({"x": est},)),
        Entry("exact_ranks", rsp.exact_ranks, (scores, pos)),
        Entry("exact_ranks_from_factors", rsp.exact_ranks_from_factors, (u, v, pos)),
        Entry("sampled_ranks", rsp.sampled_ranks, (scores, pos, 5), {"generator": g}),
        Entry("sampled_ranks_from_scorer", rsp.sampled_ranks_from_scorer,
              (lambda us, it: scores[us.unsqueeze(1).expand_as(it), it], pos, scores.shape[1], 5), {"generator": g}),
        Entry("candidate_counts", rsp.candidate_counts, (30, pos, None)),
        Entry("adaptive_sampled_ranks", rsp.adaptive_sampled_ranks,
              (scores, pos1, rsp.SamplingDesign(4, adaptive_max=16)), {"generator": g}),
        Entry("simulate_sampled_ranks", rsp.simulate_sampled_ranks, (exact, 30, 5), {"generator": g}),
        Entry("draw_sampled_ranks", rsp.draw_sampled_ranks, (exact, 30, 5)),
        Entry("MetricSpec", rsp.MetricSpec, ("ndcg",), {"k": 5}),
        Entry("metric_curve", metric_curve, ("ndcg@5", 30), extra={"n_items": "size"}),
        Entry("per_user_metrics", rsp.per_user_metrics, (scores, pos), {"metrics": ["ndcg@5"]}),
        Entry("per_user_metrics[factors]", rsp.per_user_metrics, ((u, v), pos), {"metrics": ["ndcg@5"]}),
        Entry("SamplingDesign", rsp.SamplingDesign, (5,), extra={"n_samples": "size"}),
        Entry("popularity_weights", rsp.popularity_weights, (torch.tensor([3.0, 0.0, 1.0]),)),
        Entry("AdaptiveDesign", rsp.AdaptiveDesign, (4, 16), extra={"n_samples": "size", "adaptive_max": "size",
                                                                              "top": "size"}),
        Entry("expected_sampled", expected_sampled, ("ndcg@5", exact, 30, 5)),
        Entry("sampled_rank_pmf", sampled_rank_pmf, (exact, 30, 5)),
        Entry("log_sampled_rank_pmf", log_sampled_rank_pmf, (exact, 30, 5)),
        Entry("SampledRanks.from_arrays", rsp.SampledRanks.from_arrays, (sranks, 100, 10), extra={"n_items": "size"}),
        Entry("estimate", rsp.estimate, ("hit@3", sample), extra={"method": "str"}),
        # the method objects: each option checked at construction (the common ones on every class)
        Entry("Mle", registry.Mle, extra={**est_extra, "max_rel_n_spread": "float?"}),
        Entry("Bv", registry.Bv, kwargs={"gamma": 0.1}, extra={"gamma": "float?", "max_rel_n_spread": "float?"}),
        Entry("Beta", registry.Beta, kwargs={"a": 1.0}, extra={"a": "float?"}),
        Entry("explain_flags", rsp.explain_flags, (("few_instances",),),
              skip={"n_samples": "a description such as '100..3200' is a valid n_samples there"}),
        Entry("correction_table", correction_table, ("ndcg@5", 100, 10), extra={"n_items": "size",
                                                                                      "n_samples": "size",
                                                                                      "method": "str"}),
        Entry("expected_corrected", expected_corrected, ("ndcg@5", exact, 100, 10), extra={"method": "str"}),
        Entry("table_bias", table_bias, (torch.zeros(11), "ndcg@5", 100, 10), extra={"n_items": "size",
                                                                                      "n_samples": "size"}),
        Entry("mapping", mapping, (3, 100, 10), extra={"n_items": "size", "n_samples": "size"}),
        Entry("mapping[beta]", mapping, (3, 100, 10, "beta"), {"a": 1.0}),
        Entry("fit_beta", fit_beta, (sranks, 100, 10)),
        Entry("mapping_estimate", mapping_estimate, ("hit@3", sranks, 100, 10)),
        Entry("mapped_points", mapped_points, (sranks, 100, 10)),
        Entry("sampled_hit_rate_curve", sampled_hit_rate_curve, (sranks, 100, 10)),
        Entry("dataset_beta", dataset_beta, ({"a": sranks, "b": sranks + 1}, 100, 10)),
        Entry("fit_rank_distribution", fit_rank_distribution, (sample,)),
        Entry("BetaPrior", BetaPrior, (1.0,), extra={"a": "float"}),
        Entry("VectorPrior", VectorPrior, (np.full(10, 0.1),)),
        Entry("empirical_prior", empirical_prior, (exact, 30)),
        Entry("fit_beta_prior", fit_beta_prior, (sranks, 10), extra={"n_samples": "size"}),
        Entry("identified_interval", rsp.identified_interval, ("hit@3", sranks, 100, 10)),
        Entry("TopShape", rsp.TopShape),
        Entry("paired_difference", rsp.paired_difference, ("ndcg@5", sranks, sranks.flip(0), 100, 10),
              extra={"method": "str"}),
        Entry("evaluate_factors", rsp.evaluate_factors, (x_train, x_test, torch.rand(20, 3, generator=g),
                                                           torch.rand(30, 3, generator=g)),
              {"metrics": ["ndcg"], "k": 3}),
        Entry("evaluate_factors[sampled]", rsp.evaluate_factors, (x_train, x_test, torch.rand(20, 3, generator=g),
                                                                    torch.rand(30, 3, generator=g)),
              {"metrics": ["ndcg"], "k": 3, "n_samples": 5, "method": registry.Bv(gamma=0.1)},
              skip={"k": "the exact entry covers it"}),
        Entry("consistency_report", rsp.consistency_report, (ranks_by_model, 200, 10),
              {"repeats": 2, "metrics": ["ndcg@5"], "methods": ["none"]}),
        Entry("split_train_test", rsp.split_train_test, (X,)),
        Entry("plan", planner.plan, (200, 50, "ndcg@10", 0.2), {"designs": [rsp.SamplingDesign(10)], "repeats": 2},
              extra={"target_rel_error": "float", "n_users": "int"}),
        Entry("pilot_design", planner.pilot_design, (5000, "ndcg@10"), {"n_samples": 50}),
        Entry("load_interactions", datasets.load_interactions, (path,)),
        Entry("binarize", datasets.binarize, (datasets.load_interactions(path),), {"threshold": 3.0}),
        Entry("read_rank_file", rank_files.read_rank_file, (rank_path, 100, 10)),
        Entry("toy_table", toy.toy_table, (), {"n_samples": 9}),
        Entry("ReproduceConfig", reproduce_config, (), {"data": path}),
        Entry("Estimator", rsp.Estimator, ("x", "correction", "a test entry", "m:f"),
              skip={"reference": "free text"}),
        Entry("ItemKNN", baselines.ItemKNN),
        Entry("ImplicitALS", baselines.ImplicitALS),
        Entry("EASE", baselines.EASE),
        Entry("ExactRankingMetrics", tm.ExactRankingMetrics, (["ndcg@5"],)),
        Entry("SampledRankingMetrics", tm.SampledRankingMetrics, (["ndcg@5"], 10)),
        Entry("SampledRankingMetrics.update_from_scorer", tm.SampledRankingMetrics(["ndcg@5"], 5).update_from_scorer,
              (lambda us, it: scores[us.unsqueeze(1).expand_as(it), it], pos, scores.shape[1]),
              {"users": torch.arange(4)}),
        Entry("RankingSettings", tm.RankingSettings, (["ndcg@5"],)),
        Entry("RankingMetricsCallback", lightning.RankingMetricsCallback, (tm.RankingSettings(["ndcg@5"]),)),
        Entry("recbole", recbole, (), {}, extra={
            "rsp_n_grid": "float?", "rsp_replacement": "bool?",
            "rsp_side_by_side": "bool?", "rsp_stderr": "bool?", "rsp_interval": "bool?", "rsp_full_ranks": "bool?",
            "rsp_tensorboard": "bool?", "rsp_seed": "int?", "rsp_m": "int?",
            "rsp_estimators": "names?", "rsp_weighting": "str?",
            "rsp_ties": "str?", "rsp_check_finite": "bool|str?", "rsp_exact_share": "float?",
            "rsp_exact_share_choice": "str?"}),
    ]
    return out


def wrong_values(kind: str, none_ok: bool) -> list[Any]:
    """The wrong-typed values of one option kind (``None`` too where the option does not take it)."""
    return WRONG[kind] + ([] if none_ok else [None])
