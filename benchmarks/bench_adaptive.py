"""What adaptive sampling costs in time: evaluate_factors, the torchmetrics class and the planner.

Synthetic factor model (default 5,000 users x 100,000 items, d = 64 float32, 10 training and 1 test item per user).
Timed in the same run, so ratios compare like with like:

* ``evaluate_factors``: exact metrics only; + fixed m = 100 sampling (``method="mes"``); + adaptive m = 100 ->
  3200 (``SamplingDesign(100, adaptive_max=3200)``): the extra stages redraw only rows that still have a positive ranked first.
* ``SampledRankingMetrics.update_factors`` + ``compute``: fixed m = 100 against adaptive 100 -> 3200 (keyed draws per
  stage; the state holds about 3,200 counts per distinct n).
* ``planner.plan``: the default grid (9 designs, 20 repeats) at n = 50,000, 6,000 users.

    python benchmarks/bench_adaptive.py [--users 5000 --items 100000 --dim 64 --repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import scipy.sparse as sp
import torch

from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.factors import evaluate_factors
from reco_sampled_plugin.planner import plan
from reco_sampled_plugin.registry import Mes


def make_data(n_users: int, n_items: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    user_f = (rng.standard_normal((n_users, d)) / d**0.25).astype(np.float32)
    item_f = (rng.standard_normal((n_items, d)) / d**0.25).astype(np.float32)
    picks = np.stack([rng.choice(n_items, 11, replace=False) for _ in range(n_users)])
    rows = np.repeat(np.arange(n_users), 10)
    x_train = sp.csr_matrix((np.ones(rows.size), (rows, picks[:, :10].ravel())), shape=(n_users, n_items))
    x_test = sp.csr_matrix((np.ones(n_users), (np.arange(n_users), picks[:, 10])), shape=(n_users, n_items))
    return x_train, x_test, user_f, item_f, picks


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    x_train, x_test, u, v, picks = make_data(args.users, args.items, args.dim)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.users:,} users x {args.items:,} items, d = {args.dim}")
    kw = dict(k=10, metrics=["ndcg", "hit"], as_df=False)
    t_exact = best(lambda: evaluate_factors(x_train, x_test, u, v, **kw), args.repeats)
    t_fixed = best(lambda: evaluate_factors(x_train, x_test, u, v, n_samples=100, method="mes", **kw), args.repeats)
    res = evaluate_factors(x_train, x_test, u, v, n_samples=SamplingDesign(100, adaptive_max=3200), method="mes", **kw)
    t_adapt = best(lambda: evaluate_factors(x_train, x_test, u, v, n_samples=SamplingDesign(100, adaptive_max=3200), method="mes",
                                            **kw), args.repeats)
    mean_m = float(res.sampled.sample_sizes.double().mean())
    print(f"evaluate_factors  exact {t_exact:.2f} s | + m = 100 {t_fixed:.2f} s ({t_fixed / t_exact:.2f}x) | "
          f"+ adaptive 100->3200 {t_adapt:.2f} s ({t_adapt / t_exact:.2f}x; mean m {mean_m:.0f})")

    ut, vt = torch.from_numpy(u), torch.from_numpy(v)
    pos = torch.from_numpy(picks[:, 10:11].astype(np.int64))
    exc = torch.from_numpy(picks[:, :10].astype(np.int64))

    def run(adaptive):
        metric = SampledRankingMetrics(("ndcg@10", "hit@10"), n_samples=SamplingDesign(100, adaptive_max=adaptive),
                                       estimators=("none", Mes(n_bootstrap=0)), max_n_groups=None)
        for start in range(0, args.users, 1024):
            sl = slice(start, start + 1024)
            metric.update_factors(ut[sl], vt, pos[sl], exc[sl], ids=torch.arange(args.users)[sl])
        return metric.compute()

    t_tm_fixed = best(lambda: run(None), args.repeats)
    t_tm_adapt = best(lambda: run(3200), args.repeats)
    print(f"SampledRankingMetrics.update_factors + compute  m = 100 {t_tm_fixed:.2f} s | adaptive 100->3200 "
          f"{t_tm_adapt:.2f} s ({t_tm_adapt / t_tm_fixed:.2f}x)")

    t0 = time.perf_counter()
    p = plan(50_000, 6000, "ndcg@10", 0.05)
    print(f"planner default grid ({len(p.forecasts)} designs, {p.repeats} repeats, n = 50,000, 6,000 users): "
          f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
