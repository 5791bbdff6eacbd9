"""The RecBole adapter on real RecBole runs (MovieLens 100k shipped in RecBole's wheel, CPU, short)."""

from __future__ import annotations

import glob
import math
import os

import numpy as np
import pytest
import torch
from scipy import stats

from reco_sampled_plugin.adapters import recbole as rb  # noqa: E402  (registers the plugin)
from reco_sampled_plugin.adapters import _recbole_ranks as rr  # noqa: E402

pytestmark = pytest.mark.slow

import recbole  # noqa: E402
from recbole.config import Config  # noqa: E402
from recbole.trainer import Trainer  # noqa: E402
from _recbole_helpers import evaluate_with_struct, prepare_data, replay_seeded_draws  # noqa: E402
from recbole.utils import get_model, init_seed  # noqa: E402
from reco_sampled_plugin import SampledRanks, SamplingDesign
from reco_sampled_plugin.design import ExactShare
from reco_sampled_plugin import registry

DATA_PATH = os.path.join(os.path.dirname(recbole.__file__), "dataset_example")
BASE = {
    "data_path": DATA_PATH,
    "device": "cpu",
    "use_gpu": False,
    "show_progress": False,
    "embedding_size": 16,
    "learning_rate": 0.01,
    "train_batch_size": 4096,
    "eval_batch_size": 1 << 20,
    "topk": [10],
    "metric_decimal_place": 12,
    "seed": 2020,
    "reproducibility": True,
    "checkpoint_dir": "saved",
}


def _prepare(model: str, extra: dict):
    """The config and RecBole's loaders: ``init_seed`` and ``data_preparation``, ml-100k read and each split built
    once per test process (``prepare_data``: the same loaders and batches as a fresh read and preparation)."""
    config = Config(model=model, dataset="ml-100k", config_dict={**BASE, **extra})
    train, valid, test = prepare_data(config)
    return config, train, valid, test


_evaluate = evaluate_with_struct  # trainer.evaluate and the DataStruct the evaluator saw


FULL_METRICS = ["Recall", "NDCG", "MRR", "GAUC", "ExactRecall", "ExactNDCG", "ExactMRR", "CorrectedRecall"]


@pytest.fixture(scope="module")
def bpr(workdir):
    """BPR trained for 2 epochs, evaluated on the test split in full mode (exact ranks of every positive)."""
    config, train, valid, test = _prepare(
        "BPR",
        {"epochs": 2, "metrics": FULL_METRICS, "valid_metric": "ExactRecall@10", "rsp_m": 100,
         "rsp_full_ranks": True, "rsp_ties": "average", "rsp_stderr": True, "rsp_interval": True},
    )
    init_seed(config["seed"], config["reproducibility"])
    model = get_model("BPR")(config, train._dataset)
    trainer = Trainer(config, model)
    trainer.fit(train, valid, saved=False, show_progress=False)
    result, struct = _evaluate(trainer, test)
    return {"config": config, "model": model, "trainer": trainer, "result": result, "struct": struct, "test": test}


def _full_mode(bpr, extra: dict):
    """A full-mode config of ``extra`` and the ``bpr`` fixture's test split (the data do not depend on the plugin's
    keys: built once)."""
    return Config(model="BPR", dataset="ml-100k", config_dict={**BASE, **extra}), bpr["test"]


@pytest.fixture(scope="module")
def sampled_splits():
    """The test split's loader of a sampled mode (``uni100``, ``pop100``) in RecBole's default batches
    (``eval_batch_size`` 4096: a few users each), built once per mode for the module: a loader does not depend on
    the plugin's keys (each test's own Config goes to its Trainer). Its evaluations are reseeded
    (``_evaluate(..., reseed=True)``): every one reads RecBole's negatives drawn from the run's seed, drawn once for
    the module (``replay_seeded_draws``: RecBole's pop100 sampler costs seconds per evaluation)."""
    loaders: dict = {}

    def split(mode: str):
        if mode not in loaders:
            loaders[mode] = replay_seeded_draws(_prepare("BPR", {"eval_args": {"mode": mode}, "eval_batch_size": 4096})[3])
        return loaders[mode]

    return split


@pytest.fixture(scope="module")
def full_batches(workdir):
    """The test split of full mode in small batches (``eval_batch_size`` 4096: a couple of users each), built once
    for the module: a loader does not depend on the plugin's keys (each test's own Config goes to its Trainer)."""
    return _prepare("BPR", {"eval_batch_size": 4096})[3]


def _sampled_mode(sampled_splits, extra: dict):
    """A config of ``extra`` (its ``eval_args`` a sampled mode) and that mode's shared test split."""
    config = Config(model="BPR", dataset="ml-100k", config_dict={**BASE, **extra})
    return config, sampled_splits(extra["eval_args"]["mode"])


@pytest.fixture(scope="module")
def bpr_uni100(bpr, sampled_splits):
    """The same trained model evaluated in uni100 mode on the same test split."""
    metrics = ["Recall", "CorrectedRecall", "MappedHit", "RankDistRecall"]
    config, test = _sampled_mode(sampled_splits, {"eval_args": {"mode": "uni100"}, "metrics": metrics,
                                                  "valid_metric": "CorrectedRecall@10/auto",
                                                  "rsp_estimator_options": {"auto": {"n_bootstrap": 4}}})
    trainer = Trainer(config, bpr["model"])
    result, struct = _evaluate(trainer, test, reseed=True)
    return {"result": result, "struct": struct}


def test_registration_in_place_idempotent_lowercase():
    from recbole.evaluator import register as reg
    from recbole.utils import EvaluatorType

    before = (len(reg.metrics_dict), len(reg.metric_types), len(reg.smaller_metrics))
    rb.register()
    rb.register()
    assert (len(reg.metrics_dict), len(reg.metric_types), len(reg.smaller_metrics)) == before
    for name, cls in rb.metric_classes().items():
        assert name == name.lower() and reg.metrics_dict[name] is cls
        assert reg.metric_types[name] == EvaluatorType.RANKING
        assert reg.metric_information[name] == [rb.PLUGIN_KEY]
        assert name not in reg.smaller_metrics  # every plugin metric is bigger-is-better
    for name in ("correctedrecall", "correctedndcg", "correctedap", "mappedhit", "rankdistrecall", "exactmrr"):
        assert name in reg.metrics_dict
    config = Config(model="BPR", dataset="ml-100k",
                    config_dict={**BASE, "metrics": ["CorrectedRecall"], "valid_metric": "CorrectedRecall@10/auto", "rsp_m": 50})
    assert config["valid_metric_bigger"] is True


def test_full_mode_exact_equals_recbole(bpr):
    res = bpr["result"]
    for name in ("recall@10", "ndcg@10", "mrr@10"):
        assert res[f"exact{name}"] == pytest.approx(float(res[name]), abs=1e-10), name
    assert res["recall@10"] > 0.02  # a trained model, not a constant one


def test_full_mode_rank_sums_equal_meanrank(bpr):
    struct = bpr["struct"]
    cols = rb.positive_table(struct)
    meanrank = struct.get("rec.meanrank")  # per user: sum of positive ranks (average ties), #candidates, #positives
    users = cols["user"].to(torch.int64)
    sums = torch.zeros(meanrank.shape[0], dtype=torch.float64).index_add_(0, users, cols["rank_full"])
    assert torch.all(cols["rank_full"] >= 1)
    np.testing.assert_allclose(sums.numpy(), meanrank[:, 0].double().numpy(), rtol=0, atol=1e-6)
    counts = torch.bincount(users, minlength=meanrank.shape[0]).double()
    np.testing.assert_array_equal(counts.numpy(), meanrank[:, 2].double().numpy())
    # candidates: RecBole's non-excluded items (its -inf scores start at argmin) minus the other positives
    n_user = meanrank[:, 1].double()[users]  # argmin of the sorted row = number of finite scores
    np.testing.assert_array_equal(cols["n_candidates"].numpy(), (n_user - cols["n_positives"] + 1).numpy())


