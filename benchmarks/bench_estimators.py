"""Benchmark of the rank-distribution estimators: ``mle`` on 1e6 positives, n = 1e7, m = 100.

The estimators run on the sampled-rank histogram (m + 1 counts), so the cost after the single
``bincount`` does not depend on the number of users nor on n. Timed: histogram from 1e6 sampled ranks,
the EM fit with its 32 bootstrap refits (the default), and a metric read-out.

Run:  python benchmarks/bench_estimators.py [--users 1000000] [--n-items 10000000] [--m 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from reco_sampled_plugin._rank_hist import sampled_rank_histogram
from reco_sampled_plugin.estimators import estimate
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from reco_sampled_plugin.simulate import simulate_sampled_ranks
from reco_sampled_plugin import SampledRanks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--n-items", type=int, default=10_000_000)
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    n, m = args.n_items, args.m
    exact = np.clip(np.exp(rng.normal(np.log(n / 50), 2.0, size=args.users)).astype(np.int64) + 1, 1, n)
    sampled = simulate_sampled_ranks(torch.as_tensor(exact), n, m, generator=torch.Generator().manual_seed(0))
    rows = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        hist = sampled_rank_histogram(sampled, n, m)
        t1 = time.perf_counter()
        fit = fit_rank_distribution(hist, "mle")
        t2 = time.perf_counter()
        res = fit.metric("hit@100000")
        t3 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
    t = np.array(rows)
    best = t[np.argmin(t[:, 3])]
    med = np.median(t, axis=0)
    true = float((exact <= 100_000).mean())
    print(f"mle: {args.users:,} positives, n = {n:,}, m = {m}, {len(fit.probs)} cells, "
          f"{fit.iterations} EM steps, {fit.bootstrap.shape[0]} bootstrap refits")
    print(f"  histogram {best[0]:.3f} s | fit + bootstrap {best[1]:.3f} s | metric {best[2]:.4f} s | "
          f"total best {best[3]:.3f} s, median {med[3]:.3f} s over {args.repeats}")
    print(f"  HR@100000: estimate {res.value:.4f} +- {res.stderr:.4f}, exact {true:.4f}")
    t0 = time.perf_counter()
    e = estimate("hit@100000", SampledRanks.from_arrays(sampled, n, m), "mle")
    print(f"  estimate(..., method='mle') end to end from per-user ranks: {time.perf_counter() - t0:.3f} s "
          f"({e.value:.4f} +- {e.stderr:.4f})")


if __name__ == "__main__":
    main()
