"""The difference estimator ``diff`` on an exact share against ``gmod``: bias, coverage and width per cell.

Exact ranks of the held-out items of the five recommenders of ``baselines.train_benchmark`` on ml-100k (RecBole's
wheel) or ml-latest-small (shared/data), leave-last-out, training items excluded. Each draw simulates the sampled
ranks at a fixed m from the exact ranks (uniform with replacement, the binomial law); the model (the fit ``auto``
runs, without bootstrap) predicts every positive once per draw, and then ``--choices`` independent Poisson choices of
the exact share (uniform: pi = share; active: pi from the model's NDCG@10 spread, ``ExactShare(choice="active")``)
give that many design-based estimates (eq. 1-4 of ``_design_based``, as ``estimate(..., "diff")`` computes them): draws x choices estimates per cell, whose
unbiasedness and coverage hold over both. ``gmod`` (``estimate(..., "gmod")``, its default interval) runs once per
draw at the same m, and at the same scoring: m' = m + share (mean n - 1), the pairs the share costs spent on
samples instead.

Reported per (dataset, recommender, metric, share choice): the exact users' metric; diff's bias (mean estimate minus
the truth, with its Monte Carlo standard error), coverage of the 95% interval (+- its standard error) and median
width; gmod's bias, coverage and median width at m and at m'; the width ratio diff / gmod(m').

    python benchmarks/bench_design_based.py --dataset ml-100k --draws 10 --choices 20
    python benchmarks/bench_design_based.py --dataset ml-latest-small --draws 10 --choices 20 --share 0.1
    python benchmarks/bench_design_based.py --dataset ml-100k --popularity 1 --draws 3 --choices 20

``--popularity ALPHA``: popularity draws on the recommenders' score matrices (``run_popularity``), ``pl_fit``'s
predictions (the Bhatia-Davis bound f for eq. 4's E[M^2]) against ``pl_fit``'s own interval on the same draw.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import reco_sampled_plugin as rsp  # noqa: E402
from reco_sampled_plugin._design_based import (_posterior_means, difference_estimate, inclusion_probabilities,  # noqa: E402
                                               model_fit, predictions)
from reco_sampled_plugin._rank_hist import metric_at  # noqa: E402
from reco_sampled_plugin.design import ExactShare  # noqa: E402
from reco_sampled_plugin.metric_names import parse_metric  # noqa: E402
from reco_sampled_plugin.simulate import simulate_sampled_ranks  # noqa: E402

METRICS = ("hit@10", "ndcg@10")
Z = 1.959964


def exact_ranks(dataset: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    from reco_sampled_plugin import baselines, datasets

    split = datasets.load_ml100k() if dataset == "ml-100k" else datasets.load_ml_latest_small()
    return baselines.held_out_ranks(baselines.train_benchmark(split.train, seed=0), split)


def _sampled(rt: torch.Tensor, nt: torch.Tensor, m: int, seed: int) -> rsp.SampledRanks:
    g = torch.Generator().manual_seed(seed)
    return rsp.SampledRanks(simulate_sampled_ranks(rt, nt.double(), m, "binomial", g), nt, None, rsp.SamplingDesign(m))


def r_tilde(sampled: rsp.SampledRanks) -> np.ndarray:
    return sampled.ranks.numpy()


def _shares(rng: np.random.Generator, y: np.ndarray, f: np.ndarray, f2: np.ndarray, pi: np.ndarray,
            choices: int) -> list[tuple[float, float, float]]:
    """(estimate, interval) of ``choices`` Poisson shares with probabilities ``pi`` (eq. 1-4, lambda tuned)."""
    out = []
    for _ in range(choices):
        v, se, _ = difference_estimate(y, f, pi, rng.uniform(size=len(y)) < pi, None, "tuned", f2)
        out.append((v, max(v - Z * se, 0.0), min(v + Z * se, 1.0)))
    return out


def _summary(rows: list[tuple[float, float, float]], truth: float) -> str:
    a = np.asarray(rows, dtype=np.float64)
    v, lo, hi = a[:, 0], a[:, 1], a[:, 2]
    cov = float(((lo <= truth) & (truth <= hi)).mean())
    bias_se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return (f"{v.mean() - truth:+.4f} +- {bias_se:.4f}, {cov:.3f} +- {np.sqrt(cov * (1 - cov) / len(v)):.3f}, "
            f"{np.median(hi - lo):.4f}")


def run_recommender(name: str, r: np.ndarray, n_u: np.ndarray, m: int, share: float, draws: int, choices: int,
                    seed: int) -> list[str]:
    """The table rows of one recommender (both metrics, both share choices)."""
    rt, nt = torch.from_numpy(r), torch.from_numpy(n_u)
    m_equal = int(round(m + share * (n_u.mean() - 1)))
    specs = {s: parse_metric(s) for s in METRICS}
    y = {s: metric_at(specs[s], r.astype(np.float64), n_u.astype(np.float64)) for s in METRICS}
    truth = {s: float(y[s].mean()) for s in METRICS}
    rng = np.random.default_rng(seed)
    out: dict = {}
    for d in range(draws):
        sampled = _sampled(rt, nt, m, 5000 + d)
        law_fits = {s: model_fit(specs[s], sampled.histogram()) for s in METRICS}
        moments = {s: _posterior_means(specs[s], law_fits[s][0], n_u, np.full(len(r), m), r_tilde(sampled),
                                       law_fits[s][2], second=True) for s in METRICS}
        f = {s: moments[s][0] for s in METRICS}
        pis = {"uniform": np.full(len(r), share),
               "active": inclusion_probabilities(ExactShare(share, choice="active"), f["ndcg@10"], (0.0, 1.0))}
        for s in METRICS:
            for choice, pi in pis.items():
                out.setdefault((s, "diff", choice), []).extend(_shares(rng, y[s], f[s], moments[s][1], pi, choices))
            for label, mm, smp in (("gmod", m, sampled), ("gmod_equal", m_equal, _sampled(rt, nt, m_equal, 7000 + d))):
                e = rsp.estimate(s, smp, "gmod")
                out.setdefault((s, label, ""), []).append((e.value, *e.interval(0.95)))
    rows = []
    for s in METRICS:
        g, ge = out[(s, "gmod", "")], out[(s, "gmod_equal", "")]
        for choice in ("uniform", "active"):
            dd = out[(s, "diff", choice)]
            ratio = np.median([hi - lo for _, lo, hi in dd]) / np.median([hi - lo for _, lo, hi in ge])
            rows.append(f"| {name} | {s} | {choice} | {truth[s]:.4f} | {_summary(dd, truth[s])} | "
                        f"{_summary(g, truth[s])} | {_summary(ge, truth[s])} (m' = {m_equal}) | {ratio:.2f} |")
    return rows


def run_popularity(dataset: str, m: int, share: float, alpha: float, draws: int, choices: int,
                   only: str | None) -> None:
    """The popularity design (q proportional to count^alpha, RecBole's ``popN``, drawn by the plugin on each
    recommender's score matrix as ``benchmarks/popularity_accuracy.py`` draws it): ``pl_fit``'s per-positive
    predictions, ``choices`` Poisson shares per draw, against ``pl_fit``'s own interval on the same draw."""
    from popularity_accuracy import load

    scores, test, exc, counts, n_u = load(dataset)
    print(f"{dataset}, popularity alpha = {alpha}, m = {m}, share {share}, {draws} draws x {choices} choices")
    print("| recommender | metric | share | exact | diff | pl_fit (m) | width diff / pl_fit |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(1)
    for name, sc in scores.items():
        if only is not None and only not in name:
            continue
        exact = rsp.exact_ranks(sc, test, exc, count_other_positives=False).view(-1).double().numpy()
        specs = {s: parse_metric(s) for s in METRICS}
        y = {s: metric_at(specs[s], exact, n_u.double().numpy()) for s in METRICS}
        out: dict = {}
        for d in range(draws):
            pop = rsp.sampled_ranks(sc, test, rsp.SamplingDesign(m, popularity=counts ** alpha), exclude=exc,
                                    generator=torch.Generator().manual_seed(9000 + d))
            f = {s: predictions(specs[s], pop)[0] for s in METRICS}
            pis = {"uniform": np.full(len(exact), share),
                   "active": inclusion_probabilities(ExactShare(share, choice="active"), f["ndcg@10"], (0.0, 1.0))}
            for s in METRICS:
                for choice, pi in pis.items():  # E[M^2] <= f: the Bhatia-Davis bound, as estimate() takes it here
                    out.setdefault((s, choice), []).extend(_shares(rng, y[s], f[s], f[s], pi, choices))
                e = rsp.estimate(s, pop, "pl_fit")
                out.setdefault((s, "pl_fit"), []).append((e.value, *e.interval(0.95)))
        for s in METRICS:
            truth = float(y[s].mean())
            for choice in ("uniform", "active"):
                dd, pl = out[(s, choice)], out[(s, "pl_fit")]
                ratio = np.median([hi - lo for _, lo, hi in dd]) / np.median([hi - lo for _, lo, hi in pl])
                print(f"| {name} | {s} | {choice} | {truth:.4f} | {_summary(dd, truth)} | {_summary(pl, truth)} | "
                      f"{ratio:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="ml-100k", choices=("ml-100k", "ml-latest-small"))
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--share", type=float, default=0.1)
    ap.add_argument("--draws", type=int, default=10, help="sampled draws per cell (one model fit each)")
    ap.add_argument("--choices", type=int, default=20, help="Poisson choices of the exact share per draw")
    ap.add_argument("--recommender", default=None, help="only recommenders whose name contains this")
    ap.add_argument("--popularity", type=float, default=None, metavar="ALPHA",
                    help="popularity draws (q ~ count^ALPHA) on the score matrices, against pl_fit")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.popularity is not None:
        run_popularity(args.dataset, args.m, args.share, args.popularity, args.draws, args.choices, args.recommender)
        print(f"total {time.perf_counter() - t0:.0f} s")
        return
    ranks, n_u = exact_ranks(args.dataset)
    print(f"{args.dataset}: {len(n_u)} positives, mean n {n_u.mean():.0f}; m = {args.m}, share {args.share}, "
          f"{args.draws} draws x {args.choices} choices (trained in {time.perf_counter() - t0:.0f} s)")
    print("cells: bias +- MC se, coverage of interval(0.95) +- se, median width")
    print("| recommender | metric | share | exact | diff | gmod (m) | gmod (m', equal scoring) | width diff / gmod(m') |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, (name, r) in enumerate(ranks.items()):
        if args.recommender is not None and args.recommender not in name:
            continue
        for row in run_recommender(name, r, n_u, args.m, args.share, args.draws, args.choices, seed=i):
            print(row, flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
