"""
==================================================================================================
Ranking metrics for recommenders evaluated on sampled items (:mod:`reco_sampled_plugin`)
==================================================================================================

.. currentmodule:: reco_sampled_plugin

One flow: scores (B x n, any device) -> exact or sampled ranks per relevant item -> the histogram of sampled
ranks -> an estimator (a correction table, a mapping, a rank-distribution fit) -> an :class:`Estimate` (value,
stderr, details, flags, an honest interval). Ranks are 1-based; n counts the candidates of an instance (the
relevant item included), m the sampled irrelevant items. The layers and the rules that keep them apart:
docs/architecture.md. ``import reco_sampled_plugin as rsp`` imports nothing heavy: each name below is imported on
first use (torch, numpy and scipy only; PEP 562), so ``reco-sampled --help`` starts without torch.

Ranks
=====

.. autosummary::
   :toctree: generated/

   exact_ranks -- exact rank of every relevant item among its candidates (scores of any device)
   exact_ranks_from_factors -- exact ranks from user and item factors, without the full score matrix
   sampled_ranks -- ranks among m drawn irrelevant items (a SamplingDesign or an int m)
   SampledRanks -- sampled ranks with their candidate counts, negatives and design
   sampled_ranks_from_scorer -- sampled ranks scoring only the drawn pairs (a scorer(users, items) callable)
   ScoringCost -- what the scorer loop cost: pairs, calls, seconds, and full ranking's pairs
   candidate_counts -- candidates per row: items minus the excluded ones
   adaptive_sampled_ranks -- adaptive sampling from scores: positives still first draw again
   adaptive_sampled_ranks_from_exact -- adaptive sampling simulated from exact ranks
   simulate_sampled_ranks -- sampled ranks drawn from exact ranks under the sampling law
   draw_sampled_ranks -- many independent draws of sampled ranks (simulation studies)
   RankHistogram -- the histogram of sampled ranks by (n, m): everything an estimator needs
   sampled_rank_histogram -- the histogram of sampled ranks (additive over batches and processes)

Metrics
=======

.. autosummary::
   :toctree: generated/

   MetricSpec -- a parsed metric name (kind and cut-off)
   parse_metric -- ``"ndcg@10"`` -> MetricSpec
   metric_values -- M(r) at given ranks
   metric_curve -- the whole table M(1), ..., M(n)
   per_user_metrics -- per-user metrics straight from a score batch
   per_user_metrics_from_factors -- per-user metrics straight from user and item factors
   user_metric_values -- one metric per user from the exact ranks of that user's relevant items
   mean_metrics -- means over users with a defined value
   DEFAULT_METRICS -- the metrics reported when none are named

Sampling designs
================

.. autosummary::
   :toctree: generated/

   SamplingDesign -- how the m irrelevant items are drawn, validated once
   as_design -- the one coercion: int m, (m, cap) or a design -> SamplingDesign
   popularity_weights -- RecBole's popularity weights count^alpha (count 0: never drawn)
   AdaptiveDesign -- start m and cap of adaptive sampling (its stages)
   expected_sampled -- E[M(r~) | r]: the expected sampled metric at each exact rank
   sampled_rank_pmf -- P(r~ = i | r), the sampling law
   log_sampled_rank_pmf -- log P(r~ = i | r)

Estimators
==========

.. autosummary::
   :toctree: generated/

   estimate -- the full-catalogue metric from sampled ranks, with a standard error (any registered method)
   Estimate -- value, stderr, n_instances, details, flags and interval() (the 95% interval every output shows)
   explain_flags -- each flag of an Estimate in words, with the advice (the one mapping every output uses)
   registry -- the estimator table: every list of methods is a view of it
   Estimator -- one registry entry (family, options, designs supported, summary)
   register -- add an estimator: every entry point offers it from then on
   DEFAULT_ESTIMATOR -- the method of estimate() when none is named
   ESTIMATORS -- the registered methods (a live view of the registry)
   METHODS -- the correction-table methods (a live view of the registry)
   correction_table -- the m + 1 corrected values of one (metric, n, m, method)
   expected_corrected -- E[M^(r~) | r] of a correction table
   table_bias -- the prior-weighted squared bias of a table
   clear_correction_cache -- empty the cache of correction tables
   corrected_metric -- the corrected sampled metric with its standard error
   corrected_values -- per-instance corrected values
   mapping -- Li et al.'s global location f(k) of a sampled cut-off
   fit_beta -- the algorithm-specific Beta shape a (Li et al.'s eq. 19)
   BetaFit -- the fitted shape
   mapping_estimate -- a global metric by mapping sampled ranks onto exact ones
   mapped_points -- the mapped points (f(k), SHR@k)
   sampled_hit_rate_curve -- SHR@k with its binomial standard error
   dataset_beta -- the Beta fit summarised over several recommenders
   estimate_rank_distribution -- the distribution of exact ranks fitted by likelihood (mle, mes)
   RankDistribution -- a fitted rank distribution (pmf, cdf, prior, metric)
   Prior -- the prior interface of the corrections
   UniformPrior -- uniform over the ranks
   BetaPrior -- a Beta(a, 1) prior over relative ranks
   VectorPrior -- an explicit vector over ranks
   CallablePrior -- a prior given as a function of the rank
   fit_beta_prior -- a Beta prior fitted to sampled ranks
   empirical_prior -- a smoothed histogram of exact ranks as a prior

Intervals
=========

.. autosummary::
   :toctree: generated/

   identified_interval -- every value the data allow when the top is unresolved
   IdentifiedInterval -- the bounds of a metric over the rank distributions consistent with the data
   TopShape -- the shape assumption inside the first sampled bin
   paired_difference -- the difference of two models on the same instances, with its stderr

Evaluation
==========

.. autosummary::
   :toctree: generated/

   evaluate_factors -- per-user ranking metrics of a factor model (exact, or sampled with estimates)
   FactorEvaluation -- its result when sampling (per-user values and the estimates)
   ordering_agreement -- how often a corrected metric orders two models as the exact one does
   consistency_report -- Krichene & Rendle's tables 3 and 4 for your recommenders

Planning
========

.. autosummary::
   :toctree: generated/

   AdaptiveCost -- what an adaptive design spends (mean and largest m, share at the cap)
   adaptive_cost -- the AdaptiveCost of a histogram of adaptive ranks

The planner itself (which design to run) is ``reco_sampled_plugin.planner.plan`` and ``reco-sampled plan``.

Data and splits
===============

.. autosummary::
   :toctree: generated/

   split_train_test -- a train/test split of interactions (as recometrics splits)
   leave_last_out_split -- hold out each user's latest interaction

Entry points outside this namespace
===================================

``reco_sampled_plugin.adapters`` (RecBole metrics, the Lightning callback, torchmetrics Metric classes: they
import their framework), ``reco_sampled_plugin.cli`` (``reco-sampled``), ``reco_sampled_plugin.planner``,
``reco_sampled_plugin.datasets`` and ``reco_sampled_plugin.baselines``.
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING

from . import registry  # the estimator table: standard library only
from .registry import DEFAULT_ESTIMATOR, Estimator, register

from typing import Any

if TYPE_CHECKING:  # the names below are imported on first use (PEP 562, ``__getattr__`` at the end)
    from ._rank_hist import RankHistogram, sampled_rank_histogram
    from .adaptive import AdaptiveCost, AdaptiveDesign, adaptive_cost, adaptive_sampled_ranks, adaptive_sampled_ranks_from_exact
    from .consistency import consistency_report, ordering_agreement
    from .corrections import clear_correction_cache, correction_table, expected_corrected, table_bias
    from .design import SamplingDesign, as_design, popularity_weights
    from .estimate import Estimate, explain_flags
    from .estimators import estimate
    from .factor_ranks import exact_ranks_from_factors
    from .factors import FactorEvaluation, evaluate_factors
    from .identification import IdentifiedInterval, TopShape, identified_interval
    from .mapping import BetaFit, dataset_beta, fit_beta, mapped_points, mapping, mapping_estimate, sampled_hit_rate_curve
    from .metric_names import MetricSpec, parse_metric
    from .metrics import metric_curve, metric_values
    from .priors import BetaPrior, CallablePrior, Prior, UniformPrior, VectorPrior, empirical_prior, fit_beta_prior
    from .rank_distribution import RankDistribution, estimate_rank_distribution, simulate_sampled_ranks
    from .ranking import SampledRanks, candidate_counts, exact_ranks, sampled_ranks
    from .scorer_ranks import ScoringCost, sampled_ranks_from_scorer
    from .sampling_laws import expected_sampled, log_sampled_rank_pmf, sampled_rank_pmf
    from .simulate import draw_sampled_ranks
    from .splits import leave_last_out_split, split_train_test
    from .uncertainty import corrected_metric, corrected_values, paired_difference
    from .user_metrics import DEFAULT_METRICS, mean_metrics, per_user_metrics, per_user_metrics_from_factors, user_metric_values

# The one place of the version: pyproject.toml reads it ([tool.setuptools.dynamic]); CHANGELOG.md names each release.
__version__ = "0.1.0"

__all__ = [
    # ranks
    "exact_ranks",
    "exact_ranks_from_factors",
    "sampled_ranks",
    "SampledRanks",
    "sampled_ranks_from_scorer",
    "ScoringCost",
    "candidate_counts",
    "adaptive_sampled_ranks",
    "adaptive_sampled_ranks_from_exact",
    "simulate_sampled_ranks",
    "draw_sampled_ranks",
    "RankHistogram",
    "sampled_rank_histogram",
    # metrics
    "MetricSpec",
    "parse_metric",
    "metric_values",
    "metric_curve",
    "per_user_metrics",
    "per_user_metrics_from_factors",
    "user_metric_values",
    "mean_metrics",
    "DEFAULT_METRICS",
    # sampling designs
    "SamplingDesign",
    "as_design",
    "popularity_weights",
    "AdaptiveDesign",
    "expected_sampled",
    "sampled_rank_pmf",
    "log_sampled_rank_pmf",
    # estimators
    "estimate",
    "Estimate",
    "explain_flags",
    "registry",
    "Estimator",
    "register",
    "DEFAULT_ESTIMATOR",
    "ESTIMATORS",
    "METHODS",
    "correction_table",
    "expected_corrected",
    "table_bias",
    "clear_correction_cache",
    "corrected_metric",
    "corrected_values",
    "mapping",
    "fit_beta",
    "BetaFit",
    "mapping_estimate",
    "mapped_points",
    "sampled_hit_rate_curve",
    "dataset_beta",
    "estimate_rank_distribution",
    "RankDistribution",
    "Prior",
    "UniformPrior",
    "BetaPrior",
    "VectorPrior",
    "CallablePrior",
    "fit_beta_prior",
    "empirical_prior",
    # intervals
    "identified_interval",
    "IdentifiedInterval",
    "TopShape",
    "paired_difference",
    # evaluation
    "evaluate_factors",
    "FactorEvaluation",
    "ordering_agreement",
    "consistency_report",
    # planning
    "AdaptiveCost",
    "adaptive_cost",
    # data and splits
    "split_train_test",
    "leave_last_out_split",
]

# Where each re-exported name lives: imported on first access (PEP 562), so ``import reco_sampled_plugin`` and
# ``reco-sampled --help`` import neither torch nor scipy.
_LAZY: dict[str, str] = {
    "RankHistogram": "_rank_hist",
    "sampled_rank_histogram": "_rank_hist",
    "AdaptiveCost": "adaptive",
    "AdaptiveDesign": "adaptive",
    "adaptive_cost": "adaptive",
    "adaptive_sampled_ranks": "adaptive",
    "adaptive_sampled_ranks_from_exact": "adaptive",
    "consistency_report": "consistency",
    "ordering_agreement": "consistency",
    "clear_correction_cache": "corrections",
    "correction_table": "corrections",
    "expected_corrected": "corrections",
    "table_bias": "corrections",
    "SamplingDesign": "design",
    "as_design": "design",
    "popularity_weights": "design",
    "Estimate": "estimate",
    "explain_flags": "estimate",
    "estimate": "estimators",
    "exact_ranks_from_factors": "factor_ranks",
    "sampled_ranks_from_scorer": "scorer_ranks",
    "ScoringCost": "scorer_ranks",
    "FactorEvaluation": "factors",
    "evaluate_factors": "factors",
    "IdentifiedInterval": "identification",
    "TopShape": "identification",
    "identified_interval": "identification",
    "BetaFit": "mapping",
    "dataset_beta": "mapping",
    "fit_beta": "mapping",
    "mapped_points": "mapping",
    "mapping": "mapping",
    "mapping_estimate": "mapping",
    "sampled_hit_rate_curve": "mapping",
    "MetricSpec": "metric_names",
    "parse_metric": "metric_names",
    "metric_curve": "metrics",
    "metric_values": "metrics",
    "BetaPrior": "priors",
    "CallablePrior": "priors",
    "Prior": "priors",
    "UniformPrior": "priors",
    "VectorPrior": "priors",
    "empirical_prior": "priors",
    "fit_beta_prior": "priors",
    "RankDistribution": "rank_distribution",
    "estimate_rank_distribution": "rank_distribution",
    "simulate_sampled_ranks": "rank_distribution",
    "SampledRanks": "ranking",
    "candidate_counts": "ranking",
    "exact_ranks": "ranking",
    "sampled_ranks": "ranking",
    "expected_sampled": "sampling_laws",
    "log_sampled_rank_pmf": "sampling_laws",
    "sampled_rank_pmf": "sampling_laws",
    "draw_sampled_ranks": "simulate",
    "leave_last_out_split": "splits",
    "split_train_test": "splits",
    "corrected_metric": "uncertainty",
    "corrected_values": "uncertainty",
    "paired_difference": "uncertainty",
    "DEFAULT_METRICS": "user_metrics",
    "mean_metrics": "user_metrics",
    "per_user_metrics": "user_metrics",
    "per_user_metrics_from_factors": "user_metrics",
    "user_metric_values": "user_metrics",
}

# Views of the estimator registry, computed on each access (PEP 562): a method registered later appears in them.
_REGISTRY_VIEWS = {
    "ESTIMATORS": lambda: registry.names(),
    "METHODS": lambda: registry.names(family=("none", "correction"), fits_distribution=False),
}


def __getattr__(name: str) -> Any:
    view = _REGISTRY_VIEWS.get(name)
    if view is not None:
        return view()
    source = _LAZY.get(name)
    if source is not None:
        value = getattr(importlib.import_module(f"{__name__}.{source}"), name)
        globals()[name] = value  # later accesses skip this function
        return value
    if not name.startswith("__"):
        try:  # a submodule, e.g. ``rsp.ranking`` or ``rsp.planner``
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_REGISTRY_VIEWS) | set(_LAZY))


class _Package(types.ModuleType):
    """The package's module type: the import system binds each submodule as an attribute of its package on first
    import; ``estimate`` and ``mapping`` are functions of the same names as their modules, so such a binding is
    not stored (the function is then found by ``__getattr__``)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in ("estimate", "mapping") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
