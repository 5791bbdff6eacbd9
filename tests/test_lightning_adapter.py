"""The Lightning callback on real Trainers (CPU): protocol, logging to CSV/TensorBoard/MLflow, checkpointing,
both namespaces, plots, progress, and 2-process DDP (gloo) equal to 1 process to 1e-9."""

from __future__ import annotations

import json
import math
import runpy
import sys
import warnings
from pathlib import Path

import pytest
import torch

import lightning.pytorch as pl
from torch.utils.data import DataLoader  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _forkserver  # noqa: E402
import _lightning_helpers as H  # noqa: E402

from reco_sampled_plugin import registry  # noqa: E402
from reco_sampled_plugin._hash import keyed_uniform  # noqa: E402
from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings, callback_class  # noqa: E402
from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics  # noqa: E402
from reco_sampled_plugin.design import ExactShare, SamplingDesign  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning" / "mf_ml100k.py"
OPTS = dict(n_samples=20, estimators=("none", "bv", "bound"), max_n_groups=None)  # RankingSettings
# an exact share of half the relevant items (`auto`: the design-based estimate), sampled metrics only
SHARE = dict(n_samples=SamplingDesign(20, exact_share=ExactShare(0.5, seed=3)), estimators=("auto",),
             max_n_groups=None, exact=False)
SHARE_METRICS = ("ndcg@10", "hit@5")
METRICS = ("ndcg@10", "hit@5", "auc")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def _trainer(tmp_path, callbacks, **kw):
    args = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=str(tmp_path),
    )
    args.update(kw)
    return pl.Trainer(callbacks=callbacks, **args)


def _loader(index=None, batch_size=8):
    return DataLoader(H.UserDataset(index), batch_size=batch_size)


def _plain_loop(index=None, batch_size=8, ids=True, share=False):
    """The same quantities from the torchmetrics classes in a plain loop (no Lightning); ``share``: the sampled
    metrics of :data:`SHARE` (an exact share) instead."""
    model = H.SyntheticModule()
    exact = ExactRankingMetrics(METRICS)
    sampled = SampledRankingMetrics.from_settings(RankingSettings(SHARE_METRICS, **SHARE) if share else
                                                  RankingSettings(METRICS, **OPTS))
    pos = 0
    with torch.no_grad():
        for batch in _loader(index, batch_size):
            out = model.outputs(batch)
            b = out["scores"].shape[0]
            key = out["ids"] if ids else torch.arange(pos, pos + b)
            pos += b
            exact.update(out["scores"], out["positives"], out["exclude"])
            sampled.update(out["scores"], out["positives"], out["exclude"], ids=key)
    states = sampled.estimates() if share else {**exact.estimates(), **sampled.estimates()}
    return {f"val/{k.replace('@', '_at_')}": e for k, e in states.items()}


def _values(cb, stage="validate"):
    return {k: e.value for k, e in cb.results[stage].items()}


# ------------------------------------------------------------------------------------ protocol
@pytest.mark.parametrize("protocol", ["step", "score_fn", "factors"])
def test_step_protocol_and_score_fn_equal_plain_loop(tmp_path, protocol):
    """Scores from the step, from score_fn, or the step's factors (scored in tiles by the callback): the
    same values as the torchmetrics classes fed the score matrix in a plain loop."""
    score_fn = H.score_fn if protocol == "score_fn" else None
    cb = RankingMetricsCallback(RankingSettings(METRICS, **OPTS), score_fn=score_fn)
    # with factors, an exact share too: the callback ranks the chosen rows in tiles
    shared = RankingMetricsCallback(RankingSettings(SHARE_METRICS, **SHARE), prefix="sh_")
    trainer = _trainer(tmp_path, [cb] + [shared] * (protocol == "factors"))
    trainer.validate(H.SyntheticModule(protocol=protocol), _loader(), verbose=False)
    if protocol == "factors":  # the plain loop's design-based estimates (from the score matrix)
        want = {"sh_" + k: e for k, e in _plain_loop(share=True).items()}
        assert set(shared.results["validate"]) == set(want) and len(want) == 2
        for k, e in want.items():
            got_e = shared.results["validate"][k]
            assert (got_e.value, got_e.stderr) == pytest.approx((e.value, e.stderr), abs=1e-12), k
            assert got_e.details["method"] == "diff" and got_e.details["n_exact"] == e.details["n_exact"] > 10, k
    expected = _plain_loop()
    got = cb.results["validate"]
    assert set(got) == set(expected)
    assert len(got) == len(METRICS) * 4  # exact, sampled, bv, bound
    for k, e in expected.items():
        assert got[k].value == pytest.approx(e.value, abs=1e-12), k
        assert got[k].n_instances == e.n_instances
    # logged (float32) and the headline alias
    logged = trainer.callback_metrics
    assert cb.monitor == "val_ndcg_at_10"
    assert float(logged[cb.monitor]) == pytest.approx(got["val/ndcg_at_10/exact"].value, rel=1e-6)
    assert float(logged["val/auc/bv"]) == pytest.approx(got["val/auc/bv"].value, rel=1e-6)


