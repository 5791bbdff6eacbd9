"""RecBole adapter: exact, sampled and corrected ranking metrics as RecBole metrics.

Import this module once (or call :func:`run_recbole`) and name the plugin's metrics in a RecBole config::

    metrics: [Recall, NDCG, CorrectedRecall, CorrectedNDCG, MappedHit]
    rsp_m: 100            # full mode: simulate 100 uniformly sampled items per relevant item

Importing applies the compatibility layer (:mod:`._recbole_compat`, switch off with
``RECO_SAMPLED_RECBOLE_COMPAT=0``) and :func:`register` s the metrics in RecBole's registries in place.
RecBole 1.2.1 gives metrics no per-positive ranks, so the plugin wraps its ``Collector``: every held-out
(user, item) pair becomes one evaluation instance with

* full mode: its exact rank among the user's candidates (training items, and validation items at test
  time, excluded as RecBole does), and, with ``rsp_m``, a sampled rank against ``rsp_m`` items drawn
  (seeded) from the user's irrelevant items;
* ``uniN`` / ``popN`` modes: its sampled rank against its own N draws, rebuilt from the interaction layout
  (row ``o_u + k_u + j k_u + i`` of a user's block holds negative j of its positive i), not RecBole's pooled
  ranking against all of the user's negatives;

and the user's candidate count n (irrelevant items + 1). Estimates come from
:func:`reco_sampled_plugin.estimators.estimate`. See ``docs/recbole.md`` for every name and key.

This module holds the public API and the hooks into RecBole; the parts live beside it: the config keys and
their validation (``_recbole_settings``), the per-positive table built from RecBole's batches
(``_recbole_ranks``), the adaptive stages of ``uniN`` mode scored through the model's ``predict``
(``_recbole_stages``), the metric classes (``_recbole_metrics``), the compatibility layer (``_recbole_compat``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import _recbole_compat
from ._recbole_metrics import _METRIC_CLASSES, metric_classes
from ._recbole_ranks import COLUMNS, PLUGIN_KEY, collect_batch, finish_collection, positive_table, reset_collection
from ._recbole_settings import CONFIG_DEFAULTS, FAMILIES, _Settings, _settings, validate_config

if TYPE_CHECKING:
    import torch
from ._recbole_stages import keep_positive_rows, later_scoring

__all__ = [
    "register",
    "registered",
    "run_recbole",
    "validate_config",
    "metric_classes",
    "positive_table",
    "COLUMNS",
    "PLUGIN_KEY",
    "CONFIG_DEFAULTS",
    "FAMILIES",
]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------- registration
_registered = False


def _wrap_config() -> None:
    from recbole.config import configurator

    cls = configurator.Config
    if getattr(cls.__init__, "_reco_sampled", False):
        return
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _settings(self)  # validate the plugin keys before any data is loaded or model trained

    __init__._reco_sampled = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__doc__ = original.__doc__
    cls.__init__ = __init__


def _wrap_collector() -> None:
    from recbole.evaluator.collector import Collector

    if getattr(Collector.eval_batch_collect, "_reco_sampled", False):
        return
    collect, get_struct = Collector.eval_batch_collect, Collector.get_data_struct

    def eval_batch_collect(self: Any, scores_tensor: torch.Tensor, interaction: Any, positive_u: torch.Tensor,
                           positive_i: torch.Tensor) -> None:
        collect(self, scores_tensor, interaction, positive_u, positive_i)
        collect_batch(self, scores_tensor, interaction, positive_u, positive_i)
        settings = self.__dict__.get("_rsp_settings_now")
        if settings is not None and _scores_later(settings) and len(interaction) != scores_tensor.shape[0]:
            keep_positive_rows(self, interaction, positive_u, positive_i)  # uniN / popN: context of later scoring

    def get_data_struct(self: Any) -> Any:
        table = finish_collection(self)
        settings = self.__dict__.get("_rsp_settings_now")
        if table is not None and settings is not None and _scores_later(settings):
            _later_scoring(self, table, settings)
        struct = get_struct(self)
        if table is not None:
            struct.set(PLUGIN_KEY, table)
        reset_collection(self)
        return struct

    for new, old in ((eval_batch_collect, collect), (get_data_struct, get_struct)):
        new._reco_sampled = True  # type: ignore[union-attr]  # a marker attribute on the function
        new.__wrapped__ = old  # type: ignore[union-attr]
        new.__doc__ = old.__doc__
    Collector.eval_batch_collect = eval_batch_collect
    Collector.get_data_struct = get_data_struct


def _scores_later(settings: _Settings) -> bool:
    """Whether the plugin scores pairs itself after RecBole's sampled batches (adaptive stages, an exact share)."""
    return settings.adaptive_max is not None or settings.exact_share is not None


