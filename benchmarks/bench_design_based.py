"""The difference estimator ``diff`` on an exact share against ``gmod``: bias, coverage and width per cell.

Exact ranks of the held-out items of the five recommenders of ``baselines.train_benchmark`` on ml-100k (RecBole's
wheel) or ml-latest-small (shared/data), leave-last-out, training items excluded. Each draw simulates uniform
sampled ranks (with replacement) from the exact ranks: at a fixed m (the binomial law), or adaptive (``--adaptive
CAP``: m doubling while the positive ranks first, up to CAP, ``adaptive_sampled_ranks_from_exact``). The model (the
fit ``auto`` runs, without bootstrap: ``gmod`` for adaptive draws) predicts every positive once per draw, and then
``--choices`` independent Poisson choices of the exact share (uniform: pi = share; active: pi from the model's
NDCG@10 spread, ``ExactShare(choice="active")``) give that many design-based estimates (eq. 1-4 of
``_design_based``, as ``estimate(..., "diff")`` computes them): draws x choices estimates per cell, whose
unbiasedness and coverage hold over both. ``gmod`` (``estimate(..., "gmod")``, its default interval) runs once per
draw on the same draw, and at equal scoring: the pairs the share costs, share (mean n - 1) per positive, spent on
samples instead (fixed: m' = m + share (mean n - 1); adaptive: first stage and cap scaled by the mean pairs of the
first draw plus the share's over those alone, the same stages).

Reported per (dataset, recommender, metric, share choice): the exact users' metric; diff's bias (mean estimate minus
the truth, with its Monte Carlo standard error; in parentheses the standard error over the draws' means, which the
choices sharing a draw's predictions cannot understate), coverage of the 95% interval (+- its standard error, and by
draw) and median width; gmod's bias, coverage and median width on the draw and at equal scoring; the width ratio
diff / gmod at equal scoring.

    python benchmarks/bench_design_based.py --dataset ml-100k --draws 10 --choices 20
    python benchmarks/bench_design_based.py --dataset ml-latest-small --draws 10 --choices 20 --share 0.1
    python benchmarks/bench_design_based.py --dataset ml-100k --adaptive 3200 --draws 10 --choices 20
    python benchmarks/bench_design_based.py --dataset ml-100k --popularity 1 --draws 10 --choices 20

``--popularity ALPHA``: popularity draws on the recommenders' score matrices (``run_popularity``), ``pl_fit``'s
predictions (the Bhatia-Davis bound f for eq. 4's E[M^2]) against ``pl_fit``'s own interval on the same draw.
``--coef tuned``: PPI++'s lambda (eq. 3) in eq. 1 (default: the package's, lambda = 1, exactly unbiased).

Coverage counts an interval as holding when the truth lies within ``TOL`` = 1e-9 (absolute) of it: where an active
share ranks every positive but those the model calls certain (f within 1e-5 of 0, y = 0), eq. 1 with lambda = 1
misses the truth by about that much (the unchosen positives' f), and eq. 2 and 4 read ~0 on the chosen ones (their
residuals and f are ~0): a zero-width interval off by less than the table's precision (1e-4), not a miss.
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
from reco_sampled_plugin._design_based import (  # noqa: E402
    COEF, COEFS, _posterior_means, difference_estimate, inclusion_probabilities, model_fit, predictions)
from reco_sampled_plugin._rank_hist import metric_at  # noqa: E402
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact  # noqa: E402
from reco_sampled_plugin.design import ExactShare  # noqa: E402
from reco_sampled_plugin.metric_names import MetricSpec, parse_metric  # noqa: E402
from reco_sampled_plugin.simulate import simulate_sampled_ranks  # noqa: E402

METRICS = ("hit@10", "ndcg@10")
Z = 1.959964
#: absolute tolerance of a hold: the truth within TOL of the interval (module docstring)
TOL = 1e-9


def exact_ranks(dataset: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    from reco_sampled_plugin import baselines, datasets

    split = datasets.load_ml100k() if dataset == "ml-100k" else datasets.load_ml_latest_small()
    return baselines.held_out_ranks(baselines.train_benchmark(split.train, seed=0), split)


def _sampled(rt: torch.Tensor, nt: torch.Tensor, design: rsp.SamplingDesign, seed: int) -> rsp.SampledRanks:
    """A uniform draw (with replacement) simulated from the exact ranks: fixed m (the binomial law), or adaptive
    (``adaptive_sampled_ranks_from_exact``: m doubling while the positive ranks first, up to the cap)."""
    g = torch.Generator().manual_seed(seed)
    if design.adaptive_max is not None:
        return adaptive_sampled_ranks_from_exact(rt, nt, design, g)
    return rsp.SampledRanks(simulate_sampled_ranks(rt, nt.double(), design.n_samples, "binomial", g), nt, None, design)


def _equal_design(design: rsp.SamplingDesign, pairs: float, extra: float) -> rsp.SamplingDesign:
    """The design of the same shape that scores ``extra`` more pairs per positive than ``pairs`` (the mean final m
    of ``design``'s draw): fixed m' = m + extra; adaptive: first stage and cap scaled by (pairs + extra) / pairs,
    the same number of stages."""
    m = design.n_samples
    if design.adaptive_max is None:
        return rsp.SamplingDesign(int(round(m + extra)))
    m_equal = int(round(m * (pairs + extra) / pairs))
    return rsp.SamplingDesign(m_equal, adaptive_max=m_equal * (design.cap // m))


def _label(design: rsp.SamplingDesign) -> str:
    return f"m = {design.n_samples}" + ("" if design.adaptive_max is None else f" up to {design.cap}")


def _shares(rng: np.random.Generator, y: np.ndarray, f: np.ndarray, f2: np.ndarray, pi: np.ndarray,
            choices: int, coef: str) -> list[tuple[float, float, float]]:
    """(estimate, interval) of ``choices`` Poisson shares with probabilities ``pi`` (eq. 1-4; ``coef``: lambda)."""
    out = []
    for _ in range(choices):
        v, se, _ = difference_estimate(y, f, pi, rng.uniform(size=len(y)) < pi, None, coef, f2)
        out.append((v, max(v - Z * se, 0.0), min(v + Z * se, 1.0)))
    return out


def _summary(rows: list[tuple[float, float, float]], truth: float, per: int = 1) -> str:
    """bias +- its Monte Carlo se, coverage +- its se (a hold: the truth within ``TOL`` of the interval), median
    width; rows in blocks of ``per`` from one draw
    (``per`` > 1: each se also by draw, in parentheses: the standard error of the mean over the draws' block means,
    which the choices sharing a draw's predictions cannot understate)."""
    a = np.asarray(rows, dtype=np.float64)
    v, lo, hi = a[:, 0], a[:, 1], a[:, 2]
    hit = ((lo - TOL <= truth) & (truth <= hi + TOL)).astype(np.float64)
    cov = float(hit.mean())
    bias_se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    text = [f"{v.mean() - truth:+.4f} +- {bias_se:.4f}", f"{cov:.3f} +- {np.sqrt(cov * (1 - cov) / len(v)):.3f}"]
    if per > 1 and len(v) >= 2 * per:
        for i, x in enumerate((v, hit)):
            blocks = x.reshape(-1, per).mean(1)
            text[i] += f" ({blocks.std(ddof=1) / np.sqrt(len(blocks)):.{4 - i}f})"
    return f"{text[0]}, {text[1]}, {np.median(hi - lo):.4f}"


def _moments(spec: MetricSpec, sampled: rsp.SampledRanks) -> tuple[np.ndarray, np.ndarray]:
    """(f, E[M^2 | data]) per positive under the fit ``auto`` runs on ``sampled`` (``gmod`` for an adaptive
    design or where the top is resolved, else ``mes``), as ``estimate(..., "diff")`` reads them."""
    hist = sampled.histogram(exact=False).without_empty_groups()
    fit, _, law = model_fit(spec, hist, None, sampled.design)
    m = sampled.sizes()
    m_all = m.numpy() if isinstance(m, torch.Tensor) else np.full(sampled.ranks.numel(), m)
    return _posterior_means(spec, fit, sampled.candidates().numpy(), m_all, sampled.ranks.numpy(), law, second=True)


def run_recommender(name: str, r: np.ndarray, n_u: np.ndarray, design: rsp.SamplingDesign, share: float, draws: int,
                    choices: int, seed: int, coef: str = COEF) -> list[str]:
    """The table rows of one recommender (both metrics, both share choices)."""
    rt, nt = torch.from_numpy(r), torch.from_numpy(n_u)
    specs = {s: parse_metric(s) for s in METRICS}
    y = {s: metric_at(specs[s], r.astype(np.float64), n_u.astype(np.float64)) for s in METRICS}
    truth = {s: float(y[s].mean()) for s in METRICS}
    rng = np.random.default_rng(seed)
    out: dict = {}
    equal = None
    for d in range(draws):
        sampled = _sampled(rt, nt, design, 5000 + d)
        if equal is None:  # the share's pairs spent on more draws, from the first draw's mean final m
            pairs = float(np.mean(sampled.sizes() if design.adaptive_max is None else sampled.sizes().numpy()))
            equal = _equal_design(design, pairs, share * (n_u.mean() - 1))
        moments = {s: _moments(specs[s], sampled) for s in METRICS}
        pis = {"uniform": np.full(len(r), share),
               "active": inclusion_probabilities(ExactShare(share, choice="active"), moments["ndcg@10"][0], (0.0, 1.0))}
        for s in METRICS:
            for choice, pi in pis.items():
                out.setdefault((s, "diff", choice), []).extend(
                    _shares(rng, y[s], moments[s][0], moments[s][1], pi, choices, coef))
            for label, smp in (("gmod", sampled), ("gmod_equal", _sampled(rt, nt, equal, 7000 + d))):
                e = rsp.estimate(s, smp, "gmod")
                out.setdefault((s, label, ""), []).append((e.value, *e.interval(0.95)))
    rows = []
    for s in METRICS:
        g, ge = out[(s, "gmod", "")], out[(s, "gmod_equal", "")]
        for choice in ("uniform", "active"):
            dd = out[(s, "diff", choice)]
            ratio = np.median([hi - lo for _, lo, hi in dd]) / np.median([hi - lo for _, lo, hi in ge])
            rows.append(f"| {name} | {s} | {choice} | {truth[s]:.4f} | {_summary(dd, truth[s], choices)} | "
                        f"{_summary(g, truth[s])} | {_summary(ge, truth[s])} ({_label(equal)}) | {ratio:.2f} |")
    return rows


def run_popularity(dataset: str, m: int, share: float, alpha: float, draws: int, choices: int,
                   only: str | None, coef: str = COEF) -> None:
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
                    out.setdefault((s, choice), []).extend(_shares(rng, y[s], f[s], f[s], pi, choices, coef))
                e = rsp.estimate(s, pop, "pl_fit")
                out.setdefault((s, "pl_fit"), []).append((e.value, *e.interval(0.95)))
        for s in METRICS:
            truth = float(y[s].mean())
            for choice in ("uniform", "active"):
                dd, pl = out[(s, choice)], out[(s, "pl_fit")]
                ratio = np.median([hi - lo for _, lo, hi in dd]) / np.median([hi - lo for _, lo, hi in pl])
                print(f"| {name} | {s} | {choice} | {truth:.4f} | {_summary(dd, truth, choices)} | "
                      f"{_summary(pl, truth)} | {ratio:.2f} |", flush=True)


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
    ap.add_argument("--adaptive", type=int, default=None, metavar="CAP",
                    help="adaptive uniform draws from --m doubling up to CAP (gmod's fit), against gmod at equal "
                    "scoring")
    ap.add_argument("--coef", default=COEF, choices=COEFS,
                    help=f"lambda of eq. 1: 1 (exactly unbiased) or the PPI++ value 'tuned' (default {COEF!r})")
    args = ap.parse_args()
    if args.popularity is not None and args.adaptive is not None:
        ap.error("--adaptive: adaptive draws are uniform (not with --popularity)")
    t0 = time.perf_counter()
    if args.popularity is not None:
        run_popularity(args.dataset, args.m, args.share, args.popularity, args.draws, args.choices, args.recommender,
                       args.coef)
        print(f"total {time.perf_counter() - t0:.0f} s")
        return
    ranks, n_u = exact_ranks(args.dataset)
    design = rsp.SamplingDesign(args.m, adaptive_max=args.adaptive)
    print(f"{args.dataset}: {len(n_u)} positives, mean n {n_u.mean():.0f}; {_label(design)}, share {args.share}, "
          f"{args.draws} draws x {args.choices} choices (trained in {time.perf_counter() - t0:.0f} s)")
    print("cells: bias +- MC se (by draw), coverage of interval(0.95) +- se (by draw), median width")
    print("| recommender | metric | share | exact | diff | gmod (same draw) | gmod (equal scoring) | "
          "width diff / gmod (equal) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, (name, r) in enumerate(ranks.items()):
        if args.recommender is not None and args.recommender not in name:
            continue
        for row in run_recommender(name, r, n_u, design, args.share, args.draws, args.choices, seed=i,
                                   coef=args.coef):
            print(row, flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
