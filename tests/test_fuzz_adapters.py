"""Fuzzing beyond the core functions: the Lightning callback (real Trainers), RecBole configs (real
``Config`` objects), ``evaluate_factors`` and the factor functions, and tensors on the wrong device (``meta``, mixed).

Same contract as tests/test_fuzz.py: a ``ValueError`` whose message names one of the call's arguments (or config
keys), or a result that is right in kind (finite and inside the metric's range, or NaN with an honest flag where
nothing was measured). Never another exception type, a silent NaN or a hang.
"""

from __future__ import annotations

import math
import os

import numpy as np
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from _profiles import examples

import reco_sampled_plugin as rsp
from reco_sampled_plugin import registry
from test_fuzz import _contract  # the one contract check of the fuzzing suites

FAST = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# a real Trainer per example costs ~0.3 s: fewer examples there (scaled with the profile, as every count)
FEW = settings(FAST, max_examples=examples(15))


def _unit_or_flagged_nan(est) -> None:
    """An Estimate: a value in [0, 1] with stderr >= 0 (or inf), or NaN with a flag saying why."""
    if math.isnan(est.value):
        assert est.flags, f"NaN without a flag: {est}"
    else:
        assert -1e-9 <= est.value <= 1 + 1e-9 or "outside_metric_range" in est.flags, est
        lo, hi = est.interval(0.95)
        assert 0.0 <= lo <= hi <= 1.0, est
        assert est.stderr >= 0 or math.isnan(est.stderr) and est.flags, est


# ------------------------------------------------------------------------------------------- wrong devices
def _place(t: torch.Tensor, where: str) -> torch.Tensor:
    return t.to("meta") if where == "meta" else t


places = st.sampled_from(["cpu", "meta"])


@FAST
@given(s_at=places, p_at=places, e_at=places, fn=st.sampled_from(["exact", "sampled", "per_user", "factors"]))
def test_tensors_on_meta_or_mixed_devices(s_at, p_at, e_at, fn):
    g = torch.Generator().manual_seed(0)
    scores = _place(torch.rand(3, 20, generator=g), s_at)
    pos = _place(torch.tensor([[1], [2], [3]]), p_at)
    exc = _place(torch.tensor([[4], [5], [-1]]), e_at)
    calls = {
        "exact": lambda: rsp.exact_ranks(scores, pos, exclude=exc),
        "sampled": lambda: rsp.sampled_ranks(scores, pos, 5, exclude=exc, generator=g),
        "per_user": lambda: rsp.per_user_metrics(scores, pos, ["ndcg@5"], exclude=exc, as_frame=False),
        "factors": lambda: rsp.exact_ranks_from_factors(_place(torch.rand(3, 4), s_at), torch.rand(20, 4), pos,
                                                         exclude=exc),
    }
    out = _contract(calls[fn], ("scores", "positives", "exclude", "factors", "device"))
    if (s_at, p_at, e_at) != ("cpu", "cpu", "cpu"):
        assert out is None, "a meta tensor holds no values: it must be refused"


# ------------------------------------------------------------------------------------------- evaluate_factors
def _interactions(n_users: int, n_items: int, seed: int):
    rng = np.random.default_rng(seed)
    train = sp.random(n_users, n_items, density=0.2, format="csr", random_state=rng, data_rvs=lambda k: np.ones(k))
    test = sp.random(n_users, n_items, density=0.1, format="csr", random_state=rng, data_rvs=lambda k: np.ones(k))
    test = test - test.multiply(train)  # a test item may not be a training item
    test.eliminate_zeros()
    return train, test


factor_kinds = st.sampled_from(["ok", "nan", "inf", "int", "bool", "half", "wrong_d", "wrong_rows", "1d", "none",
                                "complex", "empty"])


