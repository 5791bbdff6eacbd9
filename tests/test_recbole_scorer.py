"""Adaptive sampling in RecBole's uniN mode through the model's own predict.

Real RecBole runs on MovieLens 100k (shipped in RecBole's wheel, CPU, 1 epoch, small models): a context-aware model
(DeepFM, with user and item features) and a sequential one (SASRec). RecBole's uni20 draws are the first stage; the
positives still first draw the later stages' items, scored with ``model.predict``. The oracle: the core's adaptive
stages (``scorer_ranks.adaptive_stages``, the loop of ``sampled_ranks_from_scorer``) on the same first stage
(RecBole's sampler reseeded), the same generator, and a score matrix built independently from the dataset's own rows
(DeepFM: ``dataset.join`` of (user, item) ids; SASRec: the test rows' sequences, checked against its
``full_sort_predict``).
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from reco_sampled_plugin.adapters import recbole as rb  # noqa: E402  (registers the plugin)

pytestmark = pytest.mark.slow

import recbole  # noqa: E402
from recbole.config import Config  # noqa: E402
from recbole.data.interaction import Interaction  # noqa: E402
from recbole.trainer import Trainer  # noqa: E402
from recbole.utils import get_model, init_seed  # noqa: E402

from reco_sampled_plugin import estimate  # noqa: E402
from reco_sampled_plugin.design import SamplingDesign  # noqa: E402
from reco_sampled_plugin.ranking import prepare_index  # noqa: E402
from reco_sampled_plugin.scorer_ranks import ScorerCalls, adaptive_stages  # noqa: E402
from _recbole_helpers import evaluate_with_struct, prepare_data, replay_seeded_draws  # noqa: E402
from reco_sampled_plugin import SampledRanks
from reco_sampled_plugin import registry

DATA_PATH = os.path.join(os.path.dirname(recbole.__file__), "dataset_example")
N, CAP = 20, 160
METRICS = ["RankDistRecall", "RankDistNDCG"]
BASE = {
    "data_path": DATA_PATH, "device": "cpu", "use_gpu": False, "show_progress": False, "epochs": 1,
    "learning_rate": 0.01, "train_batch_size": 4096, "eval_batch_size": 1 << 16, "topk": [10],
    "metric_decimal_place": 12, "seed": 2020, "reproducibility": True, "checkpoint_dir": "saved",
    "metrics": METRICS, "valid_metric": "RankDistRecall@10/auto", "rsp_estimator_options": {"auto": {"n_bootstrap": 4}}, "rsp_n_grid": 0,
    "user_inter_num_interval": "[0,120]",  # the lighter 3/4 of the users: shorter runs
}
MODELS = {
    # RecBole's context-aware quick-start config (labeled mode, rating threshold) turned into a ranking evaluation
    "DeepFM": {"embedding_size": 8, "mlp_hidden_size": [16], "threshold": None,
               "train_neg_sample_args": {"distribution": "uniform", "sample_num": 1},
               "eval_args": {"split": {"RS": [0.8, 0.1, 0.1]}, "order": "RO", "group_by": "user", "mode": f"uni{N}"},
               "load_col": {"inter": ["user_id", "item_id"], "user": ["user_id", "age", "gender", "occupation"],
                            "item": ["item_id", "release_year", "class"]}},
    "SASRec": {"hidden_size": 16, "inner_size": 32, "n_layers": 1, "n_heads": 1, "MAX_ITEM_LIST_LENGTH": 10,
               "hidden_dropout_prob": 0.0, "attn_dropout_prob": 0.0,
               "train_neg_sample_args": None, "loss_type": "CE",
               "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "group_by": "user", "mode": f"uni{N}"}},
}


def _config(model: str, **extra) -> Config:
    return Config(model=model, dataset="ml-100k", config_dict={**BASE, **MODELS[model], **extra})


def _evaluate(trainer, data):
    """trainer.evaluate on RecBole's reseeded sampler (same first stage every time), with the positive table."""
    result, struct = evaluate_with_struct(trainer, data, reseed=True)
    return result, rb.positive_table(struct)


