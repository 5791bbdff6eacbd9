"""Lightning callback: exact, sampled and corrected ranking metrics during validation and test.

Attach :class:`RankingMetricsCallback` to a ``Trainer``. Batch by batch it turns the scores of the
step into ranks on the module's device and adds them to two torchmetrics states
(:mod:`reco_sampled_plugin.adapters.torchmetrics`); at epoch end it syncs them across processes
(a sum), runs every configured estimator and logs the values with ``log_dict``, so every Lightning
logger (TensorBoard, CSV, MLflow, W&B...) receives them and ``ModelCheckpoint`` / ``EarlyStopping``
can monitor them.

Protocol (see docs/lightning.md): either ``validation_step`` / ``test_step`` returns a dict (or a
:class:`RankingBatch`) with ``scores`` (B x n), ``positives``, optional ``exclude`` and ``ids``, or
the callback gets ``score_fn(pl_module, batch)`` returning the same. A factor model may hand over
``user_factors`` (B x d), ``item_factors`` (n x d) and optional ``item_bias`` (n,) instead of
``scores`` (a :class:`FactorBatch`): the scores are then computed in cache-sized tiles and counted
while hot, never stored, so the metrics cost about what the scores alone would. With ``scorer=`` (a
LightningModule method's name or a callable), the step hands over ``positives``, ``n_items`` and optional
``exclude``, ``ids``, ``users`` and nothing to score (a :class:`ScorerBatch`): the callback draws the keyed
negatives and has the scorer score the positives and the drawn items only, never a full row.

Both namespaces are supported: ``lightning.pytorch`` and ``pytorch_lightning`` each need their own
``Callback`` base, so the class is built per namespace. ``RankingMetricsCallback`` is the one for
``lightning.pytorch`` when installed (else ``pytorch_lightning``); ``PLRankingMetricsCallback`` is
the ``pytorch_lightning`` one; :func:`callback_class` builds either.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
import warnings
from typing import Any, Callable, Iterable, Mapping, Sequence, Sized, cast

import torch
from torch.utils.data import DistributedSampler

from reco_sampled_plugin._checks import check_int
from reco_sampled_plugin._options import check_bool, check_count, check_names
from reco_sampled_plugin._estimate import Estimate, interval_values

from reco_sampled_plugin.factor_ranks import capture_factor_inputs, check_factors
from reco_sampled_plugin.ranking import capture_inputs, prepare_index
from reco_sampled_plugin.scorer_ranks import DEFAULT_MAX_PAIRS, ScoringCost

from ._shared import (FactorBatch, RankingBatch, RankingSettings, ScorerBatch, as_ranking_batch, metric_key,
                      padded_inputs)
from .torchmetrics import ExactRankingMetrics, SampledRankingMetrics, defers_checks
from reco_sampled_plugin.metric_names import MetricSpec

logger = logging.getLogger(__name__)

__all__ = [
    "RankingMetricsCallback",
    "RankingSettings",
    "PLRankingMetricsCallback",
    "RankingBatch",
    "FactorBatch",
    "ScorerBatch",
    "callback_class",
    "NAMESPACES",
]

NAMESPACES = ("lightning.pytorch", "pytorch_lightning")
_STAGES = {"validate": "val", "test": "test"}


def _defer_index_checks(st: "_LoaderState", pending: list | None) -> None:
    """An accelerator's batch: its index checks (unread, ``ranking.prepare_index(pending=...)``) join the
    ``failed_checks`` state of the first metric it updated, the exact one if any (read at the epoch's end with its
    own, before the other metric's results are computed)."""
    metric = st.exact if st.exact is not None else st.sampled
    if pending and metric is not None:
        metric._defer_checks(pending)


def _find_distributed_sampler(dataloader: Any) -> DistributedSampler | None:
    for holder in (getattr(dataloader, "batch_sampler", None), dataloader):
        sampler = getattr(holder, "sampler", None)
        if isinstance(sampler, DistributedSampler):
            return sampler
    return None


class _LoaderState:
    """Per (stage, dataloader) bookkeeping of one epoch: the metric states and the row position."""

    def __init__(self, exact: ExactRankingMetrics | None, sampled: SampledRankingMetrics | None,
                 sampler: DistributedSampler | None) -> None:
        self.exact = exact
        self.sampled = sampled
        self.sampler = sampler
        self.rows = 0
        self.rows_not_samples = False

    def positions(self, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Global positions of the next ``batch`` rows, and the padding mask (None: no padding).

        A ``DistributedSampler`` (shuffled or not) hands process r the sample at global position
        r + i * W as its i-th sample and pads positions >= len(dataset) with repeats; those rows
        are dropped. Without such a sampler, the position is the running row count. More score rows
        than the sampler's samples (a dataset whose samples hold several users): rows are not samples,
        nothing is dropped from that batch on (warned once).
        """
        local = torch.arange(self.rows, self.rows + batch, device=device, dtype=torch.int64)
        self.rows += batch
        s = self.sampler
        if s is not None and self.rows > s.num_samples:
            if not self.rows_not_samples:
                self.rows_not_samples = True
                warnings.warn(
                    f"RankingMetricsCallback: more score rows ({self.rows}) on this process than its DistributedSampler "
                    f"yields samples ({s.num_samples}): rows are not samples, so its padding cannot be told apart "
                    "and is no longer dropped (return one score row per sample, or pass ids and dedup_padding=False)",
                    RuntimeWarning,
                    stacklevel=4,
                )
        if s is None:
            return local, None
        glob = s.rank + local * s.num_replicas
        n = len(cast(Sized, s.dataset))  # a map-style dataset: DistributedSampler needs its length
        padded = not s.drop_last and s.total_size > n and not self.rows_not_samples
        return glob, (glob < n) if padded else None


def _settings(settings: Any) -> RankingSettings:
    """The callback's metric settings: a :class:`RankingSettings` (None: its defaults)."""
    if settings is None:
        return RankingSettings()
    if not isinstance(settings, RankingSettings):
        raise ValueError(f"settings: expected a RankingSettings such as RankingSettings(('ndcg@10', 'hit@10'), "
                         f"n_samples=100), got {settings!r}")
    return settings


def _score_fn(score_fn: Any) -> Callable[[Any, Any], Any] | None:
    if score_fn is not None and not callable(score_fn):
        raise ValueError(f"score_fn: expected a callable score_fn(pl_module, batch) or None, got {score_fn!r}")
    return score_fn


def _scorer(scorer: Any, settings: RankingSettings) -> Any:
    """``scorer``: a LightningModule method's name or a callable, with sampled metrics only (a ValueError naming
    ``scorer`` otherwise; settings without exact metrics have a design: ``RankingSettings`` checks it)."""
    if scorer is None:
        return None
    if not (callable(scorer) or (isinstance(scorer, str) and scorer.isidentifier())):
        raise ValueError(f"scorer: expected the name of a LightningModule method pl_module.<name>(users, "
                         f"items) or a callable scorer(pl_module, users, items), got {scorer!r}")
    if settings.exact:
        raise ValueError("scorer: exact metrics need every item's score, which a scorer-driven evaluation "
                         "never computes; pass RankingSettings(..., exact=False) (sampled and corrected metrics "
                         "only)")
    return scorer


def _headline(headline: Any, settings: RankingSettings, labels: tuple[str, ...]) -> tuple[str, str]:
    """The (metric, label) also logged as ``val_<metric>``; default the first metric, exact if computed, else the
    first corrected estimator."""
    if headline is None:
        pick = "exact" if settings.exact else next((lab for lab in labels if lab != "sampled"), labels[0])
        return settings.metric_names[0], pick
    if isinstance(headline, str) or not isinstance(headline, (tuple, list)) or len(headline) != 2:
        raise ValueError(f"headline: expected a (metric, label) pair such as ('ndcg@10', 'exact'), got {headline!r}")
    metric = str(_parse(headline[0]))
    if metric not in settings.metric_names or headline[1] not in labels:
        raise ValueError(f"headline: {headline!r} is not among metrics {settings.metric_names} x {labels}")
    return metric, headline[1]


class _RankingMetricsLogic:
    """The callback's behaviour, independent of the Lightning namespace (mixed into its Callback)."""

    def __init__(
        self,
        settings: RankingSettings | None = None,
        *,
        score_fn: Callable[[Any, Any], Any] | None = None,
        scorer: str | Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        max_pairs: int = DEFAULT_MAX_PAIRS,
        stages: Sequence[str] = ("validate", "test"),
        headline: tuple[str, str] | None = None,
        prefix: str = "",
        log_interval: bool = True,
        log_stderr: bool = False,
        dedup_padding: bool = True,
        progress: bool = True,
        plot_every_n_epochs: int | None = None,
    ) -> None:
        super().__init__()
        self.settings = _settings(settings)
        self.score_fn = _score_fn(score_fn)
        self.scorer = _scorer(scorer, self.settings)
        self.max_pairs = check_int(max_pairs, "max_pairs", minimum=1)
        stages = check_names(stages, "stages", "stage names 'validate' and/or 'test'")  # one str: one stage
        bad = [s for s in stages if s not in _STAGES]
        if bad or not stages:
            raise ValueError(f"stages: unknown {bad}; use 'validate' and/or 'test'")
        self.stages = tuple(stages)
        if not isinstance(prefix, str):
            raise ValueError(f"prefix: expected a string, got {prefix!r}")
        self.prefix = prefix
        self.log_interval = check_bool(log_interval, "log_interval")
        self.log_stderr = check_bool(log_stderr, "log_stderr")
        self.dedup_padding = check_bool(dedup_padding, "dedup_padding")
        self.progress = check_bool(progress, "progress")
        self.plot_every_n_epochs = (None if plot_every_n_epochs is None
                                    else check_count(plot_every_n_epochs, "plot_every_n_epochs", 1))
        # the sampled metrics of a callback with exact metrics do not check the scores again: the exact pass does
        self._sampled_settings = (dataclasses.replace(self.settings, check_finite=False) if self.settings.exact
                                  else self.settings)
        self.labels = (("exact",) if self.settings.exact else ()) + self.settings.labels
        self.headline = _headline(headline, self.settings, self.labels)
        self.scoring_costs: dict[str, ScoringCost] = {}
        self._states: dict[tuple[str, int], _LoaderState] = {}
        self.results: dict[str, dict[str, Estimate]] = {}
        self.history: dict[str, list[dict[str, float]]] = {}
        self.plots: list[str] = []

    # ----------------------------------------------------------------------------- names
    def key(self, metric: str, label: str, stage: str = "validate", dataloader_idx: int = 0) -> str:
        """The logged name of one value, e.g. ``val/ndcg_at_10/auto``."""
        return f"{self._stage_prefix(stage, dataloader_idx)}/{metric_key(str(_parse(metric)))}/{label}"

    def _stage_prefix(self, stage: str, dataloader_idx: int) -> str:
        base = f"{self.prefix}{_STAGES[stage]}"
        return base if dataloader_idx == 0 else f"{base}_dl{dataloader_idx}"

    @property
    def monitor(self) -> str:
        """Name of the headline value during validation (for ``ModelCheckpoint`` / ``EarlyStopping``,
        mode ``"max"``): e.g. ``val_ndcg_at_10``. It has no ``/``, so checkpoint file names stay flat."""
        return self.headline_key("validate")

    def headline_key(self, stage: str = "validate", dataloader_idx: int = 0) -> str:
        return f"{self._stage_prefix(stage, dataloader_idx)}_{metric_key(self.headline[0])}"

    # ---------------------------------------------------------------------------- states
    def _state(self, trainer: Any, pl_module: Any, stage: str, dataloader_idx: int) -> _LoaderState:
        st = self._states.get((stage, dataloader_idx))
        if st is None:
            device = pl_module.device
            exact = ExactRankingMetrics.from_settings(self.settings).to(device) if self.settings.exact else None
            # without exact metrics the sampled update checks the scores itself, in its one validation read
            sampled = (SampledRankingMetrics.from_settings(self._sampled_settings).to(device)
                       if self.settings.design is not None else None)
            loaders = trainer.val_dataloaders if stage == "validate" else trainer.test_dataloaders
            if isinstance(loaders, Mapping):
                loaders = list(loaders.values())
            if isinstance(loaders, (list, tuple)):
                loader = loaders[dataloader_idx] if dataloader_idx < len(loaders) else None
            else:
                loader = loaders if dataloader_idx == 0 else None
            sampler = _find_distributed_sampler(loader) if loader is not None else None
            st = self._states[(stage, dataloader_idx)] = _LoaderState(exact, sampled, sampler)
        return st

    def _reset(self, stage: str) -> None:
        for key in [k for k in self._states if k[0] == stage]:
            del self._states[key]

    # ---------------------------------------------------------------------------- batches
    def _batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, stage: str, dataloader_idx: int) -> None:
        if stage not in self.stages or trainer.sanity_checking:
            return
        where = "validation_step" if stage == "validate" else "test_step"
        if self.score_fn is not None:
            rb = as_ranking_batch(self.score_fn(pl_module, batch), "score_fn")
        else:
            rb = as_ranking_batch(outputs, where)
        st = self._state(trainer, pl_module, stage, dataloader_idx)
        if isinstance(rb, FactorBatch):
            self._factor_batch(st, rb)
            return
        if isinstance(rb, ScorerBatch):
            self._scorer_batch(st, pl_module, rb, where if self.score_fn is None else "score_fn")
            return
        scores = rb.scores.detach()
        if capture_inputs(scores, rb.positives, rb.exclude) is not None:  # CUDA, index inputs: all in the graphs
            ids, keep = self._ids_keep(st, scores.shape[0], scores.device, rb.ids)
            if st.exact is not None:
                st.exact.update(scores, rb.positives, rb.exclude, keep)
            if st.sampled is not None:
                st.sampled.update(scores, rb.positives, rb.exclude, ids, keep)
            return
        pending: list | None = [] if defers_checks(scores.device) else None  # an accelerator: the index checks unread
        pos, exc = padded_inputs(scores, rb.positives, rb.exclude, pending, bucket=True)  # masks: shapes that repeat
        ids, keep = self._ids_keep(st, scores.shape[0], scores.device, rb.ids)
        if st.exact is not None:
            st.exact.update_padded(scores, pos, exc, keep)
        if st.sampled is not None:
            st.sampled.update_padded(scores, pos, exc, ids, keep)
        _defer_index_checks(st, pending)

    def _factor_batch(self, st: _LoaderState, fb: FactorBatch) -> None:
        """Ranks from factors: exact ranks from cache-sized score tiles, sampled ranks from dot products
        with the keyed negatives; the (B, n) scores are never formed."""
        # not detached (the factor kernels run under no_grad): a detached parameter inside Lightning's
        # inference mode is an inference tensor, with no version counter to key the cached item-factor norm
        u, v, bias = check_factors(fb.user_factors, fb.item_factors, fb.item_bias)
        if capture_factor_inputs(u, v, bias, fb.positives, fb.exclude) is not None:  # CUDA, index inputs: the graphs
            ids, keep = self._ids_keep(st, u.shape[0], u.device, fb.ids)
            if st.exact is not None:
                st.exact.update_factors(u, v, fb.positives, fb.exclude, keep, item_bias=bias)
            if st.sampled is not None:
                st.sampled.update_factors(u, v, fb.positives, fb.exclude, ids, keep, item_bias=bias)
            return
        pending: list | None = [] if defers_checks(u.device) else None  # an accelerator: the index checks unread
        pos, exc = prepare_index(fb.positives, fb.exclude, u.shape[0], v.shape[0], u.device, pending=pending,
                                 bucket=True)
        ids, keep = self._ids_keep(st, u.shape[0], u.device, fb.ids)
        s_pos = None
        if st.exact is not None:  # checks the factors (through its overflow bound)
            s_pos = st.exact.update_factors_padded(u, v, bias, pos, exc, keep)
        if st.sampled is not None:  # alone, it checks them in its one validation read
            st.sampled.update_factors_padded(u, v, bias, pos, exc, ids, keep, s_pos,
                                             check_finite=st.exact is None and bool(self.settings.check_finite))
        _defer_index_checks(st, pending)

    def _scorer_batch(self, st: _LoaderState, pl_module: Any, sb: ScorerBatch, where: str) -> None:
        """Sampled ranks through the scorer (``SampledRankingMetrics.update_from_scorer``): the keyed negatives
        of the rows' ids, only the positives and their drawn items scored; no score row is formed."""
        if self.scorer is None:
            raise ValueError(f"{where}: the batch has 'n_items' but no 'scores' or factors: pass scorer= to the "
                             "callback (a LightningModule method's name or a callable) to score the drawn items")
        assert st.sampled is not None  # a scorer needs n_samples (refused when the callback is built)
        positives = sb.positives
        b = positives.shape[0] if isinstance(positives, torch.Tensor) and positives.dim() else len(positives)
        device = positives.device if isinstance(positives, torch.Tensor) else pl_module.device
        ids, keep = self._ids_keep(st, b, device, sb.ids)
        users = sb.users if sb.users is not None else ids
        st.sampled.update_from_scorer(self._bound_scorer(pl_module), positives, sb.n_items, sb.exclude, ids, users,
                                      keep, self.max_pairs)

    def _bound_scorer(self, pl_module: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``scorer(users, items)`` for the core loop: the module's method, or the callable with the module bound
        (named as the callable, so the loop's errors name it)."""
        if isinstance(self.scorer, str):
            fn = getattr(pl_module, self.scorer, None)
            if not callable(fn):
                raise ValueError(f"scorer: {type(pl_module).__name__} has no method {self.scorer!r} to score "
                                 "(users, items)")
            return fn
        fn = self.scorer
        assert fn is not None  # _scorer_batch checked it

        def scorer(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
            return fn(pl_module, users, items)

        scorer.__qualname__ = getattr(fn, "__qualname__", None) or type(fn).__name__
        return scorer

    def _ids_keep(self, st: _LoaderState, b: int, device: torch.device, ids: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Instance ids of the next ``b`` rows (the step's, else their global positions) and the keep mask."""
        glob, keep = st.positions(b, device)
        if not self.dedup_padding:
            keep = None
        return (glob if ids is None else ids), keep  # the step's ids: converted and checked by the sampled metric

    # -------------------------------------------------------------------------- epoch end
    def _epoch_end(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage not in self.stages:
            return
        if trainer.sanity_checking:
            self._reset(stage)
            return
        states = sorted((k[1], v) for k, v in self._states.items() if k[0] == stage)
        values: dict[str, float] = {}
        results: dict[str, Estimate] = {}
        bar = self.progress and trainer.is_global_zero and getattr(trainer, "progress_bar_callback", None) is not None
        for idx, st in states:
            est: dict[str, Estimate] = {}
            if st.exact is not None:
                est.update(st.exact.estimates())
            if st.sampled is not None:
                sampled_est = st.sampled.estimates(progress=_tqdm_wrapper(stage) if bar else False)
                est.update(sampled_est)
                cost = next((e.details["adaptive"] for e in sampled_est.values() if "adaptive" in e.details), None)
                if cost is not None:  # what adaptive sampling cost, once per loader
                    prefix = self._stage_prefix(stage, idx)
                    for name in ("mean_samples", "max_samples", "share_at_cap"):
                        values[f"{prefix}/adaptive/{name}"] = float(cost[name])
                if self.scorer is not None:  # what the scorer's calls cost, summed over the processes
                    spent = st.sampled.scoring_cost(sync=True)
                    self.scoring_costs[self._stage_prefix(stage, idx)] = spent
                    prefix = self._stage_prefix(stage, idx)
                    for name in ("pairs", "calls", "share_of_full", "scorer_seconds", "loop_seconds"):
                        values[f"{prefix}/scoring/{name}"] = float(getattr(spent, name))
            for name, e in est.items():
                metric, label = name.rsplit("/", 1)
                k = self.key(metric, label, stage, idx)
                results[k] = e
                values[k] = e.value
                # the 95% interval (widened where the top is unresolved; none for exact values), stderr opt-in
                values.update(interval_values(k, e, interval=self.log_interval and label != "exact",
                                              stderr=self.log_stderr))
            h = self.key(self.headline[0], self.headline[1], stage, idx)
            if h in values:
                values[self.headline_key(stage, idx)] = values[h]
        self._reset(stage)
        if not values:
            return
        self.results[stage] = results
        self.history.setdefault(stage, []).append({"epoch": trainer.current_epoch, **values})
        # every process holds the same synced values: the mean over processes is the value itself
        pl_module.log_dict(values, on_step=False, on_epoch=True, sync_dist=True, add_dataloader_idx=False)
        if self.plot_every_n_epochs and trainer.is_global_zero:
            if len(self.history[stage]) % self.plot_every_n_epochs == 0 or stage == "test":
                self._plot(trainer, stage)

    # ------------------------------------------------------------------------------- plot
    def _plot(self, trainer: Any, stage: str) -> None:
        """Sampled vs corrected vs exact values over epochs, one panel per metric, to the loggers."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        hist = self.history[stage]
        epochs = [row["epoch"] for row in hist]
        names = self.settings.metric_names
        fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
        for ax, metric in zip(axes[0], names):
            for label in self.labels:
                k = self.key(metric, label, stage)
                ys = [row.get(k, math.nan) for row in hist]
                styles: dict[str, dict[str, Any]] = {"exact": dict(color="black", lw=2.2), "sampled": dict(ls="--")}
                style = styles.get(label, {})
                ax.plot(epochs, ys, marker="o", ms=3, label=label, **style)
            ax.set_title(f"{metric} ({_STAGES[stage]})")
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        tag = f"{self.prefix}{_STAGES[stage]}/ranking_metrics"
        epoch = trainer.current_epoch
        fname = f"{self.prefix}{_STAGES[stage]}_ranking_metrics_epoch{epoch:04d}.png"
        for trainer_logger in trainer.loggers:
            exp: Any = getattr(trainer_logger, "experiment", None)
            kind = type(trainer_logger).__name__
            if kind == "TensorBoardLogger" and hasattr(exp, "add_figure"):
                exp.add_figure(tag, fig, global_step=trainer.global_step, close=False)
            elif kind == "MLFlowLogger" and hasattr(exp, "log_figure"):
                exp.log_figure(trainer_logger.run_id, fig, f"ranking_metrics/{fname}")
            elif kind == "WandbLogger" and hasattr(trainer_logger, "log_image"):
                trainer_logger.log_image(key=tag, images=[fig])
            else:
                folder = getattr(trainer_logger, "log_dir", None) or trainer.default_root_dir
                path = os.path.join(folder, "ranking_metrics", fname)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fig.savefig(path, dpi=90)
                self.plots.append(path)
                logger.debug("ranking metrics plot: %s takes no figure, written to %s", kind, path)
        if not trainer.loggers:
            path = os.path.join(trainer.default_root_dir, "ranking_metrics", fname)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fig.savefig(path, dpi=90)
            self.plots.append(path)
            logger.debug("ranking metrics plot: the trainer has no logger, written to %s", path)
        plt.close(fig)

    # ------------------------------------------------------------------------------ hooks
    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._batch_end(trainer, pl_module, outputs, batch, "validate", dataloader_idx)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._batch_end(trainer, pl_module, outputs, batch, "test", dataloader_idx)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._reset("validate")

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._reset("test")

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._epoch_end(trainer, pl_module, "validate")

    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._epoch_end(trainer, pl_module, "test")


def _parse(metric: str) -> MetricSpec:
    from reco_sampled_plugin.metric_names import parse_metric

    return parse_metric(metric)


def _tqdm_wrapper(stage: str) -> Callable[[Iterable], Iterable]:
    def wrap(jobs: Iterable) -> Iterable:
        from .._progress import progress_bar

        return progress_bar(jobs, desc=f"ranking metrics ({_STAGES[stage]})", enabled=True, unit="estimate")

    return wrap


# ------------------------------------------------------------------------ per-namespace classes
_CLASSES: dict[str, type] = {}


def _available(namespace: str) -> bool:
    try:
        importlib.import_module(namespace)
    except ImportError:
        return False
    return True


def _default_namespace() -> str:
    for ns in NAMESPACES:
        if _available(ns):
            return ns
    raise ImportError(
        "reco_sampled_plugin.adapters.lightning needs Lightning: pip install lightning (or pytorch-lightning)"
    )


def callback_class(namespace: str | None = None) -> type:
    """The callback class for ``"lightning.pytorch"`` or ``"pytorch_lightning"`` (default: whichever
    is installed, ``lightning.pytorch`` first). Built once per namespace."""
    ns = _default_namespace() if namespace is None else namespace
    if not isinstance(ns, str) or ns not in NAMESPACES:
        raise ValueError(f"namespace: use one of {NAMESPACES}, got {ns!r}")
    cls = _CLASSES.get(ns)
    if cls is None:
        base = importlib.import_module(ns).Callback
        name = "RankingMetricsCallback" if ns == _default_namespace() else "PLRankingMetricsCallback"
        cls = type(
            name,
            (_RankingMetricsLogic, base),
            {"__module__": __name__, "__qualname__": name, "__doc__": _CALLBACK_DOC.format(namespace=ns)},
        )
        _CLASSES[ns] = cls
    return cls


_CALLBACK_DOC = """Exact, sampled and corrected ranking metrics for ``{namespace}``.

    Args:
        settings: the metric settings, a :class:`~reco_sampled_plugin.adapters.lightning.RankingSettings` (the
            object the torchmetrics classes take: ``SampledRankingMetrics.from_settings``; default
            ``RankingSettings()``): the metrics; ``exact`` (full-catalogue metrics); ``n_samples``, m or a
            :class:`~reco_sampled_plugin.design.SamplingDesign` (None: no sampled metrics; adaptive designs log
            their cost as ``val/adaptive/mean_samples``, ``.../max_samples`` and ``.../share_at_cap``); the
            ``estimators`` run on the sampled ranks, each logged under its label (the name, ``none``:
            ``sampled``, then each option set away from its default as ``_<option>-<value>``: ``bv_gamma-0.2``);
            ``seed``, ``ties``, ``count_other_positives``, ``max_n_groups``; ``check_finite`` (True: NaN or inf
            anywhere in a step's scores is a ValueError, checked in the exact metrics' counting pass at no
            measurable cost, or by one extra pass without exact metrics; ``"positives"``; False).
        score_fn: ``score_fn(pl_module, batch)`` -> dict / RankingBatch / FactorBatch; default: the
            step's output.
        stages: ``("validate", "test")`` or a subset.
        headline: (metric, label) also logged as ``val_<metric>`` (see :attr:`monitor`); default the
            first metric, exact if computed, else the first corrected estimator.
        prefix: prepended to every logged name.
        log_interval: log ``<name>_lo`` and ``<name>_hi`` beside each estimate, its 95% interval (default True;
            ``Estimate.interval``: honest about the unresolved top; not for the exact values). Where the top is
            unresolved, why is logged once (a warning, with the ``reco-sampled plan`` command).
        log_stderr: also log ``<name>_stderr``, the standard error: sampling noise only (default False).
        dedup_padding: drop the rows a DistributedSampler pads with (default True).
        progress: a tqdm bar over the epoch-end estimators (rank zero, when the trainer shows progress).
        plot_every_n_epochs: every k epochs, plot exact vs sampled vs corrected values over epochs
            to the loggers (TensorBoard figure, MLflow artifact, W&B image, else a PNG in the log dir).
        scorer: evaluate through a scorer, never a full score row (docs/scorer.md): the name of a
            LightningModule method ``pl_module.<name>(users, items) -> scores`` or a callable
            ``scorer(pl_module, users, items) -> scores`` (users (B',) int64, items (B', L) int64 on the module's
            device; (B', L) scores back there; pointwise). The step (or ``score_fn``) then returns ``positives``,
            ``n_items`` and optional ``exclude``, ``ids``, ``users`` (the ids the scorer gets; default the
            instance ids) and no ``scores``. Needs ``RankingSettings(..., exact=False)``. The cost is logged as
            ``val/scoring/pairs``,
            ``.../calls``, ``.../share_of_full``, ``.../scorer_seconds``, ``.../loop_seconds`` (summed over the
            processes) and kept in :attr:`scoring_costs`.
        max_pairs: at most this many (user, item) pairs per scorer call.

    Logged names: ``{{prefix}}val/<metric>/<label>`` (``@`` written ``_at_``), e.g. ``val/ndcg_at_10/exact``,
    ``val/ndcg_at_10/sampled``, ``val/ndcg_at_10/auto`` with ``val/ndcg_at_10/auto_lo`` and ``_hi``; ``test/...`` in testing; ``_dl<k>`` after the stage
    for dataloader k > 0. After each epoch, :attr:`results` maps those names to Estimate objects
    (float64 value, stderr) and :attr:`history` keeps the values per epoch. A value that could not be computed is
    logged as NaN and its Estimate flagged: ``no_instances`` (nothing counted, e.g. every row dropped as padding),
    ``estimator_failed`` (with a warning); one relevant item gives stderr inf, flagged ``few_instances``.
    """


def __getattr__(name: str) -> type:
    if name == "RankingMetricsCallback":
        return callback_class()
    if name == "PLRankingMetricsCallback":
        return callback_class("pytorch_lightning")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
