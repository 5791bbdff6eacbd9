"""Consistency of sampled and corrected metrics with the exact metric, on exact ranks you already have.

:func:`consistency_report` gives Krichene & Rendle's two studies in one result: the analogue of their Table 3
(exact, expected sampled and expected corrected metric per recommender, metric and method; analytic expectations, no
Monte Carlo) and their Table 4 (repeat the sampling ``repeats`` times given the exact ranks of several recommenders
and count, for every pair, metric and correction, how often the pair is ordered as by the exact metric), with the
Monte Carlo runs behind it. Plain data: lists of dicts and nested dicts (the two tables as pandas DataFrames with
``as_frame=True``).

``n_samples`` is the design of the draws and of the tables (an int m, or a fixed-m ``SamplingDesign``:
``replacement=False`` for draws without replacement). ``methods`` are labels, each naming one correction: ``"none"``,
``"rank_estimate"``, ``"rank_estimate:linear"``, ``"ls"``, ``"cls"`` or ``"bv:<gamma>"`` (``"bv"`` alone is gamma =
0.1), or a mapping from your labels to corrections (a name or the registry's method object, e.g.
``{"bv beta": registry.Bv(prior=("beta", 0.5))}``: a prior, or any other option, goes in its method object). The
labels key the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from . import registry
from ._checks import check_int, check_rank_values, check_sizes
from ._options import check_bool, check_names, check_seed
from .corrections import (as_correction, check_method, correction_method, expected_corrected, fixed_design,
                          tables_for_counts)
from .metric_names import parse_metric
from .metrics import metric_values
from .simulate import draw_sampled_ranks

from .design import SamplingDesign

if TYPE_CHECKING:
    from ._types import TensorLike

__all__ = ["DEFAULT_METHODS", "parse_method", "consistency_report"]

DEFAULT_METHODS = ("none", "rank_estimate", "cls", "bv:1", "bv:0.1", "bv:0.01", "bv:0.001")
DEFAULT_METRICS = ("recall@10", "ndcg@10", "ap", "auc")


def parse_method(label: str) -> registry.Method:
    """The correction a label names: ``"bv:0.01"`` -> ``registry.Bv(gamma=0.01)``; ``"rank_estimate:linear"`` ->
    ``registry.RankEstimate(rounding="linear")``; ``"cls"`` -> ``registry.Cls()``."""
    name, _, arg = str(label).partition(":")
    method = check_method(name)
    if not arg:
        return registry.method_class(method)()
    if method == "bv":
        try:  # the label is text: its number is parsed here, then checked by the method object as every gamma is
            gamma = float(arg)
        except ValueError:
            raise ValueError(f"method: 'bv:<gamma>' takes a number in [0, 1], got {label!r}") from None
        return registry.Bv(gamma=gamma)
    if method == "rank_estimate":
        if arg not in ("floor", "linear"):
            raise ValueError(f"method: rank_estimate takes ':floor' or ':linear', got {label!r}")
        return registry.RankEstimate(rounding=arg)
    raise ValueError(f"method: {name!r} takes no argument, got {label!r}")


def _check_repeats(repeats: Any) -> int:
    """``repeats`` as an int: at least 2 runs (a standard deviation over runs needs two; one run would
    report NaN), or 0 to skip the Monte Carlo part."""
    r = check_int(repeats, "repeats")
    if r != 0 and r < 2:
        raise ValueError(f"repeats: need at least 2 sampling runs (the spread over runs needs two); 0 skips them, got {r}")
    return r


def _check_lists(metrics: Any, methods: Any) -> tuple[tuple, dict[str, registry.Method]]:
    """``metrics`` as a tuple of names and ``methods`` as {label: method object}, each parsed once (a ValueError
    naming the list)."""
    metrics = check_names(metrics, "metrics")
    if isinstance(methods, Mapping):
        if not methods or not all(isinstance(k, str) for k in methods):
            raise ValueError(f"methods: a mapping needs at least one entry, each keyed by a str label, got {methods!r}")
        items = list(methods.items())
    else:
        items = [(label, label) for label in check_names(methods, "methods", "method labels such as 'bv:0.1'")]
    for item in metrics:
        try:
            parse_metric(item)
        except ValueError as exc:
            raise ValueError(f"metrics: {exc}") from None
    parsed = {}
    for label, method in items:
        try:
            parsed[str(label)] = parse_method(method) if isinstance(method, str) else correction_method(method)
        except ValueError as exc:
            raise ValueError(f"methods: {exc}") from None
    return metrics, parsed


def _check_seed(seed: Any) -> int | None:
    return None if seed is None else check_seed(seed, "seed")


def _prepare(exact_ranks: Mapping[str, object], n_items: Any) -> tuple[dict[str, torch.Tensor], Any]:
    if not isinstance(exact_ranks, Mapping):
        raise ValueError(f"exact_ranks: expected a mapping of recommender name to exact ranks, got {type(exact_ranks).__name__}")
    if len(exact_ranks) < 1:
        raise ValueError("exact_ranks: give at least one recommender")
    ranks = {k: check_rank_values(v, f"exact_ranks[{k!r}]").detach().cpu().reshape(-1) for k, v in exact_ranks.items()}
    sizes = {v.numel() for v in ranks.values()}
    if len(sizes) != 1:
        raise ValueError("exact_ranks: every recommender must be evaluated on the same instances")
    size = sizes.pop()
    if size == 0:  # a mean over no instance is NaN: every table cell would be
        raise ValueError("exact_ranks: no instances (every recommender's ranks are empty); give each at least one rank")
    # whole counts (n_items = 100.5 is refused, not truncated to 100), one or one per instance
    n = torch.as_tensor(check_sizes(n_items, "n_items", 2)).detach().cpu().to(torch.int64)
    if n.dim() and n.numel() not in (1, size):
        raise ValueError(f"n_items: give one count or one per instance ({size}), got shape {tuple(n.shape)}")
    n = torch.broadcast_to(n.reshape(-1) if n.dim() else n, (size,)).contiguous()
    return ranks, n


@dataclass(frozen=True)
class _Experiment:
    """The arguments of :func:`consistency_report`, each checked once."""

    ranks: dict[str, torch.Tensor]  # recommender -> exact ranks (CPU, flat)
    n: torch.Tensor  # candidates per instance (CPU, int64)
    design: SamplingDesign  # fixed m, uniform draws: the law of the draws and of the tables
    metrics: tuple
    methods: dict[str, registry.Method]  # label -> correction
    repeats: int
    seed: int | None

    @classmethod
    def checked(cls, exact_ranks: Mapping[str, object], n_items: Any, n_samples: Any, metrics: Any, methods: Any,
                repeats: Any, seed: Any) -> _Experiment:
        repeats = _check_repeats(repeats)
        seed = _check_seed(seed)
        metrics, parsed = _check_lists(metrics, methods)
        ranks, n = _prepare(exact_ranks, n_items)
        return cls(ranks, n, fixed_design(n_samples), metrics, parsed, repeats, seed)


def consistency_report(
    exact_ranks: Mapping[str, object],
    n_items: int | TensorLike,
    n_samples: SamplingDesign | int,
    metrics: Sequence[str] = DEFAULT_METRICS,
    methods: Sequence[str] | Mapping[str, str | registry.Method] = DEFAULT_METHODS,
    repeats: int = 100,
    seed: int | None = 0,
    as_frame: bool = False,
) -> dict:
    """Tables 3 and 4 of Krichene & Rendle for your recommenders, with the Monte Carlo runs behind Table 4.

    Args:
        exact_ranks: recommender name -> exact 1-based ranks on the same instances.
        n_items: n per instance (an int, or one whole count per instance).
        n_samples: the design of the draws and tables (an int m or a fixed-m ``SamplingDesign``).
        metrics: metric names. methods: labels or {label: method object} (module docstring).
        repeats: sampling runs of Table 4, an integer >= 2 (a standard deviation over one run does not exist), or
            0 to skip the Monte Carlo part.
        seed: an integer >= 0 (None: unseeded draws).
        as_frame: ``table3`` and ``table4`` as pandas DataFrames.

    Returns:
        ``{"table3": rows, "table4": rows, "exact": ..., "counts": ..., "means": ..., "repeats": R, "n_samples": m}``:

        * ``table3``: one row per (metric, recommender) with ``exact`` and, per method label, the expected corrected
          value E[M^(r~)] averaged over the instances (``none`` is the expected sampled metric), and the Monte
          Carlo standard deviation over the R runs as ``<label> sd``.
        * ``table4``: one row per (pair, metric) with the ordering counts per method label.
        * ``exact``: ``{metric: {recommender: exact metric}}``.
        * ``counts``: Table 4 by key, ``{metric: {label: {"A vs B": count}}}``: in how many of the R runs the
          corrected metric orders A and B as the exact metric does (ties count as disagreement unless the exact
          values tie too).
        * ``means``: ``{metric: {label: {recommender: [R per-run values]}}}``.

        With ``repeats=0``, ``table4``, ``counts`` and ``means`` are empty.

    Raises:
        ValueError: naming the argument (``repeats`` that is not 0 or an integer >= 2, a fractional ``n_items``,
            empty ranks, a method that is no correction, ...).
    """
    as_frame = check_bool(as_frame, "as_frame")
    exp = _Experiment.checked(exact_ranks, n_items, n_samples, metrics, methods, repeats, seed)
    exact = {metric: {name: float(metric_values(metric, r, exp.n).mean()) for name, r in exp.ranks.items()}
             for metric in exp.metrics}
    counts, means = _agreement(exp, exact) if exp.repeats > 0 else ({}, {})
    table3 = []
    for metric in exp.metrics:
        for name, r in exp.ranks.items():
            row = {"metric": metric, "recommender": name, "exact": exact[metric][name]}
            for label, method in exp.methods.items():
                row[label] = float(expected_corrected(metric, r, exp.n, exp.design, method).mean())
                if exp.repeats:
                    row[f"{label} sd"] = float(torch.tensor(means[metric][label][name]).std())
            table3.append(row)
    pairs = [f"{a} vs {b}" for a, b in combinations(exp.ranks, 2)] if exp.repeats else []
    table4 = [{"pair": pair, "metric": metric, **{label: counts[metric][label][pair] for label in exp.methods}}
              for pair in pairs for metric in exp.metrics]
    out: dict[str, Any] = {"table3": table3, "table4": table4, "exact": exact, "counts": counts, "means": means,
                           "repeats": int(exp.repeats), "n_samples": int(exp.design.n_samples)}
    if as_frame:
        import pandas as pd  # optional dependency

        out["table3"] = pd.DataFrame(table3)
        out["table4"] = pd.DataFrame(table4)
    return out


def _agreement(exp: _Experiment, exact: dict[str, dict[str, float]]) -> tuple[dict, dict]:
    """Table 4 of checked arguments: (counts, means) of :func:`consistency_report` from ``repeats`` sampling runs."""
    ranks, n, design, seed = exp.ranks, exp.n, exp.design, exp.seed
    names = list(ranks)
    draws = {
        name: draw_sampled_ranks(ranks[name], n, design.n_samples, design.law, exp.repeats,
                                 None if seed is None else seed + 7919 * i)
        for i, name in enumerate(names)
    }
    counts: dict = {}
    means: dict = {}
    for metric in exp.metrics:
        counts[metric], means[metric] = {}, {}
        for label, method in exp.methods.items():
            corr, m = as_correction(method, design)
            tables, inverse = tables_for_counts(metric, n, m, corr)
            run_means = {name: tables[inverse.unsqueeze(0), draws[name] - 1].mean(dim=1) for name in names}
            means[metric][label] = {name: v.tolist() for name, v in run_means.items()}
            counts[metric][label] = {}
            for a, b in combinations(names, 2):
                sign_exact = (exact[metric][a] > exact[metric][b]) - (exact[metric][a] < exact[metric][b])
                sign_runs = torch.sign(run_means[a] - run_means[b])
                counts[metric][label][f"{a} vs {b}"] = int((sign_runs == sign_exact).sum())
    return counts, means
