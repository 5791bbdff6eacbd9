"""reco_sampled_plugin: exact, sampled and corrected ranking metrics for recommenders, on torch."""

from .metric_names import MetricSpec, parse_metric
from .metrics import metric_curve, metric_values
from .ranking import SampledRanks, candidate_counts, exact_ranks, sampled_ranks
from .sampling_laws import expected_sampled, log_sampled_rank_pmf, sampled_rank_pmf
from .user_metrics import DEFAULT_METRICS, mean_metrics, per_user_metrics, user_metric_values

__version__ = "0.1.0"

__all__ = [
    "MetricSpec",
    "parse_metric",
    "metric_values",
    "metric_curve",
    "expected_sampled",
    "sampled_rank_pmf",
    "log_sampled_rank_pmf",
    "exact_ranks",
    "sampled_ranks",
    "SampledRanks",
    "candidate_counts",
    "per_user_metrics",
    "user_metric_values",
    "mean_metrics",
    "DEFAULT_METRICS",
]
