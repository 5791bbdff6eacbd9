"""pl_fit's tilt curve beta(r) with three knots (docs/research-notes.md, "Richer tilt curves: measured, not adopted").

Today's curve runs linearly in log r from beta_top (r = 1) to beta_deep (r = 200). Here: knots at r = 1, 30, 200,
piecewise linear in log r, constant beyond 200 (cells take the nearest BETAS value), fitted by coordinate ascent
over the grid on the three knot values, against today's two-knot constrained default. The draws are those of
``popularity_accuracy.py``'s ``load()`` (generator seed 10,000 x repeat + m). Per draw and count setting
(``_popularity_fit.COUNT_EXACT_RANK`` 0 / 32): the default fit (its per-beta tables are reused by every
three-knot curve), then

* (b) the unconstrained three-knot MLE: ascents from the best two-knot constrained and free curves (each as three
  knots, beta_30 interpolated and rounded to the grid), the better kept;
* (c) three knots with beta_1 >= beta_30 (the deep segment free);
* (d) at summary time: (b) where 2 (ll_b - ll_a) > ``NICHE_LR_CRITICAL``, else (a).

The values (spline prior) of HR@10 / NDCG@10 of (a), (b) and (c) and, with the prior replaced by the histogram of
the exact ranks on the fit's cells (the "true prior"), the composition model's own error. One JSON line per
(draw, count); ``--summarise`` prints the tables.

    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_tilt_curves.py --dataset ml-latest-small --out lsm.jsonl
    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_tilt_curves.py --dataset ml-100k --out m100k.jsonl
    python benchmarks/studies/popularity_tilt_curves.py --summarise lsm.jsonl m100k.jsonl
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/ (siblings)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/studies/
import popularity_accuracy as pa  # noqa: E402

import reco_sampled_plugin as rsp  # noqa: E402
from reco_sampled_plugin import _popularity_fit as pf, metric_values  # noqa: E402
from reco_sampled_plugin.metric_names import parse_metric  # noqa: E402
from reco_sampled_plugin.popularity import popularity_draws  # noqa: E402

KNOTS = np.log([1.0, 30.0, 200.0])
METRICS = ("hit@10", "ndcg@10")
SPECS = {s: parse_metric(s) for s in METRICS}
ROUNDS = 3


class Knot3:
    """Three-knot curves on a fitted PopularityFit ``f`` (its tables, EM and spline prior); keys ("k3", i1, i30,
    i200) are stored in f.curves so that f.estimate works on them."""

    def __init__(self, f: pf.PopularityFit) -> None:
        self.f = f
        self.lr = np.log(f.r_mid)
        self.by_idx: dict[bytes, tuple[float, np.ndarray, np.ndarray]] = {}
        self.n_em = 0

    def idx(self, t) -> np.ndarray:
        b = np.interp(self.lr, KNOTS, self.f.betas[list(t)])
        return np.abs(self.f.betas[None, :] - b[:, None]).argmin(1)

    def from_two(self, key) -> tuple[int, int, int]:
        bt, bd = self.f.betas[key[0]], self.f.betas[key[1]]
        b30 = bt + (bd - bt) * KNOTS[1] / KNOTS[2]
        return int(key[0]), int(np.abs(self.f.betas - b30).argmin()), int(key[1])

    def tri(self, t, start) -> float:
        key = ("k3",) + tuple(int(x) for x in t)
        if key not in self.f.curves:
            idx = self.idx(t)
            hit = self.by_idx.get(idx.tobytes())
            if hit is None:
                p, ll = pf._em(self.f._assemble(idx), self.f.units.w, self.f._base, start)
                self.n_em += 1
                hit = self.by_idx[idx.tobytes()] = (ll, p, idx)
            self.f.curves[key] = hit
        return self.f.curves[key][0]

    def ascent(self, t, constrained: bool):
        """Coordinate ascent over the three knot values (up to ROUNDS rounds) from ``t``; its own visited set."""
        nb = len(self.f.betas)
        ll = self.f.curves
        best = tuple(int(x) for x in t)
        self.tri(best, None)
        for _ in range(ROUNDS):
            prev = best
            for k in range(3):
                start = ll[("k3",) + best][1]
                for v in range(nb):
                    c = list(best)
                    c[k] = v
                    if constrained and c[0] < c[1]:
                        continue
                    self.tri(tuple(c), start)
                # best along this coordinate
                line = [tuple(best[:k]) + (v,) + tuple(best[k + 1:]) for v in range(nb)]
                line = [c for c in line if not (constrained and c[0] < c[1])]
                best = max(line, key=lambda c: ll[("k3",) + c][0])
            if best == prev:
                break
        return best


def run_one(units, count: int, prior_true: np.ndarray | None) -> dict:
    edges = pf.rank_edges(int(units.n.max()))
    t0 = time.time()
    f = pf.PopularityFit(units, edges, count)
    t_base = time.time() - t0
    out = {"count": count, "t_base": t_base}
    a = f.best_constrained
    t1 = time.time()
    k3 = Knot3(f)
    s_con = k3.from_two(a)
    s_free = k3.from_two(f.best_free)
    b1 = k3.ascent(s_con, constrained=False)
    b2 = k3.ascent(s_free, constrained=False) if s_free != s_con else b1
    b = max((b1, b2), key=lambda t: f.curves[("k3",) + t][0])
    c = k3.ascent(s_con, constrained=True)
    if s_free[0] >= s_free[1] and s_free != s_con:
        c2 = k3.ascent(s_free, constrained=True)
        c = max((c, c2), key=lambda t: f.curves[("k3",) + t][0])
    # the constrained optimum may also be the best of all curves tried (incl. the unconstrained ascents')
    cands = [k_ for k_ in f.curves if k_[0] == "k3" and k_[1] >= k_[2]]
    c = max(cands, key=lambda k_: f.curves[k_][0])[1:]
    cands = [k_ for k_ in f.curves if k_[0] == "k3"]
    b = max(cands, key=lambda k_: f.curves[k_][0])[1:]
    t_k3 = time.time() - t1
    keys = {"a": a, "b": ("k3",) + b, "c": ("k3",) + c, "f2": f.best_free}
    out.update(t_k3=t_k3, n_em=k3.n_em, n_k3=sum(1 for k_ in f.curves if k_[0] == "k3"),
               n_two=sum(1 for k_ in f.curves if k_[0] != "k3"), start_con=[float(f.betas[i]) for i in s_con],
               start_free=[float(f.betas[i]) for i in s_free], niche_lr=f.niche_lr)
    t2 = time.time()
    for name, key in keys.items():
        d = {"ll": f.curves[key][0],
             "betas": [float(f.betas[i]) for i in (key[1:] if key[0] == "k3" else key)]}
        for s, spec in SPECS.items():
            d[s] = f.estimate(spec, key)[0]
            if prior_true is not None:
                post = pf._rows_posterior(f._assemble(f.curves[key][2]), prior_true[None, :])
                d[s + "_tp"] = float(f.units.w @ (post * f.cell_metric(spec)).sum(1)) / float(f.units.w.sum())
        out[name] = d
    out["t_val"] = time.time() - t2
    return out


def parse_args(doc: str, extra: Callable[[argparse.ArgumentParser], None] | None = None):
    """The drivers' command line (this script's, ``popularity_tilt_mixture.py``'s and ``popularity_strata.py``'s;
    ``extra`` adds a driver's own arguments)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if extra is not None:
        extra(ap)
    ap.add_argument("--summarise", nargs="+", default=None, metavar="JSONL", help="print the tables of earlier runs")
    ap.add_argument("--dataset", default="ml-latest-small", choices=("ml-100k", "ml-latest-small"))
    ap.add_argument("--alphas", type=float, nargs="+", default=[1.0, 0.5])
    ap.add_argument("--ms", type=int, nargs="+", default=[500, 100])
    ap.add_argument("--reps", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--counts", type=int, nargs="+", default=[0, 32])
    ap.add_argument("--recs", nargs="*", default=None)
    ap.add_argument("--out", default=None, help="append one JSON line per (draw, count) here")
    args = ap.parse_args()
    if not args.summarise and args.out is None:
        ap.error("--out is required (or --summarise)")
    return args


def drive(args, run_one: Callable[[Any, int, np.ndarray], dict], describe: Callable[[dict, dict], str]) -> None:
    """Every (m, count, repeat, alpha, recommender) draw of ``args`` not yet in ``args.out``: the popularity draw
    (generator seed 10,000 x repeat + m), its units and the true prior (the histogram of the exact ranks on the
    fit's cells), ``run_one(units, count, true_prior)``'s record appended to ``args.out`` as a JSON line, and
    ``describe(record, truth)`` printed."""
    t0 = time.time()
    scores, test, exc, counts, n_u = pa.load(args.dataset)
    print(f"loaded {args.dataset} in {time.time() - t0:.0f}s", flush=True)
    if args.recs:
        scores = {k: v for k, v in scores.items() if k in args.recs}
    truths, exacts = {}, {}
    for name, sc in scores.items():
        exact = rsp.exact_ranks(sc, test, exc, count_other_positives=False).view(-1)
        exacts[name] = exact
        truths[name] = {s: float(metric_values(s, exact, n_u).double().mean()) for s in METRICS}
    done = set()
    if os.path.exists(args.out):
        for line in open(args.out):
            r = json.loads(line)
            done.add((r["recommender"], r["alpha"], r["m"], r["rep"], r["count"]))
    for m in args.ms:
        for c in args.counts:
            for rep in args.reps:
                for alpha in args.alphas:
                    for name, sc in scores.items():
                        if (name, alpha, m, rep, c) in done:
                            continue
                        g = torch.Generator().manual_seed(10_000 * rep + m)
                        pop = rsp.sampled_ranks(sc, test, rsp.SamplingDesign(m, popularity=counts ** alpha),
                                                exclude=exc, generator=g)
                        valid = (pop.ranks > 0).view(-1)
                        units = popularity_draws(pop).units
                        r_true = np.ceil(exacts[name][valid].double().numpy()).astype(np.int64)
                        assert len(r_true) == len(units.w)
                        edges = pf.rank_edges(int(units.n.max()))
                        cell = np.searchsorted(edges, r_true, side="left") - 1
                        prior = np.bincount(cell, weights=units.w, minlength=len(edges) - 1).astype(np.float64)
                        prior /= prior.sum()
                        r = run_one(units, c, prior)
                        r.update(dataset=args.dataset, recommender=name, alpha=alpha, m=m, rep=rep,
                                 truth=truths[name], n_units=int(len(units.w)))
                        with open(args.out, "a") as fh:
                            fh.write(json.dumps(r) + "\n")
                        print(f"{args.dataset} {name} a={alpha} m={m} rep={rep} count={c} base {r['t_base']:.1f}s "
                              + describe(r, truths[name]), flush=True)


def _describe(r: dict, tr: dict) -> str:
    return (f"k3 {r['t_k3']:.1f}s ({r['n_em']} EM) val {r['t_val']:.1f}s | a {r['a']['betas']} "
            f"b {r['b']['betas']} c {r['c']['betas']} LR {2 * (r['b']['ll'] - r['a']['ll']):.0f} | "
            + " ".join(f"{s} a {r['a'][s] / tr[s] - 1:+.3f} b {r['b'][s] / tr[s] - 1:+.3f} "
                       f"c {r['c'][s] / tr[s] - 1:+.3f}" for s in METRICS))


def main() -> None:
    args = parse_args(__doc__)
    if args.summarise:
        summarise(args.summarise)
    else:
        drive(args, run_one, _describe)


CRIT = pf.NICHE_LR_CRITICAL
RECS = ("iALS", "ItemKNN(q=3)", "ItemKNN(q=1,k'=10)", "Popularity", "EASE")
SHORT = {"iALS": "iALS", "ItemKNN(q=3)": "KNN3", "ItemKNN(q=1,k'=10)": "KNN1", "Popularity": "Pop", "EASE": "EASE"}
#: the worst recommender's mean |relative error| of the uniform default on uniform draws, as recorded when this study
#: ran (the default was ``mes`` then; today's reference, ``auto``: docs/popularity.md, "Measured: the default on real
#: recommenders")
REF = {("ml-100k", 100): (0.131, 0.168), ("ml-100k", 500): (0.087, 0.057),
       ("ml-latest-small", 100): (0.521, 0.600), ("ml-latest-small", 500): (0.298, 0.398)}
RULES = ("a", "b", "c", "d")


def lr(r: dict) -> float:
    return 2.0 * (r["b"]["ll"] - r["a"]["ll"])


def value(r: dict, rule: str, s: str, suffix: str = "") -> float:
    if rule == "d":
        rule = "b" if lr(r) > CRIT else "a"
    return r[rule][s + suffix]


def fmt_b(b) -> str:
    return "(" + ",".join(f"{x:g}" for x in b) + ")"


def summarise(paths: list[str]) -> None:
    """The tables of ``paths`` (JSON lines of this script): per cell and count setting, per value rule (a-d), the
    bias per recommender and the worst recommender's mean |relative error| (ratio over the uniform default's worst,
    ``REF``); the goal count; the fitted knots, LR and times; the true-prior table (alpha = 1, m = 500, repeat 0)."""
    rows = [json.loads(line) for p in paths for line in open(p)]
    cells = sorted({(r["dataset"], r["alpha"], r["m"]) for r in rows}, key=lambda k: (k[0], -k[2], -k[1]))
    goal = defaultdict(lambda: [0, 0])  # (count, rule) -> [met, cells]
    worst_tab = defaultdict(dict)  # (count, rule) -> {(ds, m, alpha, metric): ratio}
    for ds, alpha, m in cells:
        for count in (0, 32):
            sel = [r for r in rows if (r["dataset"], r["alpha"], r["m"], r["count"]) == (ds, alpha, m, count)]
            if not sel:
                continue
            reps = sorted({r["rep"] for r in sel})
            recs_here = [x for x in RECS if any(r["recommender"] == x for r in sel)]
            print(f"\n### {ds} alpha={alpha} m={m} count={count} reps={reps} recs={len(recs_here)}/5")
            print("| rule | HR worst (ratio) | HR bias " + " ".join(SHORT[x] for x in recs_here)
                  + " | NDCG worst (ratio) | NDCG bias |")
            print("| --- | --- | --- | --- | --- |")
            for rule in RULES:
                cols = []
                for k, s in enumerate(METRICS):
                    errs = {x: [value(r, rule, s) / r["truth"][s] - 1 for r in sel if r["recommender"] == x]
                            for x in recs_here}
                    bias = [np.mean(errs[x]) for x in recs_here]
                    worst = max(np.mean(np.abs(errs[x])) for x in recs_here)
                    ref = REF[(ds, m)][k]
                    cols.append(f"{worst:.3f} ({worst / ref:.2f}) | " + " ".join(f"{b:+.3f}" for b in bias))
                    if len(recs_here) == 5:
                        goal[(count, rule)][0] += worst / ref <= 1.5
                        goal[(count, rule)][1] += 1
                        worst_tab[(count, rule)][(ds, m, alpha, s)] = worst / ref
                print(f"| {rule} | " + " | ".join(cols) + " |")
            print("\nfits per rep: a = two-knot constrained (top, deep); f2 = two-knot free; b = 3-knot MLE "
                  "(b1, b30, b200); c = 3-knot b1>=b30; LR = 2(ll_b - ll_a) [* > 9.55]; LRc = 2(ll_c - ll_a); "
                  "time: base fit + 3-knot ascent (EMs) -> multiplier")
            for x in recs_here:
                parts = []
                for r in sorted([r for r in sel if r["recommender"] == x], key=lambda r: r["rep"]):
                    mult = (r["t_base"] + r["t_k3"]) / r["t_base"]
                    parts.append(f"r{r['rep']}: a{fmt_b(r['a']['betas'])} f2{fmt_b(r['f2']['betas'])} "
                                 f"b{fmt_b(r['b']['betas'])} c{fmt_b(r['c']['betas'])} LR {lr(r):.0f}"
                                 f"{'*' if lr(r) > CRIT else ''} LRc {2 * (r['c']['ll'] - r['a']['ll']):.0f} | "
                                 f"{r['t_base']:.1f}s+{r['t_k3']:.1f}s ({r['n_em']}) x{mult:.1f}")
                print(f"  {SHORT[x]}: " + " ;; ".join(parts))
    print("\n## goal (worst <= 1.5 x uniform worst) over the (data, metric, m, alpha) cells present")
    print("| count | rule | cells met | ratios (100k m500 a1 HR/NDCG, a.5; m100 ...; lsm ...) |")
    print("| --- | --- | --- | --- |")
    for count in (0, 32):
        for rule in RULES:
            g = goal.get((count, rule))
            if not g:
                continue
            t = worst_tab[(count, rule)]
            keys = sorted(t, key=lambda k: (k[0], -k[1], -k[2], k[3]))
            rat = " ".join(f"{t[k]:.2f}" for k in keys)
            mx = max(t.values())
            print(f"| {count} | {rule} | {g[0]} / {g[1]} (max ratio {mx:.2f}) | {rat} |")
    # time multiplier overall
    mult = defaultdict(list)
    for r in rows:
        mult[(r["dataset"], r["count"])].append((r["t_base"] + r["t_k3"]) / r["t_base"])
    print("\nfit-time multiplier (base + 3-knot ascent over base), median [min, max]: " + "; ".join(
        f"{k[0]} count {k[1]}: {np.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]" for k, v in sorted(mult.items())))
    # true-prior table
    print("\n## true prior (histogram of exact ranks on the fit's cells) vs spline prior, alpha=1, m=500, rep 0")
    print("| data | count | rec | a knots | b knots | HR a: true-prior / spline | HR b: true-prior / spline "
          "| NDCG a: true-prior / spline | NDCG b: true-prior / spline | LR |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted([r for r in rows if r["alpha"] == 1.0 and r["m"] == 500 and r["rep"] == 0],
                    key=lambda r: (r["dataset"], r["count"], RECS.index(r["recommender"]))):
        t = r["truth"]
        cols = []
        for s in METRICS:
            for rule in ("a", "b"):
                cols.append(f"{r[rule][s + '_tp'] / t[s] - 1:+.3f} / {r[rule][s] / t[s] - 1:+.3f}")
        print(f"| {r['dataset']} | {r['count']} | {SHORT[r['recommender']]} | {fmt_b(r['a']['betas'])} | "
              f"{fmt_b(r['b']['betas'])} | " + " | ".join(cols) + f" | {lr(r):.0f} |")


if __name__ == "__main__":
    main()