def test_full_mode_side_by_side_and_stderr(bpr):
    res = bpr["result"]
    exact, sampled, corrected = (res["correctedrecall@10/exact"], res["correctedrecall@10/sampled"], res["correctedrecall@10/auto"])
    se = res["correctedrecall@10/auto_stderr"]
    assert sampled > 3 * exact  # sampled Recall@10 with m = 100 overstates the full-catalogue value
    assert abs(corrected - exact) < 4 * se + 0.01
    # rsp_interval: K = 10 lies below the resolution (~17 on ml-100k at m = 100): the interval is the identified one,
    # wider than corrected +- 1.96 se, and it holds the exact value
    lo, hi = res["correctedrecall@10/auto_lo"], res["correctedrecall@10/auto_hi"]
    assert lo <= min(corrected, exact) and max(corrected, exact) <= hi
    assert hi - lo > 2 * 1.96 * se
    # brute force from the per-positive table: each user counts once (weights 1/|T_u|, rsp_weighting: user)
    cols = rb.positive_table(bpr["struct"])
    w = 1.0 / cols["n_positives"].numpy()
    for key, ranks in (("sampled", cols["sampled_rank"]), ("exact", cols["rank_irrelevant"])):
        expect = float(((ranks.numpy() <= 10) * w).sum() / w.sum())
        assert res[f"correctedrecall@10/{key}"] == pytest.approx(expect, abs=5e-5), key


def test_uni100_sampled_ranks_follow_binomial_law(bpr, bpr_uni100):
    full = rb.positive_table(bpr["struct"])
    samp = rb.positive_table(bpr_uni100["struct"])
    key_full = {(int(u), int(i)): j for j, (u, i) in enumerate(zip(full["uid"], full["item"]))}
    idx = np.array([key_full[(int(u), int(i))] for u, i in zip(samp["uid"], samp["item"])])
    assert len(idx) == len(key_full)  # the same held-out pairs in both modes
    r = full["rank_irrelevant"].numpy()[idx]
    n = full["n_candidates"].numpy()[idx]
    np.testing.assert_array_equal(samp["n_candidates"].numpy(), n)  # the sampler's pool = the exact ranking's
    m = samp["m"].numpy()
    assert np.all(m == 100)
    k = samp["sampled_rank"].numpy() - 1
    untied = r == np.round(r)  # average ranks of float32 score ties are halves: leave those few out
    assert untied.mean() > 0.99
    r, n, m, k = r[untied], n[untied], m[untied], k[untied]
    p = (r - 1) / (n - 1)
    z = (k.sum() - (m * p).sum()) / math.sqrt((m * p * (1 - p)).sum())
    assert abs(z) < 4, z
    rng = np.random.default_rng(0)  # randomised PIT: uniform on (0, 1) under the binomial law
    u = stats.binom.cdf(k - 1, m, p) + rng.uniform(size=k.shape) * stats.binom.pmf(k, m, p)
    assert stats.kstest(u, "uniform").pvalue > 1e-3


@pytest.mark.parametrize("mode", ["uni100", "pop100"])
def test_uni100_staged_batches_give_the_per_batch_table(bpr, sampled_splits, monkeypatch, mode):
    """uni100 / pop100 batches (RecBole's default eval_batch_size: a few users each) are copied as they arrive and
    ranked together, in one flush or in many small ones: the same table as ranking each batch at once
    (the path of other devices). RecBole draws new negatives at every evaluation: each starts from the same
    seed. Pessimistic ties: the plugin draws nothing, so every column agrees exactly."""
    config, test = _sampled_mode(sampled_splits, {
        "eval_args": {"mode": mode}, "eval_batch_size": 4096, "rsp_estimators": ["none"],
        "metrics": ["Recall", "CorrectedRecall"], "valid_metric": "CorrectedRecall@10/none"})
    trainer = Trainer(config, bpr["model"])
    # RecBole's batches (its negatives drawn from the same seed every time) drawn once for the module
    # (sampled_splits) and given to every evaluation: the same batches, without drawing them again

    def table():
        return rb.positive_table(_evaluate(trainer, test, reseed=True)[1])

    flushes = []
    original = rr._flush
    monkeypatch.setattr(rr, "_flush", lambda c: (flushes.append(bool(c.__dict__.get("_rsp_staging"))), original(c)))
    staged = table()
    assert sum(flushes) == 1  # the ~300 batches ranked together once, when the evaluation ends
    monkeypatch.setattr(rr, "_BUFFER_ELEMENTS", 20 * 1700)  # ~20 users per flush
    small = table()
    assert sum(flushes) > 20
    monkeypatch.setattr(rr, "_STAGE_ON_CPU", False)
    per_batch = table()
    assert staged["user"].shape[0] > 9000 and bool((staged["m"] == 100).all())
    for col in COLUMNS_COMPARED + ("m",):
        np.testing.assert_array_equal(staged[col].numpy(), per_batch[col].numpy(), err_msg=col)
        np.testing.assert_array_equal(small[col].numpy(), per_batch[col].numpy(), err_msg=col)


