"""Exact full-catalogue metrics: this project vs the score-matmul floor, RecBole's evaluator and recometrics.

Synthetic data (default 20,000 users x 100,000 items, d = 64 float32 factors, about 20 training and
5 test items per user). Every contender computes the same scores in batches; timings include the
scores. Prints users/s and each contender's throughput relative to the floor (the matmul alone).

    python benchmarks/bench_exact_metrics.py [--users 20000 --items 100000 --batch 1024 --recometrics-users 1000]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import scipy.sparse as sp
import torch

from reco_sampled_plugin import per_user_metrics

METRICS = ["precision@10", "tp@10", "recall@10", "ap@10", "tap@10", "ndcg@10", "hit@10", "rr@10", "auc", "pr_auc"]


def make_data(n_users, n_items, d, n_train, n_test, seed=0):
    rng = np.random.default_rng(seed)
    user_f = torch.tensor(rng.standard_normal((n_users, d), dtype=np.float32) / d**0.25)
    item_f = torch.tensor(rng.standard_normal((n_items, d), dtype=np.float32) / d**0.25)
    # distinct items per user: train then test
    picks = np.stack([rng.choice(n_items, n_train + n_test, replace=False) for _ in range(n_users)])
    train = torch.tensor(picks[:, :n_train])
    test = torch.tensor(picks[:, n_train:])
    return user_f, item_f, train, test


def batches(n_users, batch):
    for start in range(0, n_users, batch):
        yield slice(start, min(start + batch, n_users))


def run_floor(user_f, item_f, batch, buf):
    for sl in batches(len(user_f), batch):
        out = buf[: sl.stop - sl.start]
        torch.matmul(user_f[sl], item_f.T, out=out)


def run_ours(user_f, item_f, train, test, batch, buf, check_finite=True):
    sums = torch.zeros(len(METRICS), dtype=torch.float64, device=user_f.device)
    for sl in batches(len(user_f), batch):
        out = buf[: sl.stop - sl.start]
        torch.matmul(user_f[sl], item_f.T, out=out)
        vals = per_user_metrics(out, test[sl], METRICS, exclude=train[sl], as_frame=False, check_finite=check_finite)
        sums += torch.stack([torch.nan_to_num(v).sum() for v in vals.values()])
    return sums / len(user_f)


def run_ours_factors(user_f, item_f, train, test, batch):
    """The same ten metrics from the factors: scores computed in cache-sized tiles and never stored."""
    sums = torch.zeros(len(METRICS), dtype=torch.float64, device=user_f.device)
    for sl in batches(len(user_f), batch):
        vals = per_user_metrics((user_f[sl], item_f), test[sl], METRICS, exclude=train[sl], as_frame=False)
        sums += torch.stack([torch.nan_to_num(v).sum() for v in vals.values()])
    return sums / len(user_f)


def run_recbole(user_f, item_f, train, test, batch, buf):
    """RecBole 1.2.1's full-sort evaluation path: mask history with -inf, topk, positive matrix,
    then its own metric classes on the collected numpy arrays."""
    if "float" not in np.__dict__:  # RecBole 1.2.1's MRR uses np.float, removed in numpy 2 (benchmark-only shim)
        np.float = float
    from recbole.evaluator.collector import DataStruct
    from recbole.evaluator.metrics import MRR, NDCG, Hit, Precision, Recall, MAP

    config = {"topk": [10], "metric_decimal_place": 6}
    k = 10
    rec_parts = []
    n_items = item_f.shape[0]
    for sl in batches(len(user_f), batch):
        b = sl.stop - sl.start
        out = buf[:b]
        torch.matmul(user_f[sl], item_f.T, out=out)
        rows = torch.arange(b).unsqueeze(1)
        out[rows.expand_as(train[sl]), train[sl]] = -torch.inf  # RecBole: scores[history_index] = -inf
        _, topk_idx = torch.topk(out, k, dim=-1)
        pos_matrix = torch.zeros((b, n_items), dtype=torch.int)
        pos_matrix[rows.expand_as(test[sl]), test[sl]] = 1
        pos_len_list = pos_matrix.sum(dim=1, keepdim=True)
        pos_idx = torch.gather(pos_matrix, dim=1, index=topk_idx)
        rec_parts.append(torch.cat((pos_idx, pos_len_list), dim=1))
    data = DataStruct()
    data.set("rec.topk", torch.cat(rec_parts, dim=0))
    results = {}
    for cls in (Hit, MRR, NDCG, Precision, Recall, MAP):
        results.update(cls(config).calculate_metric(data))
    return results


def run_recometrics(user_f, item_f, train, test, n_users):
    import recometrics

    n_items = item_f.shape[0]
    def csr(idx):
        rows = np.repeat(np.arange(n_users), idx.shape[1])
        return sp.csr_matrix((np.ones(rows.size), (rows, idx[:n_users].numpy().ravel())), shape=(n_users, n_items))
    x_train, x_test = csr(train), csr(test)
    a, b = user_f[:n_users].numpy(), item_f.numpy()
    t = time.perf_counter()
    recometrics.calc_reco_metrics(x_train.astype(np.float32), x_test.astype(np.float32), a, b, k=10,
                                  all_metrics=True, break_ties_with_noise=False, nthreads=torch.get_num_threads())
    return time.perf_counter() - t


def timed(fn, *args, repeats=1):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--recometrics-users", type=int, default=1000, help="recometrics is slow: time it on this many users")
    ap.add_argument("--skip-recbole", action="store_true")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    device = torch.device(args.device)
    user_f, item_f, train, test = make_data(args.users, args.items, args.dim, 20, 5)
    user_f, item_f, train, test = (t.to(device) for t in (user_f, item_f, train, test))
    buf = torch.empty(args.batch, args.items, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"# {args.users:,} users x {args.items:,} items, d = {args.dim}, batch {args.batch}, "
          f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")

    # warm-up: compile the counting kernel once (reported separately)
    t = time.perf_counter()
    run_ours(user_f[: args.batch], item_f, train[: args.batch], test[: args.batch], args.batch, buf)
    sync()
    warm = time.perf_counter() - t

    rows = []
    def record(name, seconds, users):
        rows.append((name, users / seconds))

    record("scores only (floor)", timed(lambda: (run_floor(user_f, item_f, args.batch, buf), sync()), repeats=2), args.users)
    record("reco_sampled_plugin: 10 exact metrics", timed(lambda: (run_ours(user_f, item_f, train, test, args.batch, buf), sync()), repeats=2), args.users)
    record("  same, check_finite=False (no NaN/inf check)",
           timed(lambda: (run_ours(user_f, item_f, train, test, args.batch, buf, False), sync()), repeats=2), args.users)
    a = run_ours(user_f[: args.batch], item_f, train[: args.batch], test[: args.batch], args.batch, buf)
    f = run_ours_factors(user_f[: args.batch], item_f, train[: args.batch], test[: args.batch], args.batch)  # + compile
    print(f"scores vs factors path, first batch: largest difference of the metric means {float((a - f).abs().max()):.2e}")
    record("reco_sampled_plugin: 10 exact metrics from factors (tiled)",
           timed(lambda: (run_ours_factors(user_f, item_f, train, test, args.batch), sync()), repeats=2), args.users)
    if not args.skip_recbole and device.type == "cpu":
        record("RecBole 1.2.1 full-sort evaluator (6 metrics @10)", timed(lambda: run_recbole(user_f, item_f, train, test, args.batch, buf)), args.users)
    if device.type == "cpu":
        nu = min(args.recometrics_users, args.users)
        record(f"recometrics (all metrics, {nu:,} users)", run_recometrics(user_f, item_f, train, test, nu), nu)
    floor = rows[0][1]
    print(f"{'contender':55} {'users/s':>10} {'vs floor':>9}")
    for name, ups in rows:
        print(f"{name:55} {ups:10,.0f} {ups / floor:9.2f}")
    ours = rows[1][1]
    factors = rows[3][1]
    for name, ups in rows[4:]:
        print(f"reco_sampled_plugin is {ours / ups:.1f}x {name.split(' ')[0]} (from factors: {factors / ups:.1f}x)")
    print(f"(one-off compile warm-up of the counting kernel: {warm:.1f} s, not included)")


if __name__ == "__main__":
    main()
