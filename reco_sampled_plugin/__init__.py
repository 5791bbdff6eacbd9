"""Ranking metrics for recommenders evaluated on sampled items.

One flow: scores (B x n, any device) -> exact or sampled ranks per relevant item -> the histogram of sampled
ranks -> an estimator (see ``registry``) -> an :class:`Estimate` (value, stderr, details, flags, an honest
interval). Ranks are 1-based; n counts the candidates of an instance (the relevant item included), m the sampled
irrelevant items. The layers and the rules that keep them apart: docs/architecture.md. ``import
reco_sampled_plugin as rsp`` imports nothing heavy: each name below is imported on first use (PEP 562), so
``reco-sampled --help`` starts without torch.
"""

import importlib
from typing import TYPE_CHECKING, Any

from . import registry  # the estimator table: standard library only
from .registry import DEFAULT_ESTIMATOR, Estimator, register

if TYPE_CHECKING:  # mypy's view of the lazy names below; tests/test_surface.py checks it names exactly _SURFACE
    from ._estimate import Estimate, explain_flags
    from ._rank_hist import RankHistogram, sampled_rank_histogram
    from ._adaptive_law import AdaptiveCost, adaptive_cost
    from ._deferred import deferred_checks
    from .adaptive import adaptive_sampled_ranks
    from .consistency import consistency_report
    from .design import AdaptiveDesign, SamplingDesign, popularity_weights
    from .estimators import estimate
    from .factor_ranks import exact_ranks_from_factors
    from .factors import FactorEvaluation, evaluate_factors
    from .identification import TopShape, identified_interval
    from .metric_names import MetricSpec, parse_metric
    from .metrics import metric_values
    from .planner import plan
    from .ranking import SampledRanks, candidate_counts, exact_ranks, sampled_ranks
    from .scorer_ranks import ScoringCost, sampled_ranks_from_scorer
    from .simulate import draw_sampled_ranks, simulate_sampled_ranks
    from .splits import leave_last_out_split, split_train_test
    from .uncertainty import paired_difference
    from .user_metrics import DEFAULT_METRICS, mean_metrics, per_user_metrics

# The one place of the version: pyproject.toml reads it ([tool.setuptools.dynamic]); CHANGELOG.md names each release.
__version__ = "0.1.0"

