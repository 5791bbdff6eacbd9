"""Accuracy of every estimator on MovieLens 100k: error against the exact metric and pairwise ordering.

Exact ranks come from the four recommenders of ``baselines.train_all`` (iALS, ItemKNN q = 3, ItemKNN q = 1 with
k' = 10, popularity), leave-last-out, training items excluded (per-user candidate counts n_u, 946..1663).
For each m, each recommender and R repeats, sampled ranks are drawn in one vectorised call
(``draw_sampled_ranks(exact, n_u, m, repeats=R)``: r~ - 1 ~ Binomial(m, (r - 1)/(n_u - 1)), the law of uniform
sampling with replacement). Every repeat's histogram is moved onto a geometric grid of n with
``max_rel_n_spread`` (default 0.1: 7 nodes; measured error in docs/research-notes.md, "Pooling candidate counts"), then

* table estimators (``none``, ``rank_estimate``, ``cls``, ``bv`` at two gammas, the mappings ``linear``,
  ``bound``, ``beta`` a = 0.5 and 1) are one tensor contraction of the (R, nodes, m + 1) counts with tables
  built once per node for all metrics (``correction_tables``, ``mapping_tables``);
* ``beta_fit`` fits a per repeat (eq. 19) and builds its mapping tables per repeat;
* ``mle`` and ``mes`` are fitted once per repeat (``fit_rank_distribution`` of the repeats' histograms, EM batched over repeats) and
  give every metric and cut-off from that fit; ``bv_mle`` uses each repeat's ``mle`` fit as the prior of
  ``bv`` (gamma = 0.1), all metrics from one factorisation per node.

Reported per (m, recommender, metric@K, estimator): mean estimate, mean absolute and relative error over the
repeats; per (m, metric@K, estimator, pair): the share of repeats in which the pair is ordered as by the exact
metric, and the exact relative gap of the pair. BLAS runs single-threaded (faster on the shared machine; set
before numpy is imported).

Run:  python benchmarks/accuracy_ml100k.py [--repeats 100] [--ms 50 100 500] [--kmax 50] [--out benchmarks/results]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from reco_sampled_plugin import registry  # noqa: E402
from reco_sampled_plugin._progress import progress_bar  # noqa: E402
from reco_sampled_plugin._rank_hist import pool_by_n, sampled_rank_histogram  # noqa: E402
from reco_sampled_plugin.corrections import correction_tables  # noqa: E402
from reco_sampled_plugin.mapping import fit_beta, mapping_tables  # noqa: E402
from reco_sampled_plugin.metrics import metric_values  # noqa: E402
from reco_sampled_plugin.rank_distribution import fit_rank_distribution  # noqa: E402
from reco_sampled_plugin.simulate import draw_sampled_ranks  # noqa: E402

# label -> (kind, arguments); "table" estimators are fixed tables per node, the others are fitted per repeat
TABLE_ESTIMATORS = {  # (kind, method, the mapping's argument): a correction's options are its method object's
    "none": ("correction", "none", None),
    "rank_estimate": ("correction", "rank_estimate", None),
    "cls": ("correction", "cls", None),
    "bv(0.1)": ("correction", registry.Bv(gamma=0.1), None),
    "bv(0.01)": ("correction", registry.Bv(gamma=0.01), None),
    "linear": ("mapping", "linear", None),
    "bound": ("mapping", "bound", None),
    "beta(0.5)": ("mapping", "beta", 0.5),
    "beta(1)": ("mapping", "beta", 1.0),
}
FITTED_ESTIMATORS = ("beta_fit", "mle", "mes", "bv_mle(0.1)")
ESTIMATOR_ORDER = tuple(TABLE_ESTIMATORS) + FITTED_ESTIMATORS


def exact_rank_data(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Exact ranks of the test item for every recommender of ``train_all`` on ml-100k, and n per user."""
    from reco_sampled_plugin import baselines, datasets

    split = datasets.load_ml100k()
    return baselines.held_out_ranks(baselines.train_all(split.train, seed=seed), split)


