"""Consistency of sampled and corrected metrics with the exact metric, on exact ranks you already have.

* :func:`ordering_agreement` -- the Monte Carlo experiment of Krichene & Rendle's Table 4: repeat the
  sampling ``repeats`` times given the exact ranks of several recommenders and count, for every pair,
  metric and correction, how often the pair is ordered as by the exact metric.
* :func:`consistency_report` -- the analogue of their Table 3 (exact, expected sampled and expected
  corrected metric per recommender, metric and method; analytic expectations, no Monte Carlo) plus
  the Table 4 counts. Plain data: lists of dicts, or pandas DataFrames with ``as_frame=True``.

Methods are named ``"none"``, ``"rank_estimate"``, ``"rank_estimate:linear"``, ``"ls"``, ``"cls"``
or ``"bv:<gamma>"`` (``"bv"`` alone is gamma = 0.1).
"""

from __future__ import annotations

from itertools import combinations
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from ._checks import check_int, check_rank_values, check_sizes
from ._options import check_bool, check_names, check_seed
from .corrections import check_gamma, check_method, expected_corrected, tables_for_counts
from .metric_names import parse_metric
from .metrics import metric_values
from .simulate import draw_sampled_ranks

if TYPE_CHECKING:
    from .priors import PriorLike
    from ._types import TensorLike

__all__ = ["DEFAULT_METHODS", "parse_method", "ordering_agreement", "consistency_report"]

DEFAULT_METHODS = ("none", "rank_estimate", "cls", "bv:1", "bv:0.1", "bv:0.01", "bv:0.001")
DEFAULT_METRICS = ("recall@10", "ndcg@10", "ap", "auc")


def parse_method(label: str) -> tuple[str, float, str]:
    """``"bv:0.01"`` -> ("bv", 0.01, "floor"); ``"rank_estimate:linear"`` -> ("rank_estimate", 0, "linear")."""
    name, _, arg = str(label).partition(":")
    method = check_method(name)
    gamma, rounding = 0.1, "floor"
    if method == "bv" and arg:
        try:  # the label is text: its number is parsed here, then checked as every gamma is
            gamma = float(arg)
        except ValueError:
            raise ValueError(f"method: 'bv:<gamma>' takes a number in [0, 1], got {label!r}") from None
        gamma = check_gamma(gamma)
    elif method == "rank_estimate" and arg:
        if arg not in ("floor", "linear"):
            raise ValueError(f"method: rank_estimate takes ':floor' or ':linear', got {label!r}")
        rounding = arg
    elif arg:
        raise ValueError(f"method: {name!r} takes no argument, got {label!r}")
    return method, gamma, rounding


def _check_repeats(repeats: Any, allow_zero: bool) -> int:
    """``repeats`` as an int: at least 2 runs (a standard deviation over runs needs two; one run would
    report NaN), or 0 to skip the Monte Carlo part where that is allowed."""
    r = check_int(repeats, "repeats")
    if r == 0 and allow_zero:
        return 0
    if r < 2:
        raise ValueError(
            f"repeats: need at least 2 sampling runs (the spread over runs needs two){'; 0 skips them' if allow_zero else ''}, "
            f"got {r}"
        )
    return r


def _check_lists(metrics: Any, methods: Any) -> tuple[tuple, tuple]:
    """``metrics`` and ``methods`` as tuples of names, each parsed once (a ValueError naming the list)."""
    metrics, methods = check_names(metrics, "metrics"), check_names(methods, "methods", "method labels such as 'bv:0.1'")
    for name, items, parse in (("metrics", metrics, parse_metric), ("methods", methods, parse_method)):
        for item in items:
            try:
                parse(item)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
    return metrics, methods


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
    # whole counts (n_items = 100.5 is refused, not truncated to 100), one or one per instance
    n = torch.as_tensor(check_sizes(n_items, "n_items", 2)).detach().cpu().to(torch.int64)
    if n.dim() and n.numel() not in (1, size):
        raise ValueError(f"n_items: give one count or one per instance ({size}), got shape {tuple(n.shape)}")
    n = torch.broadcast_to(n.reshape(-1) if n.dim() else n, (size,)).contiguous()
    return ranks, n