def test_uni100_corrected_closer_than_recbole_sampled(bpr, bpr_uni100):
    res, full = bpr_uni100["result"], bpr["result"]
    corrected, recbole_sampled = res["correctedrecall@10/auto"], float(res["recall@10"])
    for exact in (full["correctedrecall@10/exact"], float(full["recall@10"])):
        assert abs(corrected - exact) < abs(recbole_sampled - exact)
    # every estimator family reports, with the plain sampled metric of the papers side by side
    for key in ("mappedhit@10/bound", "rankdistrecall@10/auto", "correctedrecall@10/sampled"):
        assert 0.0 <= res[key] <= 1.0
    assert "correctedrecall@10/exact" not in res  # no exact ranks in a sampled mode


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"metrics": ["CorrectedRecall"], "rsp_m": 100, "rsp_estimators": ["magic"]}, "rsp_estimators"),
        ({"metrics": ["CorrectedNDCG"], "rsp_m": 100, "rsp_estimators": ["bv"],
          "rsp_estimator_options": {"bv": {"gamma": 1.5}}}, "rsp_estimator_options: bv: gamma"),
        # auto is the default: options for an estimator not listed are refused
        ({"metrics": ["CorrectedNDCG"], "rsp_m": 100, "rsp_estimator_options": {"bv": {"gamma": 0.2}}},
         "rsp_estimator_options: given for 'bv'"),
        # an estimated metric named without its estimator (the key is correctedndcg@10/auto)
        ({"metrics": ["CorrectedNDCG"], "rsp_m": 100, "valid_metric": "CorrectedNDCG@10"},
         "valid_metric: 'CorrectedNDCG@10' is reported as 'correctedndcg@10/auto'"),
        ({"metrics": ["MappedHit"], "rsp_m": 100, "rsp_estimators": ["bv", "auto"]}, "rsp_estimators: the Mapped"),
        ({"metrics": ["RankDistRecall"], "rsp_m": 100, "rsp_estimators": ["mes", "auto"]}, "rsp_estimators: 'mes' and"),
        # the keys of 0.1's one-key-per-option configuration are unknown keys now
        ({"metrics": ["CorrectedNDCG"], "rsp_m": 100, "rsp_gamma": 0.2}, "rsp_gamma: unknown reco_sampled_plugin key"),
        ({"metrics": ["CorrectedRecall"]}, "rsp_m"),
        ({"metrics": ["CorrectedRecall"], "eval_args": {"mode": "uni100"}, "rsp_m": 50}, "rsp_m"),
        ({"metrics": ["CorrectedRecall"], "eval_args": {"mode": "labeled"}}, "eval_args.mode"),
        ({"metrics": ["ExactRecall"], "eval_args": {"mode": "uni100"}}, "eval_args.mode"),
        ({"metrics": ["MappedHit"], "eval_args": {"mode": "pop100"}}, "eval_args.mode"),
        ({"metrics": ["CorrectedRecall"], "rsp_m": 100, "rsp_gama": 0.2}, "rsp_gama"),
        ({"metrics": ["CorrectedRecall"], "rsp_m": 100, "rsp_estimators": ["bv"],
          "rsp_estimator_options": {"bv": {"prior": "jeffreys"}}}, "rsp_estimator_options: bv: prior"),
        # adaptive sampling: popN's first stage is not uniform (uniN is accepted: tests/test_recbole_scorer.py);
        # fixed-m estimators; cap below m; no rsp_m
        ({"metrics": ["RankDistRecall"], "eval_args": {"mode": "pop100"}, "rsp_adaptive_max": 800}, "pop100.*popularity"),
        ({"metrics": ["CorrectedRecall"], "rsp_m": 100, "rsp_adaptive_max": 800, "rsp_estimators": ["bv"]},
         "rsp_adaptive_max.*fixed m"),
        ({"metrics": ["RankDistRecall"], "rsp_m": 100, "rsp_adaptive_max": 50}, "rsp_adaptive_max"),
        ({"metrics": ["RankDistRecall"], "rsp_m": 100, "rsp_adaptive_max": -5}, "rsp_adaptive_max"),
        ({"metrics": ["RankDistRecall"], "rsp_m": 100, "rsp_adaptive_max": 800, "rsp_replacement": False}, "rsp_adaptive_max"),
        # exact_at_cap: adaptive, full mode only (uniN's scores cover the drawn items), a bool
        ({"metrics": ["RankDistRecall"], "rsp_m": 100, "rsp_exact_at_cap": True}, "^rsp_exact_at_cap: .*rsp_adaptive_max"),
        ({"metrics": ["RankDistRecall"], "eval_args": {"mode": "uni100"}, "rsp_adaptive_max": 800,
          "rsp_exact_at_cap": True}, "^rsp_exact_at_cap: RecBole's 'uni100' mode"),
        ({"metrics": ["RankDistRecall"], "rsp_m": 100, "rsp_adaptive_max": 800, "rsp_exact_at_cap": "yes"},
         "^rsp_exact_at_cap"),
    ],
)
def test_bad_config_fails_before_training(extra, key):
    with pytest.raises(ValueError, match=key if ".*" in key else key.replace(".", r"\.")):
        Config(model="BPR", dataset="ml-100k", config_dict={**BASE, **extra})


def test_lightgcn_under_compat_with_tensorboard(workdir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a TensorBoard directory of its own
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from reco_sampled_plugin.adapters import _recbole_compat

    assert "scipy" in _recbole_compat.applied()  # LightGCN needs dok_matrix._update (scipy >= 1.15)
    config, train, valid, test = _prepare(
        "LightGCN",
        {"epochs": 1, "n_layers": 1, "metrics": ["Recall", "CorrectedRecall", "CorrectedNDCG", "MappedHit"],
         "valid_metric": "CorrectedRecall@10/auto", "rsp_m": 100},
    )
    init_seed(config["seed"], config["reproducibility"])
    model = get_model("LightGCN")(config, train._dataset)
    trainer = Trainer(config, model)
    best_score, best_result = trainer.fit(train, valid, saved=True, show_progress=False)
    assert best_score == best_result["correctedrecall@10/auto"]  # valid_metric on a plugin metric
    result = trainer.evaluate(test, load_best_model=True)  # RecBole's own checkpoint (torch >= 2.6)
    assert 0.0 <= result["correctedrecall@10/auto"] <= 1.0
    trainer.tensorboard.flush()
    files = glob.glob(os.path.join(trainer.tensorboard.log_dir, "events.out.tfevents.*"))
    assert files
    acc = EventAccumulator(trainer.tensorboard.log_dir)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("reco_sampled/valid/correctedrecall@10/auto", "reco_sampled/test/correctedrecall@10/auto",
                "reco_sampled/test/mappedhit@10/bound", "reco_sampled/test/correctedrecall@10/exact"):
        assert tag in tags, tags
    [event] = acc.Scalars("reco_sampled/test/correctedrecall@10/auto")
    assert event.value == pytest.approx(result["correctedrecall@10/auto"], abs=1e-6)


def test_run_recbole_wrapper_logs_plugin_results(workdir, caplog):
    import logging

    from reco_sampled_plugin.adapters import _recbole_settings

    _recbole_settings._LOGGED.clear()  # the notes are logged once per process: this run's, whatever ran before
    caplog.set_level(logging.INFO)
    result = rb.run_recbole(
        model="BPR",
        dataset="ml-100k",
        config_dict={**BASE, "epochs": 1, "metrics": ["Recall", "CorrectedRecall", "ExactRecall"], "rsp_m": 100,
                     "valid_metric": "Recall@10"},
        saved=False,
    )
    test = result["test_result"]
    assert test["exactrecall@10"] == pytest.approx(float(test["recall@10"]), abs=1e-10)
    assert "correctedrecall@10/auto" in result["best_valid_result"]
    # RecBole's logger (the root logger; pytest holds it, so RecBole's own log file stays empty here)
    messages = [r.getMessage() for r in caplog.records]
    assert any("test result" in msg and "correctedrecall@10/auto" in msg for msg in messages)
    # the 95% interval by default (<name>_lo, <name>_hi), the standard error only when asked for
    lo, hi = test["correctedrecall@10/auto_lo"], test["correctedrecall@10/auto_hi"]
    assert 0.0 <= lo <= test["correctedrecall@10/auto"] <= hi <= 1.0 and "correctedrecall@10/auto_stderr" not in test
    # K = 10 below the resolution at m = 100: said once, in words, with the planner command
    why = [m for m in messages if "CorrectedRecall@10: top_unresolved: top of the ranking not resolved" in m]
    assert len(why) == 1 and "m = 100 samples" in why[0] and "(reco-sampled plan --n-items " in why[0]
    assert "--metric recall@10 --target-rel-error 0.05)" in why[0]
    # Recall (RecBole's list recall) beside CorrectedRecall (leave-one-out): one note on the difference
    notes = [m for m in messages if "CorrectedRecall@k (and its /exact) is the leave-one-out metric" in m]
    assert len(notes) == 1 and "RecBole's recall@k is the list metric" in notes[0]


def test_popularity_sampling_uncorrected_is_said(bpr, sampled_splits, caplog):
    """pop100 with rsp_estimators: [none]: CorrectedHit@10/none is the plain sampled metric, and the run says so (a
    warning naming the metric), its value equal to its /sampled key; its interval holds it."""
    import logging

    from reco_sampled_plugin.adapters import _recbole_settings

    _recbole_settings._LOGGED.clear()
    caplog.set_level(logging.INFO)
    config, test = _sampled_mode(sampled_splits, {"eval_args": {"mode": "pop100"}, "rsp_estimators": ["none"],
                                                  "metrics": ["Hit", "CorrectedHit"],
                                                  "valid_metric": "CorrectedHit@10/none"})
    res, _ = _evaluate(Trainer(config, bpr["model"]), test, reseed=True)
    assert res["correctedhit@10/none"] == res["correctedhit@10/sampled"] and res["correctedhit@10/none"] > 0.2
    assert res["correctedhit@10/none_lo"] < res["correctedhit@10/none"] < res["correctedhit@10/none_hi"]
    keys = [k for k in res if k.startswith("correctedhit@10")]  # the interval right after its point
    assert keys[:3] == ["correctedhit@10/none", "correctedhit@10/none_lo", "correctedhit@10/none_hi"]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "rsp_estimators lists none" in r.getMessage()]
    assert len(warned) == 1 and "CorrectedHit report the plain sampled metric, uncorrected" in warned[0].getMessage()
    notes = [r.getMessage() for r in caplog.records if "CorrectedHit@k (and its /exact) is the leave-one-out" in r.getMessage()]
    assert len(notes) == 1 and "RecBole's hit@k is the list metric" in notes[0]


