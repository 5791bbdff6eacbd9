"""Popularity-sampled evaluation where users evaluate: RecBole's popN, the rank-file CLI, the planner,
torchmetrics / Lightning; against RecBole's own sampler and the core on the same draws."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
import _forkserver
from _popularity_helpers import canonical_rows
from reco_sampled_plugin._popularity import POP_BINS, PROFILE_FIELDS
from reco_sampled_plugin import registry
from reco_sampled_plugin.design import SamplingDesign


# ------------------------------------------------------------------------------------------------ core: bad input
def test_popularity_weights_and_bad_input():
    w = rsp.popularity_weights(torch.tensor([4.0, 0.0, 9.0]), 0.5)
    assert w.dtype == torch.float64 and w.tolist() == [2.0, 0.0, 3.0]  # count 0: never drawn, whatever alpha
    assert rsp.popularity_weights(np.array([4.0, 0.0, 1.0]), -1.0).tolist() == [0.25, 0.0, 1.0]
    for alpha in (math.nan, math.inf, "1", True):
        with pytest.raises(ValueError, match="^alpha: "):
            rsp.popularity_weights(torch.ones(3), alpha)
    with pytest.raises(ValueError, match="^alpha: "):
        rsp.popularity_weights(torch.tensor([1e300, 1.0], dtype=torch.float64), 5.0)  # overflows float64
    with pytest.raises(ValueError, match="^counts: "):
        rsp.popularity_weights(torch.tensor([1.0, -1.0]), 1.0)
    with pytest.raises(ValueError, match="^counts: "):
        rsp.popularity_weights(torch.tensor([1.0, math.nan]), 1.0)


def test_zero_weight_for_a_drawable_candidate_is_refused():
    """A candidate of weight 0 is never drawn: the count above the positive is not identified (``popularity``)."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 12, generator=g, dtype=torch.float64)
    pos = torch.tensor([[0], [1], [2], [3]])
    w = torch.ones(12, dtype=torch.float64)
    w[7] = 0.0
    sampled = rsp.sampled_ranks(scores, pos, SamplingDesign(5, popularity=w), generator=g)
    with pytest.raises(ValueError, match="^popularity: "):
        rsp.estimate("auc", sampled, method="hh")
    exclude = torch.full((4, 1), 7)  # excluded, it is no candidate: estimated
    ok = rsp.sampled_ranks(scores, pos, SamplingDesign(5, popularity=w), exclude=exclude, generator=g)
    assert 0.0 <= rsp.estimate("auc", ok, method="hh").value <= 1.0


# --------------------------------------------------------------------------------------------------- RecBole popN
def _recbole():
    from reco_sampled_plugin.adapters import recbole as rb  # noqa: F401  (registers the plugin)

    return rb