def _stack_counts(hists) -> tuple[np.ndarray, np.ndarray, int]:
    n_nodes = hists[0].n_items
    for h in hists:
        if not np.array_equal(h.n_items, n_nodes):  # pragma: no cover - the users are the same in every repeat
            raise RuntimeError("repeats pooled onto different n nodes")
    m = int(hists[0].n_samples[0])
    return np.stack([np.stack(h.counts) for h in hists]), n_nodes, m


def run_experiment(
    ranks: dict[str, np.ndarray],
    n_u: np.ndarray,
    ms=(50, 100, 500),
    repeats: int = 100,
    kmax: int = 50,
    ks=None,
    estimators=ESTIMATOR_ORDER,
    max_rel_n_spread: float = 0.1,
    seed: int = 0,
    log=print,
    progress: bool | None = None,
) -> dict:
    """Estimates of HR@K and NDCG@K for every (m, recommender, repeat, estimator); ``progress``: a bar on stderr
    over the (m, recommender) cells (None: when stderr is a terminal).

    Returns ``{"metrics": [...], "exact": {model: (S,)}, "values": {(m, model, estimator): (R, S)},
    "timings": {...}}``.
    """
    ks = list(range(1, kmax + 1)) if ks is None else list(ks)
    metrics = [f"hit@{k}" for k in ks] + [f"ndcg@{k}" for k in ks]
    exact = {
        name: np.array([float(metric_values(mt, torch.as_tensor(r), torch.as_tensor(n_u)).mean()) for mt in metrics])
        for name, r in ranks.items()
    }
    values: dict = {}
    timings: dict = {}
    bar = progress_bar(total=len(ms) * len(ranks), desc="accuracy (m, recommender)", enabled=progress)
    for m in ms:
        per_model = {}
        for i, (name, r) in enumerate(ranks.items()):
            draws = draw_sampled_ranks(r, n_u, m, repeats=repeats, seed=seed + 1000 * m + i)
            hists = [pool_by_n(sampled_rank_histogram(d, n_u, m), max_rel_n_spread) for d in draws]
            per_model[name] = (hists,) + _stack_counts(hists)
        nodes = next(iter(per_model.values()))[2]
        t0 = time.perf_counter()
        tables = {}
        for label in estimators:
            if label not in TABLE_ESTIMATORS:
                continue
            kind, method, arg = TABLE_ESTIMATORS[label]
            if kind == "correction":
                tables[label] = np.stack([correction_tables(metrics, int(n), m, method) for n in nodes])
            else:
                tables[label] = np.stack([mapping_tables(metrics, int(n), m, method, arg) for n in nodes])
        timings[(m, "tables")] = time.perf_counter() - t0
        for name, (hists, counts, _, _) in per_model.items():
            total = counts.sum(axis=(1, 2))
            for label, tab in tables.items():  # (nodes, S, m + 1): one contraction over repeats x nodes x r~
                t0 = time.perf_counter()
                values[(m, name, label)] = np.einsum("rgi,gsi->rs", counts, tab) / total[:, None]
                timings[(m, label)] = timings.get((m, label), 0.0) + time.perf_counter() - t0
            if "beta_fit" in estimators:
                t0 = time.perf_counter()
                out = np.empty((repeats, len(metrics)))
                for b, h in enumerate(hists):
                    a = fit_beta(h).a
                    tab = np.stack([mapping_tables(metrics, int(n), m, "beta", a) for n in nodes])
                    out[b] = np.einsum("gi,gsi->s", counts[b], tab) / total[b]
                values[(m, name, "beta_fit")] = out
                timings[(m, "beta_fit")] = timings.get((m, "beta_fit"), 0.0) + time.perf_counter() - t0
            fits = {}
            for method in ("mle", "mes"):
                if method in estimators or (method == "mle" and "bv_mle(0.1)" in estimators):
                    t0 = time.perf_counter()
                    fits[method] = fit_rank_distribution(hists, method)
                    if method in estimators:
                        values[(m, name, method)] = np.stack([f.values(metrics) for f in fits[method]])
                    timings[(m, method)] = timings.get((m, method), 0.0) + time.perf_counter() - t0
            if "bv_mle(0.1)" in estimators:
                t0 = time.perf_counter()
                out = np.empty((repeats, len(metrics)))
                for b, fit in enumerate(fits["mle"]):
                    tab = np.stack([correction_tables(metrics, int(n), m, registry.Bv(gamma=0.1, prior=fit.prior(int(n))))
                                    for n in nodes])
                    out[b] = np.einsum("gi,gsi->s", counts[b], tab) / total[b]
                values[(m, name, "bv_mle(0.1)")] = out
                timings[(m, "bv_mle(0.1)")] = timings.get((m, "bv_mle(0.1)"), 0.0) + time.perf_counter() - t0
            log(f"m={m} {name}: done")
            bar.update()
    bar.close()
    return {"metrics": metrics, "exact": exact, "values": values, "timings": timings, "ms": list(ms),
            "models": list(ranks), "repeats": repeats}