def _factors(kind: str, rows: int, d: int, rng: np.random.Generator):
    x = rng.standard_normal((rows, d)).astype(np.float32)
    if kind == "nan":
        x[0, 0] = np.nan
    elif kind == "inf":
        x[-1, -1] = np.inf
    elif kind == "int":
        return x.astype(np.int64)
    elif kind == "bool":
        return x > 0
    elif kind == "half":
        return torch.from_numpy(x).half()
    elif kind == "wrong_d":
        return x[:, :-1]
    elif kind == "wrong_rows":
        return x[:-1]
    elif kind == "1d":
        return x[:, 0]
    elif kind == "none":
        return None
    elif kind == "complex":
        return x.astype(np.complex64)
    elif kind == "empty":
        return x[:, :0]
    return x


EVALUATE_OPTIONS = {  # (valid values, bad or edge values) per option of evaluate_factors
    "k": ([3, 5], [-1, 0, 2.0, True, "5", 10**12]),
    "metrics": ([None, "all", ["ndcg@3", "hit", "roc_auc"]], [["magic"], [], ["ndcg@0"], ["ndcg@99"]]),
    "n_samples": ([None, 4, 20], [-1, 0, 4.5, math.nan, 2**40, "4"]),
    "method": ([None, "bv", "mes", "none"], ["magic", 3]),
    "ties": (["pessimistic", "average", "random", "optimistic"], ["sideways", None]),
    "batch_size": ([None, 1, 5], [0, -3, 2.5]),
    "adaptive_max": ([None], [3, 2.5, -1, 2**40]),  # the cap of n_samples=SamplingDesign(4, adaptive_max=...)
}


@FAST
@given(
    broken=st.sampled_from(["nothing", "user_factors", "item_factors"] + sorted(EVALUATE_OPTIONS)),
    bad_kind=factor_kinds, data=st.data(), seed=st.integers(0, 3),
)
def test_evaluate_factors(broken, bad_kind, data, seed):
    """One argument at a time is bad (or an edge value); the others are valid, so accepted calls are exercised too."""
    n_users, n_items, d = 12, 15, 3
    rng = np.random.default_rng(seed)
    train, test = _interactions(n_users, n_items, seed)
    u = _factors(bad_kind if broken == "user_factors" else "ok", n_users, d, rng)
    v = _factors(bad_kind if broken == "item_factors" else "ok", n_items, d, rng)
    options = {name: data.draw(st.sampled_from(bad if name == broken else good), label=name)
               for name, (good, bad) in EVALUATE_OPTIONS.items()}
    cap = options.pop("adaptive_max")
    if options["method"] is not None and options["n_samples"] is None and cap is None:
        options["method"] = None

    def run():
        n_samples = options["n_samples"] if cap is None else rsp.SamplingDesign(4, adaptive_max=cap)
        return rsp.evaluate_factors(train, test, u, v, seed=seed, **{**options, "n_samples": n_samples})

    def check(out):
        frame = out.metrics if hasattr(out, "metrics") else out
        values = frame.to_numpy(dtype=np.float64)
        finite = values[np.isfinite(values)]
        assert not np.isinf(values).any()
        assert ((finite >= -1e-9) & (finite <= 1 + 1e-9)).all()
        if hasattr(out, "summary"):  # sampled: the summary's exact, sampled and corrected values are metrics too
            cols = [c for c in ("exact", "sampled", "lo", "hi") if c in out.summary.columns]
            table = out.summary[cols].to_numpy(dtype=np.float64)
            assert ((table[np.isfinite(table)] >= -1e-9) & (table[np.isfinite(table)] <= 1 + 1e-9)).all()
            for est in out.estimates.values():  # corrected values: in range, or flagged outside_metric_range
                _unit_or_flagged_nan(est)

    _contract(run, ("user_factors", "item_factors", "factors", "X_", "metric") + tuple(EVALUATE_OPTIONS), check)