def test_missing_protocol_raises_a_clear_error(tmp_path):
    class NoScores(H.SyntheticModule):
        def validation_step(self, batch, batch_idx):
            return {"loss": torch.tensor(0.0)}

    cb = RankingMetricsCallback(RankingSettings(METRICS, **OPTS))
    with pytest.raises(ValueError, match="scores.*score_fn"):
        _trainer(tmp_path, [cb]).validate(NoScores(), _loader(), verbose=False)


def test_sanity_check_is_ignored_and_test_stage_logs(tmp_path):
    cb = RankingMetricsCallback(RankingSettings(METRICS, **OPTS), log_stderr=True, log_interval=True)
    model = H.SyntheticModule()
    trainer = _trainer(tmp_path, [cb], max_epochs=1, limit_train_batches=1, num_sanity_val_steps=2)
    trainer.fit(model, _loader(), _loader())
    expected = _plain_loop()
    assert cb.results["validate"]["val/hit_at_5/sampled"].value == pytest.approx(expected["val/hit_at_5/sampled"].value, abs=1e-12)
    assert len(cb.history["validate"]) == 1  # the sanity check logged nothing
    trainer.test(model, _loader(), verbose=False)
    assert cb.results["test"]["test/ndcg_at_10/exact"].value == pytest.approx(expected["val/ndcg_at_10/exact"].value, abs=1e-12)
    assert "test_ndcg_at_10" in trainer.callback_metrics
    assert "test/ndcg_at_10/bv_stderr" in trainer.callback_metrics
    est = cb.results["test"]["test/ndcg_at_10/bv"]
    lo, hi = (float(trainer.callback_metrics[f"test/ndcg_at_10/bv_{end}"]) for end in ("lo", "hi"))
    assert (lo, hi) == pytest.approx(est.interval(0.95), abs=1e-6) and lo <= est.value <= hi
    assert "test/ndcg_at_10/exact_lo" not in trainer.callback_metrics


def test_pytorch_lightning_namespace(tmp_path):
    import pytorch_lightning as ptl

    cls = callback_class("pytorch_lightning")
    assert issubclass(cls, ptl.Callback) and not issubclass(cls, pl.Callback)
    assert issubclass(callback_class("lightning.pytorch"), pl.Callback)

    class PLModule(ptl.LightningModule):
        def __init__(self):
            super().__init__()
            self.inner = H.SyntheticModule()

        def validation_step(self, batch, batch_idx):
            return self.inner.outputs(batch)

    cb = cls(RankingSettings(METRICS, **OPTS))
    trainer = ptl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[cb], enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.validate(PLModule(), _loader(), verbose=False)
    expected = _plain_loop()
    assert _values(cb) == pytest.approx({k: e.value for k, e in expected.items()}, abs=1e-12)


def test_early_stopping_and_progress(tmp_path, capfd):
    cb = RankingMetricsCallback(RankingSettings(METRICS, **OPTS), headline=("hit@5", "bv"))
    stop = pl.callbacks.EarlyStopping(monitor=cb.monitor, mode="max", patience=1)
    trainer = _trainer(tmp_path, [cb, stop], max_epochs=5, limit_train_batches=1, num_sanity_val_steps=0,
                       enable_progress_bar=True)
    trainer.fit(H.SyntheticModule(), _loader(), _loader())
    assert trainer.current_epoch < 4  # the metric does not move (lr = 0): early stopping fires
    assert cb.monitor == "val_hit_at_5" and cb.monitor in trainer.callback_metrics
    assert "ranking metrics (val)" in capfd.readouterr().err


# --------------------------------------------------------------------------- the example, 3 loggers
@pytest.fixture(scope="module")
def example():
    return runpy.run_path(str(EXAMPLE), run_name="example_under_test")


def _check_history(cb, read, atol=1e-6):
    rows = cb.history["validate"]
    assert len(rows) == 2
    keys = [cb.key(m, lab) for m in ("hit@10", "ndcg@10", "auc") for lab in ("exact", "sampled", "cls", "bv", "bound")]
    for k in keys + [cb.monitor]:
        series = read(k)
        assert len(series) == 2, k
        for row, got in zip(rows, series):
            assert got == pytest.approx(row[k], abs=atol, rel=1e-6), k
    last = rows[-1]
    # the story the example tells: sampled hit@10 overstates the exact one; the corrections land near it
    assert last[cb.key("hit@10", "sampled")] > 2 * last[cb.key("hit@10", "exact")]
    assert abs(last[cb.key("hit@10", "bv")] - last[cb.key("hit@10", "exact")]) < 0.05