def summarise(res: dict, gap: float = 0.05) -> tuple[list[dict], list[dict]]:
    """Error rows (m, model, metric, estimator, exact, mean, abs_err, rel_err, rel_bias, sd) and ordering rows
    (m, metric, estimator, pair, rel_gap, agreement) for pairs whose exact values differ by more than ``gap``."""
    errors, order = [], []
    metrics, exact = res["metrics"], res["exact"]
    estimators = sorted({k[2] for k in res["values"]}, key=lambda e: ESTIMATOR_ORDER.index(e))
    for m in res["ms"]:
        for est in estimators:
            for s, mt in enumerate(metrics):
                for name in res["models"]:
                    v = res["values"][(m, name, est)][:, s]
                    ex = exact[name][s]
                    errors.append(dict(m=m, model=name, metric=mt, estimator=est, exact=ex, mean=float(v.mean()),
                                       abs_err=float(np.abs(v - ex).mean()), rel_err=float(np.abs(v - ex).mean() / ex),
                                       rel_bias=float((v.mean() - ex) / ex), sd=float(v.std(ddof=1))))
                for a, b in itertools.combinations(res["models"], 2):
                    ea, eb = exact[a][s], exact[b][s]
                    rel = abs(ea - eb) / max(ea, eb)
                    va, vb = res["values"][(m, a, est)][:, s], res["values"][(m, b, est)][:, s]
                    agree = float(np.mean(np.sign(va - vb) == np.sign(ea - eb)))
                    order.append(dict(m=m, metric=mt, estimator=est, pair=f"{a} vs {b}", rel_gap=rel,
                                      agreement=agree, counted=rel > gap))
    return errors, order


