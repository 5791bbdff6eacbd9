"""pl_fit stratified by an observed covariate of each positive (development probe, docs/research-notes.md, "Strata by
the positive's popularity").

The per-positive latent tilt (``popularity_tilt_mixture.py``) is confounded with the rank: where few draws beat a
positive, a slow tilt and a deeper rank explain them alike. An *observed* covariate is not: positives are split into
strata by a covariate the evaluation knows, and ``pl_fit`` is fitted on each stratum alone (its own tilt curve and
rank prior); the value is the strata's values weighted by their positives. Covariates:

* ``pos``: log popularity (all-phase count) of the held-out item itself;
* ``hist``: mean log popularity of the user's training items.

Strata at the covariate's quantiles (2 or 3). With the true prior (the histogram of exact ranks per stratum) the
composition model is judged alone. Draws as ``popularity_tilt_curves.py`` (seed 10,000 x repeat + m).

    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_strata.py --dataset ml-100k --out s100k.jsonl
    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_strata.py --dataset ml-100k --splits pos2,hist2 \
        --reps 2 3 4 5 6 7 8 9 --ms 500 --out s100k.jsonl
    python benchmarks/studies/popularity_strata.py --splits pos2,hist2 --summarise s100k.jsonl slsm.jsonl
    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_strata.py --dataset ml-100k --time --reps 0 --out /dev/null
    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_strata.py --dataset ml-100k --time count --reps 0 --out /dev/null
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/ (siblings)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/studies/
import popularity_accuracy as pa  # noqa: E402
import popularity_tilt_curves as tc  # noqa: E402
import popularity_tilt_mixture as tm  # noqa: E402

import reco_sampled_plugin as rsp  # noqa: E402
from reco_sampled_plugin import _popularity_fit as pf, metric_values  # noqa: E402
from reco_sampled_plugin.popularity import popularity_draws  # noqa: E402

METRICS, SPECS = tc.METRICS, tc.SPECS
SPLITS = [("pos", 2), ("pos", 3), ("hist", 2), ("hist", 3)]
COUNT = [0]  # the count term up to this rank (--count)


def true_value(f: pf.PopularityFit, r_true: np.ndarray) -> dict:
    cell = np.searchsorted(f.edges, r_true, side="left") - 1
    prior = np.bincount(cell, weights=f.units.w, minlength=len(f.edges) - 1).astype(np.float64)
    prior /= prior.sum()
    post = pf._rows_posterior(f._assemble(f.curves[f.best][2]), prior[None, :])
    return {s: float(f.units.w @ (post * f.cell_metric(spec)).sum(1)) / float(f.units.w.sum())
            for s, spec in SPECS.items()}


class _Half:
    """What ``popularity_tilt_mixture.spline_values`` reads of a fit (allowed cells, weights, edges), for some rows."""

    def __init__(self, f: pf.PopularityFit, rows: np.ndarray) -> None:
        self.allowed, self.edges = f.allowed[rows], f.edges
        self.units = f.units.select(rows)


def prior_only(f: pf.PopularityFit, units: pf.Units) -> dict:
    """The values with the default's halves (``_popularity_fit.strata``) for the rank prior only: one fit's tilt
    curve for every positive, the spline prior refitted on each half's likelihoods."""
    logl = f._assemble(f.curves[f.best][2])
    tot = float(units.w.sum())
    vals = {s: 0.0 for s in METRICS}
    for rows in pf.strata(units) or [np.arange(len(units.w))]:
        v = tm.spline_values(_Half(f, rows), logl[rows], {s: f.cell_metric(spec)[rows] for s, spec in SPECS.items()})
        for s in METRICS:
            vals[s] += float(units.w[rows].sum()) / tot * v[s]
    return vals


