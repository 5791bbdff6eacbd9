"""Metric names: parse ``"ndcg@10"``, ``"recall@10"``, ``"mrr"``, ``"auc"`` ... once, into a
:class:`MetricSpec`.

The catalogue follows recometrics (column names ``P@k``, ``TP@k``, ``R@k``, ``AP@k``, ``TAP@k``,
``NDCG@k``, ``Hit@k``, ``RR@k``, ``ROC_AUC``, ``PR_AUC``) and accepts the aliases used by RecBole
and torchmetrics. A metric without ``@k`` runs over the whole candidate list (k = n).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["MetricSpec", "parse_metric", "METRIC_KINDS"]

# kind -> (recometrics column prefix, needs a cut-off k)
METRIC_KINDS: dict[str, tuple[str, bool]] = {
    "precision": ("P", True),
    "trunc_precision": ("TP", True),
    "recall": ("R", True),
    "ap": ("AP", False),
    "trunc_ap": ("TAP", False),
    "ndcg": ("NDCG", False),
    "hit": ("Hit", True),
    "rr": ("RR", False),
    "auc": ("ROC_AUC", False),
}

_ALIASES: dict[str, str] = {
    "p": "precision",
    "prec": "precision",
    "precision": "precision",
    "tp": "trunc_precision",
    "trunc_precision": "trunc_precision",
    "truncated_precision": "trunc_precision",
    "r": "recall",
    "recall": "recall",
    "ap": "ap",
    "map": "ap",
    "average_precision": "ap",
    "tap": "trunc_ap",
    "trunc_ap": "trunc_ap",
    "truncated_ap": "trunc_ap",
    "ndcg": "ndcg",
    "hit": "hit",
    "hr": "hit",
    "hitrate": "hit",
    "hit_rate": "hit",
    "rr": "rr",
    "mrr": "rr",
    "reciprocal_rank": "rr",
    "auc": "auc",
    "roc_auc": "auc",
    "rocauc": "auc",
    "pr_auc": "ap",
    "prauc": "ap",
}

_PATTERN = re.compile(r"^\s*([A-Za-z_\-]+)\s*(?:@\s*([-+]?\d+))?\s*$")


@dataclass(frozen=True)
class MetricSpec:
    """A parsed metric: its kind and cut-off ``k`` (``None``: the whole candidate list).

    ``str(spec)`` is the canonical lower-case name (``"ndcg@10"``, ``"auc"``);
    :attr:`column` is the recometrics column name (``"NDCG@10"``, ``"ROC_AUC"``, ``"PR_AUC"``).
    """

    kind: str
    k: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in METRIC_KINDS:
            raise ValueError(f"metric: unknown kind {self.kind!r}; known: {sorted(METRIC_KINDS)}")
        # an int, not a bool (True is not k = 1) and not a float; this module stays free of numpy and torch
        if self.k is not None and (not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1):
            raise ValueError(f"metric: k must be a positive integer, got {self.k!r}")
        if self.kind == "auc" and self.k is not None:
            raise ValueError("metric: 'auc' takes no cut-off (it runs over the whole list)")
        if METRIC_KINDS[self.kind][1] and self.k is None:
            raise ValueError(f"metric: {self.kind!r} needs a cut-off, e.g. '{self.kind}@10'")

    def __str__(self) -> str:
        return self.kind if self.k is None else f"{self.kind}@{self.k}"

    @property
    def column(self) -> str:
        """recometrics' column name for this metric."""
        prefix = METRIC_KINDS[self.kind][0]
        if self.kind == "auc":
            return prefix
        if self.k is None:
            return "PR_AUC" if self.kind == "ap" else f"{prefix}@all"
        return f"{prefix}@{self.k}"

    @property
    def is_cutoff(self) -> bool:
        """True when M(r) = 0 for every r > k (so it is a polynomial-friendly step metric)."""
        return self.k is not None


@lru_cache(maxsize=512)
def _parse(name: str) -> MetricSpec:
    match = _PATTERN.match(name)
    if match is None:
        raise ValueError(f"metric: cannot parse {name!r}; expected a name like 'ndcg@10', 'recall@5', 'mrr', 'auc'")
    base = match.group(1).lower().replace("-", "_")
    kind = _ALIASES.get(base)
    if kind is None:
        raise ValueError(f"metric: unknown metric {match.group(1)!r} in {name!r}; known names: {sorted(_ALIASES)}")
    k = None if match.group(2) is None else int(match.group(2))
    if k is not None and k < 1:
        raise ValueError(f"metric: k must be >= 1, got {k} in {name!r}")
    if base in ("pr_auc", "prauc") and k is not None:
        raise ValueError(f"metric: {base!r} takes no cut-off; use 'ap@{k}' for a truncated AP")
    return MetricSpec(kind, k)


def parse_metric(metric: str | MetricSpec) -> MetricSpec:
    """Parse a metric name (case-insensitive) or pass a :class:`MetricSpec` through.

    Names: ``precision@k`` (``p@k``), ``tp@k``, ``recall@k`` (``r@k``), ``ap[@k]`` (``map``),
    ``tap[@k]``, ``ndcg[@k]``, ``hit@k`` (``hr@k``), ``rr[@k]`` (``mrr``), ``auc`` (``roc_auc``),
    ``pr_auc`` (= ``ap`` over the whole list).
    """
    if isinstance(metric, MetricSpec):
        return metric
    if not isinstance(metric, str):
        raise ValueError(f"metric: expected a name such as 'ndcg@10' or a MetricSpec, got {type(metric).__name__}")
    return _parse(metric)