@pytest.fixture(scope="module")
def example_run(example, tmp_path_factory):
    """One 2-epoch run of the example writing to a CSV, a TensorBoard and an MLflow logger at once (with plots):
    each logger's test below reads its own files back. The example sets torch's threads to 2 (its standalone
    default): the test process's own count is restored after it, so that the tests after it in this process do not
    run on 2 threads where tests/conftest.py gave each pytest-xdist worker its share of the cores."""
    threads = torch.get_num_threads()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return example["main"](epochs=2, logger="csv,tensorboard,mlflow", out=str(tmp_path_factory.mktemp("mf")),
                                   plot=True)
    finally:
        torch.set_num_threads(threads)


def _logger(trainer, kind: str):
    (found,) = [lg for lg in trainer.loggers if type(lg).__name__ == kind]
    return found


@pytest.mark.slow
def test_example_csv_logger_and_checkpoint(example_run):
    import csv

    trainer, cb = example_run
    with open(Path(_logger(trainer, "CSVLogger").log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))

    def read(k):
        return [float(r[k]) for r in rows if r.get(k)]

    _check_history(cb, read)
    ckpt = trainer.checkpoint_callback
    assert ckpt.monitor == "val_ndcg_at_10" and Path(ckpt.best_model_path).is_file()
    assert float(ckpt.best_model_score) == pytest.approx(max(r["val_ndcg_at_10"] for r in cb.history["validate"]), rel=1e-6)
    assert len(cb.plots) == 2 and all(Path(p).is_file() and Path(p).stat().st_size > 5000 for p in cb.plots)