# ------------------------------------------------------------------------------------------- RecBole configs
RSP_VALUES = {
    "rsp_m": st.one_of(st.none(), st.integers(-2, 300), st.sampled_from([50.0, 10.5, "100", True])),
    "rsp_adaptive_max": st.one_of(st.none(), st.integers(-2, 2000), st.sampled_from([800.0, "x"])),
    "rsp_replacement": st.sampled_from([True, False, "yes", 1, None]),
    "rsp_estimators": st.sampled_from([["bv", "bound", "auto"], ["none", "linear", "mes"], ["ls", "beta", "mle"],
                                       ["rank_estimate", "beta_fit", "gmod"], ["bv_mle", "bound", "auto"], "auto",
                                       ["magic"], [3], ["bv", "ls"], ["hh", "bound", "auto"], ["pl_fit"], None]),
    "rsp_estimator_options": st.one_of(
        st.fixed_dictionaries({"bv": st.fixed_dictionaries({"gamma": st.one_of(
            st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["0.1", None]))})}),
        st.sampled_from([{}, None, {"bv": {"prior": "uniform"}}, {"bv": {"prior": ["beta", 0.5]}},
                         {"bv": {"prior": ["beta", -1]}}, {"bv": {"prior": "jeffreys"}}, {"bv": {"gammma": 0.1}},
                         {"auto": {"n_bootstrap": 4}}, {"auto": {"n_bootstrap": -1}}, {"auto": {"n_bootstrap": 2.5}},
                         {"auto": {"n_bootstrap": "8"}}, {"auto": {"n_bootstrap": 1}}, {"beta": {"a": "2"}},
                         {"beta": {"a": math.nan}}, {"mes": {"tol": 0.0}}, "x", {"bv": 3}])),
    "rsp_weighting": st.sampled_from(["user", "item", "both"]),
    "rsp_ties": st.sampled_from(["pessimistic", "average", "random", "up"]),
    "rsp_n_grid": st.one_of(st.floats(-1, 1), st.sampled_from([None, math.nan, math.inf])),
    "rsp_seed": st.one_of(st.none(), st.integers(-5, 10), st.sampled_from([1.5, "s"])),
    "rsp_typo": st.sampled_from([1]),
}
PLUGIN_METRICS = ["ExactRecall", "CorrectedRecall", "CorrectedNDCG", "MappedHit", "RankDistRecall", "RankDistNDCG"]


@FAST
@given(
    keys=st.lists(st.sampled_from(sorted(RSP_VALUES)), max_size=4, unique=True),
    data=st.data(),
    metrics=st.lists(st.sampled_from(PLUGIN_METRICS), min_size=1, max_size=3, unique=True),
    mode=st.sampled_from(["full", "uni100", "pop100", "labeled", "uni0"]),
)
def test_recbole_configs(keys, data, metrics, mode):
    import recbole
    from recbole.config import Config

    from reco_sampled_plugin.adapters import recbole as _plugin  # noqa: F401  (registers the plugin)
    from reco_sampled_plugin.adapters._recbole_settings import validate_config

    extra = {key: data.draw(RSP_VALUES[key], label=key) for key in keys}
    config_dict = {"data_path": os.path.join(os.path.dirname(recbole.__file__), "dataset_example"), "metrics": metrics,
                   "eval_args": {"mode": mode}, "show_progress": False, **extra}
    names = tuple(extra) + ("rsp_m", "rsp_replacement", "eval_args.mode", "rsp_adaptive_max", "rsp_estimators")

    def check(config):
        settings_ = validate_config(config)  # what the plugin will run with: every value valid
        assert settings_.m is None or settings_.m >= 1
        assert all(isinstance(m, registry.Method) for m in settings_.methods.values())
        assert all(0.0 <= getattr(m, "gamma", 0.5) <= 1.0 for m in settings_.methods.values())

    _contract(lambda: Config(model="BPR", dataset="ml-100k", config_dict=config_dict), names, check)