@pytest.mark.parametrize("staged", [True, False], ids=["copied", "referenced"])
def test_buffered_flushes_give_the_same_table(bpr, full_batches, monkeypatch, staged):
    """Full-sort batches are gathered (CPU: copied into reused buffers; other devices: held by reference)
    and processed together. With RecBole's default small batches (2 users each), flushing every few users
    gives the same exact ranks, candidate counts, users and ids as one flush at the end, and sampled ranks
    from the same law; both ways of gathering give the same table."""
    config = Config(model="BPR", dataset="ml-100k", config_dict={
        **BASE, "eval_batch_size": 4096, "metrics": FULL_METRICS, "valid_metric": "ExactRecall@10", "rsp_m": 100,
        "rsp_full_ranks": True, "rsp_ties": "average"})
    test = full_batches
    trainer = Trainer(config, bpr["model"])
    monkeypatch.setattr(rr, "_STAGE_ON_CPU", staged)
    flushes = []
    original = rr._flush
    active = "_rsp_staging" if staged else "_rsp_buffer"
    monkeypatch.setattr(rr, "_flush", lambda c: (flushes.append(bool(c.__dict__.get(active))), original(c)))
    default = rb.positive_table(_evaluate(trainer, test)[1])
    assert sum(flushes) == 1  # the 472 batches ranked together once, when the evaluation ends
    monkeypatch.setattr(rr, "_BUFFER_ELEMENTS", 5 * 1700)  # ~5 users of ml-100k per flush
    small = rb.positive_table(_evaluate(trainer, test)[1])
    assert sum(flushes) > 100  # many flushes of a few batches each
    for col in ("user", "rank_full", "rank_irrelevant", "n_candidates", "n_positives", "uid", "item"):
        np.testing.assert_array_equal(small[col].numpy(), default[col].numpy(), err_msg=col)
    assert torch.equal(small["m"], default["m"])
    # sampled ranks: other draws, same distribution (means of r~ - 1 agree within a few standard errors)
    a, b = small["sampled_rank"].numpy() - 1, default["sampled_rank"].numpy() - 1
    se = np.sqrt(a.var() / a.size + b.var() / b.size)
    assert abs(a.mean() - b.mean()) < 4 * se


@pytest.mark.parametrize("replacement", [True, False], ids=["binomial", "hypergeometric"])
@pytest.mark.parametrize("ties", ["pessimistic", "average"])
def test_binomial_sampling_matches_item_draws(bpr, monkeypatch, ties, replacement):
    """Full mode draws each sampled rank from the exact counts (1 + Binomial(m, p) with replacement,
    1 + Hypergeometric(N, a, m) without) instead of drawing m items: same ranks where both are exact, and the
    sampled ranks follow the law of the item draws (checked against the exact expectation m p and against
    the item-draw path)."""
    config, test = _full_mode(bpr, {"metrics": ["Recall", "CorrectedRecall"], "valid_metric": "Recall@10",
                                    "rsp_m": 100, "rsp_ties": ties, "rsp_replacement": replacement})
    trainer = Trainer(config, bpr["model"])
    binom = rb.positive_table(_evaluate(trainer, test)[1])
    monkeypatch.setattr(rr, "_COUNT_MAX_MEAN_POSITIVES", 0)  # topk for exact ranks, m drawn items per positive
    items = rb.positive_table(_evaluate(trainer, test)[1])
    known = items["rank_irrelevant"] > 0  # the topk path knows ranks up to max(topk) only
    assert int(known.sum()) > 100 and bool((binom["rank_irrelevant"] >= 1).all())
    np.testing.assert_array_equal(binom["rank_irrelevant"][known].numpy(), items["rank_irrelevant"][known].numpy())
    np.testing.assert_array_equal(binom["n_candidates"].numpy(), items["n_candidates"].numpy())
    m = 100.0
    p = ((binom["rank_irrelevant"] - 1) / (binom["n_candidates"] - 1)).numpy()  # average ties: mean position
    for table in (binom, items):
        hits = table["sampled_rank"].numpy() - 1
        se = np.sqrt(np.sum(m * p * (1 - p)) + (hits.size / 4 if ties == "average" else 0.0))  # + tie placement
        # (without replacement the variance is smaller by (N - m) / (N - 1): the bound stays valid)
        assert abs(hits.sum() - m * p.sum()) < 4 * se, (ties, hits.sum(), m * p.sum(), se)
        # deterministic ends: nothing irrelevant above -> r~ = 1; everything above -> r~ = m + 1
        top = table["rank_irrelevant"] == 1
        assert int(top.sum()) > 0 and bool((table["sampled_rank"][top] == 1).all())


def test_reused_score_buffer_is_copied_or_caught_and_nan_scores_raise(bpr, full_batches, monkeypatch):
    """A model that writes every batch's scores into one persistent tensor: on CPU the plugin copies each
    batch as it arrives, so the table equals the ordinary model's; batches held by reference (other devices)
    are read when the evaluation ends, so the reuse is caught (tensor version counter), not silently ranked
    on the last batch's scores. NaN scores of held-out items are named, not ranked."""
    config = Config(model="BPR", dataset="ml-100k", config_dict={
        **BASE, "eval_batch_size": 4096, "metrics": ["Recall", "CorrectedRecall"], "valid_metric": "Recall@10", "rsp_m": 100})
    test = full_batches
    model = bpr["model"]
    trainer = Trainer(config, model)
    plain = rb.positive_table(_evaluate(trainer, test)[1])
    original = type(model).full_sort_predict
    shared = {}

    def reused(self, interaction):
        scores = original(self, interaction)
        out = shared.setdefault(scores.numel(), torch.empty_like(scores))
        return out.copy_(scores)

    monkeypatch.setattr(type(model), "full_sort_predict", reused)
    copied = rb.positive_table(_evaluate(trainer, test)[1])
    for col in ("rank_full", "rank_irrelevant", "n_candidates", "uid", "item"):
        np.testing.assert_array_equal(copied[col].numpy(), plain[col].numpy(), err_msg=col)
    monkeypatch.setattr(rr, "_STAGE_ON_CPU", False)
    with pytest.raises(RuntimeError, match="modified in place"):
        trainer.evaluate(test, load_best_model=False)
    monkeypatch.setattr(rr, "_STAGE_ON_CPU", True)
    monkeypatch.setattr(type(model), "full_sort_predict", lambda self, inter: torch.full_like(original(self, inter), math.nan))
    with pytest.raises(ValueError, match="NaN"):
        Trainer(config, model).evaluate(test, load_best_model=False)


def test_score_dtypes_staged_or_referenced_give_the_same_table(bpr, monkeypatch):
    """Models scoring in float64, float16 or bfloat16 (numpy has no bfloat16: those batches are held by reference)
    give the same table through either way of gathering, within one collector whose staging buffers
    change dtype between evaluations."""
    config, test = _full_mode(bpr, {"metrics": ["Recall", "CorrectedRecall"], "valid_metric": "Recall@10", "rsp_m": 100})
    model = bpr["model"]
    trainer = Trainer(config, model)
    original = type(model).full_sort_predict
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float32):
        monkeypatch.setattr(type(model), "full_sort_predict", lambda self, inter, d=dtype: original(self, inter).to(d))
        tables = []
        for staged in (True, False):
            monkeypatch.setattr(rr, "_STAGE_ON_CPU", staged)
            tables.append(rb.positive_table(_evaluate(trainer, test)[1]))
        for col in COLUMNS_COMPARED:
            np.testing.assert_array_equal(tables[0][col].numpy(), tables[1][col].numpy(), err_msg=f"{dtype} {col}")
    assert trainer.eval_collector._rsp_stage.scores.dtype == np.float32


