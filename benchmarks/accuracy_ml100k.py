"""Accuracy of every estimator on MovieLens 100k (issue 4): error against the exact metric and pairwise ordering.

Exact ranks come from three recommenders of clearly different shape (popularity, item-kNN q = 3, iALS),
leave-last-out, training items excluded (per-user candidate counts n_u). Each repeat draws sampled ranks
r~ = 1 + Binomial(m, (r - 1)/(n_u - 1)), which is the distribution of uniform sampling with replacement
from the user's irrelevant candidates (``simulate_sampled_ranks``; faster than drawing items, same law).
Users' n_u are pooled into 16 quantile bins for every estimator (so correction tables are built for 16
candidate counts, not hundreds), as ``estimate_rank_distribution`` does.

Reported per (recommender, m, metric@K, estimator): mean absolute and relative error over the repeats, and
per (m, metric@K, estimator) the share of repeats in which each pair of recommenders whose exact metrics
differ by more than 5% is ordered as by the exact metric.

Run:  python benchmarks/accuracy_ml100k.py --repeats 100 [--ms 50 100 500] [--ks 1 5 10 20 50] [--out results.csv]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import pandas as pd
import torch

from reco_sampled_plugin.baselines import ImplicitALS, ItemKNN, Popularity
from reco_sampled_plugin.datasets import load_ml100k
from reco_sampled_plugin.estimators import estimate
from reco_sampled_plugin.metrics import metric_values
from reco_sampled_plugin.rank_distribution import _pool_groups, estimate_rank_distribution, simulate_sampled_ranks
from reco_sampled_plugin._rank_hist import sampled_rank_histogram
from reco_sampled_plugin.ranking import exact_ranks

TABLE_METHODS = [("none", {}), ("rank_estimate", {}), ("cls", {}), ("bv", {"gamma": 0.01}), ("bv", {"gamma": 0.1}),
                 ("bound", {}), ("beta", {"a": 0.5}), ("beta_fit", {})]


def exact_rank_data(seed: int = 0):
    split = load_ml100k()
    users = torch.as_tensor(split.test_users)
    pos = torch.as_tensor(split.test_items[split.test_users]).unsqueeze(1)
    train = split.train[split.test_users]
    exclude = torch.full((len(users), int(train.getnnz(axis=1).max())), -1, dtype=torch.int64)
    for i in range(len(users)):  # building the padded exclusion list once (943 rows), not a hot path
        cols = train.indices[train.indptr[i]:train.indptr[i + 1]]
        exclude[i, : len(cols)] = torch.as_tensor(cols)
    n_u = torch.as_tensor(split.n_items - train.getnnz(axis=1), dtype=torch.int64)
    models = {"Popularity": Popularity(), "ItemKNN": ItemKNN(q=3), "iALS": ImplicitALS(factors=16, reg=10.0, alpha=0.2, seed=seed)}
    ranks = {}
    for name, model in models.items():
        model.fit(split.train)
        ranks[name] = exact_ranks(model.score(users), pos, exclude)[:, 0]
    return ranks, n_u


def run(repeats: int, ms, ks, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    ranks, n_u = exact_rank_data(seed)
    metrics = [f"{kind}@{k}" for kind in ("hit", "ndcg") for k in ks]
    exact = {(mod, met): float(metric_values(met, r, n_u).mean()) for mod, r in ranks.items() for met in metrics}
    rows = []
    gen = torch.Generator().manual_seed(seed)
    for m, rep in itertools.product(ms, range(repeats)):
        for mod, r in ranks.items():
            sampled = simulate_sampled_ranks(r, n_u, m, generator=gen)
            hist, _ = _pool_groups(sampled_rank_histogram(sampled, n_u, m), 16)
            fits = {meth: estimate_rank_distribution(hist, method=meth, n_bootstrap=0) for meth in ("mle", "mes")}
            for met in metrics:
                for meth, kw in TABLE_METHODS:
                    label = meth + "".join(f"({k}={v})" for k, v in kw.items())
                    rows.append((m, rep, mod, met, label, estimate(met, hist, method=meth, **kw).value))
                for meth, fit in fits.items():
                    rows.append((m, rep, mod, met, meth, fit.metric(met).value))
                rows.append((m, rep, mod, met, "bv_mle(gamma=0.1)", estimate(met, hist, method="bv_mle", n_bootstrap=0).value))
    df = pd.DataFrame(rows, columns=["m", "repeat", "model", "metric", "estimator", "value"])
    df["exact"] = [exact[(a, b)] for a, b in zip(df.model, df.metric)]
    df["abs_err"] = (df.value - df.exact).abs()
    df["rel_err"] = df.abs_err / df.exact
    errors = df.groupby(["m", "model", "metric", "estimator"])[["abs_err", "rel_err"]].mean().reset_index()
    order_rows = []
    for (m, met, est), g in df.groupby(["m", "metric", "estimator"]):
        piv = g.pivot(index="repeat", columns="model", values="value")
        agree, total = 0, 0
        for a, b in itertools.combinations(ranks, 2):
            ea, eb = exact[(a, met)], exact[(b, met)]
            if abs(ea - eb) <= 0.05 * max(ea, eb):
                continue
            agree += int(((piv[a] > piv[b]) == (ea > eb)).sum())
            total += len(piv)
        order_rows.append((m, met, est, agree / total if total else np.nan, total))
    order = pd.DataFrame(order_rows, columns=["m", "metric", "estimator", "ordering_agreement", "pair_repeats"])
    return errors, order


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--ms", type=int, nargs="+", default=[50, 100, 500])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 5, 10, 20, 50])
    ap.add_argument("--out", default=None, help="prefix for CSV outputs")
    args = ap.parse_args()
    t0 = time.perf_counter()
    errors, order = run(args.repeats, args.ms, args.ks)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    for metric in ("hit@10", "ndcg@10"):
        tab = errors[errors.metric == metric].pivot_table(index="estimator", columns=["m", "model"], values="rel_err")
        print(f"\nmean relative error, {metric} ({args.repeats} repeats)\n{tab.round(3)}")
        ordt = order[order.metric == metric].pivot_table(index="estimator", columns="m", values="ordering_agreement")
        print(f"\npairwise ordering agreement, {metric}\n{ordt.round(3)}")
    if args.out:
        errors.to_csv(f"{args.out}_errors.csv", index=False)
        order.to_csv(f"{args.out}_ordering.csv", index=False)
    print(f"\n{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