_RB_BASE = {
    "device": "cpu", "use_gpu": False, "show_progress": False, "learning_rate": 0.01, "train_batch_size": 4096,
    "eval_batch_size": 1 << 20, "topk": [10], "metric_decimal_place": 12, "seed": 2020, "reproducibility": True,
    "checkpoint_dir": "saved", "metrics": ["CorrectedAUC"], "valid_metric": "CorrectedAUC/hh",
    "rsp_estimators": ["hh", "auto"],
}
_RB_MODELS = {
    "BPR": {"embedding_size": 16, "epochs": 2},
    "SASRec": {"hidden_size": 16, "inner_size": 32, "n_layers": 1, "n_heads": 1, "MAX_ITEM_LIST_LENGTH": 10,
               "hidden_dropout_prob": 0.0, "attn_dropout_prob": 0.0, "train_neg_sample_args": None,
               "loss_type": "CE", "epochs": 1,
               "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "group_by": "user"}},
}


def _rb_config(model: str, mode: str, **extra):
    import recbole
    from recbole.config import Config

    cfg = {**_RB_BASE, "data_path": os.path.join(os.path.dirname(recbole.__file__), "dataset_example"),
           **_RB_MODELS[model], **extra}
    cfg["eval_args"] = {**cfg.get("eval_args", {}), "mode": mode}
    if mode == "full":
        cfg["rsp_m"] = 100  # full mode: CorrectedAUC's _exact is the exact AUC of every positive
    return Config(model=model, dataset="ml-100k", config_dict=cfg)


def _rb_data(config):
    """``init_seed`` and RecBole's ``data_preparation`` on ml-100k, read and split once per process for all modes
    (``prepare_data``)."""
    from _recbole_helpers import prepare_data

    return prepare_data(config)


def test_recbole_alpha_and_refusals(workdir):
    """alpha as RecBole reads it (the training sampler's, else 1.0; NaN refused naming it), and popN accepted only
    where the registry has an estimator for the design and the metric, the refusal naming what is available."""
    _recbole()
    from reco_sampled_plugin.adapters._recbole_popularity import recbole_alpha

    assert recbole_alpha(_rb_config("BPR", "pop100")) == 1.0
    half = {"distribution": "uniform", "sample_num": 1, "alpha": 0.5, "dynamic": False, "candidate_num": 0}
    assert recbole_alpha(_rb_config("BPR", "pop100", train_neg_sample_args=half)) == 0.5
    assert recbole_alpha(_rb_config("SASRec", "pop100")) == 1.0  # no training sampler: RecBole's default
    with pytest.raises(ValueError, match=r"^train_neg_sample_args\.alpha: "):
        _rb_config("BPR", "pop100", train_neg_sample_args={**half, "alpha": math.nan})
    # what the registry has for (popularity, metric): hh corrects AUC; none reports the sampled metric
    pop = SamplingDesign(100, popularity=torch.ones(5))
    assert registry.names(design=pop, metric="auc") == ("auto", "none", "hh", "pl_fit")
    with pytest.raises(ValueError, match=r"^eval_args\.mode: 'pop100' draws items by popularity, and 'correctedauc' "
                                         r"\(rsp_estimators: bv\) does not estimate auc there .*list auto or hh in "
                                         r"rsp_estimators instead"):
        _rb_config("BPR", "pop100", rsp_estimators=["bv", "auto"])
    # auto, a Corrected* estimator too, corrects ndcg there (pl_fit): the refusal names it
    with pytest.raises(ValueError, match=r"^eval_args\.mode: .*'correctedndcg' \(rsp_estimators: hh\) .*list auto in "
                                         r"rsp_estimators instead"):
        _rb_config("BPR", "pop100", metrics=["CorrectedNDCG"], valid_metric="CorrectedNDCG@10/hh")
    # the default RankDist* estimator, auto, runs hh (AUC) and pl_fit (top-K) there; a fitting method is refused
    _rb_config("BPR", "pop100", metrics=["RankDistAUC", "RankDistNDCG"], valid_metric="RankDistNDCG@10/auto")
    with pytest.raises(ValueError, match=r"^eval_args\.mode: .*'rankdistauc' \(rsp_estimators: mes\) .*list "
                                         r"auto in rsp_estimators instead"):
        _rb_config("BPR", "pop100", metrics=["RankDistAUC"], rsp_estimators=["hh", "mes"])
    with pytest.raises(ValueError, match=r"^rsp_estimators: 'hh' estimates auc only, not ndcg"):  # uniform too
        _rb_config("BPR", "uni100", metrics=["CorrectedNDCG"], valid_metric="CorrectedNDCG@10/hh")


def _rb_frequencies(sampler, user: int, k: int, w: torch.Tensor):
    """k draws of RecBole's own sampler for one user (its alias table, its redraw rule), against k q~."""
    np.random.seed(0)
    drawn = sampler.sample_by_user_ids(np.full(k, user), None, 1).numpy()
    counts = np.bincount(drawn, minlength=w.shape[0]).astype(np.float64)
    used = np.array(sorted(sampler.used_ids[user]), dtype=np.int64)
    q = w.numpy().copy()
    q[used] = 0.0
    q /= q.sum()
    return counts, q, used


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_recbole_sampler_frequencies_match_the_weights(workdir, alpha):
    """RecBole's popN draws for a heavy user (many used items, so the redraw rule matters) follow q~ = w / W_u over
    the items it has not used, w = count^alpha over all phases (``sampler_weights``): every item within 5 standard
    errors, a chi-square test over the items, and no used item (nor the padding item 0) ever drawn."""
    _recbole()
    from scipy import stats

    from reco_sampled_plugin.adapters._recbole_popularity import sampler_weights

    half = {"distribution": "uniform", "sample_num": 1, "alpha": alpha, "dynamic": False, "candidate_num": 0}
    config = _rb_config("BPR", "pop100", train_neg_sample_args=half)
    _, _, test = _rb_data(config)
    sampler = test._sampler
    assert sampler.distribution == "popularity" and sampler.alpha == alpha
    w = sampler_weights(sampler, test._dataset.item_num)
    user = int(np.argmax([len(u) for u in sampler.used_ids]))
    k = 200_000
    counts, q, used = _rb_frequencies(sampler, user, k, w)
    assert len(used) > 300 and counts[used].sum() == 0 and counts[0] == 0
    expected = k * q
    free = q > 0
    z = (counts[free] - expected[free]) / np.sqrt(expected[free] * (1 - q[free]))
    assert np.abs(z).max() < 5.5, np.abs(z).max()
    big = expected >= 5
    small = free & ~big  # pooled into one cell (when there are any)
    pool = [counts[small].sum()] if small.any() else []
    f_obs = np.append(counts[big], pool)
    assert stats.chisquare(f_obs, np.append(expected[big], [expected[small].sum()] if small.any() else [])).pvalue > 1e-3
    # the uniform weights would fail: the law is popularity's, not uniform's
    u = k * free / free.sum()
    assert stats.chisquare(f_obs, np.append(u[big], [u[small].sum()] if small.any() else [])).pvalue < 1e-12


@pytest.fixture(scope="module")
def rb_runs(workdir):  # about a minute on 2 cores: the tests that use it are marked slow
    """BPR and SASRec trained briefly on ml-100k; the test split in full mode (exact AUC) and pop100 (hh), with what
    the pop100 evaluation drew (captured at the adapter's flush). The two modes' loaders come from one split per
    model (``prepare_data``: RecBole's data_preparation for each mode, the split built once; the pop100 evaluation
    draws from the generators as a fresh preparation leaves them). Trained and evaluated with torch's anomaly
    detection off: importing RecBole's sequential models turns it on for the whole process (recbole's SINE module
    calls ``torch.autograd.set_detect_anomaly(True)``), which only adds NaN checks to every backward pass and a
    stack trace to every autograd node and changes no value (the runs' results and drawn batches checked bit for bit
    against runs with it on), at a cost: this module's CPU time 28-31 s with it, 21-23 s without. The process's
    setting is restored afterwards."""
    _recbole()
    import recbole.model.sequential_recommender  # noqa: F401  (the import that turns anomaly detection on)
    from recbole.trainer import Trainer
    from recbole.utils import get_model, init_seed

    from _recbole_helpers import evaluate_with_struct
    from reco_sampled_plugin.adapters import _recbole_ranks as rr

    out = {}
    with torch.autograd.set_detect_anomaly(False):  # restored on leaving
        for name in _RB_MODELS:
            config = _rb_config(name, "full")
            train, _, test = _rb_data(config)
            init_seed(config["seed"], config["reproducibility"])
            model = get_model(name)(config, train._dataset)
            trainer = Trainer(config, model)
            trainer.fit(train, None, saved=False, show_progress=False)
            full, _ = evaluate_with_struct(trainer, test)
            # RankDist*: auto runs hh (AUC) and pl_fit (NDCG; SASRec only: its 943 positives fit in seconds, BPR's 10k
            # positives in a minute)
            pconfig = _rb_config(name, "pop100", rsp_stderr=True, metrics=["CorrectedAUC", "RankDistAUC"] + (
                ["RankDistNDCG"] if name == "SASRec" else []))
            _, _, ptest = _rb_data(pconfig)
            seen = []
            original = rr._process_sampled
            rr._process_sampled = lambda c, *a: (seen.append(tuple(x.clone() for x in a)), original(c, *a))
            try:
                pop, struct = evaluate_with_struct(Trainer(pconfig, model), ptest)
            finally:
                rr._process_sampled = original
            out[name] = {"full": full, "pop": pop, "struct": struct, "seen": seen, "sampler": ptest._sampler,
                         "n_items": ptest._dataset.item_num}
    return out


def _core_from_seen(run):
    """The core's SampledRanks on RecBole's own drawn negatives: the positives padded per user row, the user's other
    used items (and the padding item 0) excluded, the sampler's weights as the design."""
    from reco_sampled_plugin.adapters import _recbole_ranks as rr
    from reco_sampled_plugin.adapters._recbole_popularity import sampler_weights

    (scores, pos_u, pos_i, items, row_uids), = run["seen"]
    sampler, n = run["sampler"], run["n_items"]
    counts = rr._counts_per_row(pos_u, scores.shape[0])
    neg, pos_rows, n_draws, misplaced = rr._neg_layout(items, pos_u, pos_i, counts)
    assert n_draws == 100 and not bool(misplaced)
    uids = row_uids[pos_rows]
    b, p = scores.shape[0], int(counts.max())
    slot = torch.arange(pos_u.shape[0]) - (torch.cumsum(counts, 0) - counts)[pos_u]
    positives = torch.full((b, p), -1, dtype=torch.int64)
    positives[pos_u, slot] = pos_i
    negatives = torch.full((b, p, 100), -1, dtype=torch.int64)
    negatives[pos_u, slot] = neg
    negatives = torch.where((positives < 0).unsqueeze(2), negatives[:, :1].expand_as(negatives), negatives)  # padding
    from recbole.sampler import RepeatableSampler

    row_uid = torch.zeros(b, dtype=torch.int64)
    row_uid[pos_u] = uids
    if isinstance(sampler, RepeatableSampler):  # each row excludes its own target only (and the padding)
        used = [set() for _ in range(b)]
    else:
        used = [set(sampler.used_ids[int(u)]) for u in row_uid]
    for r in range(b):
        used[r] -= set(positives[r][positives[r] >= 0].tolist())
        used[r].add(0)
    e = max(len(u) for u in used)
    exclude = torch.full((b, e), -1, dtype=torch.int64)
    for r, u in enumerate(used):
        exclude[r, : len(u)] = torch.tensor(sorted(u))
    finite = torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))  # undrawn items: never read
    w = sampler_weights(sampler, n)
    sampled = rsp.sampled_ranks(finite.to(torch.float64), positives, SamplingDesign(100, popularity=w),
                                exclude=exclude, negatives=negatives)
    return sampled, positives, pos_u, slot