COLUMNS_COMPARED = ("user", "rank_full", "rank_irrelevant", "n_candidates", "sampled_rank", "n_positives", "uid", "item")


def test_staging_copies_batches_and_rejects_what_it_cannot_hold():
    """The CPU staging of full-sort batches: copies (not views) of every batch in arrival order, positives
    moved to global rows, buffers grown without losing data and reused by the next evaluation; a batch of
    another dtype or width, or one that needs autograd, is refused (the caller flushes and re-opens)."""

    class Inter:  # the part of RecBole's Interaction the staging reads
        def __init__(self, uid):
            self.interaction = {} if uid is None else {"user_id": uid}

    g = torch.Generator().manual_seed(0)
    batches = []
    for b in (2, 3, 1, 2, 2, 3):  # more than the first buffers hold: grows several times
        scores = torch.randn(b, 7, generator=g)
        k = torch.randint(1, 4, (b,), generator=g)
        pu = torch.repeat_interleave(torch.arange(b), k)
        pi = torch.randint(1, 7, (pu.shape[0],), generator=g)
        batches.append((scores, torch.randint(0, 100, (b,), generator=g), pu, pi))
    stage = rr._Staging()
    for evaluation in range(2):  # the second evaluation reuses the grown buffers
        stage.open(batches[0][0], batches[0][0].numpy(), "user_id")
        for scores, uid, pu, pi in batches:
            passed = scores.clone()
            assert stage.add(passed, Inter(uid), pu, pi)
            passed.fill_(math.nan)  # the model reuses / overwrites its tensor: the staged copy is unaffected
        got_scores, got_u, got_i, got_uid = stage.take()
        rows = torch.tensor([sc.shape[0] for sc, _, _, _ in batches])
        offsets = torch.cumsum(rows, 0) - rows
        assert torch.equal(got_scores, torch.cat([sc for sc, _, _, _ in batches]))
        assert torch.equal(got_u, torch.cat([pu + o for (_, _, pu, _), o in zip(batches, offsets)]))
        assert torch.equal(got_i, torch.cat([pi for _, _, _, pi in batches]))
        assert torch.equal(got_uid, torch.cat([u for _, u, _, _ in batches]))
    capacity = stage.scores.shape[0]
    stage.open(batches[0][0], batches[0][0].numpy(), "user_id")
    scores, uid, pu, pi = batches[0]
    assert not stage.add(scores.double(), Inter(uid), pu, pi)  # another dtype
    assert not stage.add(torch.randn(2, 8), Inter(uid), pu, pi)  # another width
    assert not stage.add(torch.randn(2, 7, requires_grad=True), Inter(uid), pu, pi)  # autograd: no numpy view
    assert not stage.add(scores, Inter(uid), None, pi)  # no positives
    assert stage.nrows == 0 and stage.scores.shape[0] == capacity
    assert stage.add(scores, Inter(None), pu, pi) and stage.take()[3] is None  # batches without user ids
    # sampled mode: every interaction row's item and user id are kept (RecBole's layout), both required
    stage.open(scores, scores.numpy(), "user_id", "item_id")
    rows = Inter(torch.arange(10))
    rows.interaction["item_id"] = torch.arange(100, 110)
    assert not stage.add(scores, Inter(torch.arange(10)), pu, pi)  # no item column
    assert stage.add(scores, rows, pu, pi) and stage.add(scores, rows, pu, pi)
    got = stage.take()
    assert len(got) == 5 and torch.equal(got[3], torch.arange(100, 110).repeat(2)) and torch.equal(got[4], torch.arange(10).repeat(2))
    assert torch.equal(got[1], torch.cat([pu, pu + scores.shape[0]]))


@pytest.mark.parametrize("where", ["dispatch", "device_code"])
def test_other_positive_counts_match_brute_force(device, monkeypatch, where):
    """#(other positives of the same user scoring >= / > each positive), ties and unsorted users included; on
    the positives' device (numpy on the CPU; ``device_code``: the torch code of other devices, on this one)."""
    if where == "device_code":
        monkeypatch.setattr(rr, "_other_positive_counts_host", rr._other_positive_counts_device)
    g = torch.Generator().manual_seed(3)
    counts = torch.tensor([3, 0, 5, 1, 4])
    pos_u = torch.repeat_interleave(torch.arange(5), counts)[torch.randperm(13, generator=g)]
    s_pos = torch.randint(0, 3, (13,), generator=g).to(torch.float32)  # many ties
    s_pos = s_pos - 1.0  # negative, zero and positive scores
    s_pos[s_pos == 0] = torch.tensor([0.0, -0.0]).repeat(7)[: int((s_pos == 0).sum())]  # -0.0 ties +0.0
    counts, pos_u, s_pos = counts.to(device), pos_u.to(device), s_pos.to(device)
    same = pos_u.unsqueeze(0) == pos_u.unsqueeze(1)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        s = s_pos.to(dtype)
        ge, gt = rr._other_positive_counts(pos_u, s, counts)
        ge_bf = (same & (s.unsqueeze(0) >= s.unsqueeze(1))).sum(1) - 1
        gt_bf = (same & (s.unsqueeze(0) > s.unsqueeze(1))).sum(1)
        assert torch.equal(ge, ge_bf) and torch.equal(gt, gt_bf), dtype
        assert int((ge - gt).max()) >= 1  # ties were exercised
        # tied positives listed earlier (deterministic ties place tied relevant items in listed order)
        tb = rr._other_positive_counts(pos_u, s, counts, tied_before=True)[2]
        earlier = torch.arange(13, device=device).unsqueeze(0) < torch.arange(13, device=device).unsqueeze(1)
        assert torch.equal(tb, (same & (s.unsqueeze(0) == s.unsqueeze(1)) & earlier).sum(1)), dtype
        for ties in ("pessimistic", "optimistic"):  # with no other item tied: the tied positives' ranks are an ordering
            full = rr._full_ranks(ge + 1, gt, ge, gt, tb, ties)
            for u in range(5):
                mine = full[pos_u == u]
                assert sorted(mine.tolist()) == list(range(1, len(mine) + 1)), (dtype, ties)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    assert rr._other_positive_counts(empty, torch.zeros(0), torch.zeros(2, dtype=torch.int64))[0].numel() == 0
    assert len(rr._other_positive_counts(empty, torch.zeros(0), torch.zeros(2, dtype=torch.int64), tied_before=True)) == 3