def ordering_agreement(
    exact_ranks: Mapping[str, object],
    n_items: int | TensorLike,
    n_samples: int,
    metrics: Sequence[str] = DEFAULT_METRICS,
    methods: Sequence[str] = DEFAULT_METHODS,
    repeats: int = 100,
    sampling: str = "binomial",
    prior: PriorLike = None,
    seed: int | None = 0,
) -> dict:
    """Table 4: for each metric, method and pair "A vs B", in how many of ``repeats`` sampling runs the
    corrected metric orders A and B as the exact metric does (ties count as disagreement unless the
    exact values tie too).

    Args:
        exact_ranks: recommender name -> exact 1-based ranks on the same instances.
        n_items: n per instance (int or tensor). n_samples: m. sampling: law of the draws and tables.
        repeats: sampling runs, an integer >= 2 (``means`` feeds standard deviations over runs).
        seed: an integer >= 0 (None: unseeded draws).

    Returns:
        ``{"repeats": R, "counts": {metric: {method: {"A vs B": count}}}, "exact": {metric: {name: value}},
        "means": {metric: {method: {name: [R per-run values]}}}}``
    """
    repeats = _check_repeats(repeats, allow_zero=False)
    seed = _check_seed(seed)
    metrics, methods = _check_lists(metrics, methods)
    ranks, n = _prepare(exact_ranks, n_items)
    names = list(ranks)
    draws = {
        name: draw_sampled_ranks(ranks[name], n, n_samples, sampling, repeats, None if seed is None else seed + 7919 * i)
        for i, name in enumerate(names)
    }
    counts: dict = {}
    exact: dict = {}
    means: dict = {}
    for metric in metrics:
        exact[metric] = {name: float(metric_values(metric, ranks[name], n).mean()) for name in names}
        counts[metric], means[metric] = {}, {}
        for label in methods:
            method, gamma, rounding = parse_method(label)
            tables, inverse = tables_for_counts(metric, n, n_samples, method, gamma, sampling, prior, rounding)
            run_means = {name: tables[inverse.unsqueeze(0), draws[name] - 1].mean(dim=1) for name in names}
            means[metric][label] = {name: v.tolist() for name, v in run_means.items()}
            counts[metric][label] = {}
            for a, b in combinations(names, 2):
                sign_exact = (exact[metric][a] > exact[metric][b]) - (exact[metric][a] < exact[metric][b])
                sign_runs = torch.sign(run_means[a] - run_means[b])
                counts[metric][label][f"{a} vs {b}"] = int((sign_runs == sign_exact).sum())
    return {"repeats": int(repeats), "counts": counts, "exact": exact, "means": means}


def consistency_report(
    exact_ranks: Mapping[str, object],
    n_items: int | TensorLike,
    n_samples: int,
    metrics: Sequence[str] = DEFAULT_METRICS,
    methods: Sequence[str] = DEFAULT_METHODS,
    repeats: int = 100,
    sampling: str = "binomial",
    prior: PriorLike = None,
    seed: int | None = 0,
    as_frame: bool = False,
) -> dict:
    """Tables 3 and 4 of Krichene & Rendle for your recommenders.

    ``table3``: one row per (metric, recommender) with ``exact`` and, per method, the expected corrected
    value E[M^(r~)] averaged over the instances (``none`` is the expected sampled metric), and the Monte
    Carlo standard deviation over ``repeats`` runs as ``<method> sd``. ``table4``: one row per (pair,
    metric) with the ordering counts per method. ``repeats=0`` skips the Monte Carlo part; otherwise it must be
    an integer >= 2 (a standard deviation over one run does not exist): anything else is a ValueError naming
    ``repeats``.
    """
    repeats = _check_repeats(repeats, allow_zero=True)
    seed = _check_seed(seed)
    metrics, methods = _check_lists(metrics, methods)
    as_frame = check_bool(as_frame, "as_frame")
    ranks, n = _prepare(exact_ranks, n_items)
    table3 = []
    mc = (
        ordering_agreement(ranks, n, n_samples, metrics, methods, repeats, sampling, prior, seed)
        if repeats > 0
        else None
    )
    for metric in metrics:
        for name, r in ranks.items():
            row = {"metric": metric, "recommender": name, "exact": float(metric_values(metric, r, n).mean())}
            for label in methods:
                method, gamma, rounding = parse_method(label)
                e = expected_corrected(metric, r, n, n_samples, method, gamma, sampling, prior, rounding=rounding)
                row[label] = float(e.mean())
                if mc is not None:
                    row[f"{label} sd"] = float(torch.tensor(mc["means"][metric][label][name]).std())
            table3.append(row)
    table4 = []
    if mc is not None:
        pairs = list(next(iter(next(iter(mc["counts"].values())).values())))
        for pair in pairs:
            for metric in metrics:
                row = {"pair": pair, "metric": metric}
                row.update({label: mc["counts"][metric][label][pair] for label in methods})
                table4.append(row)
    out = {"table3": table3, "table4": table4, "repeats": int(repeats), "n_samples": int(n_samples)}
    if as_frame:
        import pandas as pd  # optional dependency

        out["table3"] = pd.DataFrame(table3)
        out["table4"] = pd.DataFrame(table4)
    return out