def run_one(units: pf.Units, cov: dict, r_true: np.ndarray) -> dict:
    edges = pf.rank_edges(int(units.n.max()))
    t0 = time.time()
    f = pf.PopularityFit(units, edges, COUNT[0])
    out = {"t_base": time.time() - t0, "a": {s: f.estimate(spec)[0] for s, spec in SPECS.items()},
           "a_tp": true_value(f, r_true), "a_key": list(f.beta_of())}
    for name, k in SPLITS:
        if name == "prior":  # the default's halves (pos2), the rank prior refitted per half at one fit's tilt
            out[f"{name}{k}"] = prior_only(f, units)
            continue
        if name == "cross":  # pos x hist, each at its median
            lab = sum((cov[c] > np.median(cov[c])).astype(np.int64) * (2 ** i) for i, c in enumerate(("pos", "hist")))
        else:
            x = cov[name]
            cuts = np.quantile(x, np.arange(1, k) / k)
            lab = np.searchsorted(cuts, x, side="right")
        t1 = time.time()
        vals = {s: 0.0 for s in METRICS}
        tps = {s: 0.0 for s in METRICS}
        keys = []
        tot = float(units.w.sum())
        for g in range(k):
            sel = lab == g
            fs = pf.PopularityFit(units.select(np.flatnonzero(sel)), edges, COUNT[0])
            share = float(units.w[sel].sum()) / tot
            tp = true_value(fs, r_true[sel])
            for s, spec in SPECS.items():
                vals[s] += share * fs.estimate(spec)[0]
                tps[s] += share * tp[s]
            keys.append(list(fs.beta_of()))
        out[f"{name}{k}"] = {**vals, "t": time.time() - t1, "keys": keys}
        out[f"{name}{k}_tp"] = tps
    return out


def drive(args) -> None:
    scores, test, exc, counts, n_u = pa.load(args.dataset)
    logc = torch.log(counts)
    hist = torch.where(exc >= 0, logc[exc.clamp_min(0)], torch.zeros(())).sum(1) / (exc >= 0).sum(1).clamp_min(1)
    cov_all = {"pos": logc[test.view(-1)].numpy(), "hist": hist.numpy()}
    done = set()
    if os.path.exists(args.out):
        for line in open(args.out):
            r = json.loads(line)
            done.add((r["recommender"], r["alpha"], r["m"], r["rep"]))
    for m in args.ms:
        for rep in args.reps:
            for alpha in args.alphas:
                for name, sc in scores.items():
                    if (name, alpha, m, rep) in done or (args.recs and name not in args.recs):
                        continue
                    exact = rsp.exact_ranks(sc, test, exc, count_other_positives=False).view(-1)
                    truth = {s: float(metric_values(s, exact, n_u).double().mean()) for s in METRICS}
                    g = torch.Generator().manual_seed(10_000 * rep + m)
                    pop = rsp.sampled_ranks(sc, test, rsp.SamplingDesign(m, popularity=counts ** alpha),
                                            exclude=exc, generator=g)
                    valid = (pop.ranks > 0).view(-1)
                    units = popularity_draws(pop).units
                    r_true = np.ceil(exact[valid].double().numpy()).astype(np.int64)
                    cov = {k: v[valid.numpy()] for k, v in cov_all.items()}
                    if args.time:  # the estimator end to end: both metrics and the interval, fits not cached
                        key, (a, b) = ("strata", ("none", "positive")) if args.time == "strata" \
                            else ("count_term", ("off", "on"))
                        times = {}
                        for how in (a, b, a, b):  # alternating, the second pair kept
                            fresh = copy.copy(pop)  # a copy keeps none of pop's units, nor the fits they keep
                            t0 = time.perf_counter()
                            for s in METRICS:
                                rsp.estimate(s, fresh, rsp.registry.PlFit(**{key: how})).interval(0.95)
                            times[how] = time.perf_counter() - t0
                        print(f"{args.dataset} {name} a={alpha} m={m} rep={rep} n_pos={len(units.w)}: HR@10 + NDCG@10 "
                              f"{key}={a} {times[a]:.2f} s, {key}={b} {times[b]:.2f} s", flush=True)
                        continue
                    r = run_one(units, cov, r_true)
                    r.update(dataset=args.dataset, recommender=name, alpha=alpha, m=m, rep=rep, truth=truth)
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps(r) + "\n")
                    print(f"{args.dataset} {name} a={alpha} m={m} rep={rep} base {r['t_base']:.1f}s | "
                          + " ".join(f"{s} a {r['a'][s] / truth[s] - 1:+.3f} " + " ".join(
                              f"{n}{k} {r[f'{n}{k}'][s] / truth[s] - 1:+.3f}" for n, k in SPLITS) for s in METRICS),
                          flush=True)