def _markdown(errors, order, res, seconds: float) -> str:
    import pandas as pd

    err = pd.DataFrame(errors)
    ordr = pd.DataFrame(order)
    err["kind"] = err.metric.str.split("@").str[0]
    ordr["kind"] = ordr.metric.str.split("@").str[0]
    est_order = [e for e in ESTIMATOR_ORDER if e in set(err.estimator)]
    lines = [f"{res['repeats']} repeats, recommenders: {', '.join(res['models'])}; total {seconds:.0f} s.", ""]
    # table 1: HR@10 / NDCG@10 at every m: mean relative error per recommender, worst ordering agreement
    for mt in ("hit@10", "ndcg@10"):
        sub = err[err.metric == mt]
        if sub.empty:
            continue
        tab = sub.pivot_table(index="estimator", columns=["m", "model"], values="rel_err").reindex(est_order)
        cols = [f"m={m} {mod}" for m, mod in tab.columns]
        lines += [f"**Mean relative error of {mt.upper() if mt.startswith('hit') else mt} (|estimate - exact| / exact, mean over repeats)**", "",
                  "| estimator | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for est, row in tab.iterrows():
            lines.append(f"| `{est}` | " + " | ".join(f"{v:.1%}" for v in row.values) + " |")
        lines.append("")
    # table 2: averages over K = 1..kmax
    agg = err.groupby(["kind", "m", "estimator"]).rel_err.mean().unstack(["kind", "m"]).reindex(est_order)
    o = ordr[ordr.counted].groupby(["kind", "m", "estimator"]).agreement.agg(["mean", "min"])
    kinds = [k for k in ("hit", "ndcg") if k in set(err.kind)]
    header = ["estimator"] + [f"{k.upper() if k == 'hit' else 'NDCG'} m={m} rel.err / order (mean, min)" for k in kinds for m in res["ms"]]
    lines += ["**Averaged over K = 1..%d and the recommenders: mean relative error; ordering agreement over pairs "
              "whose exact values differ by > 5%% (mean and worst pair/K)**" % max(int(x.split("@")[1]) for x in res["metrics"]), "",
              "| " + " | ".join(header) + " |", "|---|" + "---|" * (len(header) - 1)]
    for est in est_order:
        cells = []
        for k in kinds:
            for m in res["ms"]:
                e = agg.loc[est, (k, m)]
                if (k, m, est) in o.index:
                    om, omin = o.loc[(k, m, est)]
                    cells.append(f"{e:.1%} / {om:.1%}, {omin:.0%}")
                else:
                    cells.append(f"{e:.1%} / -")
        lines.append(f"| `{est}` | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def _plot(errors, ms, path: Path) -> None:
    """Small multiples: one panel per estimator (shared log axis), the error against K, one colour per m, HR solid
    and NDCG dashed (one plot of 13 overlapping lines before)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    err = pd.DataFrame(errors)
    err["kind"] = err.metric.str.split("@").str[0]
    err["K"] = err.metric.str.split("@").str[1].astype(int)
    kinds = [k for k in ("hit", "ndcg") if k in set(err.kind)]
    est_order = [e for e in ESTIMATOR_ORDER if e in set(err.estimator)]
    ncols = 5
    nrows = -(-len(est_order) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.6 * nrows), squeeze=False, sharex=True,
                             sharey=True)
    colours = dict(zip(ms, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    mean = err.groupby(["estimator", "kind", "m", "K"]).rel_err.mean()
    for ax, est in zip(axes.flat, est_order):
        for k in kinds:
            for m in ms:
                s = mean.loc[(est, k, m)]
                ax.plot(s.index, 100 * s.values, "-" if k == "hit" else "--", color=colours[m], lw=1.2,
                        label=f"{'HR' if k == 'hit' else 'NDCG'}, m = {m}")
        ax.axhline(5, color="0.6", lw=0.8, ls=":")
        ax.set_title(est, fontsize=9)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(est_order):]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=6)
    fig.supxlabel("K")
    fig.supylabel("mean relative error, % (avg over recommenders; dotted: 5%)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--ms", type=int, nargs="+", default=[50, 100, 500])
    ap.add_argument("--kmax", type=int, default=50)
    ap.add_argument("--spread", type=float, default=0.1, help="max_rel_n_spread of the n grid")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="output directory")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar on stderr (default: when stderr is a terminal)")
    ap.add_argument("--plot-from", default=None, metavar="CSV",
                    help="only redraw the figure from a saved accuracy_ml100k_errors.csv (into --out)")
    args = ap.parse_args()
    import pandas as pd

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_from:
        saved = pd.read_csv(args.plot_from)
        _plot(saved.to_dict("records"), sorted(saved.m.unique().tolist()), out / "accuracy_ml100k.png")
        print(f"wrote {out}/accuracy_ml100k.png")
        return
    t0 = time.perf_counter()
    ranks, n_u = exact_rank_data(args.seed)
    t_ranks = time.perf_counter() - t0
    res = run_experiment(ranks, n_u, args.ms, args.repeats, args.kmax, max_rel_n_spread=args.spread, seed=args.seed,
                         progress=args.progress)
    errors, order = summarise(res)
    seconds = time.perf_counter() - t0
    pd.DataFrame(errors).to_csv(out / "accuracy_ml100k_errors.csv", index=False)
    pd.DataFrame(order).to_csv(out / "accuracy_ml100k_ordering.csv", index=False)
    md = _markdown(errors, order, res, seconds)
    timing = ", ".join(f"{k[1]}@m={k[0]}: {v:.1f}s" for k, v in sorted(res["timings"].items(), key=lambda kv: -kv[1])[:8])
    md += f"\nTimings (training and exact ranks {t_ranks:.0f} s; largest parts): {timing}\n"
    (out / "accuracy_ml100k.md").write_text(md)
    _plot(errors, res["ms"], out / "accuracy_ml100k.png")
    print(md)
    print(f"wrote {out}/accuracy_ml100k_{{errors,ordering}}.csv, .md, .png in {seconds:.0f} s")


if __name__ == "__main__":
    main()