def test_hypergeometric_sampled_law(device):
    """Without replacement: 1 + Hypergeometric(N, a, m) (mean m a / N, variance with the finite-population
    factor (N - m) / (N - 1)); drawing every item gives the exact count; too few items raise. The draws come
    back on the counts' device."""
    g = torch.Generator(device=device).manual_seed(0)
    size, n_items, m = 200_000, 1000, 50
    n = torch.full((size,), n_items, device=device)
    ge, gt = torch.full((size,), 300, device=device), torch.full((size,), 200, device=device)
    for ties, p in (("pessimistic", 0.3), ("optimistic", 0.2), ("average", 0.25)):
        r = rr._hypergeometric_sampled(ge, gt, n, m, ties, g)
        assert r.device.type == device.type
        var = m * 0.3 * 0.7 * (n_items - m) / (n_items - 1)
        assert abs(float(r.mean()) - (1 + m * p)) < 4 * math.sqrt(var / size) + 1e-3, ties
        assert int(r.min()) >= 1 and int(r.max()) <= m + 1
        if ties == "pessimistic":  # the finite-population variance (9.98), not the binomial one (10.5)
            assert float(r.var()) == pytest.approx(var, rel=0.02)
    few = torch.tensor([7, 0, 3, 10], device=device)
    ten = torch.full((4,), 10, device=device)
    assert torch.equal(rr._hypergeometric_sampled(few, few, ten, 10, "pessimistic", g), 1.0 + few.double())
    one = [torch.tensor([v], device=device) for v in (9, 4, 10)]
    tied = rr._hypergeometric_sampled(*one, 10, "average", g)
    assert 5 <= float(tied) <= 10  # above = 4 exactly, then placed among the 5 tied items
    with pytest.raises(ValueError, match="rsp_m"):
        rr._hypergeometric_sampled(few, few, ten, 11, "pessimistic", g)


def test_binomial_sampled_law(device):
    """1 + Binomial(m, ge/N) per positive (pessimistic), gt/N (optimistic), average between them; on the
    counts' device."""
    g = torch.Generator(device=device).manual_seed(0)
    n = torch.full((200_000,), 1000, device=device)
    ge, gt = torch.full((200_000,), 300, device=device), torch.full((200_000,), 200, device=device)
    for ties, p in (("pessimistic", 0.3), ("optimistic", 0.2), ("average", 0.25)):
        r = rr._binomial_sampled(ge, gt, n, 50, ties, g)
        assert abs(float(r.mean()) - (1 + 50 * p)) < 4 * math.sqrt(50 * 0.3 * 0.7 / 200_000) + 1e-3, ties
        assert int(r.min()) >= 1 and int(r.max()) <= 51
    ten = torch.full((5,), 10, device=device)
    assert bool((rr._binomial_sampled(torch.zeros(5, device=device), None, ten, 7, "pessimistic", g) == 1).all())
    assert bool((rr._binomial_sampled(ten, None, ten, 7, "pessimistic", g) == 8).all())


def test_sequential_model_in_uni100_mode(workdir, caplog):
    """A sequential model (GRU4Rec) in uni100: RecBole's RepeatableSampler excludes only each row's own target
    (its used_ids hold the last batch's rows, not users'), so n = item_num - 1, as in full mode; small batches
    used to crash indexing used_ids by user id. The model is evaluated as initialised: what is checked (the
    candidate counts, m, the sampled ranks' range, the estimate's range) does not depend on training, which costs
    minutes for a sequence model on ml-100k."""
    config, train, _, test = _prepare("GRU4Rec", {
        "epochs": 1, "hidden_size": 16, "embedding_size": 16, "train_neg_sample_args": None, "loss_type": "CE",
        "MAX_ITEM_LIST_LENGTH": 10,  # the sequences' window: what is checked does not depend on it (RecBole: 50)
        "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "group_by": "user", "mode": "uni100"},
        "metrics": ["Recall", "CorrectedRecall"], "valid_metric": "Recall@10", "eval_batch_size": 2048,
        # the users with <= 120 ratings (641 of 943, as tests/test_recbole_scorer.py's SASRec): RecBole's sequence
        # augmentation loops over every interaction in Python (2 s of the test's 3.5); the checks do not depend on
        # the size, and indexing used_ids by these user ids still crashes (IndexError) without the fix
        "user_inter_num_interval": "[0,120]"})
    import logging

    from reco_sampled_plugin.adapters import _recbole_settings

    _recbole_settings._LOGGED.clear()
    caplog.set_level(logging.INFO)
    init_seed(config["seed"], config["reproducibility"])
    model = get_model("GRU4Rec")(config, train._dataset)
    trainer = Trainer(config, model)
    result, struct = _evaluate(trainer, test)
    # one held-out item per user: the leave-one-out and list metrics agree, so no note says they differ
    assert not [r for r in caplog.records if "is the leave-one-out metric" in r.getMessage()]
    cols = rb.positive_table(struct)
    item_num = test._dataset.item_num
    assert cols["user"].shape[0] == test._dataset.user_num - 1  # one held-out item per user (id 0 is padding)
    assert bool((cols["n_candidates"] == item_num - 1).all()) and bool((cols["m"] == 100).all())
    assert bool((cols["sampled_rank"] >= 1).all()) and bool((cols["sampled_rank"] <= 101).all())
    assert 0.0 <= result["correctedrecall@10/auto"] <= 1.0


def test_full_mode_adaptive_sampling_equals_the_core(bpr):
    """rsp_adaptive_max in full mode: per-positive stage sizes drawn from the exact counts (first only at the cap),
    RankDist* estimates equal estimate(adaptive=) on the table's draws (user weights), the cost reported."""
    from reco_sampled_plugin import estimate

    metrics = ["RankDistRecall", "RankDistNDCG", "ExactRecall"]
    config, test = _full_mode(bpr, {"metrics": metrics, "valid_metric": "RankDistRecall@10/auto", "rsp_m": 20,
                                    "rsp_adaptive_max": 320, "rsp_n_grid": 0,
                                    "rsp_estimator_options": {"auto": {"n_bootstrap": 4}}})
    trainer = Trainer(config, bpr["model"])
    res, struct = _evaluate(trainer, test)
    cols = rb.positive_table(struct)
    r, m, n = cols["sampled_rank"], cols["m"], cols["n_candidates"]
    assert set(m.unique().tolist()) <= {20.0, 40.0, 80.0, 160.0, 320.0} and bool((m > 20).any())
    assert not bool(((r == 1) & (m < 320)).any())
    w = 1.0 / cols["n_positives"]
    for name, metric in (("rankdistrecall@10/auto", "recall@10"), ("rankdistndcg@10/auto", "ndcg@10")):
        core = estimate(
            metric,
            SampledRanks.from_arrays(r.long(), n.long(), m.long(), SamplingDesign(20, adaptive_max=320)),
            registry.Auto(n_bootstrap=4, seed=config["seed"]),
            weights=w,
        )
        base = name.split("/")[0]
        assert res[name] == pytest.approx(core.value, abs=1e-10), name
        assert res[f"{base}/adaptive_mean_samples"] == pytest.approx(float((m * w).sum() / w.sum()), abs=1e-9)
        assert res[f"{base}/adaptive_max_samples"] == int(m.max())
        assert res[f"{base}/adaptive_share_at_cap"] == pytest.approx(float(((m == 320) * w).sum() / w.sum()), abs=1e-9)
    # the adaptive estimate lands near the exact value (ml-100k, m = 20 -> 320)
    assert abs(res["rankdistrecall@10/auto"] - res["exactrecall@10"]) < 0.35 * res["exactrecall@10"]
    # a planner's result in rsp_design (here the forecast it recommends) is the same evaluation as the keys it sets
    from reco_sampled_plugin.planner import plan

    planned = plan(400, 50, "recall@10", 10.0, designs=[SamplingDesign(20, adaptive_max=320)], repeats=2,
                   target_rel_halfwidth=100.0, method="mes").recommended
    assert planned is not None and planned.spec == "20:320"
    config, _ = _full_mode(bpr, {"metrics": metrics, "valid_metric": "RankDistRecall@10/auto", "rsp_design": planned,
                                 "rsp_n_grid": 0, "rsp_estimator_options": {"auto": {"n_bootstrap": 4}}})
    assert _evaluate(Trainer(config, bpr["model"]), test)[0] == res  # the same data, scored alike