# The one table of the top-level names: (section, ((name, module, one-line summary), ...)). ``__all__``, the lazy
# imports and the catalogue of ``help(reco_sampled_plugin)`` are derived from it.
_SURFACE: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    ("Ranks", (
        ("exact_ranks", "ranking", "exact rank of every relevant item among its candidates (scores of any device)"),
        ("exact_ranks_from_factors", "factor_ranks", "exact ranks from user and item factors, without the score matrix"),
        ("sampled_ranks", "ranking", "ranks among m drawn irrelevant items (a SamplingDesign or an int m)"),
        ("SampledRanks", "ranking", "sampled ranks with their candidate counts, negatives and design"),
        ("sampled_ranks_from_scorer", "scorer_ranks", "sampled ranks scoring only the drawn pairs (a scorer callable)"),
        ("ScoringCost", "scorer_ranks", "what the scorer loop cost: pairs, calls, seconds, and full ranking's pairs"),
        ("candidate_counts", "ranking", "candidates per row: items minus the excluded ones"),
        ("adaptive_sampled_ranks", "adaptive", "adaptive sampling from scores: positives still first draw again"),
        ("deferred_checks", "_deferred", "a block whose exact_ranks / per_user_metrics checks are read once, at its end"),
        ("RankHistogram", "_rank_hist", "the histogram of sampled ranks by (n, m): everything an estimator needs"),
        ("sampled_rank_histogram", "_rank_hist", "the histogram of sampled ranks (additive over batches and processes)"),
    )),
    ("Sampling designs", (
        ("SamplingDesign", "design", "how the m irrelevant items are drawn, validated once"),
        ("AdaptiveDesign", "design", "start m and cap of adaptive sampling (its stages)"),
        ("popularity_weights", "design", "RecBole's popularity weights count^alpha (count 0: never drawn)"),
    )),
    ("Metrics", (
        ("parse_metric", "metric_names", '"ndcg@10" -> MetricSpec'),
        ("MetricSpec", "metric_names", "a parsed metric name (kind and cut-off)"),
        ("metric_values", "metrics", "M(r) at given ranks"),
        ("per_user_metrics", "user_metrics", "per-user metrics straight from a score batch or user and item factors"),
        ("mean_metrics", "user_metrics", "means over users with a defined value"),
        ("DEFAULT_METRICS", "user_metrics", "the metrics reported when none are named"),
    )),
    ("Estimation", (
        ("estimate", "estimators", "the full-catalogue metric from sampled ranks, with a standard error"),
        ("Estimate", "_estimate", "value, stderr, n_instances, details, flags and interval() (the 95% interval)"),
        ("explain_flags", "_estimate", "each flag of an Estimate in words, with the advice"),
        ("registry", "registry", "the estimator table: registry.names() lists the methods"),
        ("Estimator", "registry", "one registry entry (family, options, designs supported, summary)"),
        ("register", "registry", "add an estimator: every entry point offers it from then on"),
        ("DEFAULT_ESTIMATOR", "registry", "the method of estimate() when none is named"),
    )),
    ("Intervals and comparisons", (
        ("identified_interval", "identification", "every value the data allow when the top is unresolved"),
        ("TopShape", "identification", "the shape assumption inside the first sampled bin"),
        ("paired_difference", "uncertainty", "the difference of two models on the same instances, with its stderr"),
    )),
    ("Evaluation", (
        ("evaluate_factors", "factors", "per-user ranking metrics of a factor model (exact, or sampled with estimates)"),
        ("FactorEvaluation", "factors", "its result when sampling (per-user values and the estimates)"),
        ("consistency_report", "consistency", "Krichene & Rendle's tables 3 and 4 for your recommenders"),
    )),
    ("Planning", (
        ("plan", "planner", "which design to run: forecast error and cost, pick the cheapest meeting a target"),
        ("adaptive_cost", "_adaptive_law", "the AdaptiveCost of a histogram of adaptive ranks"),
        ("AdaptiveCost", "_adaptive_law", "what an adaptive design spends (mean and largest m, share at the cap)"),
    )),
    ("Simulation", (
        ("simulate_sampled_ranks", "simulate", "sampled ranks drawn from exact ranks under the sampling law"),
        ("draw_sampled_ranks", "simulate", "many independent draws of sampled ranks (simulation studies)"),
    )),
    ("Data and splits", (
        ("split_train_test", "splits", "a train/test split of interactions (as recometrics splits)"),
        ("leave_last_out_split", "splits", "hold out each user's latest interaction"),
    )),
)

# Beyond this namespace, in their modules: the papers' baselines and their tables (``corrections``, ``mapping``,
# ``priors``, ``rank_distribution``), the sampling laws (``sampling_laws``), the adapters (``adapters``: they
# import their framework), ``cli`` (``reco-sampled``), ``planner``, ``datasets`` and ``baselines``.
_ELSEWHERE = ("corrections", "mapping", "priors", "rank_distribution", "sampling_laws", "design", "adaptive",
              "identification", "consistency", "metrics", "user_metrics", "uncertainty", "planner", "adapters", "cli",
              "datasets", "baselines")

__all__ = [name for _, entries in _SURFACE for name, _, _ in entries]
_LAZY: dict[str, str] = {name: module for _, entries in _SURFACE for name, module, _ in entries}


def _catalogue() -> str:
    """The package docstring's catalogue: a section per group, a line per name."""
    lines = []
    for section, entries in _SURFACE:
        lines += ["", section, "=" * len(section), ""]
        lines += [f"{name} -- {summary}" for name, _, summary in entries]
    lines += ["", "Elsewhere", "=========", "",
              "In their modules (``reco_sampled_plugin.<module>``): " + ", ".join(_ELSEWHERE) + "."]
    return "\n".join(lines)


__doc__ = (__doc__ or "") + _catalogue()


def __getattr__(name: str) -> Any:
    source = _LAZY.get(name)
    if source is not None:
        module = importlib.import_module(f"{__name__}.{source}")
        value = module if source == name else getattr(module, name)
        globals()[name] = value  # later accesses skip this function
        return value
    if not name.startswith("__"):
        try:  # a submodule, e.g. ``rsp.corrections`` or ``rsp.planner``
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
