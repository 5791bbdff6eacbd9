"""The planner's interval forecast against the interval users read: ``DesignForecast.rel_width`` (the median 95%
interval width relative to the value, ``estimate(metric, sampled).interval(0.95)`` with the default ``auto``) of
each design a plan forecasts, against the median width measured by running that design on fresh draws of real
recommenders' exact ranks (leave-last-out held-out items; users resampled with replacement in every draw, as the
plan's sets of users are fresh; the same estimator and interval the entry points print, flags included).

Data: ml-100k (the recbole wheel) and ml-latest-small (/work/shared/data/ml-latest-small, via
``datasets.load_ml_latest_small``), ItemKNN(q=3); the plan from an adaptive pilot of the real ranks
(``planner.pilot_design``), default grid, point target ``--target``, the default interval target.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_plan_width.py [--draws 20] [--metric ndcg@10]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch


def held_out(name: str):
    from reco_sampled_plugin import baselines, datasets

    split = datasets.load_ml100k() if name == "ml-100k" else datasets.load_ml_latest_small()
    model = baselines.ItemKNN(q=3).fit(split.train)
    ranks, n_u = baselines.held_out_ranks({"ItemKNN(q=3)": model}, split)
    return np.asarray(ranks["ItemKNN(q=3)"]), np.asarray(n_u)


def measured_width(r: np.ndarray, n_u: np.ndarray, metric: str, design, draws: int, seed: int) -> float:
    """Median over ``draws`` fresh draws (users resampled) of (hi - lo) / the set's exact metric."""
    from reco_sampled_plugin import estimate
    from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
    from reco_sampled_plugin.metrics import metric_values
    from reco_sampled_plugin.ranking import SampledRanks
    from reco_sampled_plugin.simulate import simulate_sampled_ranks

    gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    widths = []
    for _ in range(draws):
        idx = rng.integers(0, len(r), len(r))
        rt, nt = torch.from_numpy(r[idx]), torch.from_numpy(n_u[idx])
        truth = float(metric_values(metric, rt, nt).double().mean())
        if design.adaptive_max is None:
            s = SampledRanks.from_arrays(simulate_sampled_ranks(rt, nt, design.n_samples, design.law, gen), nt,
                                         design.n_samples, design)
        else:
            d = adaptive_sampled_ranks_from_exact(rt, nt, design, generator=gen)
            s = SampledRanks.from_arrays(d.ranks, nt, d.n_samples, design, exact_ranks=d.exact_ranks)
        lo, hi = estimate(metric, s).interval(0.95)
        widths.append((hi - lo) / truth)
    return float(np.median(widths))


def main(argv=None) -> list[dict]:
    from reco_sampled_plugin import planner
    from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--metric", default="ndcg@10")
    ap.add_argument("--target", type=float, default=0.1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    for name in ("ml-100k", "ml-latest-small"):
        r, n_u = held_out(name)
        pilot_design = planner.pilot_design(int(n_u.max()), args.metric)
        pilot = adaptive_sampled_ranks_from_exact(torch.from_numpy(r), torch.from_numpy(n_u), pilot_design,
                                                  generator=torch.Generator().manual_seed(2024))
        t = time.perf_counter()
        p = planner.plan(n_u, len(n_u), args.metric, args.target, pilot=pilot, seed=1,
                         execution=planner.PlanExecution(forecast_all=True))
        seconds = time.perf_counter() - t
        print(f"{name}: {len(n_u)} users, n {int(n_u.min())}..{int(n_u.max())}, pilot {pilot_design}; plan "
              f"{seconds:.1f} s; interval target +-{p.target_halfwidth:.1%} (full ranking +-{p.full_rel_width / 2:.1%});"
              f" recommended {None if p.recommended is None else p.recommended.label}", flush=True)
        for f in p.forecasts:
            if not math.isfinite(f.rel_width):
                continue
            got = measured_width(r, n_u, args.metric, f.design, args.draws, seed=7)
            row = {"data": name, "design": f.label, "method": f.method, "rel_error": f.rel_error,
                   "forecast_width": f.rel_width, "measured_width": got, "ratio": f.rel_width / got,
                   "recommended": p.recommended is not None and f.label == p.recommended.label}
            rows.append(row)
            print(f"  {f.label:<26} point {f.rel_error:6.1%}  width forecast {f.rel_width:7.1%}  measured "
                  f"{got:7.1%}  ratio {row['ratio']:.2f}{'  <- recommended' if row['recommended'] else ''}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
