"""Speed of the rank-distribution fits on one evaluation with any mix of n and m.

1e6 positives drawn from a lognormal exact-rank distribution, sampled with replacement, in five designs:
one (n, m); per-user n = n - |train_u| (training-set sizes lognormal, median 30, up to n / 10: a few thousand
distinct n, as in real data) with one m; adaptive sampling (m doubling from 100 up to
3200 while the positive ranks first, per-user n); three samplers mixed (m in {50, 100, 500}); m proportional
to the user's training items (m = 10 |train_u| within 50..500: a few hundred distinct m, pooled onto a 10% grid
of m); and, adversarially, m uniform in 50..500 per positive (every positive its own (n, m) group). Timed per design: the histogram from the per-positive ranks,
and ``estimate("hit@10", hist, method=...)`` for ``mes`` and ``mle`` with their default bootstraps (16 / 32
refits), best of ``--repeats`` (fits are cleared between repeats).

Run:  python benchmarks/bench_estimator_mixes.py [--positives 1000000] [--n-items 10000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from reco_sampled_plugin import estimators
from reco_sampled_plugin._rank_hist import sampled_rank_histogram
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.simulate import draw_sampled_ranks


def designs(positives: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    train = np.minimum(np.exp(rng.normal(np.log(30), 1.5, size=positives)).astype(np.int64) + 1, n // 10)
    n_u = n - train
    exact = np.clip(np.exp(rng.normal(np.log(n / 200), 2.5, size=positives)).astype(np.int64) + 1, 1, None)
    exact_u = np.minimum(exact, n_u)
    exact_n = np.minimum(exact, n)
    yield "one (n, m): n = %d, m = 100" % n, draw_sampled_ranks(exact_n, n, 100, seed=1)[0], n, 100
    yield "per-user n, m = 100", draw_sampled_ranks(exact_u, n_u, 100, seed=2)[0], n_u, 100
    gen = torch.Generator().manual_seed(3)
    drawn = adaptive_sampled_ranks_from_exact(torch.from_numpy(exact_u), torch.from_numpy(n_u),
                                              SamplingDesign(100, adaptive_max=3200), gen)
    ranks, sizes = drawn.ranks, drawn.n_samples
    yield "adaptive 100 -> 3200, per-user n", ranks, n_u, sizes
    m3 = rng.choice([50, 100, 500], size=positives)
    yield "per-user n, m in {50, 100, 500}", draw_sampled_ranks(exact_u, n_u, m3, seed=4)[0], n_u, m3
    m_prop = np.clip(10 * train, 50, 500)
    yield "per-user n, m = 10 |train_u| in 50..500", draw_sampled_ranks(exact_u, n_u, m_prop, seed=5)[0], n_u, m_prop
    m_many = rng.integers(50, 501, size=positives)
    yield "per-user n, m uniform in 50..500 (adversarial)", draw_sampled_ranks(exact_u, n_u, m_many, seed=6)[0], n_u, m_many


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positives", type=int, default=1_000_000)
    ap.add_argument("--n-items", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-many-m", action="store_true", help="leave out the adversarial design")
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(f"{args.positives:,} positives; best of {args.repeats}; estimate('hit@10', hist, method=...) with its "
          "default bootstrap")
    print("| design | groups | histogram | mes | mle |\n|---|---|---|---|---|")
    for name, ranks, n_u, m_u in designs(args.positives, args.n_items):
        if args.skip_many_m and "adversarial" in name:
            continue
        t_hist, t = [], {"mes": [], "mle": []}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            hist = sampled_rank_histogram(ranks, torch.as_tensor(n_u), torch.as_tensor(m_u))
            t_hist.append(time.perf_counter() - t0)
            for method in t:
                t0 = time.perf_counter()
                estimators.estimate("hit@10", hist, method=method)
                t[method].append(time.perf_counter() - t0)
        print(f"| {name} | {hist.n_groups:,} | {min(t_hist):.3f} s | {min(t['mes']):.3f} s | {min(t['mle']):.3f} s |",
              flush=True)


if __name__ == "__main__":
    main()
