"""One key per metric across every logger: the Lightning callback's logged names and the torchmetrics classes'
``compute()`` keys (logged after the stage) are the same, ``val/ndcg_at_10/auto``, in real CSV, TensorBoard and
MLflow (SQLite store) loggers' files; MLflow accepts them unchanged (it refuses ``@``)."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import _lightning_helpers as H
import lightning.pytorch as pl
from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

METRICS = ("ndcg@10", "hit@5")
SETTINGS = dict(n_samples=20, max_n_groups=None, seed=3)  # estimators: the default, ("none", "auto")


def _logged_keys(tmp_path: Path, module: pl.LightningModule, callbacks: list, mlflow_uri: str) -> dict[str, set[str]]:
    """Validate ``module`` once with a CSV, a TensorBoard and an MLflow logger (``mlflow_uri``: a SQLite file, the
    store MLflow 3 keeps; its file store refuses new runs by default); each logger's keys as read back from its own
    files."""
    import mlflow
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    loggers = [pl.loggers.CSVLogger(str(tmp_path / "csv")), pl.loggers.TensorBoardLogger(str(tmp_path / "tb")),
               pl.loggers.MLFlowLogger(tracking_uri=mlflow_uri)]
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=loggers, callbacks=callbacks, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=False, default_root_dir=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # MLFlowLogger warns where it rewrites a key
        trainer.validate(module, DataLoader(H.UserDataset(), batch_size=8), verbose=False)
    for lg in loggers:
        lg.finalize("success")
    with open(Path(loggers[0].log_dir) / "metrics.csv") as f:
        keys = {"csv": set(next(csv.reader(f)))}
    acc = EventAccumulator(loggers[1].log_dir)
    acc.Reload()
    keys["tensorboard"] = set(acc.Tags()["scalars"])
    client = mlflow.tracking.MlflowClient(tracking_uri=loggers[2]._tracking_uri)
    keys["mlflow"] = set(client.get_run(loggers[2].run_id).data.metrics)
    return keys


@pytest.mark.slow  # two Trainers and an MLflow store (its schema migrations): ~15-30 s
def test_callback_and_torchmetrics_log_the_same_keys_in_every_logger(tmp_path):
    settings = RankingSettings(METRICS, **SETTINGS)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # one store, two runs
    by_callback = _logged_keys(tmp_path / "cb", H.SyntheticModule(), [RankingMetricsCallback(settings)], uri)
    by_classes = _logged_keys(tmp_path / "tm", H.TorchmetricsModule(METRICS, **SETTINGS), [], uri)
    want = {f"val/{m}/{lab}{end}" for m in ("ndcg_at_10", "hit_at_5") for lab in ("sampled", "auto")
            for end in ("", "_lo", "_hi")} | {"val/ndcg_at_10/exact", "val/hit_at_5/exact"}
    for name in ("csv", "tensorboard", "mlflow"):
        assert want <= by_callback[name], (name, sorted(want - by_callback[name]))
        assert want <= by_classes[name], (name, sorted(want - by_classes[name]))
        # the same names beyond the callback's own extras (the headline val_<metric>, the epoch counter)
        extra = {k for k in by_callback[name] - by_classes[name] if not k.startswith("val_") and k != "epoch"}
        assert not extra, (name, sorted(extra))
