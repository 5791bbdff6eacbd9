"""Matrix factorisation on MovieLens 100k with Lightning, logging exact, sampled (m = 100) and corrected metrics.

    python examples/lightning/mf_ml100k.py --epochs 3 --logger csv --out runs/mf

The data is the ``ml-100k.inter`` file inside the ``recbole`` wheel (read directly, no RecBole at run time),
split leave-last-out (Krichene & Rendle section 6): each user's last event is the held-out item, ranked
against every item except the user's training items. The model is trained with a full softmax over items.
Each validation epoch the :class:`RankingMetricsCallback` logs, for hit@10, ndcg@10 and AUC: the exact
metric, the sampled metric with m = 100 uniform negatives, the corrections ``cls`` and ``bv`` and Li et al.'s
``bound`` mapping. CPU, well under a minute.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings
from reco_sampled_plugin.datasets import load_ml100k
from reco_sampled_plugin.exclusions import prepare_exclusions
from reco_sampled_plugin.registry import Method, Mle

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - the older namespace works the same way
    import pytorch_lightning as pl

METRICS = ("hit@10", "ndcg@10", "auc")
ESTIMATORS = ("none", "cls", "bv", "bound")


class MatrixFactorization(pl.LightningModule):
    """Users and items as d-dimensional vectors; score = <u, v> + item bias; full-softmax training.

    ``validation_step`` / ``test_step`` follow the callback's protocol: they return the scores of
    every item, the held-out item, the training items to exclude and the user ids. The training items are a padded
    index table built once (a mask would do the same, but on a GPU its width is read back at every batch).
    """

    def __init__(self, train_mask: torch.Tensor, dim: int = 32, lr: float = 0.01, weight_decay: float = 1e-5) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["train_mask"])
        n_users, n_items = train_mask.shape
        self.user = torch.nn.Embedding(n_users, dim)
        self.item = torch.nn.Embedding(n_items, dim)
        self.bias = torch.nn.Parameter(torch.zeros(n_items))
        torch.nn.init.normal_(self.user.weight, std=0.1)
        torch.nn.init.normal_(self.item.weight, std=0.1)
        # each user's training items ascending, -1 padding: (n_users, most training items of a user)
        self.register_buffer("train_items", prepare_exclusions(train_mask, n_items).padded(), persistent=False)

    def scores(self, users: torch.Tensor) -> torch.Tensor:
        return self.user(users) @ self.item.weight.T + self.bias

    def training_step(self, batch, batch_idx):
        users, items = batch
        loss = torch.nn.functional.cross_entropy(self.scores(users), items)
        self.log("train_loss", loss, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx) -> dict[str, torch.Tensor]:
        users, items = batch
        return {"scores": self.scores(users), "positives": items, "exclude": self.train_items[users], "ids": users}

    test_step = validation_step

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


def make_data(batch_size: int = 1024, eval_batch_size: int = 256) -> tuple[torch.Tensor, DataLoader, DataLoader]:
    """(train mask, train loader over (user, item) pairs, evaluation loader over (user, held-out item))."""
    split = load_ml100k()
    train = split.train
    users = np.repeat(np.arange(split.n_users), np.diff(train.indptr))
    mask = torch.zeros(split.n_users, split.n_items, dtype=torch.bool)
    mask[torch.from_numpy(users), torch.from_numpy(train.indices.astype(np.int64))] = True
    pairs = TensorDataset(torch.from_numpy(users), torch.from_numpy(train.indices.astype(np.int64)))
    test_users = split.test_users
    held = TensorDataset(torch.from_numpy(test_users), torch.from_numpy(split.test_items[test_users]))
    gen = torch.Generator().manual_seed(0)
    return (
        mask,
        DataLoader(pairs, batch_size=batch_size, shuffle=True, generator=gen),
        DataLoader(held, batch_size=eval_batch_size),
    )


def make_loggers(kinds: str, out: str) -> list | bool:
    """The loggers named in ``kinds`` (comma-separated: ``"csv"``, ``"csv,tensorboard,mlflow"``), or False for
    ``"none"``: Lightning writes every logged value to each of them."""
    if kinds == "none":
        return False
    return [make_logger(kind.strip(), out) for kind in kinds.split(",")]


def make_logger(kind: str, out: str):
    if kind == "csv":
        return pl.loggers.CSVLogger(out, name="mf_ml100k")
    if kind == "tensorboard":
        return pl.loggers.TensorBoardLogger(out, name="mf_ml100k")
    if kind == "mlflow":
        # a local SQLite store (MLflow 3 keeps the ./mlruns file store in maintenance mode)
        os.makedirs(out, exist_ok=True)
        uri = "sqlite:///" + os.path.abspath(os.path.join(out, "mlflow.db"))
        return pl.loggers.MLFlowLogger(experiment_name="mf_ml100k", tracking_uri=uri)
    raise ValueError(f"logger: use csv, tensorboard, mlflow (comma-separated) or none, got {kind!r}")


def main(
    epochs: int = 3,
    logger: str = "csv",
    out: str = "runs/mf_ml100k",
    estimators: tuple[str | Method, ...] = ESTIMATORS,
    plot: bool = False,
    seed: int = 0,
    **callback_options: Any,
) -> tuple[Any, Any]:
    """Train for ``epochs`` epochs; returns (trainer, callback). The callback's ``history`` holds
    every logged value per epoch, its ``results`` the last epoch's estimates with standard errors."""
    pl.seed_everything(seed, verbose=False)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))  # at most 2 (a small model), never more than set
    mask, train_loader, eval_loader = make_data()
    model = MatrixFactorization(mask)
    callback = RankingMetricsCallback(
        RankingSettings(METRICS, n_samples=100, estimators=estimators),
        headline=("ndcg@10", "exact"),
        plot_every_n_epochs=1 if plot else None,
        **callback_options,
    )
    checkpoint = pl.callbacks.ModelCheckpoint(
        dirpath=os.path.join(out, "checkpoints"), monitor=callback.monitor, mode="max", save_top_k=1
    )
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=make_loggers(logger, out),
        callbacks=[callback, checkpoint],
        default_root_dir=out,
        num_sanity_val_steps=0,
        enable_model_summary=False,
        log_every_n_steps=20,
    )
    trainer.fit(model, train_loader, eval_loader)
    return trainer, callback


def _cell(row, key: str) -> str:
    """The value, and its 95% interval where logged (``<key>_lo`` / ``<key>_hi``: every estimate, not the exact)."""
    if f"{key}_lo" not in row:
        return f"{row[key]:8.4f}"
    return f"{row[key]:8.4f} [{row[key + '_lo']:.4f}, {row[key + '_hi']:.4f}]"


def _print_table(callback) -> None:
    rows = callback.history["validate"]
    for metric in METRICS:
        labels = callback.labels
        print(f"\n{metric} (estimates with their 95% interval): " + " | ".join(labels))
        for row in rows:
            vals = " | ".join(_cell(row, callback.key(metric, lab)) for lab in labels)
            print(f"  epoch {row['epoch']}: {vals}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--logger", default="csv",
                        help="csv, tensorboard, mlflow, several of them comma-separated, or none")
    parser.add_argument("--out", default="runs/mf_ml100k")
    parser.add_argument("--plot", action="store_true", help="also log a per-epoch plot of the curves")
    parser.add_argument("--mle", action="store_true", help="also run the rank-distribution estimator (slower)")
    args = parser.parse_args()
    est = ESTIMATORS + ((Mle(n_bootstrap=4),) if args.mle else ())  # logged as mle_n_bootstrap-4
    _, cb = main(args.epochs, args.logger, args.out, est, args.plot)
    _print_table(cb)

