"""Small synthetic LightningModule and callbacks for the Lightning adapter tests (importable by
ddp_spawn children, which unpickle these classes by module name)."""

from __future__ import annotations

import json
import os

import torch
from torch.utils.data import Dataset

import lightning.pytorch as pl

N_USERS, N_ITEMS, DIM = 37, 240, 8


def synthetic_data(seed: int = 0):
    """Scores' factors, per-user positives (1 or 2, padded with -1) and exclusions (0..40 items)."""
    g = torch.Generator().manual_seed(seed)
    users = torch.randn(N_USERS, DIM, generator=g)
    items = torch.randn(N_ITEMS, DIM, generator=g)
    order = torch.argsort(torch.rand(N_USERS, N_ITEMS, generator=g), dim=1)
    positives = order[:, :2].clone()
    positives[torch.arange(N_USERS) % 3 != 0, 1] = -1  # every third user has two relevant items
    exclude = torch.zeros(N_USERS, N_ITEMS, dtype=torch.bool)
    for u in range(N_USERS):  # varying exclusion counts: n differs per user and per process
        exclude[u, order[u, 2 : 2 + (u * 7) % 41]] = True
    return users, items, positives, exclude


class UserDataset(Dataset):
    """Item i is user ``index[i]``: (user id, positives row, exclusion row)."""

    def __init__(self, index=None, seed: int = 0) -> None:
        _, _, self.positives, self.exclude = synthetic_data(seed)
        self.index = list(range(N_USERS)) if index is None else list(index)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):
        u = self.index[i]
        return u, self.positives[u], self.exclude[u]


class IndexedUserDataset(UserDataset):
    """:class:`UserDataset` with its exclusions as padded indices (width 41, -1 padding) and, ``one_positive``, each
    user's first relevant item as a single index (the (B,) form)."""

    def __init__(self, one_positive: bool = False, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self.one_positive = one_positive

    def __getitem__(self, i):
        u, positives, exclude = super().__getitem__(i)
        row = torch.full((41,), -1, dtype=torch.int64)
        items = exclude.nonzero()[:, 0]
        row[: items.numel()] = items
        return u, positives[0] if self.one_positive else positives, row


class SyntheticModule(pl.LightningModule):
    """Fixed factor model; ``validation_step`` returns scores (``protocol='step'``), its factors
    (``'factors'``) or nothing (``'score_fn'``: the callback calls :func:`score_fn`)."""

    def __init__(self, return_ids: bool = True, protocol: str = "step", seed: int = 0) -> None:
        super().__init__()
        users, items, _, _ = synthetic_data(seed)
        self.users = torch.nn.Parameter(users)
        self.items = torch.nn.Parameter(items)
        self.return_ids = return_ids
        self.protocol = protocol

    def outputs(self, batch) -> dict:
        ids, positives, exclude = batch
        if self.protocol == "factors":  # a FactorBatch: the callback computes the scores itself
            out = {"user_factors": self.users[ids], "item_factors": self.items, "positives": positives, "exclude": exclude}
        else:
            out = {"scores": self.users[ids] @ self.items.T, "positives": positives, "exclude": exclude}
        if self.return_ids:
            out["ids"] = ids
        return out

    def validation_step(self, batch, batch_idx):
        return self.outputs(batch) if self.protocol in ("step", "factors") else None

    test_step = validation_step

    def training_step(self, batch, batch_idx):  # no optimisation: the tests evaluate a fixed model
        return None

    def configure_optimizers(self):  # pragma: no cover
        return torch.optim.SGD(self.parameters(), lr=0.0)


def score_fn(pl_module, batch):
    """The user scoring function of the protocol (module-level, so it pickles)."""
    return pl_module.outputs(batch)


class DumpResults(pl.Callback):
    """After each validation epoch, every process writes its callbacks' float64 results to JSON."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        out = {}
        for cb in trainer.callbacks:
            if hasattr(cb, "results") and "validate" in getattr(cb, "results", {}):
                out.update({k: [e.value, e.stderr, e.n_instances] for k, e in cb.results["validate"].items()})
        path = os.path.join(self.folder, f"rank{trainer.global_rank}_of{trainer.world_size}.json")
        with open(path, "w") as f:
            json.dump(out, f)


class ScorerModule(SyntheticModule):
    """The synthetic model as a pointwise scorer: its score table ``users @ items.T`` is the model, read
    whole by the score protocol (``protocol='step'``) and pair by pair by :meth:`score_pairs` (``'scorer'``: the
    step returns ``positives``, ``n_items``, ``exclude``, ``users`` and no scores), so both paths see the same
    float32 scores bit for bit."""

    def __init__(self, return_ids: bool = True, protocol: str = "scorer", seed: int = 0) -> None:
        super().__init__(return_ids=return_ids, protocol=protocol, seed=seed)
        with torch.no_grad():
            self.register_buffer("table", self.users @ self.items.T)
        self.pairs_scored = 0

    def outputs(self, batch) -> dict:
        ids, positives, exclude = batch
        if self.protocol == "scorer":
            out = {"positives": positives, "exclude": exclude, "n_items": self.table.shape[1], "users": ids}
        else:
            out = {"scores": self.table[ids], "positives": positives, "exclude": exclude}
        if self.return_ids:
            out["ids"] = ids
        return out

    def validation_step(self, batch, batch_idx):
        return self.outputs(batch)

    test_step = validation_step

    def score_pairs(self, users, items):
        """(B,) users, (B, L) items -> (B, L) scores: the pairs alone."""
        self.pairs_scored += items.numel()
        return self.table[users.unsqueeze(1), items]


def pair_scorer(pl_module, users, items):
    """The scorer as a callable given to the callback (module-level, so it pickles)."""
    return pl_module.score_pairs(users, items)


class DumpScoringCosts(pl.Callback):
    """After each validation epoch, every process writes its callbacks' synced scoring costs (pairs, calls,
    full_pairs) to JSON."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        out = {}
        for cb in trainer.callbacks:
            for k, c in getattr(cb, "scoring_costs", {}).items():
                out[k] = [c.pairs, c.calls, c.full_pairs, c.stages]
        out["pairs_scored_here"] = pl_module.pairs_scored
        path = os.path.join(self.folder, f"cost{trainer.global_rank}_of{trainer.world_size}.json")
        with open(path, "w") as f:
            json.dump(out, f)


class TorchmetricsModule(SyntheticModule):
    """The synthetic model evaluated by the torchmetrics classes themselves (no callback): ``compute()``'s keys
    logged after the stage, ``val/<key>``, as a user's module logs them."""

    def __init__(self, metrics, **settings) -> None:
        super().__init__()
        from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics

        self.exact = ExactRankingMetrics(metrics)
        self.sampled = SampledRankingMetrics(metrics, **settings)

    def validation_step(self, batch, batch_idx):
        out = self.outputs(batch)
        self.exact.update(out["scores"], out["positives"], out["exclude"])
        self.sampled.update(out["scores"], out["positives"], out["exclude"], ids=out["ids"])

    def on_validation_epoch_end(self) -> None:
        values = {**self.exact.compute(), **self.sampled.compute()}
        self.log_dict({f"val/{k}": v.float() for k, v in values.items()})
        self.exact.reset()
        self.sampled.reset()
