"""Coverage of the default estimator's 95% interval in every cell of the accuracy benchmarks, through ``estimate()``.

The cells of ``accuracy_at_scale.py``: ml-100k and ml-latest-small, m in {50, 100, 500}, the five recommenders of
``baselines.train_benchmark``, HR@K and NDCG@K for K in {1, 5, 10, 20, 50, 100}. Each repeat draws sampled ranks from
the recommender's exact ranks (uniform, with replacement; the draws of ``accuracy_at_scale``, same seeds), wraps them
as ``SampledRanks.from_arrays(ranks, n_u, m, SamplingDesign(m))`` and calls ``estimate(metric, sample)`` with the
default method (``auto``: ``gmod`` where K is at least the resolution b = (n - 1)/(m + 1) + 1, ``mes`` elsewhere, the
default bootstrap) and, with ``--also``, other methods (e.g. ``bv``) on the same draws. A cell's coverage is the
share of repeats whose ``Estimate.interval(0.95)`` holds the users' exact metric.

Writes one JSON line per (data set, m, recommender, metric, method) to ``--out`` as it goes (a partial run is
usable) and prints the summary: per method, the worst cell, the cells below 0.9, and the cells with K >= b.

Run:  python benchmarks/studies/default_coverage.py [--repeats 100] [--datasets ml-100k ml-latest-small]
      [--ms 50 100 500] [--also bv] [--only bv] [--resolved-only | --unresolved-only] [--models iALS ...]
      [--out benchmarks/results/default_coverage.jsonl] [--ranks-cache DIR] [--summary FILE ...]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from accuracy_at_scale import KS, exact_rank_data  # noqa: E402

from reco_sampled_plugin import SampledRanks, SamplingDesign, estimate  # noqa: E402
from reco_sampled_plugin.metrics import metric_values  # noqa: E402
from reco_sampled_plugin.simulate import draw_sampled_ranks  # noqa: E402

METRICS = [f"hit@{k}" for k in KS] + [f"ndcg@{k}" for k in KS]


def rank_data(dataset: str, seed: int, cache: str | None):
    """``accuracy_at_scale.exact_rank_data`` (the recommenders' exact ranks: a minute of training on
    ml-latest-small), kept as ``{cache}/{dataset}-{seed}.pkl`` when ``cache`` is given."""
    if cache is None:
        return exact_rank_data(dataset, seed)
    path = Path(cache) / f"{dataset}-{seed}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    data = exact_rank_data(dataset, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(data))
    return data


def cells(dataset: str, ms, repeats: int, methods, seed: int = 0, resolved_only: bool = False, models=None,
          cache: str | None = None, unresolved_only: bool = False):
    """Yield one record per (m, recommender, metric, method): coverage, median width, what auto ran.
    ``resolved_only``: only the metrics with K at least the coarsest resolution b, and HR@100;
    ``unresolved_only``: only those with K < b (where ``auto`` runs ``mes``)."""
    ranks, n_u = rank_data(dataset, seed, cache)
    b_max = {m: (float(n_u.max()) - 1.0) / (m + 1.0) + 1.0 for m in ms}
    for m in ms:
        metrics = [mt for mt in METRICS if not resolved_only or mt == "hit@100" or int(mt.split("@")[1]) >= b_max[m]]
        metrics = [mt for mt in metrics if not unresolved_only or int(mt.split("@")[1]) < b_max[m]]
        for i, (name, r) in enumerate(ranks.items()):
            if models and name not in models:
                continue
            t0 = time.perf_counter()
            exact = {mt: float(metric_values(mt, torch.from_numpy(r), torch.from_numpy(n_u)).mean()) for mt in metrics}
            draws = draw_sampled_ranks(r, n_u, m, repeats=repeats, seed=seed + 1000 * m + i)  # as accuracy_at_scale
            hold = {(mt, meth): [] for mt in metrics for meth in methods}
            width = {(mt, meth): [] for mt in metrics for meth in methods}
            ran: dict = {mt: set() for mt in metrics}
            for b in range(repeats):
                sample = SampledRanks.from_arrays(draws[b], n_u, m, SamplingDesign(m))
                for meth in methods:
                    for mt in metrics:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            e = estimate(mt, sample, meth)
                        lo, hi = e.interval(0.95)
                        hold[(mt, meth)].append(lo <= exact[mt] <= hi)
                        width[(mt, meth)].append((hi - lo) / exact[mt])
                        if meth == "auto":
                            ran[mt].add(e.details["auto"]["method"])
            for mt in metrics:
                k = int(mt.split("@")[1])
                for meth in methods:
                    yield dict(dataset=dataset, m=m, model=name, metric=mt, method=meth, exact=exact[mt],
                               coverage=float(np.mean(hold[(mt, meth)])), repeats=repeats,
                               median_rel_width=float(np.median(width[(mt, meth)])), k_resolved=k >= b_max[m],
                               auto_ran=sorted(ran[mt]) if meth == "auto" else None)
            print(f"{dataset} m={m} {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)


def summary(rows) -> str:
    out = []
    for meth in sorted({r["method"] for r in rows}):
        sub = [r for r in rows if r["method"] == meth]
        worst = min(sub, key=lambda r: r["coverage"])
        low = [r for r in sub if r["coverage"] < 0.9]
        res = [r for r in sub if r["k_resolved"]]
        out.append(f"{meth}: {len(sub)} cells ({sub[0]['repeats']} draws each), worst coverage {worst['coverage']:.2f} "
                   f"({worst['dataset']} m={worst['m']} {worst['model']} {worst['metric']}); cells below 0.9: {len(low)}")
        for r in low:
            out.append(f"  below 0.9: {r['dataset']} m={r['m']} {r['model']} {r['metric']}: {r['coverage']:.2f}")
        if res:
            out.append(f"  K >= b: {len(res)} cells, worst {min(r['coverage'] for r in res):.2f}, "
                       f"median width / exact {np.median([r['median_rel_width'] for r in res]):.2f}")
        for ds in sorted({r["dataset"] for r in sub}):
            for m in sorted({r["m"] for r in sub if r["dataset"] == ds}):
                c = [r["coverage"] for r in sub if r["dataset"] == ds and r["m"] == m]
                out.append(f"  {ds} m={m}: worst {min(c):.2f} over {len(c)} cells")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--ms", type=int, nargs="+", default=[50, 100, 500])
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "ml-latest-small"],
                    choices=["ml-100k", "ml-latest-small"])
    ap.add_argument("--also", nargs="*", default=[], help="other methods to run on the same draws (e.g. bv)")
    ap.add_argument("--only", nargs="*", default=None, help="only these methods (default: auto and --also)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "default_coverage.jsonl"))
    only_k = ap.add_mutually_exclusive_group()
    only_k.add_argument("--resolved-only", action="store_true", help="only the cells with K >= b, and HR@100")
    only_k.add_argument("--unresolved-only", action="store_true", help="only the cells with K < b (auto runs mes)")
    ap.add_argument("--models", nargs="*", help="only these recommenders (default: all five)")
    ap.add_argument("--ranks-cache", help="a folder keeping the recommenders' exact ranks between runs")
    ap.add_argument("--summary", nargs="+", help="no run: the summary of these JSON-lines files")
    args = ap.parse_args()
    if args.summary:
        rows = [json.loads(line) for f in args.summary for line in Path(f).read_text().splitlines() if line]
        print(summary(rows))
        return
    methods = args.only if args.only else ["auto", *args.also]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = []
    with out.open("a") as fh:
        for ds in args.datasets:
            for row in cells(ds, args.ms, args.repeats, methods, resolved_only=args.resolved_only,
                             models=args.models, cache=args.ranks_cache, unresolved_only=args.unresolved_only):
                rows.append(row)
                fh.write(json.dumps(row) + "\n")
                fh.flush()
    print(summary(rows))
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
