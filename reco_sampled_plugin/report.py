"""Write a :class:`~reco_sampled_plugin.reproduce.ReproduceResult` as a report folder: ``report.md``
(the tables), CSV files and PNG plots (matplotlib, imported lazily), and a terminal summary."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np

from ._tables import format_table
from ._estimate import explain_flags
from .reproduce import ReproduceResult

__all__ = ["write_report", "summary_lines", "ordering_verdicts", "unresolved_notes"]


def _fmt(v: object) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _estimator_labels(result: ReproduceResult) -> list[str]:
    cfg = result.config
    adaptive = ["adaptive:mes"] if cfg.design.adaptive_max is not None else []
    return list(cfg.methods) + [f"map:{m}" for m in cfg.mapping_methods] + list(cfg.rank_dist_methods) + adaptive


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(rows[0])
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def ordering_verdicts(result: ReproduceResult, metric: str = "recall@10", good: str = "bv:0.1") -> dict:
    """Pairs the uncorrected sampled metric mis-orders in most runs, and how ``good`` does on them."""
    runs = result.config.repeats
    out: dict[str, Any] = {"misordered_by_none": [], "fixed_by": good}
    for row in result.table4:
        if row["metric"] != metric:
            continue
        if row["none"] < runs / 2:
            out["misordered_by_none"].append({"pair": row["pair"], "none": row["none"], good: row.get(good)})
    return out


def _verdict_lines(result: ReproduceResult, metric: str, each: str, otherwise: str) -> list[str]:
    """The ordering verdict of ``metric`` (:func:`ordering_verdicts`) as lines: ``each`` formatted for every pair the
    sampled metric mis-orders (fields ``pair``, ``none`` and ``bv``, runs that order it correctly, and ``runs``),
    else the one line ``otherwise``."""
    runs = result.config.repeats
    pairs = ordering_verdicts(result, metric)["misordered_by_none"]
    return [each.format(pair=p["pair"], none=p["none"], bv=p["bv:0.1"], runs=runs) for p in pairs] or [otherwise]


def unresolved_notes(result: ReproduceResult) -> list[str]:
    """Why the metrics of Table 3 whose cut-off lies inside the first sampled bin (flag ``top_unresolved`` of every
    estimate there) cannot be pinned down by m samples, in words (``explain_flags``), with the planner command."""
    from ._rank_hist import RankHistogram
    from .identification import top_sensitive
    from .metric_names import parse_metric

    m = result.config.m
    n = int(np.median(np.asarray(result.n_candidates)))
    hist = RankHistogram(np.array([n]), np.array([m]), (np.ones(m + 1),))  # positives at r~ = 1: the bin matters
    users = int(result.dataset.get("test_users", 0)) or None
    metrics = list(dict.fromkeys(row["metric"] for row in result.table3))
    return [f"{metric}: {line}" for metric in metrics if top_sensitive(parse_metric(metric), hist)
            for line in explain_flags(["top_unresolved"], metric=metric, n_items=n, n_samples=m, users=users)]


def _markdown(result: ReproduceResult, figures: dict[str, str]) -> str:
    cfg = result.config
    labels = _estimator_labels(result)
    d = result.dataset
    lines = [
        "# Sampled vs exact metrics: reproduction report",
        "",
        f"Data: `{os.path.basename(d['path'])}` ({d['users']:,} users, {d['items']:,} items, {d['events']:,} events), "
        f"binarised, each user's last event held out ({d['test_users']:,} test events). Exact ranks among each user's "
        f"candidates (catalogue minus training items: {int(result.n_candidates.min()):,} to {int(result.n_candidates.max()):,}). "
        f"Sampling: m = {cfg.m}, {cfg.sampling}, {cfg.repeats} runs, seed {cfg.seed}.",
        "",
        "Estimators: `none` is the plain sampled metric; `rank_estimate`, `cls`, `bv:gamma` are Krichene & Rendle's "
        "corrections (uniform prior); `map:linear`, `map:bound` and `map:beta:1` are Li et al.'s mappings applied as "
        "tables, `map:beta_fit` fits a per run (eq. 19); "
        "`mes` and `mle` estimate the rank distribution from each run's sampled ranks and read every metric from it, "
        "`bv_mle` is `bv` (gamma = 0.1) with that run's `mle` fit as prior "
        "(docs/estimators.md compares them all)."
        + (f" `adaptive:mes` samples adaptively (m = {cfg.m} doubling for positives ranked first, up to "
           f"{cfg.design.adaptive_max}; Li et al., AAAI 2023) and fits `mes` to the final (n, m, rank) of each run."
           if cfg.design.adaptive_max is not None else ""),
        "",
        "## Table 3: exact, expected sampled and corrected metrics (mean, and sd over runs)",
        "",
    ]
    lines += format_table(
        ["metric", "recommender", "exact"] + labels,
        ([row["metric"], row["recommender"], f"{row['exact']:.4f}"]
         + [f"{row[lab]:.4f} ± {row[lab + ' sd']:.4f}" if f"{lab} sd" in row else f"{row[lab]:.4f}" for lab in labels]
         for row in result.table3))
    lines += [
        "",
        f"± is the standard deviation over the {cfg.repeats} sampling runs (the estimator's run-to-run spread "
        "against the exact value), not an interval of one run: one run's honest 95% interval is "
        "`Estimate.interval(0.95)` (`reco-sampled estimate` prints it; docs/estimators.md measures its coverage).",
    ]
    lines += [
        "",
        f"## Table 4: runs (out of {cfg.repeats}) that order each pair as the exact metric does",
        "",
    ]
    lines += format_table(["pair", "metric"] + labels,
                          ([row["pair"], row["metric"]] + [row[lab] for lab in labels] for row in result.table4))
    lines += ["", "## What the data show", ""]
    lines += _verdict_lines(
        result, "recall@10",
        "- Recall@10, {pair}: the uncorrected sampled metric orders the pair correctly in only {none} of {runs} runs; "
        "`bv` with gamma = 0.1 in {bv}.",
        f"- On these data the uncorrected sampled Recall@10 orders every pair correctly in most runs: sampling does "
        f"not mis-order these recommenders here (the sample is {cfg.m} of about "
        f"{int(result.n_candidates.float().mean())} candidates).")
    notes = unresolved_notes(result)
    if notes:
        lines += ["", "Where the top of the ranking is not resolved, no estimator's point value can be trusted alone:", ""]
        lines += [f"- {line}" for line in notes]
    lines += ["", "## Figures", ""]
    captions = {
        "figure5": "Figure 5 analogue: distribution of the exact ranks of the held-out items.",
        "figure6": "Figure 6 analogue: expected Recall@10 against the number of samples m, uncorrected and `bv` (gamma = 0.1); dotted lines are the exact values.",
        "mapping": "Li et al.: sampled hit ratio SHR@k against the exact hit ratio at the mapped cut-off f(k) (bound mapping).",
    }
    if "grouping_error" in result.figure6:
        lines += [
            f"Figure 6 shares one `bv` table among users whose candidate counts differ by less than "
            f"{100 * cfg.n_spread:g}% (each user's own n still drives the sampling law); at m = {cfg.m} "
            f"this moves the expected corrected Recall@10 by at most {result.figure6['grouping_error']:.1e} "
            f"against one table per distinct n.",
            "",
        ]
    if cfg.design.adaptive_max is not None:
        lines += ["What adaptive sampling cost (sampled items per positive, mean over runs; a fixed design costs "
                  f"m = {cfg.m}):", ""]
        first: dict[str, dict] = {}  # each recommender's first row
        for row in result.table3:
            if "adaptive mean m" in row:
                first.setdefault(row["recommender"], row)
        lines += format_table(["recommender", "mean m", "share at the cap"],
                              ([name, f"{row['adaptive mean m']:.1f}", f"{row['adaptive share at cap']:.3f}"]
                               for name, row in first.items()))
        lines.append("")
    for key, fname in figures.items():
        lines += [f"![{key}]({fname})", "", captions[key], ""]
    t = result.timings
    lines += ["## Timings", "", ", ".join(f"{k} {v:.1f} s" for k, v in t.items()), ""]
    return "\n".join(lines)


def _plots(result: ReproduceResult, out: Path) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {}
    # Figure 5: rank distributions
    fig, ax = plt.subplots(figsize=(7, 4))
    n_max = int(result.n_candidates.max())
    bins = np.unique(np.geomspace(1, n_max + 1, 40).astype(int))
    for name, r in result.ranks.items():
        ax.hist(r.numpy(), bins=bins.tolist(), histtype="step", label=name, linewidth=1.5)
    ax.set_xscale("log")
    ax.set_xlabel("exact rank of the held-out item (log scale)")
    ax.set_ylabel("test users")
    ax.set_title("Exact rank distributions")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "figure5_rank_distribution.png", dpi=110)
    plt.close(fig)
    figures["figure5"] = "figure5_rank_distribution.png"

    # Figure 6: expected Recall@10 vs m
    f6 = result.figure6
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(f6["exact"]):
        c = colors[i % len(colors)]
        for ax, key in zip(axes, ("none", "bv:0.1")):
            ax.plot(f6["m"], f6[key][name], marker="o", color=c, label=name)
            ax.axhline(f6["exact"][name], color=c, linestyle=":")
    for ax, title in zip(axes, ("uncorrected sampled Recall@10", "corrected (bv, gamma = 0.1)")):
        ax.set_xscale("log")
        ax.set_xlabel("m (sampled items per relevant item)")
        ax.set_ylabel("expected Recall@10")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "figure6_recall_vs_m.png", dpi=110)
    plt.close(fig)
    figures["figure6"] = "figure6_recall_vs_m.png"

    # Li et al.: SHR@k vs HR@f(k)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, c) in enumerate(result.mapping_curves.items()):
        col = colors[i % len(colors)]
        ax.plot(c["f_bound"], c["shr"], color=col, label=f"{name}: SHR@k at K = f(k)")
        ax.plot(c["f_bound"], c["hr_at_f_bound"], color=col, linestyle=":", label=f"{name}: exact HR@K")
    ax.set_xscale("log")
    ax.set_xlabel("global cut-off K = f(k) (bound mapping)")
    ax.set_ylabel("hit ratio")
    ax.set_title(f"Sampled hit ratio mapped to global cut-offs (m = {result.config.m})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "mapping_shr_vs_hr.png", dpi=110)
    plt.close(fig)
    figures["mapping"] = "mapping_shr_vs_hr.png"
    return figures


def write_report(result: ReproduceResult, out_dir: str | os.PathLike, plots: bool = True) -> Path:
    """Write report.md, table3.csv, table4.csv, figure6.csv, ranks.csv and the PNG plots; return the folder."""
    from ._options import check_bool

    plots = check_bool(plots, "plots")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "table3.csv", result.table3)
    _write_csv(out / "table4.csv", result.table4)
    f6 = result.figure6
    _write_csv(
        out / "figure6.csv",
        [
            {"recommender": name, "m": m, "exact": f6["exact"][name], "none": f6["none"][name][i], "bv:0.1": f6["bv:0.1"][name][i]}
            for name in f6["exact"]
            for i, m in enumerate(f6["m"])
        ],
    )
    names = list(result.ranks)
    with open(out / "ranks.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["n_candidates"] + names)
        cols = [result.n_candidates.tolist()] + [result.ranks[n].tolist() for n in names]
        w.writerows(zip(*cols))
    figures = _plots(result, out) if plots else {}
    (out / "report.md").write_text(_markdown(result, figures))
    return out


def summary_lines(result: ReproduceResult, metric: str = "recall@10") -> list[str]:
    """A short terminal summary: exact vs sampled vs corrected for one metric, and the ordering verdict."""
    first = result.table3[0] if result.table3 else {}
    labels = [lab for lab in ("none", "bv:0.1", "map:bound", "mes", "adaptive:mes") if lab in first]
    lines = [f"{metric}: exact vs expected sampled (none), corrected and estimated, m = {result.config.m}"]
    lines += format_table(["recommender", "exact"] + labels,
                          ([row["recommender"], f"{row['exact']:.4f}"] + [f"{row[lab]:.4f}" for lab in labels]
                           for row in result.table3 if row["metric"] == metric),
                          formats=["<22", ">9"] + [">12"] * len(labels))
    lines += _verdict_lines(result, metric, "mis-ordered by the sampled metric: {pair} (correct in {none}/{runs} runs; "
                                            "bv 0.1: {bv}/{runs})",
                            "the sampled metric orders every pair correctly in most runs on these data")
    lines += [line for line in unresolved_notes(result) if line.startswith(f"{metric}: ")]
    return lines