def _later_scoring(collector: Any, table: torch.Tensor, settings: _Settings) -> None:
    """uniN with ``rsp_adaptive_max``: the later stages; uniN / popN with ``rsp_exact_share``: the share's users
    scored whole (``_recbole_stages.later_scoring``); what the evaluation scored is logged and kept as
    ``collector.rsp_cost`` (a ``ScoringCost``)."""
    done = later_scoring(collector, table, settings)
    if done is None:
        return
    cost, what = done
    collector.rsp_cost = cost
    logger.info(
        "reco_sampled_plugin: %s scored %d (user, item) pairs in %d stage(s) (%.1f%% of full ranking's %d): "
        "RecBole's first stage and %d plugin predict call(s), %.3f s in predict, %.3f s drawing and counting", what,
        cost.pairs, cost.stages, 100 * cost.share_of_full, cost.full_pairs, cost.calls, cost.scorer_seconds,
        cost.loop_seconds)


def _plugin_keys(result: dict, settings: _Settings) -> list[str]:
    prefixes = tuple(settings.metrics)
    return [k for k in result if isinstance(k, str) and k.split("@")[0].split("/")[0] in prefixes]


def _wrap_trainer() -> None:
    from recbole.trainer.trainer import Trainer

    if getattr(Trainer.evaluate, "_reco_sampled", False):
        return
    original = Trainer.evaluate

    def evaluate(self: Any, eval_data: Any, *args: Any, **kwargs: Any) -> Any:
        collector = getattr(self, "eval_collector", None)
        if collector is not None:
            reset_collection(collector, eval_data)
            collector._rsp_model, collector._rsp_device = self.model, self.device  # uniN adaptive stages score with it
        result = original(self, eval_data, *args, **kwargs)
        settings = _settings(self.config) if result else None
        writer = getattr(self, "tensorboard", None)
        if settings is not None and settings.tensorboard and writer is not None:
            phase = getattr(getattr(eval_data, "_sampler", None), "phase", None) or "eval"
            steps = self.__dict__.setdefault("_rsp_tb_steps", {})
            step = steps.get(phase, 0)
            for key in _plugin_keys(result, settings):
                writer.add_scalar(f"reco_sampled/{phase}/{key}", float(result[key]), step)
            writer.flush()
            steps[phase] = step + 1
        return result

    evaluate._reco_sampled = True  # type: ignore[attr-defined]
    evaluate.__wrapped__ = original  # type: ignore[attr-defined]
    evaluate.__doc__ = original.__doc__
    Trainer.evaluate = evaluate


def register(compat: bool | None = None) -> dict[str, type]:
    """Register the plugin's metrics in RecBole's registries, in place (idempotent; call before ``Config``).

    Adds every class of :func:`metric_classes` to ``metrics_dict``, ``metric_information``,
    ``metric_types`` (and ``smaller_metrics`` for none: all are bigger-is-better), wraps
    ``Collector.eval_batch_collect`` / ``get_data_struct`` (per-positive ranks, only when a plugin
    metric is configured; ``uniN`` with ``rsp_adaptive_max``: the later stages), ``Trainer.evaluate``
    (TensorBoard; hands the model to the collector) and ``Config.__init__`` (validation).

    Args:
        compat: True applies the compatibility layer, False leaves it off, None follows the environment.
    """
    global _registered
    _recbole_compat.apply(enabled=compat)
    from recbole.evaluator import register as reg

    for name, cls in _METRIC_CLASSES.items():
        reg.metrics_dict[name] = cls
        reg.metric_information[name] = cls.metric_need
        reg.metric_types[name] = cls.metric_type
        if cls.smaller and name not in reg.smaller_metrics:
            reg.smaller_metrics.append(name)
    _wrap_config()
    _wrap_collector()
    _wrap_trainer()
    if not _registered:
        logger.debug("reco_sampled_plugin: registered %d RecBole metrics", len(_METRIC_CLASSES))
    _registered = True
    return metric_classes()


def registered() -> bool:
    """True once :func:`register` has run."""
    return _registered


def run_recbole(
    model: str | None = None,
    dataset: str | None = None,
    config_file_list: list[str] | None = None,
    config_dict: dict | None = None,
    saved: bool = True,
    compat: bool | None = None,
) -> dict:
    """Register the plugin, then run ``recbole.quick_start.run_recbole`` (same arguments and result).

    Args:
        compat: True/False force the compatibility layer on/off; None follows ``RECO_SAMPLED_RECBOLE_COMPAT``.
    """
    from reco_sampled_plugin._options import check_bool

    saved = check_bool(saved, "saved")
    register(compat=compat)
    from recbole.quick_start import run_recbole as _run

    return _run(model=model, dataset=dataset, config_file_list=config_file_list, config_dict=config_dict, saved=saved)


register()