RULES = ("a",) + tuple(f"{n}{k}" for n, k in SPLITS)


def summarise(paths: list[str]) -> None:
    rows = [json.loads(line) for p in paths for line in open(p)]
    cells = sorted({(r["dataset"], r["alpha"], r["m"]) for r in rows}, key=lambda k: (k[0], -k[2], -k[1]))
    goal = defaultdict(lambda: [0, 0])
    for suffix in ("", "_tp"):
        print(f"\n## values{' under the true prior' if suffix else ''}")
        for ds, alpha, m in cells:
            sel = [r for r in rows if (r["dataset"], r["alpha"], r["m"]) == (ds, alpha, m)]
            recs = [x for x in tc.RECS if any(r["recommender"] == x for r in sel)]
            print(f"\n### {ds} alpha={alpha} m={m} reps={sorted({r['rep'] for r in sel})}")
            print("| rule | " + " | ".join(f"{s} worst (ratio) | bias " + " ".join(tc.SHORT[x] for x in recs)
                                          for s in METRICS) + " |")
            for rule in RULES:
                if any(rule + suffix not in r for r in sel):  # prior2 has no true-prior value
                    continue
                cols = []
                for k, s in enumerate(METRICS):
                    errs = {x: [r[rule + suffix][s] / r["truth"][s] - 1 for r in sel if r["recommender"] == x]
                            for x in recs}
                    worst = max(np.mean(np.abs(errs[x])) for x in recs)
                    ref = tc.REF[(ds, m)][k]
                    cols.append(f"{worst:.3f} ({worst / ref:.2f}) | "
                                + " ".join(f"{np.mean(errs[x]):+.3f}" for x in recs))
                    goal[(suffix, rule)][0] += worst / ref <= 1.5
                    goal[(suffix, rule)][1] += 1
                print(f"| {rule} | " + " | ".join(cols) + " |")
    for suffix in ("", "_tp"):
        print(f"goal{suffix}: " + ", ".join(f"{rule} {goal[(suffix, rule)][0]}/{goal[(suffix, rule)][1]}"
                                            for rule in RULES))


def _extra(ap) -> None:
    ap.add_argument("--splits", default="pos2,pos3,hist2,hist3",
                    help="comma-separated covariate and strata count: pos2, hist3, cross4 (pos x hist), prior2 (the "
                         "default's halves for the rank prior only, one tilt curve)")
    ap.add_argument("--count", type=int, default=0, help="the count term up to this rank (0: off, the default; "
                    "32: pl_fit's count_term='on')")
    ap.add_argument("--time", nargs="?", const="strata", default=None, choices=("strata", "count"),
                    help="time pl_fit end to end, strata none / positive (or count_term off / on with 'count'; no "
                         "--out rows written)")


def main() -> None:
    global RULES
    args = tc.parse_args(__doc__, _extra)
    SPLITS[:] = [(v.rstrip("0123456789"), int(v[len(v.rstrip("0123456789")):])) for v in args.splits.split(",")]
    RULES = ("a",) + tuple(f"{n}{k}" for n, k in SPLITS)
    COUNT[0] = args.count
    if args.summarise:
        summarise(args.summarise)
    else:
        drive(args)


if __name__ == "__main__":
    main()