def test_full_mode_exact_at_cap_equals_the_core(bpr):
    """rsp_exact_at_cap in full mode: the positives still first at the cap get their exact rank among the irrelevant
    candidates (the ``exact_at_cap`` column: ``rank_irrelevant`` there, 0 elsewhere); RankDist* estimates equal the
    core's ``estimate`` on the table's SampledRanks with those exact ranks (user weights), the plain sampled metric
    reads r~; rsp_design's spec ``20:320:exact`` is the same evaluation as the keys."""
    from reco_sampled_plugin import estimate

    metrics = ["RankDistRecall", "RankDistNDCG"]
    keys = {"metrics": metrics, "valid_metric": "RankDistRecall@10/auto", "rsp_n_grid": 0,
            "rsp_estimator_options": {"auto": {"n_bootstrap": 4}}}
    config, test = _full_mode(bpr, {**keys, "rsp_m": 20, "rsp_adaptive_max": 320, "rsp_exact_at_cap": True})
    res, struct = _evaluate(Trainer(config, bpr["model"]), test)
    cols = rb.positive_table(struct)
    r, m, n, at_cap = cols["sampled_rank"], cols["m"], cols["n_candidates"], cols["exact_at_cap"]
    done = (r == 1) & (m == 320)
    assert 0 < int(done.sum()) < r.shape[0]
    assert torch.equal(at_cap, torch.where(done, cols["rank_irrelevant"], torch.zeros_like(at_cap)))
    assert bool((at_cap[done] > 1).any())  # completions below the top, not only R = 1
    w = 1.0 / cols["n_positives"]
    sampled = SampledRanks.from_arrays(r.long(), n.long(), m.long(), SamplingDesign(20, adaptive_max=320,
                                                                                    exact_at_cap=True),
                                       exact_ranks=at_cap.long())
    for name, metric in (("rankdistrecall@10", "recall@10"), ("rankdistndcg@10", "ndcg@10")):
        core = estimate(metric, sampled, registry.Auto(n_bootstrap=4, seed=config["seed"]), weights=w)
        assert res[f"{name}/auto"] == pytest.approx(core.value, abs=1e-10), name
        assert res[f"{name}/sampled"] == pytest.approx(estimate(metric, sampled, "none", weights=w).value, abs=1e-10)
    config, _ = _full_mode(bpr, {**keys, "rsp_design": "20:320:exact"})
    assert _evaluate(Trainer(config, bpr["model"]), test)[0] == res
    # the threshold rule (rsp_design "20:320:top3:exact" = rsp_adaptive_top: 3): within the top 3 at the cap completed
    config, _ = _full_mode(bpr, {**keys, "rsp_design": "20:320:top3:exact"})
    res3, struct3 = _evaluate(Trainer(config, bpr["model"]), test)
    cols3 = rb.positive_table(struct3)
    r3, m3, at_cap3 = cols3["sampled_rank"], cols3["m"], cols3["exact_at_cap"]
    done3 = (r3 <= 3) & (m3 == 320)
    assert not bool(((r3 <= 3) & (m3 < 320)).any()) and bool((done3 & (r3 > 1)).any())
    assert torch.equal(at_cap3, torch.where(done3, cols3["rank_irrelevant"], torch.zeros_like(at_cap3)))
    sampled3 = SampledRanks.from_arrays(r3.long(), cols3["n_candidates"].long(), m3.long(), SamplingDesign(
        20, adaptive_max=320, adaptive_top=3, exact_at_cap=True), exact_ranks=at_cap3.long())
    core3 = estimate("recall@10", sampled3, registry.Auto(n_bootstrap=4, seed=config["seed"]),
                     weights=1.0 / cols3["n_positives"])
    assert res3["rankdistrecall@10/auto"] == pytest.approx(core3.value, abs=1e-10)
    config, _ = _full_mode(bpr, {**keys, "rsp_m": 20, "rsp_adaptive_max": 320, "rsp_adaptive_top": 3,
                                 "rsp_exact_at_cap": True})
    assert _evaluate(Trainer(config, bpr["model"]), test)[0] == res3


def test_rankdist_bootstrap_only_for_a_standard_error():
    """RankDist* refit the rank distribution n_bootstrap times (8 unless rsp_estimator_options say otherwise) only
    when a standard error or an interval is reported (the estimate itself is the one fit either way)."""
    from reco_sampled_plugin.adapters import _recbole_metrics as rm

    def kwargs(**extra):
        config = Config(model="BPR", dataset="ml-100k", config_dict={
            **BASE, "metrics": ["RankDistRecall"], "valid_metric": "RankDistRecall@10/auto", "rsp_m": 100, **extra})
        return rm.metric_classes()["rankdistrecall"](config)._method()

    assert kwargs().n_bootstrap == 8  # the interval is reported by default
    assert kwargs().seed == BASE["seed"] and kwargs(rsp_seed=5).seed == 5  # the run's seed
    assert kwargs(rsp_interval=False).n_bootstrap == 0
    assert kwargs(rsp_interval=False, rsp_stderr=True).n_bootstrap == 8
    assert kwargs(rsp_interval=True, rsp_estimator_options={"auto": {"n_bootstrap": 4}}).n_bootstrap == 4


@pytest.mark.parametrize("mode, choice", [("uni100", "active"), ("pop100", "uniform")])
def test_exact_share_equals_the_core(bpr, sampled_splits, mode, choice):
    """rsp_exact_share in uniN / popN: the positives chosen by the keyed uniform of (rsp_seed, user id, item id)
    below their inclusion probability, their exact ranks those of full mode (the same model and split, ranked
    independently there), the reported estimates the core's difference estimator on those draws (user weights),
    and the cost the first stage plus each chosen row's whole candidate list. popN: the share drawn alike and carried
    by the popularity sample the estimators read (``pl_fit``'s estimates, 50-100 s each here, are the core's: their
    share is tests/test_design_based.py's)."""
    from reco_sampled_plugin import estimate
    from reco_sampled_plugin._hash import keyed_uniform
    from reco_sampled_plugin.adapters import _recbole_metrics as rm
    metrics = ["CorrectedNDCG", "CorrectedHit"]
    cheap = {} if mode == "uni100" else {"rsp_estimators": ["none"]}  # popN: no pl_fit (below)
    given = {**cheap, "eval_args": {"mode": mode}, "metrics": metrics, "rsp_seed": 5, "rsp_n_grid": 0,
             "valid_metric": "CorrectedNDCG@10/auto"}
    config, test = _sampled_mode(sampled_splits, {**given, "rsp_exact_share": 0.05, "rsp_exact_share_choice": choice})
    if mode == "pop100":  # the design in one key (rsp_design, as a planner's popularity design carries it): weights
        # the sampler's up to a factor run as the keys do; others are refused at the first batch, naming rsp_design
        from reco_sampled_plugin.adapters._recbole_popularity import sampler_weights

        w = sampler_weights(test._sampler, test._dataset.item_num)

        def planned(weights):
            design = SamplingDesign(100, popularity=weights, exact_share=ExactShare(0.05, choice=choice))
            return Config(model="BPR", dataset="ml-100k", config_dict={**BASE, **given, "rsp_design": design})

        with pytest.raises(ValueError, match=r"^rsp_design: popularity m=100, exact share 0.05 \(uniform\) draws by "
                                             "its own popularity weights"):
            _evaluate(Trainer(planned(w.sqrt()), bpr["model"]), test, reseed=True)
        config = planned(3.0 * w)
    trainer = Trainer(config, bpr["model"])
    res, struct = _evaluate(trainer, test, reseed=True)
    cols = rb.positive_table(struct)
    exact, pi = struct.get(rb.PLUGIN_KEY).__dict__["_rsp_share"]
    uid, item = cols["uid"].long(), cols["item"].long()
    chosen = exact > 0
    assert torch.equal(chosen, keyed_uniform(5, uid, item) < pi) and 10 < int(chosen.sum()) < 0.2 * len(pi)
    if choice == "uniform":
        assert bool((pi == 0.05).all())
    else:
        assert float(pi.mean()) == pytest.approx(0.05, rel=1e-6) and float(pi.max()) > 2 * float(pi.min())
    full = rb.positive_table(bpr["struct"])  # full mode: every positive's exact rank among its irrelevant items
    where = {(int(u), int(i)): k for k, (u, i) in enumerate(zip(full["uid"].long(), full["item"].long()))}
    at = torch.tensor([where[(int(u), int(i))] for u, i in zip(uid[chosen], item[chosen])])
    assert torch.equal(exact[chosen], full["rank_irrelevant"][at])
    assert torch.equal(cols["n_candidates"][chosen], full["n_candidates"][at])
    cost = trainer.eval_collector.rsp_cost  # a chosen row scores its candidates (a block's rows padded to its longest)
    share_pairs = cost.pairs - int((1 + cols["m"]).sum())
    n_irr = cols["n_candidates"][chosen] - 1
    assert int(n_irr.sum()) <= share_pairs <= int(chosen.sum()) * int(n_irr.max()) and cost.stages == 2
    w = 1.0 / cols["n_positives"]
    if mode == "uni100":
        design = SamplingDesign(100, exact_share=ExactShare(0.05, choice=choice, seed=5))
        sampled = SampledRanks.from_arrays(cols["sampled_rank"].long(), cols["n_candidates"].long(), 100, design,
                                           share_ranks=exact.long(), inclusion=pi)
    else:  # popN: the sample the estimators read carries the share as drawn (the design's and the arrays)
        table = struct.get(rb.PLUGIN_KEY)
        rm._table_cache(table).clear()
        popn = rm._popularity_ranks(table, ExactShare(0.05, seed=5))
        assert popn.design.exact_share == ExactShare(0.05, seed=5) and popn.design.popularity is not None
        assert torch.equal(popn.share_ranks, exact) and torch.equal(popn.inclusion, pi)
        return
    for key, metric in (("correctedndcg@10/auto", "ndcg@10"), ("correctedhit@10/auto", "hit@10")):
        core = estimate(metric, sampled, weights=w)
        assert core.details["method"] == "diff" and core.details["n_exact"] == int(chosen.sum())
        assert res[key] == pytest.approx(core.value, abs=1e-10), key
        lo, hi = core.interval(0.95)
        assert res[f"{key}_lo"] == pytest.approx(lo, abs=1e-10) and res[f"{key}_hi"] == pytest.approx(hi, abs=1e-10)


