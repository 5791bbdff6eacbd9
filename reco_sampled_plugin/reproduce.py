"""The main job: reproduce Krichene & Rendle's and Li et al.'s experiments on real data.

Pipeline (``reco-sampled reproduce``): load a user,item[,rating,timestamp] file (default: MovieLens
100k from the ``recbole`` wheel), binarise, hold out each user's last event (Krichene & Rendle
section 6), train the paper's three recommenders (section 9: iALS d = 16, lambda = 10, alpha = 0.2;
item-kNN q = 3; item-kNN q = 1, k' = 10) plus popularity, rank every test item exactly among the
user's candidates (the catalogue minus the user's training items), and compute

* the exact rank distributions (Figure 5),
* Table 3: exact, expected sampled and expected corrected metrics with Monte Carlo standard
  deviations over ``repeats`` sampling runs, plus Li et al.'s mapping estimators,
* Table 4: how many of the runs order each pair of recommenders as the exact metric does,
* Figure 6: expected Recall@10 against m, uncorrected and ``bv`` (gamma = 0.1),
* Li et al.'s SHR-vs-HR mapping (sampled hit ratio at k against exact HR at f(k)),
* with an adaptive design (``n_samples=SamplingDesign(m, adaptive_max=cap)``): adaptive sampling (m doubling for
  positives ranked first, up to the cap; Li et al., AAAI 2023) in Tables 3 and 4 (``adaptive:mes``), with its cost
  (mean m per positive, share at the cap).

This module computes; :mod:`reco_sampled_plugin.report` writes Markdown, CSV and PNG.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Callable, Sequence, cast

import numpy as np
import torch

from . import registry
from ._checks import check_int, check_required
from ._options import check_names, check_positive_float, check_seed
from ._progress import ProgressBar, progress_bar
from .consistency import consistency_report
from .corrections import correction_tables, expected_corrected
from .datasets import LeaveLastOutSplit, binarize, leave_last_out, load_interactions, ml100k_path
from .design import SamplingDesign, as_design
from .mapping import mapping, mapping_table, mapping_tables
from .metrics import metric_values
from .ranking import exact_ranks
from .sampling_laws import SAMPLING_LAWS, expected_sampled
from .simulate import draw_sampled_ranks

logger = logging.getLogger(__name__)

__all__ = ["ReproduceConfig", "ReproduceResult", "run_reproduce", "exact_ranks_for_split"]

PAPER_METRICS = ("recall@10", "ndcg@10", "ap", "auc")
PAPER_METHODS = ("none", "rank_estimate", "cls", "bv:1", "bv:0.1", "bv:0.01", "bv:0.001")
MAPPING_METHODS = ("linear", "bound", "beta:1", "beta_fit")
RANK_DIST_METHODS = ("mes", "mle", "bv_mle")  # bv_mle: bv (gamma = 0.1) with each run's mle fit as prior


@dataclass
class ReproduceConfig:
    """Settings of :func:`run_reproduce` (defaults: the paper's setup on MovieLens 100k).

    ``n_samples`` is the sampling design, uniform: an int m (``SamplingDesign(m)``, with replacement),
    ``SamplingDesign(m, replacement=False)`` (without), or ``SamplingDesign(m, adaptive_max=cap)``: Tables 3 and 4
    then also sample adaptively from m up to the cap (``adaptive:mes``); every other row draws a fixed m.
    """

    data: str | None = None  # None: ml-100k from the recbole wheel
    n_samples: int | SamplingDesign = 100
    repeats: int = 100
    seed: int = 0
    metrics: Sequence[str] = PAPER_METRICS
    methods: Sequence[str] = PAPER_METHODS
    mapping_methods: Sequence[str] = MAPPING_METHODS
    rank_dist_methods: Sequence[str] = RANK_DIST_METHODS  # fitted per run (batched EM / L-BFGS-B)
    m_grid: Sequence[int] = (10, 20, 50, 100, 200, 500, 1000)
    als_iterations: int = 20
    batch_size: int = 1024
    n_spread: float = 0.02  # Figure 6: users share a correction table when their n differ by < 2%

    @property
    def design(self) -> SamplingDesign:
        """``n_samples`` as a :class:`~reco_sampled_plugin.design.SamplingDesign` (an int m: with replacement)."""
        return as_design(self.n_samples)

    @property
    def m(self) -> int:
        """The sampled irrelevant items per test item of the fixed-m rows (an adaptive design's first stage)."""
        return self.design.n_samples

    @property
    def sampling(self) -> str:
        """The design's law, ``"binomial"`` (with replacement) or ``"hypergeometric"``."""
        return self.design.law


@dataclass
class ReproduceResult:
    """Everything the report shows, as plain data."""

    config: ReproduceConfig
    dataset: dict
    ranks: dict[str, torch.Tensor]  # recommender -> exact 1-based ranks of the test items
    n_candidates: torch.Tensor  # candidates per test user
    table3: list[dict]
    table4: list[dict]
    figure6: dict  # {"m": [...], "exact": {rec: v}, "none": {rec: [...]}, "bv:0.1": {rec: [...]}}
    mapping_curves: dict  # rec -> {"k", "f_bound", "shr", "hr_at_f", "exact_hr"}
    timings: dict[str, float] = field(default_factory=dict)


_LAWS = {"binomial": True, "hypergeometric": False}


def _design(m: int, sampling: str) -> SamplingDesign:
    """The fixed-m :class:`~reco_sampled_plugin.design.SamplingDesign` of ``m`` and the law ``sampling`` (checked)."""
    return SamplingDesign(m, replacement=_LAWS[sampling])


def _int_list(x: Any, name: str) -> tuple:
    """A list option of integers (``m_grid``): a list or tuple, not one number, a str or a mapping."""
    if not isinstance(x, (list, tuple)) or not x:
        raise ValueError(f"{name}: expected a non-empty list of integers, got {x!r}")
    return tuple(x)


def _checked_config(cfg: ReproduceConfig) -> ReproduceConfig:
    """``cfg`` with every option checked once: ``n_samples`` as its uniform SamplingDesign (an int m: with
    replacement), its estimator labels' base names against the registry (``bv:0.1`` -> ``bv``)."""
    # every option through the package's one check of its kind (a ValueError naming the field)
    if cfg.data is not None and not isinstance(cfg.data, (str, os.PathLike)):
        raise ValueError(f"data: expected a file path or None, got {cfg.data!r}")
    lists: dict[str, Any] = {key: check_names(getattr(cfg, key), key, "estimator labels") for key in
             ("methods", "mapping_methods", "rank_dist_methods")}
    cfg = dataclasses.replace(
        cfg, repeats=check_int(cfg.repeats, "repeats", 2), seed=check_seed(cfg.seed, "seed"),
        als_iterations=check_int(cfg.als_iterations, "als_iterations", 0),
        batch_size=check_int(cfg.batch_size, "batch_size", 1), n_spread=check_positive_float(cfg.n_spread, "n_spread"),
        metrics=check_names(cfg.metrics, "metrics"), m_grid=tuple(check_int(m, "m_grid", 1) for m in
                                                                  _int_list(cfg.m_grid, "m_grid")), **lists)
    design = as_design(check_required(cfg.n_samples, "n_samples", "the sampled irrelevant items per test item m, or a "
                                      "SamplingDesign"))
    if design.law not in SAMPLING_LAWS:  # the simulations are of uniform draws
        raise ValueError(f"n_samples: the reproduction simulates uniform draws; {design!r} has {design.law} draws")
    if design.exact_at_cap:  # the adaptive rows fit the sampled ranks only
        raise ValueError(f"n_samples: the reproduction's adaptive rows draw without completion; drop exact_at_cap "
                         f"from {design!r}")
    groups = (
        ("methods", cfg.methods, lambda e: e.family in ("none", "correction") and not e.fits_distribution),
        ("mapping_methods", cfg.mapping_methods, lambda e: e.family == "mapping"),
        ("rank_dist_methods", cfg.rank_dist_methods, lambda e: e.fits_distribution),
    )
    fixed = SamplingDesign(design.n_samples, replacement=design.replacement)  # Tables 3 and 4: fixed m
    for key, labels, fits in groups:
        for label in labels:
            base = str(label).partition(":")[0]
            entry = registry.get(base)
            if not fits(entry):
                raise ValueError(f"{key}: {label!r} is a {entry.family} estimator; use some of "
                                 f"{tuple(n for n in registry.names() if fits(registry.get(n)))}")
            if not entry.supports(fixed):
                raise ValueError(f"{key}: {label!r} does not support {fixed.describe()}")
    if design.adaptive is not None and not registry.get("mes").supports(design):  # the adaptive:mes rows
        raise ValueError(f"n_samples: 'mes' does not support {design.describe()}")
    return dataclasses.replace(cfg, n_samples=design)


def _progress(total: int, desc: str, enabled: bool | None) -> ProgressBar:
    """A manual progress bar on stderr (``_progress.progress_bar``; None: when stderr is a terminal)."""
    return progress_bar(total=total, desc=desc, enabled=enabled)


def exact_ranks_for_split(models: dict, train: Any, test_items: np.ndarray, batch_size: int = 1024,
                          progress: bool | None = False) -> tuple[dict[str, torch.Tensor], torch.Tensor, np.ndarray]:
    """Exact ranks of each user's test item for each model, training items excluded.

    Returns ({model: (U,) int64 ranks}, (U,) candidate counts, test user indices).
    """
    users = np.flatnonzero(test_items >= 0)
    n_items = train.shape[1]
    n_train = np.diff(train.indptr)[users]
    n_cand = torch.tensor(n_items - n_train, dtype=torch.int64)
    out = {}
    bar = _progress(len(models) * math.ceil(len(users) / batch_size), "exact ranks", progress)
    for name, model in models.items():
        parts = []
        for start in range(0, len(users), batch_size):  # batches of users; each batch vectorised
            u = users[start : start + batch_size]
            block = train[u]
            width = max(int(np.diff(block.indptr).max()), 1) if len(u) else 1
            exclude = torch.full((len(u), width), -1, dtype=torch.int64)
            row = np.repeat(np.arange(len(u)), np.diff(block.indptr))
            slot = np.arange(block.nnz) - np.repeat(block.indptr[:-1], np.diff(block.indptr))
            exclude[row, slot] = torch.from_numpy(block.indices.astype(np.int64))
            scores = model.score(torch.from_numpy(u)).cpu()
            parts.append(exact_ranks(scores, torch.from_numpy(test_items[u].astype(np.int64)), exclude)[:, 0])
            bar.update()
        out[name] = torch.cat(parts)
    bar.close()
    return out, n_cand, users


def _run_histograms(draws: dict[str, torch.Tensor], n_cand: torch.Tensor, cfg: ReproduceConfig) -> dict[str, list]:
    """recommender -> each run's histogram of sampled ranks moved onto the 10% grid of n (``pool_by_n``): formed
    once, read by ``beta_fit`` (:func:`_beta_fit_runs`) and the rank-distribution fits (:func:`_rank_dist_rows`)."""
    from ._rank_hist import pool_by_n, sampled_rank_histogram

    n_np = n_cand.numpy()
    return {name: [pool_by_n(sampled_rank_histogram(d, n_np, cfg.m), 0.1) for d in d_runs.numpy()]
            for name, d_runs in draws.items()}


def _mapping_rows(ranks: dict[str, torch.Tensor], n_cand: torch.Tensor, cfg: ReproduceConfig,
                  draws: dict[str, torch.Tensor], hists: dict[str, list]) -> tuple[list[dict], dict]:
    """Li et al.'s mapping estimators as table methods: expected value and Monte Carlo sd per
    (metric, recommender), and the per-run means for the ordering counts (``hists``: :func:`_run_histograms`)."""
    rows: list[dict] = []
    run_means: dict = {}
    uniq, inverse = torch.unique(n_cand, return_inverse=True)
    if "beta_fit" in cfg.mapping_methods:  # a fitted per run (eq. 19): tables on the 10% grid of n
        fitted = _beta_fit_runs(ranks, cfg, hists)
    for metric in cfg.metrics:
        run_means[metric] = {}
        for label in cfg.mapping_methods:
            if label == "beta_fit":
                run_means[metric]["map:beta_fit"] = {name: fitted[name][:, list(cfg.metrics).index(metric)] for name in ranks}
                continue
            method, _, arg = label.partition(":")
            a = float(arg) if arg else None
            tables = torch.from_numpy(
                np.stack([mapping_table(metric, int(n), cfg.m, method, a) for n in uniq.tolist()])
            )
            run_means[metric][f"map:{label}"] = {
                name: tables[inverse.unsqueeze(0), draws[name] - 1].mean(dim=1) for name in ranks
            }
    for metric in cfg.metrics:
        for name in ranks:
            row: dict[str, Any] = {"metric": metric, "recommender": name}
            for label in cfg.mapping_methods:
                v = run_means[metric][f"map:{label}"][name]
                row[f"map:{label}"] = float(v.mean())
                row[f"map:{label} sd"] = float(v.std())
            rows.append(row)
    return rows, run_means


def _beta_fit_runs(ranks: dict[str, torch.Tensor], cfg: ReproduceConfig, hists: dict[str, list]) -> dict:
    """Li et al.'s ``beta_fit`` per run: a from the run's sampled ranks (eq. 19), then the Beta mapping tables
    of every metric on the 10% grid of n (``hists``: :func:`_run_histograms`); returns recommender -> (runs,
    metrics) values."""
    from .mapping import fit_beta

    out = {}
    for name in ranks:
        values = []
        for hist in hists[name]:
            a = fit_beta(hist).a
            tables = [mapping_tables(list(cfg.metrics), int(n), cfg.m, "beta", a) for n in hist.n_items]
            values.append(sum(t @ c for t, c in zip(tables, hist.counts)) / hist.total)
        out[name] = torch.from_numpy(np.stack(values))
    return out


def _rank_dist_rows(ranks: dict[str, torch.Tensor], cfg: ReproduceConfig,
                    run_hists: dict[str, list]) -> tuple[list[dict], dict]:
    """Rank-distribution estimators (``mle``, ``mes``): one fit per run (histograms moved onto a 10% grid
    of n, fits batched over the runs), every metric read from the fit; ``bv_mle``: ``bv`` (gamma = 0.1) with
    the run's ``mle`` fit as prior. Rows and per-run values as :func:`_mapping_rows` (``run_hists``:
    :func:`_run_histograms`)."""
    from .rank_distribution import fit_rank_distribution

    metrics = list(cfg.metrics)
    per_run: dict = {metric: {} for metric in metrics}
    design = _design(cfg.m, cfg.sampling)  # bv_mle's tables: one fixed-m design for every run and n
    for name in ranks:
        hists = run_hists[name]
        fits = {}
        for method in cfg.rank_dist_methods:
            fit_method = "mle" if method == "bv_mle" else method
            if fit_method not in fits:
                fits[fit_method] = fit_rank_distribution(hists, fit_method, sampling=cfg.sampling)
            if method == "bv_mle":  # bv (gamma = 0.1) with each run's mle fit as the prior p(r)
                values = torch.from_numpy(np.stack([
                    cast(np.ndarray, sum(correction_tables(metrics, int(n), design,
                                                           registry.Bv(gamma=0.1, prior=fit.prior(int(n)))) @ c
                                         for n, c in zip(h.n_items, h.counts))) / h.total
                    for h, fit in zip(hists, fits["mle"])
                ]))
            else:
                values = torch.from_numpy(np.stack([f.values(metrics) for f in fits[method]]))  # (runs, metrics)
            for s, metric in enumerate(metrics):
                per_run[metric].setdefault(method, {})[name] = values[:, s]
    rows = []
    for metric in metrics:
        for name in ranks:
            row: dict[str, Any] = {"metric": metric, "recommender": name}
            for method in cfg.rank_dist_methods:
                v = per_run[metric][method][name]
                row[method] = float(v.mean())
                row[f"{method} sd"] = float(v.std())
            rows.append(row)
    return rows, per_run


def _adaptive_rows(ranks: dict[str, torch.Tensor], n_cand: torch.Tensor, cfg: ReproduceConfig) -> tuple[list[dict], dict]:
    """Adaptive sampling (``adaptive.py``) from the exact ranks, ``repeats`` runs drawn at once, one ``mes`` fit
    per run (histograms on the 10% grid of n, groups keyed by (n, final m)): rows with the mean, sd and the cost
    (mean m per positive, share at the cap), and the per-run values as :func:`_mapping_rows`."""
    from ._rank_hist import pool_by_n, sampled_rank_histogram
    from .adaptive import adaptive_sampled_ranks_from_exact
    from .rank_distribution import fit_rank_distribution

    design = cfg.design
    assert design.adaptive_max is not None  # called for an adaptive configuration only
    metrics = list(cfg.metrics)
    per_run: dict = {metric: {"adaptive:mes": {}} for metric in metrics}
    cost: dict = {}
    n_np = n_cand.numpy()
    for i, (name, r) in enumerate(ranks.items()):
        gen = torch.Generator().manual_seed(cfg.seed + 104_729 * (i + 1))
        runs = r.unsqueeze(0).expand(cfg.repeats, -1)
        drawn = adaptive_sampled_ranks_from_exact(runs, n_cand, design, gen)
        s_ranks, sizes = drawn.ranks, cast(torch.Tensor, drawn.n_samples)  # an adaptive draw carries its sizes
        hists = [pool_by_n(sampled_rank_histogram(d, n_np, z), 0.1) for d, z in zip(s_ranks.numpy(), sizes.numpy())]
        fits = fit_rank_distribution(hists, "mes", sampling="binomial")
        values = torch.from_numpy(np.stack([f.values(metrics) for f in fits]))
        for k, metric in enumerate(metrics):
            per_run[metric]["adaptive:mes"][name] = values[:, k]
        cost[name] = (float(sizes.double().mean()), float((sizes == design.cap).double().mean()))
    rows = []
    for metric in metrics:
        for name in ranks:
            v = per_run[metric]["adaptive:mes"][name]
            rows.append({"metric": metric, "recommender": name, "adaptive:mes": float(v.mean()),
                         "adaptive:mes sd": float(v.std()), "adaptive mean m": cost[name][0],
                         "adaptive share at cap": cost[name][1]})
    return rows, per_run


def _ordering_counts(exact: dict, run_means: dict) -> dict:
    counts = {}
    names = list(exact)
    for a, b in combinations(names, 2):
        sign_exact = (exact[a] > exact[b]) - (exact[a] < exact[b])
        counts[f"{a} vs {b}"] = int((torch.sign(run_means[a] - run_means[b]) == sign_exact).sum())
    return counts


def _mapping_curves(ranks: dict[str, torch.Tensor], n_cand: torch.Tensor, m: int, seed: int) -> dict:
    """For each recommender: SHR@k (one sampling run), f(k) by ``bound`` and ``beta`` (a = 1), and
    the exact HR at those cut-offs (Li et al., Figure 1 / Table 5)."""
    n = int(torch.median(n_cand.double()).round())
    k = np.arange(1, m + 2)
    curves = {}
    for i, (name, r) in enumerate(ranks.items()):
        sampled = draw_sampled_ranks(r, n_cand, m, repeats=1, seed=seed + 31 * i)[0]
        shr = np.array([float((sampled <= kk).double().mean()) for kk in k.tolist()])
        f_bound = mapping(k, n, m, "bound")
        f_beta = mapping(k, n, m, "beta", a=1.0)
        # exact HR at a (possibly fractional) cut-off K: fraction of ranks <= K
        r_sorted = np.sort(r.numpy())
        hr = lambda K: np.searchsorted(r_sorted, np.floor(K), side="right") / len(r_sorted)  # noqa: E731
        curves[name] = {
            "k": k.tolist(),
            "shr": shr.tolist(),
            "f_bound": np.asarray(f_bound, dtype=float).tolist(),
            "f_beta": np.asarray(f_beta, dtype=float).tolist(),
            "hr_at_f_bound": hr(np.asarray(f_bound, dtype=float)).tolist(),
            "hr_at_f_beta": hr(np.asarray(f_beta, dtype=float)).tolist(),
            "n_items": n,
        }
    return curves


def _n_groups(n_cand: torch.Tensor, spread: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Geometric bins of relative width ``spread`` over the candidate counts: (representative n per
    bin, bin index per user). The representative is the bin's median count."""
    logn = torch.log(n_cand.double())
    bins = torch.floor((logn - logn.min()) / math.log1p(spread)).to(torch.int64)
    uniq, inverse = torch.unique(bins, return_inverse=True)
    reps = torch.stack([n_cand[inverse == g].double().median() for g in range(len(uniq))]).round().to(torch.int64)
    return reps, inverse


def _expected_corrected_grouped(metric: str, ranks: torch.Tensor, n_cand: torch.Tensor, m: int, sampling: str,
                                spread: float) -> torch.Tensor:
    """E[M^(r~) | r] per user with the ``bv`` (gamma = 0.1) table of the user's n-bin (see :func:`_n_groups`);
    the sampling law uses each user's own n. ``spread = 0`` gives one table per distinct n (exact)."""
    from .corrections import correction_table
    from .sampling_laws import log_sampled_rank_pmf_unbounded

    if spread <= 0:
        return expected_corrected(metric, ranks, n_cand, _design(m, sampling), "bv")
    reps, inverse = _n_groups(n_cand, spread)
    tables = torch.stack([correction_table(metric, int(n), _design(m, sampling), "bv") for n in reps.tolist()])
    pmf = log_sampled_rank_pmf_unbounded(ranks, n_cand, m, sampling).exp()  # (U, m + 1)
    return (pmf * tables[inverse]).sum(1)


def _load_split(cfg: ReproduceConfig) -> tuple[LeaveLastOutSplit, dict]:
    """The leave-last-out split of ``cfg.data`` (default ml-100k), binarised, and what the report says of the data."""
    path = cfg.data or ml100k_path()
    inter = binarize(load_interactions(path))
    split = leave_last_out(inter)
    dataset = {
        "path": str(path),
        "users": int(split.n_users),
        "items": int(split.n_items),
        "events": int(len(inter)),
        "test_users": int(split.n_test),
    }
    if split.n_test < 2:
        raise ValueError(f"data: {path} leaves fewer than 2 users with a held-out event; nothing to evaluate")
    return split, dataset


def _tables_3_and_4(ranks: dict[str, torch.Tensor], n_cand: torch.Tensor, cfg: ReproduceConfig,
                    progress: bool | None) -> tuple[list[dict], list[dict]]:
    """Tables 3 and 4: the consistency report's rows (``none`` and the corrections) joined with the mapping,
    rank-distribution and adaptive estimators' rows (one draw of ``repeats`` runs per recommender, shared)."""
    m = cfg.m
    bar = _progress(3, "tables 3 and 4", progress)
    report = consistency_report(ranks, n_cand, _design(m, cfg.sampling), cfg.metrics, cfg.methods, cfg.repeats, seed=cfg.seed)
    bar.update()
    names = list(ranks)
    draws = {
        name: draw_sampled_ranks(ranks[name], n_cand, m, cfg.sampling, cfg.repeats, cfg.seed + 7919 * i)
        for i, name in enumerate(names)
    }
    hists = _run_histograms(draws, n_cand, cfg)  # each run's pooled histogram, for beta_fit and the fits
    map_rows, map_runs = _mapping_rows(ranks, n_cand, cfg, draws, hists)
    bar.update()
    rd_rows, rd_runs = _rank_dist_rows(ranks, cfg, hists)
    bar.update()
    if cfg.design.adaptive_max is not None:
        ad_rows, ad_runs = _adaptive_rows(ranks, n_cand, cfg)
    else:
        ad_rows, ad_runs = [{} for _ in rd_rows], {metric: {} for metric in cfg.metrics}
    bar.close()
    table3 = report["table3"]
    for row, extra, extra_rd, extra_ad in zip(table3, map_rows, rd_rows, ad_rows):
        assert row["metric"] == extra["metric"] == extra_rd["metric"] == extra_ad.get("metric", row["metric"])
        assert row["recommender"] == extra["recommender"] == extra_rd["recommender"]
        for more in (extra, extra_rd, extra_ad):
            row.update({k: v for k, v in more.items() if k not in ("metric", "recommender")})
    table4 = report["table4"]
    for row in table4:
        exact = {name: float(metric_values(row["metric"], ranks[name], n_cand).mean()) for name in names}
        runs_by_label = list(map_runs[row["metric"]].items()) + list(rd_runs[row["metric"]].items())
        for label, runs in runs_by_label + list(ad_runs[row["metric"]].items()):
            row[label] = _ordering_counts(exact, runs)[row["pair"]]
    return table3, table4


def _figure6(ranks: dict[str, torch.Tensor], n_cand: torch.Tensor, cfg: ReproduceConfig,
             progress: bool | None) -> dict[str, Any]:
    """Figure 6: expected Recall@10 against m (``m_grid``; without replacement only m below every user's
    irrelevant items), uncorrected and ``bv`` (gamma = 0.1) on tables shared within ``n_spread``, and the error of
    that sharing at the Tables' m (``grouping_error``, with ``bv:0.1`` among the methods)."""
    grid = [mm for mm in cfg.m_grid if cfg.sampling == "binomial" or mm < int(n_cand.min())]
    figure6: dict[str, Any] = {"m": grid, "exact": {}, "none": {}, "bv:0.1": {}}
    bar = _progress(len(grid) * len(ranks), "Figure 6", progress)
    for name in ranks:
        figure6["exact"][name] = float(metric_values("recall@10", ranks[name], n_cand).mean())
        figure6["none"][name], figure6["bv:0.1"][name] = [], []
        for mm in grid:
            figure6["none"][name].append(float(expected_sampled("recall@10", ranks[name], n_cand, mm, cfg.sampling).mean()))
            figure6["bv:0.1"][name].append(
                float(_expected_corrected_grouped("recall@10", ranks[name], n_cand, mm, cfg.sampling, cfg.n_spread).mean())
            )
            bar.update()
    bar.close()
    # measured error of sharing tables across n-bins, at the m of Table 3 (whose per-n tables exist)
    if "bv:0.1" in cfg.methods:
        figure6["grouping_error"] = max(
            abs(float(_expected_corrected_grouped("recall@10", r, n_cand, cfg.m, cfg.sampling, cfg.n_spread).mean())
                - float(_expected_corrected_grouped("recall@10", r, n_cand, cfg.m, cfg.sampling, 0.0).mean()))
            for r in ranks.values()
        )
    return figure6


def run_reproduce(cfg: ReproduceConfig | None = None, progress: bool | None = None, log: Callable[[str], None] | None = None) -> ReproduceResult:
    """Run the whole experiment; see the module docstring. ``log`` receives one line per stage (each is also logged
    at INFO on this module's logger); ``progress``: bars on stderr (True, False; None: when stderr is a terminal)."""
    cfg = _checked_config(cfg or ReproduceConfig())

    def say(line: str) -> None:
        logger.info("%s", line)
        if log is not None:
            log(line)

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    split, dataset = _load_split(cfg)
    timings["load"] = time.perf_counter() - t0
    say(f"data: {dataset['users']:,} users, {dataset['items']:,} items, {dataset['events']:,} events, "
        f"{dataset['test_users']:,} held-out events ({timings['load']:.1f} s)")

    from .baselines import train_all

    t = time.perf_counter()
    models = train_all(split.train, seed=cfg.seed, als_iterations=cfg.als_iterations)
    timings["train"] = time.perf_counter() - t
    say(f"trained {', '.join(models)} ({timings['train']:.1f} s)")

    t = time.perf_counter()
    ranks, n_cand, _ = exact_ranks_for_split(models, split.train, split.test_items, cfg.batch_size, progress)
    timings["rank"] = time.perf_counter() - t
    say(f"exact ranks of {len(n_cand):,} test items among {int(n_cand.min()):,}-{int(n_cand.max()):,} candidates ({timings['rank']:.1f} s)")

    m = cfg.m  # the design was checked by _checked_config
    if m >= int(n_cand.min()) and cfg.sampling == "hypergeometric":
        raise ValueError(f"n_samples: m = {m} draws without replacement exceed some user's {int(n_cand.min()) - 1} irrelevant items")

    t = time.perf_counter()
    table3, table4 = _tables_3_and_4(ranks, n_cand, cfg, progress)
    timings["tables"] = time.perf_counter() - t
    say(f"tables 3 and 4: {len(cfg.metrics)} metrics x {len(cfg.methods) + len(cfg.mapping_methods) + len(cfg.rank_dist_methods)} estimators, "
        f"{cfg.repeats} sampling runs ({timings['tables']:.1f} s)")

    t = time.perf_counter()
    figure6 = _figure6(ranks, n_cand, cfg, progress)
    timings["figure6"] = time.perf_counter() - t
    say(f"Figure 6: expected Recall@10 for m in {figure6['m']} ({timings['figure6']:.1f} s)")

    t = time.perf_counter()
    curves = _mapping_curves(ranks, n_cand, m, cfg.seed)
    timings["mapping"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    return ReproduceResult(cfg, dataset, ranks, n_cand, table3, table4, figure6, curves, timings)
