"""evaluate_factors vs recometrics.calc_reco_metrics: all ten metrics (AUC included) straight from factors.

Synthetic data (default 20,000 users x 100,000 items, d = 64 float32 factors, 30 interactions per user split
70/30 into train and test by recometrics' 'all' split). Both libraries compute the scores themselves; timings
include everything from the sparse matrices and factors to the per-user table. recometrics runs on the first
``--recometrics-users`` users (its cost is linear in users: each user is scored and fully sorted independently),
and its users/s are extrapolated to the whole set; both use every core (``nthreads=-1``, torch's default threads).
The matmul floor (scores alone, same batches, reused buffer) is measured in the same run.

    python benchmarks/bench_factors.py [--users 20000 --items 100000 --dim 64 --recometrics-users 1000 --repeats 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from importlib.metadata import version as _version

import numpy as np
import recometrics
import scipy.sparse as sp
import torch

from reco_sampled_plugin.factors import evaluate_factors


def make_data(n_users: int, n_items: int, d: int, per_user: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    user_f = (rng.standard_normal((n_users, d), dtype=np.float32) / d**0.25).astype(np.float32)
    item_f = (rng.standard_normal((n_items, d), dtype=np.float32) / d**0.25).astype(np.float32)
    # distinct items per user: draw twice as many sorted columns, drop repeats, keep the first per_user
    cols = np.sort(rng.integers(0, n_items, size=(n_users, per_user * 2)), axis=1)
    keep = np.ones_like(cols, dtype=bool)
    keep[:, 1:] = cols[:, 1:] != cols[:, :-1]
    rows = np.repeat(np.arange(n_users), cols.shape[1])[keep.ravel()]
    cols = cols.ravel()[keep.ravel()]
    counts = np.cumsum(keep, axis=1)[keep]
    first = counts <= per_user
    x = sp.csr_matrix((np.ones(first.sum()), (rows[first], cols[first])), shape=(n_users, n_items))
    x_train, x_test = recometrics.split_reco_train_test(x, split_type="all", items_test_fraction=0.3, seed=1)
    return sp.csr_matrix(x_train), sp.csr_matrix(x_test), user_f, item_f


def floor(user_f: np.ndarray, item_f: np.ndarray, batch: int) -> float:
    a, b = torch.from_numpy(user_f), torch.from_numpy(item_f)
    buf = torch.empty((batch, b.shape[0]), dtype=a.dtype)
    t0 = time.perf_counter()
    for s in range(0, a.shape[0], batch):
        rows = a[s : s + batch]
        torch.matmul(rows, b.T, out=buf[: rows.shape[0]])
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=20_000)
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--per-user", type=int, default=30)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--recometrics-users", type=int, default=1000)
    p.add_argument("--batch", type=int, default=None, help="evaluate_factors batch_size (default: automatic)")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    x_train, x_test, user_f, item_f = make_data(args.users, args.items, args.dim, args.per_user)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), recometrics {_version('recometrics')}")
    print(f"data: {args.users} users x {args.items} items, d = {args.dim} float32, "
          f"{x_train.nnz / args.users:.1f} train + {x_test.nnz / args.users:.1f} test items per user, k = {args.k}")

    # warm-up (compiles the counting kernels once) on a slice, and the parity check on the recometrics subset
    sub = slice(0, args.recometrics_users)
    ours_sub = evaluate_factors(x_train[sub], x_test[sub], user_f[sub], item_f, k=args.k, metrics="all",
                                batch_size=args.batch)
    t0 = time.perf_counter()
    ref = recometrics.calc_reco_metrics(x_train[sub], x_test[sub], user_f[sub], item_f, k=args.k,
                                        all_metrics=True, break_ties_with_noise=False, nthreads=-1)
    t_ref = time.perf_counter() - t0
    diff = max(float(np.nanmax(np.abs(ours_sub[c].to_numpy() - ref[c].to_numpy()))) for c in ref.columns)
    ref_rate = args.recometrics_users / t_ref

    t_floor = min(floor(user_f, item_f, 1024) for _ in range(args.repeats))
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = evaluate_factors(x_train, x_test, user_f, item_f, k=args.k, metrics="all", batch_size=args.batch)
        times.append(time.perf_counter() - t0)
    t_ours = min(times)
    ours_rate = args.users / t_ours
    floor_rate = args.users / t_floor
    print(f"max |ours - recometrics| over {args.recometrics_users} users, 10 metrics (float32): {diff:.2e}")
    print(f"mean NDCG@{args.k} {np.nanmean(out[f'NDCG@{args.k}']):.5f}, mean ROC_AUC {np.nanmean(out['ROC_AUC']):.5f}")
    print()
    print("| contender | users | time (s) | users/s | vs recometrics | vs matmul floor |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| matmul floor (scores only, batches of 1024) | {args.users} | {t_floor:.2f} | {floor_rate:,.0f} | "
          f"{floor_rate / ref_rate:.1f}x | 1.00 |")
    print(f"| evaluate_factors (all 10 metrics) | {args.users} | {t_ours:.2f} | {ours_rate:,.0f} | "
          f"**{ours_rate / ref_rate:.1f}x** | {ours_rate / floor_rate:.2f} |")
    print(f"| recometrics calc_reco_metrics (all_metrics) | {args.recometrics_users} (extrapolated) | {t_ref:.2f} | "
          f"{ref_rate:,.0f} | 1.0x | {ref_rate / floor_rate:.3f} |")
    print(f"\nevaluate_factors times: {', '.join(f'{t:.2f}' for t in times)} s; recometrics extrapolated to "
          f"{args.users} users: {args.users / ref_rate:.0f} s")


if __name__ == "__main__":
    main()
