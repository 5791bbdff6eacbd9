"""The planner's forecasts of popularity designs against real draws (docs/popularity.md, "Planning a popularity
design").

For each recommender of ``baselines.train_benchmark`` on ml-100k or ml-latest-small (leave-last-out, the held-out
item against the user's drawable items, counts over all phases as ``popularity_accuracy.py``): a pilot popularity
draw (m = ``--pilot-m``, q proportional to count^alpha, alpha 1, seed 999), then for each metric
``plan(n_items, users, metric, 0.1, pilot=pilot, designs=[SamplingDesign(m, popularity=counts ** alpha) ...],
repeats=R, execution=PlanExecution(forecast_all=True, screen=False))``: the forecast relative RMSE of the default estimator (``auto``: ``hh``
for AUC, ``pl_fit`` otherwise) per design. Next to it the real relative RMSE: ``--real-repeats`` real popularity
draws per design on the recommender's scores (seeds as ``popularity_accuracy.py``: 10,000 x repeat + m), each
estimated with the same default and compared with the recommender's exact metric. Columns: forecast, real, their
ratio.

    OMP_NUM_THREADS=1 python benchmarks/planner_popularity.py --dataset ml-100k --repeats 10 --real-repeats 10
    OMP_NUM_THREADS=1 python benchmarks/planner_popularity.py --dataset ml-100k --recommenders EASE --out e.json
    python benchmarks/planner_popularity.py --merge a.json b.json      # the table of earlier runs

Sharded by recommender (``--recommenders`` takes names separated by ``;``), each run writing its rows to ``--out``
after each recommender.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import reco_sampled_plugin as rsp  # noqa: E402
from reco_sampled_plugin import metric_values  # noqa: E402
from reco_sampled_plugin.planner import PlanExecution, plan  # noqa: E402

from popularity_accuracy import load  # noqa: E402

METRICS = ("auc", "hit@10", "ndcg@10")


def run(dataset: str, repeats: int, real_repeats: int, ms: tuple[int, ...], alphas: tuple[float, ...],
        pilot_m: int, names: list[str] | None, out: str | None) -> list[dict]:
    scores, test, exc, counts, n_u = load(dataset)
    rows: list[dict] = []
    for name, sc in scores.items():
        if names and name not in names:
            continue
        t0 = time.time()
        exact = rsp.exact_ranks(sc, test, exc, count_other_positives=False).view(-1)
        truth = {s: float(metric_values(s, exact, n_u).double().mean()) for s in METRICS}
        pilot = rsp.sampled_ranks(sc, test, rsp.SamplingDesign(pilot_m, popularity=counts), exclude=exc,
                                  generator=torch.Generator().manual_seed(999))
        designs = [rsp.SamplingDesign(m, popularity=counts ** a) for a in alphas for m in ms]
        real: dict[tuple[float, int, str], list[float]] = {}
        for a in alphas:
            for m in ms:
                for rep in range(real_repeats):
                    g = torch.Generator().manual_seed(10_000 * rep + m)
                    draw = rsp.sampled_ranks(sc, test, rsp.SamplingDesign(m, popularity=counts ** a), exclude=exc,
                                             generator=g)
                    for s in METRICS:
                        real.setdefault((a, m, s), []).append(rsp.estimate(s, draw).value / truth[s] - 1.0)
        t_real = time.time() - t0
        for s in METRICS:
            t1 = time.time()
            p = plan(len(counts), len(exact), s, 0.1, pilot=pilot, designs=designs, repeats=repeats,
                     execution=PlanExecution(forecast_all=True, screen=False))
            seconds = time.time() - t1
            for i, (d, f) in enumerate(zip(designs, p.forecasts)):
                a = alphas[i // len(ms)]
                e = np.asarray(real[(a, d.n_samples, s)])
                rows.append({"dataset": dataset, "recommender": name, "metric": s, "alpha": a, "m": d.n_samples,
                             "forecast": f.rel_error, "forecast_se": f.rel_error_se, "method": f.method,
                             "forecast_bias": f.rel_bias, "forecast_width": f.rel_width,
                             "real": float(np.sqrt(np.mean(e ** 2))), "real_bias": float(e.mean()),
                             "real_repeats": len(e), "repeats": repeats, "plan_seconds": seconds,
                             "world": p.shape_source})
        print(f"{dataset} {name}: real draws {t_real:.0f} s, plans {time.time() - t0 - t_real:.0f} s", flush=True)
        if out:
            with open(out, "w") as fh:
                json.dump(rows, fh)
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'dataset':<16}{'recommender':<20}{'metric':<9}{'alpha':>6}{'m':>5}{'forecast':>10}{'real':>9}"
             f"{'ratio':>7}"]
    ratios = []
    for r in rows:
        ratio = r["forecast"] / r["real"] if r["real"] > 0 else math.nan
        ratios.append(ratio)
        lines.append(f"{r['dataset']:<16}{r['recommender']:<20}{r['metric']:<9}{r['alpha']:>6g}{r['m']:>5}"
                     f"{r['forecast']:>10.2%}{r['real']:>9.2%}{ratio:>7.2f}")
    x = np.log(np.asarray(ratios))
    lines.append(f"ratio forecast / real: median {math.exp(float(np.median(x))):.2f}, within 2x in "
                 f"{int(np.sum(np.abs(x) <= math.log(2)))} of {len(x)}, within 1.5x in "
                 f"{int(np.sum(np.abs(x) <= math.log(1.5)))} of {len(x)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="ml-100k", choices=("ml-100k", "ml-latest-small"))
    ap.add_argument("--repeats", type=int, default=10, help="the plan's Monte Carlo repeats per design")
    ap.add_argument("--real-repeats", type=int, default=10, help="real popularity draws per design")
    ap.add_argument("--m", type=int, nargs="+", default=[100, 500])
    ap.add_argument("--alpha", type=float, nargs="+", default=[1.0])
    ap.add_argument("--pilot-m", type=int, default=100)
    ap.add_argument("--recommenders", default=None, help="names separated by ';' (default: all five)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--merge", nargs="*", default=None, help="print the table of these runs' rows and stop")
    ap.add_argument("--world", default=None, choices=("em-smooth", "em", "spline"),
                    help="the world's rank prior (default: the planner's)")
    args = ap.parse_args()
    if args.world is not None:
        import reco_sampled_plugin.planner as planner

        planner._POPULARITY_WORLD = {"em-smooth": ("em", True), "em": ("em", False),
                                     "spline": ("spline", False)}[args.world]
    if args.merge is not None:
        rows = [r for f in args.merge for r in json.load(open(f))]
    else:
        rows = run(args.dataset, args.repeats, args.real_repeats, tuple(args.m), tuple(args.alpha), args.pilot_m,
                   args.recommenders.split(";") if args.recommenders else None, args.out)
    print(table(rows))


if __name__ == "__main__":
    main()
