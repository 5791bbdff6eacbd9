"""What ``method="auto"`` runs (one place): the choice among the registry's ``AUTO_CHOICES`` and its compute function
on a bare histogram. Read by ``estimators.estimate`` and by the design-based estimator's predictions
(``_design_based.model_fit``), which sit above it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from . import registry
from .identification import resolution, top_kind

if TYPE_CHECKING:
    from ._estimate import EstimatorOutput
    from ._rank_hist import RankHistogram
    from .design import AdaptiveDesign, SamplingDesign
    from .metric_names import MetricSpec

__all__ = ["auto_method", "auto_choice", "estimate_auto"]


def auto_method(spec: MetricSpec, hist: RankHistogram, design: AdaptiveDesign | None,
                fit: bool = False) -> tuple[str, str]:
    """What ``method="auto"`` runs on ``hist`` (``registry.AUTO_CHOICES``) and why: the ``resolved`` choice for an
    adaptive design or where every group with positives at r~ = 1 has its resolution b = (n - 1)/(m + 1) + 1 at
    most the metric's cut-off K; the ``unresolved`` one otherwise (AP, RR, NDCG without cut-off count as resolved
    only when no positive ranks first or every such group's b is below 2: its first bin is rank 1 alone, where
    ``mes``'s smoothing was all bias and no interval said so: 0.56 [0.56, 0.56] for an NDCG of 1 on 20 users). AUC at a fixed m: the ``auc`` choice, the sampled AUC (unbiased; it went to
    ``mes`` once a positive ranked first: 0.75 [0.73, 0.76] for a true 0.996 on 20 users at n = 1,000, m = 100). Popularity-sampled ranks never reach here: ``estimate`` runs
    ``registry.popularity_auto`` on their SampledRanks (``hh`` for AUC, ``pl_fit`` otherwise). ``fit``: a rank
    distribution is wanted (the difference estimator's model): AUC takes the ``resolved`` choice, a fit."""
    if design is not None:
        return registry.AUTO_CHOICES["resolved"], "adaptive design"
    if spec.k is None and not top_kind(spec):  # AUC, linear in the rank
        if fit:
            return registry.AUTO_CHOICES["resolved"], "AUC: a rank distribution's fit for the model"
        return registry.AUTO_CHOICES["auc"], "AUC at a fixed m: the sampled AUC is unbiased"
    occupied = hist.top_counts > 0
    if not np.any(occupied):
        return registry.AUTO_CHOICES["resolved"], "no positive ranked first"
    b = float(np.max(resolution(hist)[occupied]))
    if spec.k is not None and spec.k >= b:
        return registry.AUTO_CHOICES["resolved"], f"cut-off K = {spec.k} >= resolution b = {b:.3g}"
    if spec.k is None and b < 2.0:  # the first sampled bin holds rank 1 alone (identification.top_sensitive)
        return registry.AUTO_CHOICES["resolved"], f"resolution b = {b:.3g} < 2: r~ = 1 is rank 1"
    why = f"cut-off K = {spec.k} < resolution b = {b:.3g}" if spec.k is not None else "no cut-off"
    return registry.AUTO_CHOICES["unresolved"], why


def estimate_auto(spec: MetricSpec, hist: RankHistogram, *, method: str, sampling: str, options: dict) -> EstimatorOutput:
    """The registry's compute function of ``auto`` on a bare histogram (fixed m per group): the chosen method's."""
    chosen, _ = auto_method(spec, hist, None)
    entry = registry.get(chosen)
    return entry.compute_function()(spec, hist, method=chosen, sampling=sampling, options=options)


def auto_choice(spec: MetricSpec, auto: registry.Method, hist: RankHistogram, design: SamplingDesign | None,
                fit: bool = False) -> tuple[registry.Method, dict]:
    """What ``auto`` runs on these data (one place): ``registry.popularity_auto`` under a popularity design
    (``hh`` for AUC, ``pl_fit`` otherwise), else :func:`auto_method`; the choice gets auto's options it takes
    (the others are reported in ``details["auto"]["options_unused"]`` and warned about where given)."""
    if design is not None and design.popularity is not None:
        name = registry.popularity_auto(spec, design)
        why = f"popularity design: {name} is the first of AUTO_CHOICES['popularity'] that estimates {spec.kind}"
    else:
        name, why = auto_method(spec, hist, None if design is None else design.adaptive, fit)
    cls = registry.method_class(name)
    takes = cls.entry.option_names + registry.COMMON_OPTIONS
    given = auto.given()
    chosen = cls(**{k: v for k, v in given.items() if k in takes})
    details: dict[str, Any] = {"method": name, "reason": why}
    if design is not None and design.popularity is not None:
        unused = sorted(k for k in given if k not in takes)
        if unused:
            warnings.warn(f"auto runs {name} on popularity-sampled ranks, which takes no {', '.join(unused)}: "
                          f"ignored (its standard error is {name}'s own)", UserWarning, stacklevel=3)
        details["options_unused"] = unused
    return chosen, details