@pytest.mark.slow
def test_example_tensorboard_logger(example_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, cb = example_run
    acc = EventAccumulator(_logger(trainer, "TensorBoardLogger").log_dir, size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    _check_history(cb, lambda k: [ev.value for ev in acc.Scalars(k)])
    assert len(acc.Images("val/ranking_metrics")) == 2


@pytest.mark.slow
def test_example_mlflow_logger(example_run):
    import mlflow

    trainer, cb = example_run
    logger = _logger(trainer, "MLFlowLogger")
    client = mlflow.tracking.MlflowClient(tracking_uri=logger._tracking_uri)

    def read(k):
        return [m.value for m in sorted(client.get_metric_history(logger.run_id, k), key=lambda m: m.step)]

    _check_history(cb, read)
    # the plots reach MLflow as artifacts too (one per epoch)
    artifacts = [a.path for a in client.list_artifacts(logger.run_id, "ranking_metrics")]
    assert len(artifacts) == 2, artifacts


# ------------------------------------------------------------------------------------------- DDP
def _spawned(tmp_path, tag, callbacks, loader, devices, strategy="auto", return_ids=True):
    folder = tmp_path / tag
    folder.mkdir()
    trainer = _trainer(tmp_path / f"root_{tag}", callbacks + [H.DumpResults(str(folder))], devices=devices,
                       strategy=strategy)
    trainer.validate(H.SyntheticModule(return_ids=return_ids), loader, verbose=False)
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


@pytest.mark.slow
def test_ddp_two_processes_equal_one(tmp_path):
    """37 users, batch 8, 2 processes: 19 + 19 rows (the DistributedSampler pads user 0 onto process 1),
    uneven last batches (3 rows each), different histogram shapes per process. Ids are not returned:
    the negatives are keyed by the global sample position, which the callback derives from the sampler."""
    opts = dict(OPTS, estimators=("none", "bv", "bound", "cls"))

    adaptive = dict(n_samples=SamplingDesign(5, adaptive_max=40), estimators=("none", registry.Mes(n_bootstrap=4)),
                    max_n_groups=None)

    def callbacks():
        return [RankingMetricsCallback(RankingSettings(METRICS, **opts)),
                RankingMetricsCallback(RankingSettings(METRICS, **opts), prefix="raw_", dedup_padding=False),
                RankingMetricsCallback(RankingSettings(METRICS, exact=False, **adaptive), prefix="ad_"),
                RankingMetricsCallback(RankingSettings(SHARE_METRICS, **SHARE), prefix="sh_")]

    two = _spawned(tmp_path, "ddp", callbacks(), _loader(batch_size=8), devices=2, strategy=_forkserver.lightning_ddp(),
                   return_ids=False)
    one = _spawned(tmp_path, "one", callbacks(), _loader(batch_size=8), devices=1, return_ids=False)
    # what happens without dedup: user 0 counted twice, its copy keyed by position 37
    padded = _spawned(tmp_path, "padded", callbacks(), _loader(index=list(range(37)) + [0], batch_size=8),
                      devices=1, return_ids=False)
    assert sorted(two) == ["rank0_of2.json", "rank1_of2.json"]
    positives = H.synthetic_data()[2]
    n_pos = int((positives >= 0).sum())
    assert n_pos == 50 and int((positives[0] >= 0).sum()) == 2
    r0, r1 = two["rank0_of2.json"], two["rank1_of2.json"]
    ref, ref_padded = one["rank0_of1.json"], padded["rank0_of1.json"]
    dedup_keys = [k for k in ref if not k.startswith(("raw_", "ad_", "sh_"))]
    adaptive_keys = [k for k in ref if k.startswith("ad_")]
    share_keys = [k for k in ref if k.startswith("sh_")]
    chosen = (positives >= 0) & (keyed_uniform(3, torch.arange(37).view(-1, 1), positives.clamp(min=0)) < 0.5)
    assert (int(chosen[0::2].sum()), int(chosen[1::2].sum())) == (10, 16)  # share rows per process: padded to 16
    assert len(adaptive_keys) == len(METRICS) * 2 and len(share_keys) == len(SHARE_METRICS)
    # the exact share's rows (a different number per process: padded, gathered, the padding dropped) and the
    # adaptive states (rows of every stage, summed) sync to the one process's estimates
    for k in adaptive_keys + share_keys:
        assert r0[k] == r1[k], k
        for a, b in zip(r0[k], ref[k]):
            assert a == pytest.approx(b, abs=1e-9, rel=0), k
        assert r0[k][2] == n_pos
    assert len(dedup_keys) == len(METRICS) * 5
    for k in dedup_keys:
        assert r0[k] == r1[k], k  # every process holds the same synced result
        for a, b in zip(r0[k], ref[k]):
            assert a == pytest.approx(b, abs=1e-9, rel=0), k
        assert r0[k][2] == n_pos  # 37 users, 13 of them with two relevant items
        raw = "raw_" + k
        assert r0[raw][2] == n_pos + 2  # user 0 (two relevant items) counted twice
        for a, b in zip(r0[raw], ref_padded[raw]):
            assert a == pytest.approx(b, abs=1e-9, rel=0), raw
    # the duplicate changes something (so dedup is not vacuous)
    assert any(abs(r0["raw_" + k][0] - r0[k][0]) > 1e-6 for k in dedup_keys)
    assert not any(math.isnan(v[0]) for v in r0.values())


def test_callback_refuses_average_ties_with_sampled_metrics_when_built():
    """'average' ties give fractional sampled ranks: refused when the callback is built (not at the first
    validation batch); exact metrics alone take them."""
    with pytest.raises(ValueError, match="ties: 'average'"):
        RankingSettings(("ndcg@10",), ties="average", n_samples=20)
    assert RankingMetricsCallback(RankingSettings(("ndcg@10",), ties="average", n_samples=None)).settings.design is None


def test_padding_is_dropped_only_while_rows_are_samples():
    """A DistributedSampler pads the last positions with repeats (dropped); when a process sees more score rows
    than samples (samples holding several users) rows are not samples: nothing is dropped, with a warning."""
    from torch.utils.data import DistributedSampler

    from reco_sampled_plugin.adapters.lightning import _LoaderState

    sampler = DistributedSampler(list(range(5)), num_replicas=2, rank=1, shuffle=False)  # positions 1, 3, 5 (padding)
    st = _LoaderState(None, None, sampler)
    glob, keep = st.positions(3, "cpu")
    assert glob.tolist() == [1, 3, 5] and keep.tolist() == [True, True, False]
    st = _LoaderState(None, None, sampler)
    with pytest.warns(RuntimeWarning, match="rows are not samples"):
        glob, keep = st.positions(4, "cpu")
    assert keep is None and glob.tolist() == [1, 3, 5, 7]


def test_defaults_log_the_interval_not_the_stderr(tmp_path):
    """The callback's defaults run the sampled metric and registry.DEFAULT_ESTIMATOR and log each
    estimate's 95% interval as ``<name>_lo`` / ``<name>_hi``; the standard error (sampling noise only) is opt-in."""
    from reco_sampled_plugin import registry

    cb = RankingMetricsCallback(RankingSettings(("hit@5",), n_samples=20))
    assert cb.labels == ("exact", "sampled", registry.DEFAULT_ESTIMATOR)
    trainer = _trainer(tmp_path, [cb])
    trainer.validate(H.SyntheticModule(), _loader(), verbose=False)
    logged = trainer.callback_metrics
    for label in ("sampled", registry.DEFAULT_ESTIMATOR):
        k = cb.key("hit@5", label)
        lo, hi = cb.results["validate"][k].interval(0.95)
        assert (float(logged[f"{k}_lo"]), float(logged[f"{k}_hi"])) == pytest.approx((lo, hi), abs=1e-6)
        assert 0.0 <= lo <= cb.results["validate"][k].value <= hi <= 1.0
        assert f"{k}_stderr" not in logged
    assert cb.key("hit@5", "exact") + "_lo" not in logged
