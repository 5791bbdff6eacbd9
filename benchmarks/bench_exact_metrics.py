"""Exact full-catalogue metrics: this project vs the score-matmul floor and its peers, in one run on one device.

Synthetic data (default 20,000 users x 100,000 items, d = 64 float32 factors, about 20 training and
5 test items per user). Every contender computes the same scores in batches; timings include the
scores. Prints users/s and each contender's throughput relative to the floor (the matmul alone), and where the
peers' metric values differ from this project's on the same users. The peers: RecBole 1.2.1's full-sort evaluator
(its masking, top-k and positive matrix on the device, its metric classes on the host; six metrics @10) and
torchmetrics' retrieval metrics (the same six, a ``MetricCollection`` updated with each batch's flattened scores,
training items at -inf, computed per batch; ``--torchmetrics-users`` of them: its compute loops over users in
Python) on any device; recometrics (C++, CPU only) on ``--recometrics-users``.

    python benchmarks/bench_exact_metrics.py [--users 20000 --items 100000 --batch 1024 --recometrics-users 1000]
    python benchmarks/bench_exact_metrics.py --device cuda   # on a GPU: the floor, this project, RecBole, torchmetrics
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import platform
import time

import numpy as np
import scipy.sparse as sp
import torch

from reco_sampled_plugin import _graphs, counting, deferred_checks, per_user_metrics

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


def run_ours(user_f, item_f, train, test, batch, buf, check_finite=True, deferred=False):
    """The ten metrics per batch; ``deferred``: in a ``deferred_checks`` block (the checks read once, at its end)."""
    sums = torch.zeros(len(METRICS), dtype=torch.float64, device=user_f.device)
    with deferred_checks() if deferred else contextlib.nullcontext():
        for sl in batches(len(user_f), batch):
            out = buf[: sl.stop - sl.start]
            torch.matmul(user_f[sl], item_f.T, out=out)
            vals = per_user_metrics(out, test[sl], METRICS, exclude=train[sl], as_frame=False,
                                    check_finite=check_finite)
            sums += torch.stack([torch.nan_to_num(v).sum() for v in vals.values()])
    return sums / len(user_f)


def run_ours_factors(user_f, item_f, train, test, batch):
    """The same ten metrics from the factors: scores computed in cache-sized tiles and never stored."""
    sums = torch.zeros(len(METRICS), dtype=torch.float64, device=user_f.device)
    for sl in batches(len(user_f), batch):
        vals = per_user_metrics((user_f[sl], item_f), test[sl], METRICS, exclude=train[sl], as_frame=False)
        sums += torch.stack([torch.nan_to_num(v).sum() for v in vals.values()])
    return sums / len(user_f)


PEER_METRICS = ["hit@10", "rr@10", "ndcg@10", "precision@10", "recall@10", "ap@10"]  # what RecBole and torchmetrics share


def _masked_scores(user_f, item_f, train, sl, buf):
    """One batch's scores with its training items at -inf (RecBole's ``scores[history_index] = -inf``)."""
    out = buf[: sl.stop - sl.start]
    torch.matmul(user_f[sl], item_f.T, out=out)
    rows = torch.arange(out.shape[0], device=out.device).unsqueeze(1)
    out[rows.expand_as(train[sl]), train[sl]] = -torch.inf
    return out, rows


def run_recbole(user_f, item_f, train, test, batch, buf, n_users=None):
    """RecBole 1.2.1's full-sort evaluation path: mask history with -inf, topk, positive matrix (on the scores'
    device), then its own metric classes on the collected arrays (on the host, as RecBole's collector does).
    Returns {metric: mean} in this project's names."""
    if "float" not in np.__dict__:  # RecBole 1.2.1's MRR uses np.float, removed in numpy 2 (benchmark-only shim)
        np.float = float
    from recbole.evaluator.collector import DataStruct
    from recbole.evaluator.metrics import MRR, NDCG, Hit, Precision, Recall, MAP
    config = {"topk": [10], "metric_decimal_place": 6}
    k = 10
    rec_parts = []
    n_items = item_f.shape[0]
    for sl in batches(n_users or len(user_f), batch):
        out, rows = _masked_scores(user_f, item_f, train, sl, buf)
        _, topk_idx = torch.topk(out, k, dim=-1)
        pos_matrix = torch.zeros((out.shape[0], n_items), dtype=torch.int, device=out.device)
        pos_matrix[rows.expand_as(test[sl]), test[sl]] = 1
        pos_len_list = pos_matrix.sum(dim=1, keepdim=True)
        pos_idx = torch.gather(pos_matrix, dim=1, index=topk_idx)
        rec_parts.append(torch.cat((pos_idx, pos_len_list), dim=1).cpu())
    data = DataStruct()
    data.set("rec.topk", torch.cat(rec_parts, dim=0))
    results = {}
    for cls in (Hit, MRR, NDCG, Precision, Recall, MAP):
        results.update(cls(config).calculate_metric(data))
    names = {"hit@10": "hit@10", "mrr@10": "rr@10", "ndcg@10": "ndcg@10", "precision@10": "precision@10",
             "recall@10": "recall@10", "map@10": "ap@10"}
    return {names[key]: float(value) for key, value in results.items() if key in names}


def run_torchmetrics(user_f, item_f, train, test, batch, buf, n_users):
    """torchmetrics' retrieval metrics @10 as a user of its classes would run them on a full catalogue: each batch's
    scores flattened with one query index per user (training items at -inf), computed and reset per batch (the
    states hold B x n scores, targets and indexes). Returns {metric: mean over the users}."""
    from torchmetrics import MetricCollection
    from torchmetrics.retrieval import (RetrievalHitRate, RetrievalMAP, RetrievalMRR, RetrievalNormalizedDCG,
                                        RetrievalPrecision, RetrievalRecall)
    metrics = MetricCollection({"hit@10": RetrievalHitRate(top_k=10), "rr@10": RetrievalMRR(top_k=10),
                                "ndcg@10": RetrievalNormalizedDCG(top_k=10), "precision@10": RetrievalPrecision(top_k=10),
                                "recall@10": RetrievalRecall(top_k=10), "ap@10": RetrievalMAP(top_k=10)}).to(user_f.device)
    sums = dict.fromkeys(metrics.keys(), 0.0)
    for sl in batches(n_users, batch):
        out, rows = _masked_scores(user_f, item_f, train, sl, buf)
        target = torch.zeros(out.shape, dtype=torch.bool, device=out.device)
        target[rows.expand_as(test[sl]), test[sl]] = True
        indexes = rows.expand_as(out)
        metrics.update(out.reshape(-1), target.reshape(-1), indexes=indexes.reshape(-1))
        for key, value in metrics.compute().items():
            sums[key] += float(value) * out.shape[0]
        metrics.reset()
    return {key: total / n_users for key, total in sums.items()}


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
    ap.add_argument("--recometrics-users", type=int, default=1000,
                    help="recometrics is slow: time it on this many users (0: skip)")
    ap.add_argument("--skip-recbole", action="store_true")
    ap.add_argument("--torchmetrics-users", type=int, default=512,
                    help="torchmetrics' retrieval metrics loop over users in Python: time them on this many (0: skip)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=None,
                    help="passes timed, the best reported (default 2; 3 on an accelerator, whose first two passes "
                         "capture CUDA graphs: the first pass is reported too)")
    ap.add_argument("--backend", choices=("auto", "eager", "compiled"), default="auto",
                    help="the counting backend (auto: eager until a process has counted 2^32 comparisons, 2^36 with "
                         "numpy's CPU path; compiled: torch.compile's kernels, compiled in the warm-up)")
    ap.add_argument("--profile", type=int, default=0, metavar="BATCHES",
                    help="after the timings, profile this many (replayed) batches of the ten metrics: the operators "
                         "and kernels with the most device time, kernels per batch, device busy share of the wall time")
    args = ap.parse_args()
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("reco_sampled_plugin._graphs").setLevel(logging.DEBUG)  # why a capture failed, if one does
    counting.set_backend(args.backend)
    device = torch.device(args.device)
    user_f, item_f, train, test = make_data(args.users, args.items, args.dim, 20, 5)
    user_f, item_f, train, test = (t.to(device) for t in (user_f, item_f, train, test))
    buf = torch.empty(args.batch, args.items, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"# {args.users:,} users x {args.items:,} items, d = {args.dim}, batch {args.batch}, "
          f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
          f"counting backend {args.backend}")

    # warm-up: compile the counting kernel once (reported separately)
    t = time.perf_counter()
    run_ours(user_f[: args.batch], item_f, train[: args.batch], test[: args.batch], args.batch, buf)
    sync()
    warm = time.perf_counter() - t

    rows = []
    def record(name, seconds, users):
        rows.append((name, users / seconds))

    record("scores only (floor)", timed(lambda: (run_floor(user_f, item_f, args.batch, buf), sync()), repeats=2), args.users)
    repeats = args.repeats or (2 if device.type == "cpu" else 3)
    t = time.perf_counter()
    run_ours(user_f, item_f, train, test, args.batch, buf)
    sync()
    first = time.perf_counter() - t
    record("reco_sampled_plugin: 10 exact metrics", min(first, timed(lambda: (run_ours(user_f, item_f, train, test, args.batch, buf), sync()), repeats=repeats - 1)), args.users)
    record("  same, first pass (captures, compilation included)", first, args.users)
    record("  same, check_finite=False (no NaN/inf check)",
           timed(lambda: (run_ours(user_f, item_f, train, test, args.batch, buf, False), sync()), repeats=repeats), args.users)
    record("  same, in a deferred_checks block (no read per batch)",
           timed(lambda: (run_ours(user_f, item_f, train, test, args.batch, buf, True, True), sync()),
                 repeats=repeats), args.users)
    a = run_ours(user_f[: args.batch], item_f, train[: args.batch], test[: args.batch], args.batch, buf)
    f = run_ours_factors(user_f[: args.batch], item_f, train[: args.batch], test[: args.batch], args.batch)  # + compile
    print(f"scores vs factors path, first batch: largest difference of the metric means {float((a - f).abs().max()):.2e}")
    record("reco_sampled_plugin: 10 exact metrics from factors (tiled)",
           timed(lambda: (run_ours_factors(user_f, item_f, train, test, args.batch), sync()), repeats=repeats), args.users)
    peers = {}
    for module in ("recbole", "torchmetrics"):
        if importlib.util.find_spec(module) is None:
            print(f"({module} is not installed: its row is left out)")
    if not args.skip_recbole and importlib.util.find_spec("recbole") is not None:
        peers["RecBole"] = run_recbole(user_f, item_f, train, test, args.batch, buf)  # its values (and a warm-up)
        record("RecBole 1.2.1 full-sort evaluator (6 metrics @10)",
               timed(lambda: (run_recbole(user_f, item_f, train, test, args.batch, buf), sync())), args.users)
    nt = min(args.torchmetrics_users, args.users)
    if nt and importlib.util.find_spec("torchmetrics") is not None:
        t = time.perf_counter()  # timed once, its values kept (no compilation to warm up; seconds per batch)
        peers["torchmetrics"] = run_torchmetrics(user_f, item_f, train, test, args.batch, buf, nt)
        sync()
        record(f"torchmetrics {torchmetrics_version()} retrieval (6 metrics @10, {nt:,} users)", time.perf_counter() - t, nt)
    if device.type == "cpu" and args.recometrics_users:
        nu = min(args.recometrics_users, args.users)
        record(f"recometrics (all metrics, {nu:,} users)", run_recometrics(user_f, item_f, train, test, nu), nu)
    floor = rows[0][1]
    print(f"{'contender':55} {'users/s':>10} {'vs floor':>9}")
    for name, ups in rows:
        print(f"{name:55} {ups:10,.0f} {ups / floor:9.2f}")
    ours = rows[1][1]
    factors = rows[5][1]
    for name, ups in rows[6:]:
        print(f"reco_sampled_plugin is {ours / ups:.1f}x {name.split(' ')[0]} (from factors: {factors / ups:.1f}x)")
    for peer, values in peers.items():  # the same metrics on the same users: the largest difference of the means
        users = args.users if peer == "RecBole" else nt
        mine = per_user_means(user_f, item_f, train, test, args.batch, buf, users)
        gaps = ", ".join(f"{m} {abs(mine[m] - values[m]):.1e}" for m in PEER_METRICS)
        print(f"{peer} vs reco_sampled_plugin, |difference of the means| over {users:,} users: {gaps}")
    if "torchmetrics" in peers:  # a definition, not an error: its AP@k averages over the hits in the top k only
        print("(torchmetrics' AP@10 is the mean precision at its hits within the top 10, and counts a relevant item "
              "only where its score is > 0; this project's, RecBole's and recometrics' divide by min(10, relevant))")
    print(f"(one-off compile warm-up of the counting kernel: {warm:.1f} s, not included)")
    stats = _graphs._stats
    print(f"(CUDA graphs: {stats['captures']} captured, {stats['replays']} replays, {stats['failures']} failed captures; "
          f"off on a CPU)")
    if args.profile:
        profile_batches(user_f, item_f, train, test, args.batch, buf, args.profile, sync)
        profile_batches(user_f, item_f, train, test, args.batch, buf, args.profile, sync, deferred=True)


def per_user_means(user_f, item_f, train, test, batch, buf, n_users):
    """This project's means of PEER_METRICS over the first ``n_users`` users."""
    sums = torch.zeros(len(PEER_METRICS), dtype=torch.float64, device=user_f.device)
    for sl in batches(n_users, batch):
        out = buf[: sl.stop - sl.start]
        torch.matmul(user_f[sl], item_f.T, out=out)
        vals = per_user_metrics(out, test[sl], PEER_METRICS, exclude=train[sl], as_frame=False)
        sums += torch.stack([v.sum() for v in vals.values()])
    return dict(zip(PEER_METRICS, (sums / n_users).tolist()))


def profile_batches(user_f, item_f, train, test, batch, buf, n_batches, sync, deferred=False):
    """Where a steady-state batch's time goes: torch.profiler over ``n_batches`` batches of ``run_ours`` (already
    warm, so replayed where graphs are captured). Prints the top entries by self device time (self CPU time on a
    CPU), the kernels launched per batch and the share of the wall time the device was busy (kernel time summed);
    ``deferred``: the batches in a ``deferred_checks`` block, the summary line only."""
    from torch.profiler import ProfilerActivity, profile

    on_device = user_f.device.type == "cuda"
    users = min(n_batches * batch, len(user_f))
    sl = slice(0, users)
    run_ours(user_f[sl], item_f, train[sl], test[sl], batch, buf, True, deferred)  # warm (and captured) at this size
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    with profile(activities=activities) as prof:
        t = time.perf_counter()
        run_ours(user_f[sl], item_f, train[sl], test[sl], batch, buf, True, deferred)
        sync()
        wall = time.perf_counter() - t
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in kernels) / 1e6
    n = -(-users // batch)
    print(f"# profile{' (deferred_checks)' if deferred else ''}: {n} batches of {batch}, wall {wall * 1e3 / n:.3f} ms "
          f"per batch; {sum(e.count for e in kernels) / n:.0f} kernels per batch, device busy {busy * 1e3 / n:.3f} ms "
          f"per batch ({busy / wall:.0%} of the wall)")
    if deferred:
        return
    print(events.table(sort_by="self_device_time_total" if on_device else "self_cpu_time_total", row_limit=30,
                       max_name_column_width=70))


def torchmetrics_version() -> str:
    import torchmetrics

    return torchmetrics.__version__


if __name__ == "__main__":
    main()
