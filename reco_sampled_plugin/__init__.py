"""reco_sampled_plugin: exact, sampled and corrected ranking metrics for recommenders, on torch."""

from .metric_names import MetricSpec, parse_metric
from .metrics import metric_curve, metric_values
from .sampling_laws import expected_sampled, log_sampled_rank_pmf, sampled_rank_pmf

__version__ = "0.1.0"

__all__ = [
    "MetricSpec",
    "parse_metric",
    "metric_values",
    "metric_curve",
    "expected_sampled",
    "sampled_rank_pmf",
    "log_sampled_rank_pmf",
]