# ------------------------------------------------------------------------------------------- Lightning callback
def _bad_outputs(kind: str, b: int, n: int, g: torch.Generator) -> dict:
    scores = torch.rand(b, n, generator=g)
    pos = torch.randint(0, n, (b, 1), generator=g)
    out = {"scores": scores, "positives": pos, "ids": torch.arange(b)}
    if kind == "nan_irrelevant":
        scores[0, (int(pos[0, 0]) + 1) % n] = math.nan
    elif kind == "nan_positive":
        scores[0, int(pos[0, 0])] = math.nan
    elif kind == "int_scores":
        out["scores"] = (scores * 100).long()
    elif kind == "pos_out_of_range":
        out["positives"] = pos + n
    elif kind == "pos_float":
        out["positives"] = pos.double() + 0.5
    elif kind == "exclude_positive":
        out["exclude"] = pos.clone()
    elif kind == "ids_wrong_shape":
        out["ids"] = torch.arange(b + 1)
    elif kind == "ids_float":
        out["ids"] = torch.arange(b).double()
    elif kind == "missing_scores":
        del out["scores"]
    elif kind == "all_padding":
        out["positives"] = torch.full((b, 1), -1)
    elif kind == "empty_batch":
        out = {"scores": scores[:0], "positives": pos[:0], "ids": torch.arange(0)}
    elif kind == "factors_nan":
        u, v = torch.randn(b, 4, generator=g), torch.randn(n, 4, generator=g)
        v[1, 1] = math.nan
        out = {"user_factors": u, "item_factors": v, "positives": pos, "ids": torch.arange(b)}
    elif kind == "factors_mismatch":
        out = {"user_factors": torch.randn(b, 4), "item_factors": torch.randn(n, 3), "positives": pos}
    elif kind == "meta_scores":
        out["scores"] = scores.to("meta")
    return out


OUTPUT_KINDS = ["ok", "nan_irrelevant", "nan_positive", "int_scores", "pos_out_of_range", "pos_float",
                "exclude_positive", "ids_wrong_shape", "ids_float", "missing_scores", "all_padding", "empty_batch",
                "factors_nan", "factors_mismatch", "meta_scores"]


@FEW
@given(kind=st.sampled_from(OUTPUT_KINDS), n_samples=st.sampled_from([None, 5, 20]),
       metrics=st.sampled_from([("ndcg@5",), ("hit@3", "auc")]), seed=st.integers(0, 5))
def test_lightning_callback_step_outputs(kind, n_samples, metrics, seed, tmp_path_factory):
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    b, n = 6, 30
    batch = _bad_outputs(kind, b, n, torch.Generator().manual_seed(seed))

    class Module(pl.LightningModule):
        def validation_step(self, _batch, _idx):
            return batch

    callback = RankingMetricsCallback(RankingSettings(metrics, n_samples=n_samples,
                                                      estimators=("none",) if n_samples else ()))
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, callbacks=[callback],
                         enable_checkpointing=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path_factory.mktemp("pl")))

    def run():
        trainer.validate(Module(), DataLoader([0], batch_size=1), verbose=False)
        return callback.results["validate"]

    def check(results):
        assert results, "no result logged"
        for est in results.values():
            _unit_or_flagged_nan(est)

    _contract(run, ("scores", "positives", "exclude", "ids", "user_factors", "item_factors", "factors"), check)


CALLBACK_OPTIONS = {  # (valid values, bad or edge values) per option of the callback's RankingSettings
    "metrics": ([("ndcg@10",), "ndcg@10", ("hit@5", "auc")], [("magic@3",), (), ("hit@0",), 3]),
    "n_samples": ([None, 10, 100], [-2, 0, 10.5, 2**31, "10", True]),
    "ties": (["pessimistic", "average", "random"], ["up", None]),
    "estimators": ([("none",), ("bv", "mes"), ()], [("magic",), "bv", (3,)]),
    "adaptive_max": ([None], [5, 2**30, 100.5, -1]),  # the cap of n_samples=SamplingDesign(m, adaptive_max=...)
}


@FAST
@given(broken=st.sampled_from(["nothing"] + sorted(CALLBACK_OPTIONS)), data=st.data())
def test_lightning_callback_options(broken, data):
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    options = {name: data.draw(st.sampled_from(bad if name == broken else good), label=name)
               for name, (good, bad) in CALLBACK_OPTIONS.items()}
    if options["n_samples"] is None:
        options["estimators"] = ()
    cap = options.pop("adaptive_max")

    def run():
        m = options["n_samples"]
        return RankingMetricsCallback(RankingSettings(**{**options, "n_samples": m if cap is None or m is None else
                                                         rsp.SamplingDesign(m, adaptive_max=cap)}))

    _contract(run, tuple(CALLBACK_OPTIONS) + ("metric",))