@pytest.fixture(scope="module", params=list(MODELS))
def run(request, workdir):
    """One model trained 1 epoch (users with <= 120 ratings, to keep the run short); its test split
    evaluated in uni20 (fixed) and uni20 -> 160 (adaptive), RecBole's sampler reseeded before each (as before every
    evaluation in this module: RecBole's batches of the first, drawn from the seed, are given to the later ones,
    ``replay_seeded_draws``)."""
    name = request.param
    config = _config(name, rsp_adaptive_max=CAP)
    train, _, test = prepare_data(config)  # init_seed, data_preparation (read and split once per process)
    replay_seeded_draws(test)
    init_seed(config["seed"], config["reproducibility"])
    model = get_model(name)(config, train._dataset)
    trainer = Trainer(config, model)
    trainer.fit(train, None, saved=False, show_progress=False)
    fixed, fixed_cols = _evaluate(Trainer(_config(name), model), test)
    log = _Records()
    logger = logging.getLogger("reco_sampled_plugin.adapters.recbole")
    logger.addHandler(log)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        result, cols = _evaluate(trainer, test)
    finally:
        logger.removeHandler(log)
        logger.setLevel(level)
    return {"name": name, "config": config, "model": model, "test": test, "trainer": trainer, "fixed": fixed,
            "fixed_cols": fixed_cols, "result": result, "cols": cols, "log": log.messages}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _oracle_scorer(run, uids: torch.Tensor):
    """scorer(rows, items) of the positives' users built from the dataset's own rows, not the evaluation's:
    DeepFM: (user id, item id) pairs joined with their features; SASRec: each user's one test row (its item
    sequence), whose full_sort_predict row the pairs' predict scores must equal."""
    model, dataset = run["model"], run["test"]._dataset
    uid_f, iid_f = dataset.uid_field, dataset.iid_field
    if run["name"] == "SASRec":
        feat = dataset.inter_feat
        where = {int(u): i for i, u in enumerate(feat[uid_f].tolist())}
        seqs = feat[torch.tensor([where[int(u)] for u in uids])]
        with torch.no_grad():
            full = model.full_sort_predict(seqs).reshape(len(seqs), -1).double()

    def scorer(rows: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        b, length = items.shape
        if run["name"] == "SASRec":
            inter = seqs[rows].repeat_interleave(length)
            inter.update(Interaction({iid_f: items.reshape(-1)}))
        else:
            inter = dataset.join(Interaction({uid_f: uids[rows].repeat_interleave(length), iid_f: items.reshape(-1)}))
        with torch.no_grad():
            got = model.predict(inter).reshape(b, length).double()
        if run["name"] == "SASRec":  # predict on the replicated sequence = RecBole's own full-sort scores
            torch.testing.assert_close(got, full[rows.unsqueeze(1).expand_as(items), items], atol=1e-4, rtol=1e-4)
        return got

    return scorer


def _core_stages(run, going: torch.Tensor, design: SamplingDesign):
    """The oracle of the later stages: the core's ``adaptive_stages`` of ``design`` over the score matrix for the
    fixed run's positives ``going`` (their first-stage ranks and RecBole's seed), exclusions from RecBole's sampler
    (item 0 and, for DeepFM, the user's used items but the positive itself; SASRec's RepeatableSampler excludes the
    target only). Returns (ranks, sizes, stages, the scorer's calls)."""
    f, test = run["fixed_cols"], run["test"]
    uids, pos_i = f["uid"][going].long(), f["item"][going].long()
    scorer = _oracle_scorer(run, uids)
    k = uids.numel()
    used = test._sampler.used_ids
    sequential = run["name"] == "SASRec"
    excl = [[0] + ([] if sequential else sorted(set(used[int(u)]) - {int(i)})) for u, i in zip(uids, pos_i)]
    exclude = torch.full((k, max(map(len, excl))), -1, dtype=torch.int64)
    for r, e in enumerate(excl):
        exclude[r, : len(e)] = torch.tensor(e)
    positives = pos_i.unsqueeze(1)
    n = test._dataset.item_num
    pos, exc = prepare_index(positives, exclude, k, n, torch.device("cpu"))
    rows = torch.arange(k)
    calls = ScorerCalls(scorer, 1 << 16, True, torch.device("cpu"))
    ranks, sizes, stages = adaptive_stages(calls, pos, exc, rows, scorer(rows, positives),
                                           f["sampled_rank"][going].long().unsqueeze(1), design, n, "pessimistic",
                                           torch.Generator().manual_seed(run["config"]["seed"]), from_mask=False)
    return ranks, sizes, stages, calls


def test_uni_adaptive_equals_the_core_on_the_same_draws(run):
    """The positives first among RecBole's 20 draws go on to 40, 80, 160 items scored by the model's predict:
    ranks and sizes equal the core's adaptive stages on the same first stage and generator over an independently
    built score matrix; every other positive keeps its first-stage rank and m = 20."""
    f, a = run["fixed_cols"], run["cols"]
    assert torch.equal(f["uid"], a["uid"]) and torch.equal(f["item"], a["item"])  # same first stage, same order
    first = f["sampled_rank"] == 1
    assert bool((f["m"] == N).all()) and 0 < int(first.sum()) < first.numel()
    assert torch.equal(a["sampled_rank"][~first], f["sampled_rank"][~first]) and bool((a["m"][~first] == N).all())
    assert set(a["m"][first].unique().tolist()) <= {2.0 * N, 4.0 * N, 8.0 * N} and CAP == 8 * N
    assert not bool(((a["sampled_rank"] == 1) & (a["m"] < CAP)).any())
    ranks, sizes, stages, calls = _core_stages(run, first, SamplingDesign(N, adaptive_max=CAP))
    assert torch.equal(a["sampled_rank"][first], ranks[:, 0].double())
    assert torch.equal(a["m"][first], sizes[:, 0].double())
    # what the evaluation scored: RecBole's 1 + N per positive, then only the new items of the later stages
    cost = run["trainer"].eval_collector.rsp_cost
    assert cost.pairs == a["m"].numel() * (1 + N) + int((a["m"] - N).sum()) == a["m"].numel() * (1 + N) + calls.pairs
    assert cost.stages == stages >= 2 and cost.calls >= stages - 1 and 0 < cost.share_of_full < 1


def test_uni_adaptive_top_rule_equals_the_core_on_the_same_draws(run):
    """rsp_adaptive_top: 3: the positives within the top 3 of RecBole's 20 draws go on (their beats added), and
    ranks and sizes equal the core's stages of SamplingDesign(20, adaptive_max=160, adaptive_top=3) on the same first
    stage over the oracle's score matrix; none stops within the top 3 below the cap; every other positive keeps its
    first-stage rank and m = 20."""
    f, test = run["fixed_cols"], run["test"]
    trainer = Trainer(_config(run["name"], rsp_adaptive_max=CAP, rsp_adaptive_top=3), run["model"])
    _, a = _evaluate(trainer, test)
    assert torch.equal(f["uid"], a["uid"]) and torch.equal(f["item"], a["item"])
    going = f["sampled_rank"] <= 3
    assert bool((going & (f["sampled_rank"] > 1)).any())
    assert torch.equal(a["sampled_rank"][~going], f["sampled_rank"][~going]) and bool((a["m"][~going] == N).all())
    assert not bool(((a["sampled_rank"] <= 3) & (a["m"] < CAP)).any())
    ranks, sizes, _, _ = _core_stages(run, going, SamplingDesign(N, adaptive_max=CAP, adaptive_top=3))
    assert torch.equal(a["sampled_rank"][going], ranks[:, 0].double())
    assert torch.equal(a["m"][going], sizes[:, 0].double())


def test_uni_adaptive_rankdist_estimates(run):
    """RankDist* estimates with the adaptive design on the table's ranks (user weights), their cost keys, and no
    refusal; the fixed run reports no adaptive keys."""
    res, cols, seed = run["result"], run["cols"], run["config"]["seed"]
    r, m, n = cols["sampled_rank"], cols["m"], cols["n_candidates"]
    w = 1.0 / cols["n_positives"]
    for name, metric in (("rankdistrecall@10/auto", "recall@10"), ("rankdistndcg@10/auto", "ndcg@10")):
        core = estimate(
            metric,
            SampledRanks.from_arrays(r.long(), n.long(), m.long(), SamplingDesign(N, adaptive_max=CAP)),
            registry.Auto(n_bootstrap=4, seed=seed),
            weights=w,
        )
        base = name.split("/")[0]
        assert res[name] == pytest.approx(core.value, abs=1e-10), name
        assert res[f"{base}/adaptive_mean_samples"] == pytest.approx(float((m * w).sum() / w.sum()), abs=1e-9)
        assert res[f"{base}/adaptive_max_samples"] == int(m.max())
        assert f"{base}/adaptive_mean_samples" not in run["fixed"]
        assert 0.0 <= res[name] <= 1.0


def test_uni_adaptive_logs_its_cost(run):
    """The evaluation's pairs, stages and predict calls are logged (RecBole's logger shows the plugin's)."""
    cost = run["trainer"].eval_collector.rsp_cost
    assert [m for m in run["log"] if f"adaptive uniN sampling scored {cost.pairs} (user, item) pairs" in m]


@pytest.mark.parametrize("extra, match", [
    ({"eval_args": {"mode": "pop100"}, "metrics": ["RankDistRecall"]}, "rsp_adaptive_max.*popularity|pop100"),
    ({"eval_args": {"mode": {"valid": "uni50", "test": "uni100"}}, "metrics": ["RankDistRecall"]},
     "rsp_adaptive_max.*different first stages"),
    ({"eval_args": {"mode": "uni100"}, "metrics": ["RankDistRecall"], "rsp_adaptive_max": 50}, "rsp_adaptive_max"),
    ({"eval_args": {"mode": "uni100"}, "metrics": ["CorrectedRecall"], "rsp_estimators": ["bv", "auto"]},
     "rsp_adaptive_max.*fixed m"),
])
def test_what_stays_refused(extra, match):
    """uniN adaptive sampling is accepted; what is still impossible is refused by key before any data is loaded."""
    rb.validate_config(_config("DeepFM", rsp_adaptive_max=800, eval_args={"mode": "uni100"}))
    with pytest.raises(ValueError, match=match):
        _config("DeepFM", **{"rsp_adaptive_max": 800, **extra})


def test_a_failing_predict_in_a_later_stage_is_named(run, monkeypatch):
    """NaN from predict on the plugin's pairs (recognised by their rows: copies of positives, label 1 throughout,
    while RecBole's batches hold their negatives' label 0) is a ValueError naming the scorer and the call; the
    next evaluation starts clean and gives the same table."""
    model, label = run["model"], run["config"]["LABEL_FIELD"]
    original = model.predict

    def predict(interaction):
        scores = original(interaction)
        return torch.full_like(scores, float("nan")) if bool((interaction[label] == 1).all()) else scores

    monkeypatch.setattr(model, "predict", predict)
    with pytest.raises(ValueError, match=rf"scorer '{run['name']}\.predict' returned \d+ non-finite score.*call 1"):
        _evaluate(run["trainer"], run["test"])
    monkeypatch.setattr(model, "predict", original)
    _, cols = _evaluate(run["trainer"], run["test"])
    assert torch.equal(cols["sampled_rank"], run["cols"]["sampled_rank"]) and torch.equal(cols["m"], run["cols"]["m"])


@pytest.mark.parametrize("ties", ["optimistic", "average"])
def test_uni_adaptive_tie_policies(run, ties):
    """rsp_ties carried into the later stages (average: the core's random order, an integer rank as RecBole's first
    stage gives): ranks integral, within each final m, first only at the cap; optimistic never above pessimistic on the shared first stage."""
    name = run["name"]
    trainer = Trainer(_config(name, rsp_adaptive_max=CAP, rsp_ties=ties), run["model"])
    _, cols = _evaluate(trainer, run["test"])
    r, m = cols["sampled_rank"], cols["m"]
    assert torch.equal(r, r.round()) and bool((r >= 1).all()) and bool((r <= m + 1).all())
    assert set(m.unique().tolist()) <= {float(N), 2.0 * N, 4.0 * N, 8.0 * N}
    assert not bool(((r == 1) & (m < CAP)).any())
    if ties == "optimistic":  # ties only lower a rank: compare on the first stage (RecBole's same draws)
        same = (m == N) & (run["cols"]["m"] == N)
        assert bool((r[same] <= run["cols"]["sampled_rank"][same]).all())
