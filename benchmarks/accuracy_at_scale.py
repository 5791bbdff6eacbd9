"""Accuracy and interval coverage of every estimator on ml-100k and ml-latest-small.

Exact ranks of the held-out item (leave-last-out, training items excluded, per-user n) for five recommenders of
different shape (``baselines.train_benchmark``: iALS, ItemKNN q = 3, ItemKNN q = 1 k' = 10, popularity, EASE)
on each data set. For each m, recommender and repeat the sampled ranks are drawn with replacement and every
estimator of ``accuracy_ml100k.run_experiment`` estimates HR@K and NDCG@K, K in {1, 5, 10, 20, 50, 100}.

Reported per (data set, m, recommender, metric, estimator): mean estimate, relative error, and for the 95%
interval of ``Estimate.interval`` (the sampling interval value +- 1.96 stderr, widened by the identified
interval of ``identification.py`` where the metric depends on the unresolved top: K below the resolution
(n - 1)/(m + 1) + 1, or NDCG at any K where one sampled rank spans two or more exact ranks):
**coverage** (share of repeats whose interval contains the exact value), **median width**, and the width
relative to the sampling interval alone. Standard errors: table estimators (corrections, mappings, ``beta_fit``,
``bv_mle``) the sd of the per-positive table values over sqrt(N), as ``estimate()``; ``mle`` / ``mes`` the
multinomial bootstrap of ``estimate()``'s default (32 / 16 refits).
The **oracle** row is the posterior mean under the recommender's true rank distribution (prior = the empirical
exact ranks, likelihood = the sampling law): no estimator can expect to beat it. ``gmod`` is fitted as
``estimate()`` fits it (the raw histogram, its 16 bootstrap refits and the ``mes`` reference of its model term) and
reports the users' value, its interval with ``Estimate.interval``'s bias-aware ends over the twin gap; the table
"gmod against the oracle where the top is resolved" lists, per recommender, the cells with K >= b (every positive's
resolution (n - 1)/(m + 1) + 1 at most K), ``gmod``, ``mes`` and the oracle.

Run:  python benchmarks/accuracy_at_scale.py [--repeats 50] [--ms 50 100 500] [--datasets ml-100k ml-latest-small]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from statistics import NormalDist  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_ml100k import TABLE_ESTIMATORS, run_experiment  # noqa: E402

from reco_sampled_plugin import registry  # noqa: E402
from reco_sampled_plugin._rank_hist import pool_by_n, sampled_rank_histogram  # noqa: E402
from reco_sampled_plugin.corrections import correction_tables  # noqa: E402
from reco_sampled_plugin._estimate import bias_aware_halfwidth  # noqa: E402
from reco_sampled_plugin.identification import identified_interval, top_sensitive  # noqa: E402
from reco_sampled_plugin.metric_names import parse_metric  # noqa: E402
from reco_sampled_plugin.mapping import fit_beta, mapping_tables  # noqa: E402
from reco_sampled_plugin.metrics import metric_values  # noqa: E402
from reco_sampled_plugin import registry  # noqa: E402
from reco_sampled_plugin.rank_distribution import fit_rank_distribution  # noqa: E402
from reco_sampled_plugin.simulate import draw_sampled_ranks  # noqa: E402

KS = (1, 5, 10, 20, 50, 100)
ESTIMATORS = ("none", "bv(0.1)", "cls", "bound", "beta(0.5)", "beta_fit", "mle", "mes", "bv_mle(0.1)")
# mes with the entropy relative to r^-beta (a log-rank-smooth prior for the unresolved top)
MES_TILTS = {"mes(beta=0.5)": 0.5, "mes(beta=1)": 1.0}
# fitted as estimate() fits them, outside run_experiment (g-modelling, the users' value)
FIT_ESTIMATORS = ("gmod",)
ALL = ESTIMATORS + tuple(MES_TILTS) + FIT_ESTIMATORS
Z95 = NormalDist().inv_cdf(0.975)


def exact_rank_data(dataset: str, seed: int = 0):
    from reco_sampled_plugin import baselines, datasets

    split = datasets.load_ml100k() if dataset == "ml-100k" else datasets.load_ml_latest_small()
    return baselines.held_out_ranks(baselines.train_benchmark(split.train, seed=seed), split)


def oracle_values(r: np.ndarray, n_u: np.ndarray, draws: torch.Tensor, m, metrics) -> np.ndarray:
    """Posterior mean of M under the empirical exact-rank distribution (prior: the users' exact ranks; the
    likelihood of user u's r~ at support point v is the binomial pmf with p = (r_v - 1)/(n_u - 1), zero where
    r_v > n_u): (repeats, len(metrics)). ``m``: an int, or (repeats, N) per-positive final sizes of adaptive draws
    (the stopping factor of adaptive sampling is free of R, so the same binomial likelihood at the final m)."""
    mv = torch.stack([metric_values(mt, torch.from_numpy(r), torch.from_numpy(n_u)) for mt in metrics], 1)  # (N, S)
    rt = torch.from_numpy(r).to(torch.float64).unsqueeze(0)  # (1, N) support
    nt = torch.from_numpy(n_u).to(torch.float64).unsqueeze(1)  # (N, 1) users
    p = ((rt - 1.0) / (nt - 1.0)).clamp(max=1.0)
    valid = rt <= nt
    logp, log1p = torch.log(p), torch.log1p(-p)
    out = np.empty((draws.shape[0], len(metrics)))
    for b in range(draws.shape[0]):
        j = (draws[b].to(torch.float64) - 1.0).unsqueeze(1)  # (N, 1) successes
        mb = torch.as_tensor(m[b] if isinstance(m, torch.Tensor) else m, dtype=torch.float64).reshape(-1, 1)
        logc = torch.lgamma(mb + 1.0) - torch.lgamma(j + 1.0) - torch.lgamma(mb - j + 1.0)
        a = torch.where(j > 0, j * logp, torch.zeros_like(p))  # 0 log 0 = 0
        c = torch.where(mb - j > 0, (mb - j) * log1p, torch.zeros_like(p))
        logw = torch.where(valid, logc + a + c, torch.tensor(-torch.inf, dtype=torch.float64))
        w = torch.softmax(torch.nan_to_num(logw, nan=-torch.inf), dim=1)
        out[b] = (w @ mv).mean(0).numpy()
    return out


def common_shape_bound(ranks: dict, n_u: np.ndarray, m: int, metric: str) -> dict:
    """How well any estimator that assumes one shape of P(R) inside the first sampled bin can do, even knowing
    every recommender's mass there exactly: with share_j = M_j / HR@b_j (b_u = (n_u - 1)/(m + 1) + 1 per user),
    the best common share s* = 2 / (1/s_min + 1/s_max) has worst relative error (s_max - s_min)/(s_max + s_min)."""
    b_u = (n_u - 1.0) / (m + 1.0) + 1.0
    shares = {}
    for name, r in ranks.items():
        value = float(metric_values(metric, torch.from_numpy(r), torch.from_numpy(n_u)).mean())
        shares[name] = value / float(np.mean(r <= b_u))
    lo, hi = min(shares.values()), max(shares.values())
    return {"shares": shares, "bound": (hi - lo) / (hi + lo)}


def standard_errors(res, per_model, metrics, m):
    """Standard errors per (model, estimator): (repeats, S)."""
    out = {}
    for name, (hists, counts, nodes) in per_model.items():
        total = counts.sum(axis=(1, 2))
        for label in ESTIMATORS:
            if label in TABLE_ESTIMATORS:
                kind, method, arg = TABLE_ESTIMATORS[label]
                tab = np.stack([correction_tables(metrics, int(n), m, method) if kind == "correction"
                                else mapping_tables(metrics, int(n), m, method, arg) for n in nodes])  # (G, S, m + 1)
                tabs = None
            elif label in ("beta_fit", "bv_mle(0.1)"):
                tabs = []
                fits = fit_rank_distribution(hists, "mle") if label == "bv_mle(0.1)" else None
                for b, h in enumerate(hists):
                    if label == "beta_fit":
                        a = fit_beta(h).a
                        tabs.append(np.stack([mapping_tables(metrics, int(n), m, "beta", a) for n in nodes]))
                    else:
                        tabs.append(np.stack([correction_tables(metrics, int(n), m,
                                                                registry.Bv(gamma=0.1, prior=fits[b].prior(int(n))))
                                              for n in nodes]))
                tab = None
            else:
                continue
            se = np.empty((len(hists), len(metrics)))
            for b in range(len(hists)):
                t = tab if tabs is None else tabs[b]
                mean = np.einsum("gi,gsi->s", counts[b], t) / total[b]
                sq = np.einsum("gi,gsi->s", counts[b], t * t) / total[b]
                se[b] = np.sqrt(np.maximum(sq - mean**2, 0.0) * total[b] / (total[b] - 1.0) / total[b])
            out[(name, label)] = se
        # the bootstrap of estimate()'s default (16 refits for mes, 32 for mle)
        for label, method in {"mle": registry.Mle(), "mes": registry.Mes(),
                              **{k: registry.Mes(beta=v) for k, v in MES_TILTS.items()}}.items():
            fits = [fit_rank_distribution(h, method) for h in hists]
            out[(name, label)] = np.array([[f.metric(mt).stderr for mt in metrics] for f in fits])
    return out


def run(dataset: str, ms, repeats: int, seed: int, log=print, progress: bool | None = None):
    t0 = time.perf_counter()
    ranks, n_u = exact_rank_data(dataset, seed)
    log(f"{dataset}: exact ranks of {len(ranks)} recommenders, {len(n_u)} users in {time.perf_counter() - t0:.0f} s")
    metrics = [f"hit@{k}" for k in KS] + [f"ndcg@{k}" for k in KS]
    res = run_experiment(ranks, n_u, ms, repeats, ks=KS, estimators=ESTIMATORS, seed=seed, log=log, progress=progress)
    rows = []
    for m in ms:
        per_model, draws_by = {}, {}
        for i, (name, r) in enumerate(ranks.items()):
            draws = draw_sampled_ranks(r, n_u, m, repeats=repeats, seed=seed + 1000 * m + i)  # as run_experiment
            hists = [pool_by_n(sampled_rank_histogram(d, n_u, m), 0.1) for d in draws]
            per_model[name] = (hists, np.stack([np.stack(h.counts) for h in hists]), hists[0].n_items)
            draws_by[name] = (draws, [sampled_rank_histogram(d, n_u, m) for d in draws])
            for label, beta in MES_TILTS.items():
                fits = fit_rank_distribution(hists, registry.Mes(beta=beta))
                res["values"][(m, name, label)] = np.stack([f.values(metrics) for f in fits])
        ses = standard_errors(res, per_model, metrics, m)
        twins: dict = {}  # gmod's twin gaps (down, up) per draw and metric: its interval's bias-aware ends
        for name in ranks:  # gmod as estimate() runs it: the raw histogram, bootstrap and reference included
            for label in FIT_ESTIMATORS:
                fits = [fit_rank_distribution(h, label) for h in draws_by[name][1]]
                est = [[f.metric(mt, target="users") for mt in metrics] for f in fits]
                res["values"][(m, name, label)] = np.array([[e.value for e in row] for row in est])
                ses[(name, label)] = np.array([[e.stderr for e in row] for row in est])
                twins[(name, label)] = np.array([[e.details.get("twin_gap", (0.0, 0.0)) for e in row] for row in est])
        t1 = time.perf_counter()
        b_max = (float(n_u.max()) - 1.0) / (m + 1.0) + 1.0  # the coarsest resolution: K >= b_max is resolved
        for name, r in ranks.items():
            draws, raw_hists = draws_by[name]
            oracle = oracle_values(r, n_u, draws, m, metrics)
            ident = {}  # where estimate() widens the interval (identification.top_sensitive)
            for s, mt in enumerate(metrics):
                if top_sensitive(parse_metric(mt), raw_hists[0]):
                    ivs = [identified_interval(mt, h, level=0.95) for h in raw_hists]
                    ident[s] = (np.array([iv.lo for iv in ivs]), np.array([iv.hi for iv in ivs]))
            for s, mt in enumerate(metrics):
                exact = res["exact"][name][s]
                for label in ALL + ("oracle",):
                    v = oracle[:, s] if label == "oracle" else res["values"][(m, name, label)][:, s]
                    row = dict(dataset=dataset, m=m, model=name, metric=mt, estimator=label, exact=exact,
                               mean=float(v.mean()), rel_err=float(np.abs(v - exact).mean() / exact),
                               rel_bias=float((v.mean() - exact) / exact), unresolved=s in ident,
                               k_resolved=parse_metric(mt).k >= b_max)
                    if label != "oracle":
                        se = ses[(name, label)][:, s]
                        lo, hi = v - Z95 * se, v + Z95 * se
                        s_width = np.median(hi - lo)
                        if (name, label) in twins:  # as Estimate.interval: bias-aware ends over the twin gap
                            gap = twins[(name, label)][:, s]
                            lo = v - np.array([bias_aware_halfwidth(a, d, 0.95) for a, d in zip(se, gap[:, 0])])
                            hi = v + np.array([bias_aware_halfwidth(a, u, 0.95) for a, u in zip(se, gap[:, 1])])
                        if s in ident and label != "none":
                            lo, hi = np.minimum(lo, ident[s][0]), np.maximum(hi, ident[s][1])
                        cover = (lo <= exact) & (exact <= hi)
                        row.update(coverage=float(cover.mean()), sampling_coverage=float(
                            ((v - Z95 * se <= exact) & (exact <= v + Z95 * se)).mean()),
                            median_width=float(np.median(hi - lo)),
                            width_vs_sampling=float(np.median(hi - lo) / s_width) if s_width > 0 else float("nan"))
                    rows.append(row)
        log(f"{dataset} m={m}: intervals and oracle in {time.perf_counter() - t1:.0f} s")
    return rows


def markdown(df, repeats) -> str:
    lines = [f"{repeats} repeats per cell; 95% intervals. Relative error: mean over repeats of |estimate - exact| / exact.", ""]
    for ds in df.dataset.unique():
        sub = df[df.dataset == ds]
        for mt in ("hit@10", "ndcg@10"):
            s = sub[sub.metric == mt]
            lines += [f"**{ds}, {mt.upper() if mt.startswith('hit') else 'NDCG@10'}: worst relative error over the "
                      "recommenders / coverage (worst recommender) / median width relative to the exact value**", "",
                      "| estimator | " + " | ".join(f"m = {m}" for m in sorted(s.m.unique())) + " |",
                      "|---|" + "---|" * s.m.nunique()]
            for est in ALL + ("oracle",):
                cells = []
                for m in sorted(s.m.unique()):
                    c = s[(s.m == m) & (s.estimator == est)]
                    if est == "oracle":
                        cells.append(f"{c.rel_err.max():.1%}")
                    else:
                        w = (c.median_width / c.exact).median()
                        cells.append(f"{c.rel_err.max():.1%} / {c.coverage.min():.2f} / {w:.2f}x")
                lines.append(f"| `{est}` | " + " | ".join(cells) + " |")
            lines.append("")
        cov = sub[sub.estimator != "oracle"].groupby(["estimator", "m"]).coverage.min().unstack("m")
        lines += [f"**{ds}: worst coverage over recommenders, HR and NDCG, K in {list(KS)}**", "",
                  "| estimator | " + " | ".join(f"m = {m}" for m in cov.columns) + " |", "|---|" + "---|" * len(cov.columns)]
        for est in ALL:
            lines.append(f"| `{est}` | " + " | ".join(f"{cov.loc[est, m]:.2f}" for m in cov.columns) + " |")
        lines.append("")
    lines += resolved_table(df)
    unres = df[(df.estimator == "mes") & df.unresolved]
    lines += ["**`mes` where the top is unresolved: median width of the honest interval relative to the "
              "sampling interval**: " + ", ".join(f"{ds} {unres[unres.dataset == ds].width_vs_sampling.median():.1f}x"
                                                  for ds in unres.dataset.unique()), ""]
    return "\n".join(lines)


def resolved_table(df) -> list[str]:
    """Per recommender, HR / NDCG at K = 10 and 50 where the top is resolved (K >= b for every positive): relative error of the oracle,
    ``gmod`` (its ratio to the oracle, its coverage) and ``mes``."""
    if "gmod" not in set(df.estimator) or "k_resolved" not in df:
        return []
    res = df[df.k_resolved.astype(bool) & df.metric.isin(["hit@10", "ndcg@10", "hit@50", "ndcg@50"])]
    if not len(res):
        return []
    lines = ["**gmod against the oracle where the top is resolved (K >= b): mean relative error, gmod's ratio to "
             "the oracle and coverage, mes**", "",
             "| data set | m | metric | recommender | oracle | `gmod` (ratio, coverage) | `mes` (coverage) |",
             "|---|---|---|---|---|---|---|"]
    for (ds, m, mt, model), c in res.groupby(["dataset", "m", "metric", "model"], sort=False):
        e = c.set_index("estimator")
        o, g, s = e.loc["oracle"], e.loc["gmod"], e.loc["mes"]
        lines.append(f"| {ds} | {m} | {mt} | {model} | {o.rel_err:.1%} | {g.rel_err:.1%} "
                     f"({g.rel_err / o.rel_err:.1f}x, {g.coverage:.2f}) | {s.rel_err:.1%} ({s.coverage:.2f}) |")
    return lines + [""]


def plot(df, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(df.dataset.unique())
    m0 = 100 if (df.m == 100).any() else int(df.m.min())  # the plotted m (a run with --ms 500 has no m = 100)
    fig, axes = plt.subplots(2, len(datasets), figsize=(6 * len(datasets), 8), squeeze=False)
    for j, ds in enumerate(datasets):
        sub = df[(df.dataset == ds) & (df.m == m0) & df.metric.str.startswith("hit")]
        sub = sub.assign(K=sub.metric.str.split("@").str[1].astype(int))
        for est in ("bv(0.1)", "bound", "mes", "oracle"):
            e = sub[sub.estimator == est].groupby("K").rel_err.max()
            axes[0][j].plot(e.index, e.values, marker="o", label=est)
            if est != "oracle":
                c = sub[sub.estimator == est].groupby("K").coverage.min()
                axes[1][j].plot(c.index, c.values, marker="o", label=est)
        axes[0][j].set_yscale("log")
        axes[0][j].set_title(f"{ds}, HR@K, m = {m0}: worst relative error")
        axes[1][j].axhline(0.9, color="grey", lw=0.8)
        axes[1][j].set_ylim(0, 1.02)
        axes[1][j].set_title(f"{ds}, HR@K, m = {m0}: worst coverage of the 95% interval")
        for ax in axes[:, j]:
            ax.set_xscale("log")
            ax.set_xlabel("K")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--ms", type=int, nargs="+", default=[50, 100, 500])
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "ml-latest-small"], choices=["ml-100k", "ml-latest-small"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--bound-only", action="store_true", help="only the common-shape bound table (from exact ranks)")
    ap.add_argument("--from-csv", nargs="+", help="no run: tables and plot from these accuracy_at_scale.csv files")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar on stderr (default: when stderr is a terminal)")
    args = ap.parse_args()
    if args.bound_only:
        print("| data set | m | metric | within-bin shares M / HR@b (min..max over recommenders) | "
              "best worst-case relative error of a common shape |\n|---|---|---|---|---|")
        for ds in args.datasets:
            ranks, n_u = exact_rank_data(ds, args.seed)
            for m in args.ms:
                for metric in ("hit@10", "ndcg@10"):
                    b = common_shape_bound(ranks, n_u, m, metric)
                    sh = b["shares"].values()
                    print(f"| {ds} | {m} | {metric} | {min(sh):.3f}..{max(sh):.3f} | {b['bound']:.1%} |")
        return
    import pandas as pd

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.from_csv:  # e.g. the two data sets run as two processes, one per core
        df = pd.concat([pd.read_csv(f) for f in args.from_csv], ignore_index=True)
    else:
        df = pd.DataFrame([row for ds in args.datasets for row in run(ds, args.ms, args.repeats, args.seed,
                                                                      progress=args.progress)])
    df.to_csv(out / "accuracy_at_scale.csv", index=False)
    repeats = args.repeats
    md = markdown(df, repeats) + f"\nTotal {time.perf_counter() - t0:.0f} s.\n"
    (out / "accuracy_at_scale.md").write_text(md)
    plot(df, out / "accuracy_at_scale.png")
    print(md)


if __name__ == "__main__":
    main()