@pytest.mark.parametrize("extra, match", [
    ({"rsp_exact_share": 0.1}, "^rsp_exact_share: the (valid|test) mode is 'full'"),
    ({"eval_args": {"mode": "uni100"}, "rsp_exact_share": 1.5}, r"^rsp_exact_share: expected a number in \(0, 1\]"),
    ({"eval_args": {"mode": "uni100"}, "rsp_exact_share": 0.1, "rsp_exact_share_choice": "greedy"},
     "^rsp_exact_share_choice: expected one of"),
    ({"eval_args": {"mode": "uni100"}, "rsp_exact_share_choice": "active"}, "^rsp_exact_share_choice: set rsp_exact_share"),
])
def test_exact_share_keys_are_checked(extra, match):
    base = {**BASE, "metrics": ["CorrectedNDCG"], "valid_metric": "CorrectedNDCG@10/auto", "rsp_m": 100}
    if "eval_args" in extra:
        base.pop("rsp_m")
    with pytest.raises(ValueError, match=match):
        Config(model="BPR", dataset="ml-100k", config_dict={**base, **extra})


@pytest.mark.parametrize("extra, match", [
    ({"rsp_design": "100:800", "rsp_m": 100},
     r"^rsp_design: given together with rsp_m \(100\); rsp_design sets rsp_m, "),
    ({"eval_args": {"mode": "uni100"}, "rsp_design": "100+0.1:active", "rsp_exact_share": 0.1},
     "^rsp_design: given together with rsp_exact_share .* drop rsp_exact_share or rsp_design"),
    ({"eval_args": {"mode": "uni100"}, "rsp_design": "100", "rsp_exact_share_choice": "active"},
     "^rsp_design: given together with rsp_exact_share_choice"),
    ({"eval_args": {"mode": "pop100"}, "rsp_design": "100:800"},
     "^rsp_design: '100:800' draws uniformly, but RecBole's 'pop100' mode .* draws by popularity"),
    ({"eval_args": {"mode": "uni100"}, "rsp_design": "50"}, "^rsp_design: '50' \\(its rsp_m\\): 50 disagrees with"),
    ({"eval_args": {"mode": "uni100"}, "rsp_design": "100:norepl"}, "^rsp_design: '100:norepl' draws without "),
    ({"eval_args": {"mode": "uni100"}, "rsp_design": "100:800:exact"},
     r"^rsp_design: '100:800:exact' \(its rsp_exact_at_cap\): RecBole's 'uni100' mode .* scores the drawn items only"),
    ({"rsp_design": "100+0.1:uniform"},
     r"^rsp_design: '100\+0.1:uniform' \(its rsp_exact_share\): the (valid|test) mode is 'full'"),
    # RecBole evaluates a config string: 100+0.1 arrives as the sum 100.1 (the spec writes 100+0.1:uniform)
    ({"eval_args": {"mode": "uni100"}, "rsp_design": "100+0.1"}, "^rsp_design: expected a design spec .* got 100.1"),
    ({"eval_args": {"mode": "uni100"}, "rsp_design": "100:x"}, "^rsp_design: expected a design spec M"),
    ({"eval_args": {"mode": "uni100"}, "rsp_seed": 5,
      "rsp_design": SamplingDesign(100, exact_share=ExactShare(0.1, seed=3))},
     r"^rsp_design: .* \(its rsp_exact_share\): the share is keyed by seed 3, the run by 5"),
    ({"rsp_design": SamplingDesign(100, popularity=torch.ones(1683))},
     "^rsp_design: popularity m=100 draws by popularity, which RecBole runs in its popN mode only"),
])
def test_design_key_is_checked(extra, match):
    """rsp_design (a design, a planner result or its spec) sets rsp_m, rsp_adaptive_max, rsp_replacement and the
    share keys: given beside one of them it is refused naming both; what the mode cannot run is refused with the
    reason, before any data is loaded."""
    base = {**BASE, "metrics": ["CorrectedNDCG"], "valid_metric": "CorrectedNDCG@10/auto"}
    with pytest.raises(ValueError, match=match):
        Config(model="BPR", dataset="ml-100k", config_dict={**base, **extra})



def test_settings_follow_a_changed_design_of_the_same_length():
    """The validated settings are cached on the config while its keys stay the same; a design whose weights change
    only in the middle (their repr alike: torch elides it) is a change, and the settings follow it."""
    from reco_sampled_plugin.adapters._recbole_settings import _settings

    w1 = torch.ones(1683, dtype=torch.float64)
    w2 = w1.clone()
    w2[800] = 2.0
    assert repr(w1) == repr(w2)
    config = Config(model="BPR", dataset="ml-100k",
                    config_dict={**BASE, "eval_args": {"mode": "pop100"}, "metrics": ["CorrectedNDCG"],
                                 "valid_metric": "CorrectedNDCG@10/none", "rsp_estimators": ["none"],
                                 "rsp_design": SamplingDesign(100, popularity=w1)})
    first = _settings(config)
    assert _settings(config) is first  # unchanged keys: the cached settings
    config["rsp_design"] = SamplingDesign(100, popularity=w1.clone())
    assert _settings(config) is first  # equal content: still cached
    config["rsp_design"] = SamplingDesign(100, popularity=w2)
    second = _settings(config)
    assert second is not first and second.planned is not None and float(second.planned.popularity[800]) == 2.0