@pytest.fixture(scope="module")
def rb_core(rb_runs):
    """``_core_from_seen`` of each model's run, built once for the module (on first use): the popN and pop100 tests
    read the same core draws."""
    built: dict = {}

    def core(model):
        if model not in built:
            built[model] = _core_from_seen(rb_runs[model])
        return built[model]

    return core


@pytest.mark.slow
@pytest.mark.parametrize("model", list(_RB_MODELS))
def test_recbole_popn_equals_the_core_on_the_same_draws(rb_runs, rb_core, model):
    """The adapter's per-positive statistics (from RecBole's drawn negatives and the model's scores) equal the core's
    ``sampled_ranks(..., negatives=RecBole's draws)`` under the sampler's weights, and so does the estimate."""
    rb = _recbole()
    run = rb_runs[model]
    sampled, positives, pos_u, slot = rb_core(model)
    cols = rb.positive_table(run["struct"])
    stats = sampled.popularity_stats
    assert bool((cols["popularity"] == 1).all())
    np.testing.assert_array_equal(cols["sampled_rank"].numpy(), sampled.ranks[pos_u, slot].numpy())
    np.testing.assert_array_equal(cols["hh_beating"].numpy(), stats.beating[pos_u, slot].numpy())
    np.testing.assert_allclose(cols["hh_s1"].numpy(), stats.inv_q[pos_u, slot].numpy(), rtol=1e-12)
    np.testing.assert_allclose(cols["hh_s2"].numpy(), stats.inv_q2[pos_u, slot].numpy(), rtol=1e-12)
    assert bool((cols["hh_unreachable"] == 0).all()) and bool((stats.unreachable[positives >= 0] == 0).all())
    np.testing.assert_array_equal(cols["n_candidates"].numpy(), sampled.candidates()[pos_u, slot].numpy())
    weights = torch.zeros(positives.shape, dtype=torch.float64)
    weights[pos_u, slot] = 1.0 / cols["n_positives"]  # RecBole's user weighting, as the adapter
    core = rsp.estimate("auc", sampled, method="hh", weights=weights)
    assert run["pop"]["correctedauc/hh"] == pytest.approx(core.value, abs=1e-11)
    # pl_fit's class counts: from RecBole's used items (the adapter) = from the core's exclusions
    for f in PROFILE_FIELDS:
        got = torch.stack([cols[f"{f}_{c}"] for c in range(POP_BINS)], 1)
        np.testing.assert_array_equal(got.numpy(), getattr(stats, f)[pos_u, slot].double().numpy(), err_msg=f)
    assert float(cols["profile_0"].sum() + sum(cols[f"profile_{c}"].sum() for c in range(1, POP_BINS))) > 0
    # the default RankDist* estimator, auto: hh for AUC, pl_fit for NDCG, as the core's on the same draws
    assert run["pop"]["rankdistauc/auto"] == pytest.approx(core.value, abs=1e-11)
    assert ("rankdistndcg@10/auto" in run["pop"]) == (model == "SASRec")  # the fixture runs RankDistNDCG for SASRec only
    if model == "SASRec":
        ndcg = rsp.estimate("ndcg@10", sampled, method="pl_fit", weights=weights)
        assert run["pop"]["rankdistndcg@10/auto"] == pytest.approx(ndcg.value, abs=1e-11)
        # 943 positives: stratified by their own popularity, so the adapter's positive weights (RecBole's item
        # column under the sampler's weights) are the core's too
        assert len(ndcg.details["strata"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("model", list(_RB_MODELS))
def test_recbole_pop100_hh_auc_matches_full_mode(rb_runs, rb_core, model):
    """pop100 next to full mode on the same trained model: the hh AUC agrees with the exact AUC of full mode within
    4 of its sampling standard errors (conditional on these positives), while RecBole's plain pop100 AUC is far off.
    Figures: docs/recbole.md."""
    run = rb_runs[model]
    sampled, _, pos_u, slot = rb_core(model)
    cols = _recbole().positive_table(run["struct"])
    weights = torch.zeros(sampled.ranks.shape, dtype=torch.float64)
    weights[pos_u, slot] = 1.0 / cols["n_positives"]
    est = rsp.estimate("auc", sampled, method="hh", weights=weights)
    exact, hh, plain = run["full"]["correctedauc/exact"], run["pop"]["correctedauc/hh"], run["pop"]["correctedauc/sampled"]
    se = est.details["stderr_sampling"]
    print(f"\n{model}: exact {exact:.4f}  hh {hh:.4f} (sampling se {se:.4f}, se {est.stderr:.4f}, Kish share "
          f"{est.details['ess_share']:.2f})  plain pop100 {plain:.4f}", file=sys.stderr)
    assert abs(hh - exact) < 4 * se, (hh, exact, se)
    assert abs(plain - exact) > 20 * se
    assert run["pop"]["correctedauc/hh_lo"] < exact < run["pop"]["correctedauc/hh_hi"]


# ------------------------------------------------------------------------------------------------- CLI rank files
def _pop_draw(seed=0, users=300, n=400, m=50, alpha=1.0):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 300, (n,), generator=g).double()
    scores = torch.randn(users, n, generator=g, dtype=torch.float64) + 0.002 * counts  # popular items score higher
    pos = torch.randint(0, n, (users, 1), generator=g)
    scores[torch.arange(users), pos[:, 0]] += 1.5  # the held-out items lifted above the noise
    design = SamplingDesign(m, popularity=rsp.popularity_weights(counts, alpha))
    return rsp.sampled_ranks(scores, pos, design, generator=g), scores, pos


def test_cli_rank_file_with_statistics_equals_the_core(tmp_path, capsys):
    """A popularity draw written as a rank file (hh_s1, hh_s2 columns, 17 digits) reads back to the same statistics
    and the same hh AUC as the core's estimate on the draw; ``reco-sampled estimate`` prints it (and ``none`` for the
    top-K metrics, the only method the registry has for them there)."""
    from reco_sampled_plugin.cli import main
    from reco_sampled_plugin.rank_files import read_rank_file, write_rank_file

    sampled = _pop_draw()[0]
    path = write_rank_file(tmp_path / "pop.csv", sampled)
    text = path.read_text()
    assert "sampled_rank,n_candidates,n_samples,hh_s1,hh_s2" in text and "--sampling popularity" in text
    data = read_rank_file(path)
    assert data.popularity
    np.testing.assert_array_equal(data.hh_s1, sampled.popularity_stats.inv_q.numpy().ravel())
    np.testing.assert_array_equal(data.hh_s2, sampled.popularity_stats.inv_q2.numpy().ravel())
    core = rsp.estimate("auc", sampled, method="hh")
    back = rsp.estimate("auc", data.sampled(), method="hh")
    assert back.value == pytest.approx(core.value, abs=1e-13) and back.stderr == pytest.approx(core.stderr, rel=1e-10)
    assert back.details["stderr_sampling"] == pytest.approx(core.details["stderr_sampling"], rel=1e-10)
    assert main(["estimate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "popularity draws, m = 50" in out and f"{core.value:.5f}" in out
    hh_rows = [line for line in out.splitlines() if " hh " in f" {line} "]
    assert len(hh_rows) == 1 and "auc" in hh_rows[0]  # hh for AUC only; top-K rows come from none
    assert main(["estimate", str(path), "--metric", "ndcg@10", "--method", "hh"]) == 2
    assert "metric: method 'hh' estimates auc only" in capsys.readouterr().err


def test_cli_rank_file_bad_input(tmp_path, capsys):
    from reco_sampled_plugin.cli import main
    from reco_sampled_plugin.rank_files import read_rank_file

    def file(text):
        p = tmp_path / f"f{abs(hash(text))}.csv"
        p.write_text(text)
        return p

    # a beating draw weighs 1/q~ >= 1 (probabilities sum to one): S1 below the count of beating draws is refused
    with pytest.raises(ValueError, match=r":1: hh_s1 1.5 is below the 3 beating draws.*sum to one"):
        read_rank_file(file("4,100,10,1.5,9\n"))
    with pytest.raises(ValueError, match=r":1: hh_s2 .* is below"):
        read_rank_file(file("4,100,10,30,100\n"))  # 3 S2 = 300 < S1^2 = 900
    with pytest.raises(ValueError, match=r":1: hh_s1 and hh_s2 must be 0"):
        read_rank_file(file("1,100,10,2,4\n"))
    with pytest.raises(ValueError, match=r":1: hh_s1 'nan' must be a finite number >= 0"):
        read_rank_file(file("2,100,10,nan,4\n"))
    with pytest.raises(ValueError, match=r":2: expected .* on every line of a popularity-sampled file"):
        read_rank_file(file("2,100,10,2,4\n3,100,10\n"))
    with pytest.raises(ValueError, match=r":1: expected .*got 4 fields"):
        read_rank_file(file("2,100,10,2\n"))
    with pytest.raises(ValueError, match=r"^n_samples: a popularity-sampled rank file needs one m"):
        read_rank_file(file("2,100,10,2,4\n2,100,20,2,4\n")).sampled()
    plain = file("2,100,10\n3,100,10\n")
    assert main(["estimate", str(plain), "--sampling", "popularity"]) == 2
    assert "--sampling: popularity-sampled ranks need each positive's Hansen-Hurwitz statistics" in capsys.readouterr().err
    pop = file("2,100,10,2,4\n3,100,10,5,13\n")
    assert main(["estimate", str(pop), "--sampling", "hypergeometric"]) == 2
    assert "contradicts the file's hh_s1 / hh_s2 columns" in capsys.readouterr().err
    assert main(["estimate", str(pop), "--metric", "auc", "--method", "hh"]) == 0  # well-formed: estimated


# ---------------------------------------------------------------------------------------------------- the planner
def test_planner_takes_popularity_designs_through_the_design_object():
    """A popularity design needs a popularity pilot (whose fitted pl_fit model the planner simulates); with one it is
    forecast like any design (tests/test_planner_popularity.py checks the world and the forecasts)."""
    from reco_sampled_plugin.planner import plan

    pop = SamplingDesign(50, popularity=torch.ones(400))
    with pytest.raises(ValueError, match=r"^designs: popularity m=50 draws by popularity; a popularity design's "
                                         r"accuracy depends on how the items above each positive vary"):
        plan(400, 300, "auc", 0.05, designs=[pop], method="hh", repeats=2)
    sampled = _pop_draw()[0]
    weights = sampled.design.popularity
    p = plan(int(weights.numel()), int((sampled.ranks > 0).sum()), "auc", 0.5, pilot=sampled,
             designs=[sampled.design, SamplingDesign(10)], repeats=2)
    assert p.forecasts[0].method == "hh" and p.forecasts[0].design.law == "popularity"
    assert p.forecasts[1].method == "none" and p.forecasts[1].design.law == "binomial"  # auto's uniform pick for AUC


# ------------------------------------------------------------------------------------------- torchmetrics, Lightning
def _tm_batches(seed=1, users=240, n=300):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 200, (n,), generator=g).double()
    scores = torch.randn(users, n, generator=g, dtype=torch.float64) + 0.003 * counts
    perm = torch.stack([torch.randperm(n, generator=g)[:5] for _ in range(users)])
    pos, exclude = perm[:, :2].clone(), perm[:, 2:].clone()  # distinct items: 2 relevant, 3 excluded per user
    pos[::3, 1] = -1  # one or two relevant items per user
    scores[torch.arange(users).unsqueeze(1).expand_as(pos)[pos >= 0], pos[pos >= 0]] += 1.0
    return scores, pos, exclude, rsp.popularity_weights(counts, 1.0)


def test_torchmetrics_popularity_state_equals_the_core():
    """SampledRankingMetrics with a popularity design: its keyed draws follow the law (each draw's item is the one the
    core's inverse cdf gives for the same uniform number), its state keeps each relevant item's statistics exactly as
    the core computes them on the same negatives, and its hh AUC equals the core's estimate on them; batches, forward,
    merge_state and reset keep or drop them together."""
    from reco_sampled_plugin import _hash
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    scores, pos, exclude, w = _tm_batches()
    design = SamplingDesign(40, popularity=w)
    metric = SampledRankingMetrics(["auc", "ndcg@10"], design, estimators=["none", "hh"], seed=7)
    ids = torch.arange(scores.shape[0])
    metric.update(scores[:100], pos[:100], exclude[:100], ids=ids[:100])
    metric.update(scores[100:], pos[100:], exclude[100:], ids=ids[100:])
    # the same negatives through the core: the keyed draw, then sampled_ranks(..., negatives=...) under the design
    b, p = pos.shape
    u = _hash.keyed_uniform(7, 0, ids.view(b, 1, 1), pos.view(b, p, 1), torch.arange(40).view(1, 1, 40))
    # the inverse cdf by brute force: the first item whose cumulative allowed weight exceeds u W
    allowed = torch.ones((b, scores.shape[1]), dtype=torch.float64)
    for r in range(b):  # the row's relevant and excluded items are never drawn
        allowed[r, pos[r][pos[r] >= 0]] = 0.0
        allowed[r, exclude[r]] = 0.0
    cdf = torch.cumsum(allowed * w, 1)
    neg = (cdf.unsqueeze(1).unsqueeze(1) <= (u * cdf[:, -1:].view(b, 1, 1)).unsqueeze(-1)).sum(-1)
    neg = torch.where((pos >= 0).unsqueeze(2), neg, neg[:, :1])
    core = rsp.sampled_ranks(scores, pos, design, exclude=exclude, negatives=neg)
    got = metric.popularity_ranks()
    valid = pos >= 0
    # the state's positives (read in a canonical order) are the core's: ranks, n, S1, S2 (to rounding), the counts
    # and the positive's own weight (pl_fit's strata: w at the positive's item)
    np.testing.assert_allclose(canonical_rows(got), canonical_rows(core), rtol=1e-13, atol=0)
    np.testing.assert_array_equal(core.popularity_stats.positive_weight[valid].numpy(), w[pos[valid]].numpy())
    est = metric.estimates()
    assert set(est) == {"auc/sampled", "auc/hh", "ndcg@10/sampled"}  # hh: AUC only (the registry's metrics)
    assert est["auc/hh"].value == pytest.approx(rsp.estimate("auc", core, method="hh").value, abs=1e-13)
    assert est["auc/sampled"].value == pytest.approx(rsp.estimate("auc", core, method="none").value, abs=1e-13)
    # merge_state of two halves = one state; a different weight vector is refused; reset drops the statistics
    a = SampledRankingMetrics(["auc"], design, estimators=["hh"], seed=7)
    c = SampledRankingMetrics(["auc"], design, estimators=["hh"], seed=7)
    a.update(scores[:100], pos[:100], exclude[:100], ids=ids[:100])
    c.update(scores[100:], pos[100:], exclude[100:], ids=ids[100:])
    a.merge_state(c)
    assert a.compute()["auc/hh"].item() == pytest.approx(est["auc/hh"].value, abs=1e-13)
    other = SampledRankingMetrics(["auc"], SamplingDesign(40, popularity=w + 1), estimators=["hh"], seed=7)
    other.update(scores[:10], pos[:10], exclude[:10], ids=ids[:10])
    with pytest.raises(ValueError, match="^popularity: "):
        a.merge_state(other)
    a.reset()
    assert a.pop.shape == (0, 6 + 3 * POP_BINS + 1) and a.hist.shape[0] == 0  # the hh columns, then pl_fit's
    # a batch refused whole leaves the state as it was (nothing half-written)
    before = metric.pop.clone()
    with pytest.raises(ValueError, match="^scores: 299 items"):
        metric.update(scores[:5, :-1], pos[:5].clamp(max=298), None)
    assert torch.equal(metric.pop, before)
    fresh = SampledRankingMetrics(["auc"], design, estimators=["hh"], seed=7)
    with pytest.raises(ValueError, match="^n_samples: the design's popularity weights count 300 items, the scores 299"):
        fresh.update(scores[:5, :-1], pos[:5].clamp(max=298), None)
    assert fresh.pop.shape == (0, 6 + 3 * POP_BINS + 1) and fresh.hist.shape[0] == 0


@pytest.mark.parametrize("replacement", [True, False], ids=["with_replacement", "without_replacement"])
def test_torchmetrics_popularity_from_factors_and_a_scorer_equals_the_score_matrix(replacement):
    """Factor batches (update_factors) and scorer batches (update_from_scorer) draw the same keyed popularity
    negatives as the score matrix of the same factors (with or without replacement): the same histogram, the same
    per-positive statistics (with replacement; none without) and the same estimates bit for bit."""
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    scores, pos, exclude, w = _tm_batches(users=60)
    g = torch.Generator().manual_seed(2)
    u, v = torch.randn(60, 5, generator=g, dtype=torch.float64), torch.randn(300, 5, generator=g, dtype=torch.float64)
    design = SamplingDesign(20, replacement=replacement, popularity=w)
    methods = ["none", "hh"] if replacement else ["none"]
    made = [SampledRankingMetrics(["auc", "ndcg@10"], design, estimators=methods, seed=3) for _ in range(3)]
    ids = torch.arange(60)
    made[0].update(u @ v.T, pos, exclude, ids=ids)
    made[1].update_factors(u, v, pos, exclude, ids=ids)
    made[2].update_from_scorer(lambda users, items: (u[users].unsqueeze(1) * v[items]).sum(-1), pos, 300,
                               exclude=exclude, ids=ids)
    ref = made[0].estimates()
    for other in made[1:]:
        assert torch.equal(other.hist, made[0].hist) and other.estimates().keys() == ref.keys()
        assert all(other.estimates()[k].value == ref[k].value for k in ref)
        if replacement:
            assert torch.equal(other.pop, made[0].pop)
    assert not hasattr(made[0], "pop") if not replacement else made[0].pop.shape[0] == int((pos >= 0).sum())


def test_torchmetrics_popularity_without_replacement_equals_the_core():
    """Popularity draws without replacement through SampledRankingMetrics (keyed: an exponential race): the state's
    sampled metric equals the core's estimate on the same keyed ranks (``estimate(metric, SampledRanks(ranks, n,
    design=...), "none")``) bit for bit, its popularity_ranks carry the same sampled ranks (no statistics, as the
    core's), a corrected estimator is refused when the metric is built (nothing corrects these draws); and over 1,200 users its sampled metric
    agrees with the core's own (generator) draws of the same design within 4 standard errors of the difference."""
    from reco_sampled_plugin._keyed import MatrixScores, RowKeys, keyed_ranks
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics
    from reco_sampled_plugin.ranking import padded_candidate_counts

    scores, pos, exclude, w = _tm_batches(seed=4, users=1200)
    design = SamplingDesign(30, replacement=False, popularity=w)
    with pytest.raises(ValueError, match=r"^estimators: \['auto'\] do not support popularity m=30, without "
                                         r"replacement; use some of \('none',\)"):
        SampledRankingMetrics(["auc", "ndcg@10"], design, estimators=["none", "auto"], seed=7)
    metric = SampledRankingMetrics(["auc", "ndcg@10"], design, estimators=["none"], seed=7, max_n_groups=None)
    ids = torch.arange(scores.shape[0])
    for part in (slice(0, 500), slice(500, None)):
        metric.update(scores[part], pos[part], exclude[part], ids=ids[part])
    est = metric.estimates()
    assert "auc/auto" not in est
    keyed = keyed_ranks(MatrixScores(scores), pos, exclude, scores.shape[1], design, RowKeys.of(7, ids, pos.device),
                        "pessimistic")
    n = padded_candidate_counts(scores.shape[1], pos, exclude, count_other_positives=False)
    core = rsp.SampledRanks(keyed.ranks, n, None, design)
    for name in ("auc", "ndcg@10"):
        want = rsp.estimate(name, core, method="none")
        assert (est[f"{name}/sampled"].value, est[f"{name}/sampled"].stderr) == (want.value, want.stderr)
    got = metric.popularity_ranks()
    valid = keyed.ranks > 0
    assert got.popularity_stats is None and got.design == design
    assert torch.equal(torch.sort(got.ranks).values, torch.sort(keyed.ranks[valid]).values)
    with pytest.raises(ValueError, match="^method: 'hh' does not support .*not independent and keep no per-draw statistics"):
        rsp.estimate("auc", got, method="hh")
    drawn = rsp.sampled_ranks(scores, pos, design, exclude=exclude, generator=torch.Generator().manual_seed(9))
    assert drawn.popularity_stats is None
    for name in ("auc", "ndcg@10"):
        a, b = est[f"{name}/sampled"], rsp.estimate(name, drawn, method="none")
        assert abs(a.value - b.value) <= 4 * math.hypot(a.stderr, b.stderr)


def _lightning_callbacks(w):
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    design = SamplingDesign(20, popularity=w)
    return [RankingMetricsCallback(RankingSettings(("auc", "hit@5"), n_samples=design, estimators=("none", "hh"),
                                                   exact=True))]


def _lightning_run(tmp_path, tag, w, devices, strategy="auto"):
    import json

    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    import _lightning_helpers as H

    folder = tmp_path / tag
    folder.mkdir()
    trainer = pl.Trainer(callbacks=_lightning_callbacks(w) + [H.DumpResults(str(folder))], accelerator="cpu",
                         devices=devices, strategy=strategy, logger=False, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=False, default_root_dir=str(tmp_path / tag))
    trainer.validate(H.SyntheticModule(return_ids=False), DataLoader(H.UserDataset(), batch_size=8), verbose=False)
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def _lightning_weights():
    import _lightning_helpers as H

    g = torch.Generator().manual_seed(3)
    return rsp.popularity_weights(torch.randint(1, 50, (H.N_ITEMS,), generator=g).double(), 1.0)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
def test_lightning_popularity_ddp_two_processes_equal_one(tmp_path):
    """RankingMetricsCallback with a popularity design: 2 gloo processes (started as ddp_spawn starts them, from the
    fork server of tests/_forkserver.py; the DistributedSampler pads user 0 onto process 1 and the callback drops it)
    give what 1 process gives, and 1 process what the torchmetrics class gives in a plain loop; hh reports AUC only
    (the registry's metrics), hit@5 only its sampled value."""
    from torch.utils.data import DataLoader

    import _lightning_helpers as H
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    w = _lightning_weights()
    two = _lightning_run(tmp_path, "ddp", w, 2, _forkserver.lightning_ddp())
    one = _lightning_run(tmp_path, "one", w, 1)
    r0, r1, ref = two["rank0_of2.json"], two["rank1_of2.json"], one["rank0_of1.json"]
    hh = [k for k in ref if k.endswith("/hh")]
    assert hh == ["val/auc/hh"] and "val/hit_at_5/hh" not in ref and "val/hit_at_5/sampled" in ref
    for k in ref:
        assert r0[k] == r1[k], k
        for a, b in zip(r0[k], ref[k]):
            assert a == pytest.approx(b, abs=1e-9, rel=0), k
    plain = SampledRankingMetrics(("auc", "hit@5"), SamplingDesign(20, popularity=w), estimators=("none", "hh"))
    model, start = H.SyntheticModule(), 0
    with torch.no_grad():
        for batch in DataLoader(H.UserDataset(), batch_size=8):
            out = model.outputs(batch)
            b = out["scores"].shape[0]
            plain.update(out["scores"], out["positives"], out["exclude"], ids=torch.arange(start, start + b))
            start += b
    assert ref["val/auc/hh"][0] == pytest.approx(plain.estimates()["auc/hh"].value, abs=1e-12)
    assert ref["val/auc/hh"][2] == 50  # every relevant item once


def test_torchmetrics_popularity_state_on_the_device_equals_the_cpu_one(device):
    """SampledRankingMetrics with a popularity design moved to ``device`` (its inputs there too): the keyed draws and
    every popularity statistic (the positive's own weight included) equal the CPU metric's, and so do its estimates."""
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    scores, pos, exclude, w = _tm_batches()
    ids = torch.arange(scores.shape[0])
    out = {}
    for dev in dict.fromkeys(("cpu", str(device))):  # on the CPU alone: one run, compared with itself as before
        metric = SampledRankingMetrics(["auc", "ndcg@10"], SamplingDesign(40, popularity=w),
                                       estimators=["none", "hh", "pl_fit"], seed=7).to(dev)
        for part in (slice(0, 100), slice(100, None)):
            metric.update(scores[part].to(dev), pos[part].to(dev), exclude[part].to(dev), ids=ids[part].to(dev))
        got = metric.popularity_ranks()
        out[str(dev)] = (got, {k: (e.value, e.stderr) for k, e in metric.estimates().items()})
    (a, est_a), (b, est_b) = out["cpu"], out[str(device)]
    assert torch.equal(a.ranks, b.ranks.cpu())
    for f in ("beating", "inv_q", "inv_q2", "unreachable", "profile", "beat_bins", "miss_bins", "positive_weight"):
        torch.testing.assert_close(getattr(a.popularity_stats, f), getattr(b.popularity_stats, f).cpu(),
                                   rtol=1e-12, atol=1e-9)
    assert set(est_a) == set(est_b) and "ndcg@10/pl_fit" in est_a
    for k in est_a:
        assert est_b[k] == pytest.approx(est_a[k], rel=1e-9, abs=1e-12), k
