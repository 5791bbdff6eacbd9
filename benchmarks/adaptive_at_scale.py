"""Adaptive against fixed-m sampling at catalogue scale: accuracy, honest-interval coverage, cost.

Exact ranks of the held-out item for the five recommenders of ``baselines.train_benchmark`` on ml-100k and
ml-latest-small (as ``accuracy_at_scale.py``). For each design, recommender and repeat, sampled ranks are drawn
from the exact ranks (with replacement; adaptive: m doubling for positives ranked first, up to the cap,
``adaptive_sampled_ranks_from_exact``) and ``estimate(..., method=...)`` for each of ``--methods`` (default
``mes``; ``gmod`` where the design resolves the top) estimates HR@10 and NDCG@10 (``adaptive=`` for the adaptive
designs; the bootstrap standard error of ``estimate()``'s default). The **oracle** row is the posterior mean under the
recommender's own exact ranks as prior (``accuracy_at_scale.oracle_values``, at each positive's final m): what no
estimator can expect to beat.

Reported per (data set, design, recommender, metric): relative bias and sd over repeats, relative RMSE, coverage
and median width of the 95% ``Estimate.interval`` (honest about the unresolved top), and the cost: mean sampled
items per positive and the share of positives at the cap.

Run:  python benchmarks/adaptive_at_scale.py [--repeats 20] [--datasets ml-100k ml-latest-small] [--methods mes gmod]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from reco_sampled_plugin import estimate, metric_values  # noqa: E402
from reco_sampled_plugin._progress import progress_bar  # noqa: E402
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact  # noqa: E402
from reco_sampled_plugin.simulate import draw_sampled_ranks  # noqa: E402
from reco_sampled_plugin import SampledRanks, SamplingDesign
from reco_sampled_plugin import registry

METRICS = ("hit@10", "ndcg@10")
# (m, cap): cap None = fixed m
DESIGNS = ((100, None), (500, None), (100, 800), (100, 3200), (100, 12800))


def exact_rank_data(dataset: str, seed: int = 0):
    from reco_sampled_plugin import baselines, datasets

    split = datasets.load_ml100k() if dataset == "ml-100k" else datasets.load_ml_latest_small()
    return baselines.held_out_ranks(baselines.train_benchmark(split.train, seed=seed), split)


def label(m: int, cap: int | None) -> str:
    return f"m={m}" if cap is None else f"m={m}->{cap}"


def run(dataset: str, repeats: int, seed: int, log=print, progress: bool | None = None,
        methods=("mes",)) -> list[dict]:
    from accuracy_at_scale import oracle_values

    t0 = time.perf_counter()
    ranks, n_u = exact_rank_data(dataset, seed)
    log(f"{dataset}: {len(n_u)} users, n {n_u.min()}..{n_u.max()}, trained and ranked in {time.perf_counter() - t0:.0f} s")
    n_t = torch.from_numpy(n_u)
    rows = []
    bar = progress_bar(total=len(DESIGNS) * len(ranks) * repeats, desc=f"{dataset}: fits", enabled=progress,
                       unit="fit")
    for d, (m, cap) in enumerate(DESIGNS):
        for i, (name, r) in enumerate(ranks.items()):
            t = time.perf_counter()
            r_t = torch.from_numpy(r)
            exact = {mt: float(metric_values(mt, r_t, n_t).mean()) for mt in METRICS}
            runs = r_t.unsqueeze(0).expand(repeats, -1)
            if cap is None:
                s = draw_sampled_ranks(r_t, n_t, m, repeats=repeats, seed=seed + 1000 * d + i)
                z = torch.full_like(s, m)
            else:
                gen = torch.Generator().manual_seed(seed + 1000 * d + i)
                drawn = adaptive_sampled_ranks_from_exact(runs, n_t, SamplingDesign(m, adaptive_max=cap), gen)
                s, z = drawn.ranks, drawn.n_samples
            est = {(meth, mt): [] for meth in methods for mt in METRICS}
            for b in range(repeats):
                extra = {} if cap is None else {"adaptive": (m, cap)}
                for meth in methods:
                    for mt in METRICS:
                        e = estimate(
                            mt,
                            SampledRanks.from_arrays(s[b], n_t, z[b]),
                            registry.method_class(meth)(**extra),
                        )
                        lo, hi = e.interval(0.95)
                        est[(meth, mt)].append((e.value, lo, hi))
                bar.update()
            oracle = oracle_values(r, n_u, s, z, METRICS)  # (repeats, metrics)
            for k, mt in enumerate(METRICS):
                est[("oracle", mt)] = [(v, np.nan, np.nan) for v in oracle[:, k]]
            first = len(rows)
            for (meth, mt), vals in est.items():
                a = np.asarray(vals, dtype=np.float64)
                ex = exact[mt]
                rel = a[:, 0] / ex - 1.0
                rows.append({
                    "dataset": dataset, "design": label(m, cap), "estimator": meth, "recommender": name, "metric": mt,
                    "exact": ex, "rel_bias": float(rel.mean()), "rel_sd": float(rel.std(ddof=1)),
                    "rel_rmse": float(np.sqrt(np.mean(rel ** 2))), "rel_mae": float(np.mean(np.abs(rel))),
                    "coverage": float(np.mean((a[:, 1] <= ex) & (ex <= a[:, 2]))) if meth != "oracle" else np.nan,
                    "rel_width": float(np.median(a[:, 2] - a[:, 1]) / ex) if meth != "oracle" else np.nan,
                    "mean_m": float(z.double().mean()), "share_at_cap": float((z == (cap or m)).double().mean()) if cap else 0.0,
                })
            log(f"  {label(m, cap):14} {name:20} {time.perf_counter() - t:6.1f} s  "
                + "  ".join(f"{r_['estimator']} {r_['metric']} mae {100 * r_['rel_mae']:.1f}% cov {r_['coverage']:.2f}"
                            for r_ in rows[first:]))
    bar.close()
    return rows


def markdown(rows: list[dict], repeats: int) -> str:
    out = [f"Relative RMSE over {repeats} repeats (bias, sd), coverage of the 95% interval, its median width "
           "relative to the exact value, mean m per positive (share at the cap).", ""]
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        out += [f"### {ds}", "", "| design | metric | estimator | worst rel. RMSE | mean rel. RMSE | mean |rel. error| "
                "(per recommender) | worst |bias| | min coverage | median rel. width | mean m | share at cap |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for design in dict.fromkeys(r["design"] for r in rows if r["dataset"] == ds):
            for mt, meth in ((mt, meth) for mt in METRICS for meth in dict.fromkeys(r["estimator"] for r in rows)):
                sel = [r for r in rows if r["dataset"] == ds and r["design"] == design and r["metric"] == mt
                       and r["estimator"] == meth]
                if not sel:
                    continue
                maes = ", ".join(f"{100 * r['rel_mae']:.1f}" for r in sel)
                out.append(
                    f"| {design} | {mt} | {meth} | {100 * max(r['rel_rmse'] for r in sel):.1f}% | "
                    f"{100 * np.mean([r['rel_rmse'] for r in sel]):.1f}% | {maes} | "
                    f"{100 * max(abs(r['rel_bias']) for r in sel):.1f}% | "
                    f"{min(r['coverage'] for r in sel):.2f} | {100 * np.median([r['rel_width'] for r in sel]):.0f}% | "
                    f"{np.mean([r['mean_m'] for r in sel]):.0f} | {np.mean([r['share_at_cap'] for r in sel]):.3f} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "ml-latest-small"])
    ap.add_argument("--methods", nargs="+", default=["mes"], help="estimators to run (the oracle row is added)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar on stderr (default: when stderr is a terminal)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    for ds in args.datasets:
        rows += run(ds, args.repeats, args.seed, progress=args.progress, methods=tuple(args.methods))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import csv

    with open(out / "adaptive_at_scale.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    text = markdown(rows, args.repeats)
    (out / "adaptive_at_scale.md").write_text(text + f"\nTotal {time.perf_counter() - t0:.0f} s.\n")
    print(text)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
