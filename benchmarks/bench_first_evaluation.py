"""The first evaluation on real data: ``estimate()`` with one candidate count n against 1,000 distinct n.

Real evaluations exclude each user's training items, so every user has their own n (ml-100k: 279 distinct n
among 943 users); benchmarks with one n for every user hide the cost of per-n work. For every registered
estimator: ``estimate(metric, ...)`` plus its 95% ``interval()`` on 5,000 positives (m = 100, exact ranks from a
Beta(0.4, 3) shape, sampled ranks drawn with replacement), every cache emptied before each call (correction and
mapping tables, quadrature rules, fits, identification programs): the cost a user meets at the first evaluation.
Same positives and ranks in both cases; only n differs (n = 1,500 for all, or 1,500..2,499: 1,000 distinct).
Median of ``--repeats`` cold calls. The goal: 1,000 distinct n within 3x of one n, for every method.

``--ladder 1 16 100 250 1000``: instead, the cost at each number of distinct n, spread evenly over the same range
(n = 1,500..2,499), so that only the count changes: the growth from one n is a step at 2..16 distinct n (the fits'
and the identified interval's 16 pooled groups, ``max_groups``), flat beyond.

Run:  python benchmarks/bench_first_evaluation.py [--repeats 5] [--metric ndcg@10] [--methods bv cls ...] [--ladder ...]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from reco_sampled_plugin import registry  # noqa: E402
from reco_sampled_plugin.estimators import estimate  # noqa: E402
from reco_sampled_plugin.simulate import draw_sampled_ranks  # noqa: E402
from reco_sampled_plugin import SampledRanks

OPTIONS = {"beta": {"a": 1.0}}


def clear_caches() -> None:
    """Every memo the estimators keep, so the next call pays what a first evaluation pays."""
    import importlib
    import pkgutil

    import reco_sampled_plugin as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        try:
            mod = importlib.import_module(f"reco_sampled_plugin.{info.name}")
        except ImportError:  # pragma: no cover - an optional dependency
            continue
        for obj in list(vars(mod).values()):
            if callable(getattr(obj, "cache_clear", None)) and getattr(obj, "__module__", "") == mod.__name__:
                obj.cache_clear()
    # (fitted rank distributions and the identification's programs and intervals are kept on their histogram: each
    # call builds a new one)


def data(distinct: int, positives: int, seed: int = 0, spread: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Exact ranks and n of ``positives`` positives with ``distinct`` candidate counts: n = 1,500, 1,501, ... or, with
    ``spread``, evenly over 1,500..2,499 (steps of 1,000 // distinct)."""
    rng = np.random.default_rng(seed)
    n = 1500 + (np.arange(positives) % distinct) * (1000 // distinct if spread else 1)
    u = rng.beta(0.4, 3.0, positives)
    return 1 + np.floor((n - 1) * u).astype(np.int64), n


def cold(metric: str, sampled, n, method: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        clear_caches()
        t = time.perf_counter()
        est = estimate(
            metric,
            SampledRanks.from_arrays(sampled, n, 100),
            registry.method_class(method)(**OPTIONS.get(method, {})),
        )
        est.interval(0.95)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--positives", type=int, default=5000)
    ap.add_argument("--metric", default="ndcg@10")
    ap.add_argument("--methods", nargs="*", default=None)
    ap.add_argument("--ladder", type=int, nargs="*", default=None,
                    help="distinct n counts (<= 1,000) spread over the same range of n: the cost at each")
    args = ap.parse_args()
    # the registry's methods for this metric (hh: AUC only), but pl_fit: the popularity designs' estimator, whose
    # cost grows with the positives (seconds per draw of ml-100k's 943: docs/popularity.md, "Top-K metrics: pl_fit"),
    # not with the distinct n
    methods = args.methods or [m for m in registry.names(metric=args.metric) if m != "pl_fit"]
    counts = args.ladder or [1, 1000]
    if any(not 1 <= d <= 1000 for d in counts):
        ap.error("--ladder: counts of distinct n between 1 and 1,000")
    cases = {}
    for distinct in counts:
        r, n = data(distinct, args.positives, spread=args.ladder is not None)
        sampled = draw_sampled_ranks(r, torch.as_tensor(n), 100, repeats=1, seed=1)[0]
        cases[distinct] = (sampled, torch.as_tensor(n))
    # imports and one-off work outside the timings
    estimate(args.metric, SampledRanks.from_arrays(*cases[counts[0]], 100), "none")
    print(f"{args.metric}, {args.positives:,} positives, m = 100, estimate() + interval(), cold caches, median of "
          f"{args.repeats}; torch {torch.__version__}, {torch.get_num_threads()} thread(s), load average "
          f"{os.getloadavg()[0]:.2f}")
    if args.ladder is not None:
        print("| method | " + " | ".join(f"{d:,} distinct n (s)" for d in counts) + " |")
        print("|---" * (len(counts) + 1) + "|")
        for method in methods:
            times = [cold(args.metric, *cases[d], method, args.repeats) for d in counts]
            print(f"| `{method}` | " + " | ".join(f"{t:.3f}" for t in times) + " |", flush=True)
        return
    print("| method | one n (s) | 1,000 distinct n (s) | ratio |")
    print("|---|---|---|---|")
    for method in methods:
        one = cold(args.metric, *cases[1], method, args.repeats)
        many = cold(args.metric, *cases[1000], method, args.repeats)
        print(f"| `{method}` | {one:.3f} | {many:.3f} | {many / one:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
