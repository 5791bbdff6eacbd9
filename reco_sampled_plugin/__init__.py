"""reco_sampled_plugin: exact, sampled and corrected ranking metrics for recommenders, on torch.

One flow: scores (B x n, any device) -> exact or sampled ranks per relevant item -> the histogram
of sampled ranks -> an estimator (a correction table, a mapping, a rank-distribution fit) ->
an :class:`Estimate` (value, stderr, details, flags). Ranks are 1-based; n counts the candidates
of an instance (the relevant item included), m the sampled irrelevant items.
"""

from ._rank_hist import RankHistogram, sampled_rank_histogram
from .adaptive import AdaptiveCost, AdaptiveDesign, adaptive_cost
from .consistency import consistency_report, ordering_agreement
from .corrections import METHODS, clear_correction_cache, correction_table, expected_corrected, table_bias
from .estimate import Estimate
from .estimators import ESTIMATORS, estimate
from .factors import FactorEvaluation, evaluate_factors
from .identification import IdentifiedInterval, TopShape, identified_interval
from .mapping import (
    BetaFit,
    dataset_beta,
    fit_beta,
    mapped_points,
    mapping,
    mapping_estimate,
    sampled_hit_rate_curve,
)
from .metric_names import MetricSpec, parse_metric
from .metrics import metric_curve, metric_values
from .priors import BetaPrior, CallablePrior, Prior, UniformPrior, VectorPrior, empirical_prior, fit_beta_prior
from .adaptive import adaptive_sampled_ranks, adaptive_sampled_ranks_from_exact
from .rank_distribution import RankDistribution, estimate_rank_distribution, simulate_sampled_ranks
from .ranking import SampledRanks, candidate_counts, exact_ranks, sampled_ranks
from .sampling_laws import expected_sampled, log_sampled_rank_pmf, sampled_rank_pmf
from .simulate import draw_sampled_ranks
from .splits import leave_last_out_split, split_train_test
from .uncertainty import corrected_metric, corrected_values, paired_difference
from .factor_ranks import exact_ranks_from_factors
from .user_metrics import DEFAULT_METRICS, mean_metrics, per_user_metrics, per_user_metrics_from_factors, user_metric_values

__version__ = "0.1.0"

__all__ = [
    # ranks and the metric catalogue (issue 2)
    "MetricSpec",
    "parse_metric",
    "metric_values",
    "metric_curve",
    "exact_ranks",
    "exact_ranks_from_factors",
    "sampled_ranks",
    "SampledRanks",
    "candidate_counts",
    "per_user_metrics",
    "per_user_metrics_from_factors",
    "user_metric_values",
    "mean_metrics",
    "DEFAULT_METRICS",
    "expected_sampled",
    "sampled_rank_pmf",
    "log_sampled_rank_pmf",
    "draw_sampled_ranks",
    # corrections and uncertainty (issue 3)
    "Estimate",
    "METHODS",
    "correction_table",
    "expected_corrected",
    "table_bias",
    "clear_correction_cache",
    "corrected_metric",
    "corrected_values",
    "paired_difference",
    "ordering_agreement",
    "consistency_report",
    "Prior",
    "UniformPrior",
    "BetaPrior",
    "VectorPrior",
    "CallablePrior",
    "fit_beta_prior",
    "empirical_prior",
    # mapping and rank-distribution estimators (issue 4)
    "ESTIMATORS",
    "estimate",
    "mapping",
    "fit_beta",
    "BetaFit",
    "mapping_estimate",
    "mapped_points",
    "sampled_hit_rate_curve",
    "dataset_beta",
    "estimate_rank_distribution",
    "RankDistribution",
    "adaptive_sampled_ranks",
    "adaptive_sampled_ranks_from_exact",
    "simulate_sampled_ranks",
    "RankHistogram",
    "sampled_rank_histogram",
    # honest intervals where the top is unresolved (issue 16)
    "TopShape",
    "identified_interval",
    "IdentifiedInterval",
    # adaptive sampling everywhere (issue 17)
    "AdaptiveDesign",
    "AdaptiveCost",
    "adaptive_cost",
    # recometrics parity (issue 8)
    "evaluate_factors",
    "FactorEvaluation",
    "split_train_test",
    "leave_last_out_split",
]
