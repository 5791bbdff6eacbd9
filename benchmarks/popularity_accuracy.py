"""Popularity-sampled evaluation corrected, on real recommenders: relative error, coverage of
the 95% interval and median width of AUC, HR@10 and NDCG@10, next to uniform sampling at the same m.

The five recommenders of ``baselines.train_benchmark`` on ml-100k or ml-latest-small (leave-last-out); each held-out
item is ranked against m negatives drawn from the user's drawable items (not in its training row) by popularity,
q proportional to count^alpha (RecBole's ``popN``; counts over all phases, train and held-out, as RecBole counts
them, so every item has a weight > 0), by the plugin's own draw on the recommender's score matrix
(``sampled_ranks(scores, ..., SamplingDesign(m, popularity=counts ** alpha))``). The truth is each recommender's
exact metric over the same users (``baselines.held_out_ranks``' ranks). Rows per (alpha, m, metric):

* ``hh`` (AUC) and ``pl_fit`` (HR@10, NDCG@10) on the popularity draw: the corrected estimates;
* ``none`` on the popularity draw: the uncorrected popularity-sampled metric (its interval covers the sampled
  metric, not the full one);
* ``pl_fit rank_prior=em (before)``: pl_fit's value under the EM prior its tilt was chosen with, on the same fit
  (the default before the g-modelling prior), and ``pl_fit niche=hedge`` (the harmonic-mean hedge where
  the niche test rejects);
* ``uniform`` at the same m, ``estimate(metric, sampled)`` with the default estimator (``auto``: gmod where the
  design resolves the top, mes elsewhere). (On the popularity draw ``auto`` runs exactly the corrected rows' methods:
  ``registry.AUTO_CHOICES["popularity"]``.)

Columns: mean |relative error| and mean relative error (bias) over recommenders and repeats, the worst recommender's
mean |relative error|, coverage of ``interval(0.95)`` (share of recommender x repeat cells whose interval holds the
exact metric), median interval width relative to the exact metric. A second table gives the 1.5x ratio goal per
cell (worst recommender against ``auto`` on uniform draws) before / after / hedge.

    OMP_NUM_THREADS=1 python benchmarks/popularity_accuracy.py --dataset ml-100k --repeats 20
    OMP_NUM_THREADS=1 python benchmarks/popularity_accuracy.py --dataset ml-latest-small --repeats 20 --out x.json
    OMP_NUM_THREADS=1 python benchmarks/popularity_accuracy.py --dataset ml-100k --repeats 10 --count-term on
    OMP_NUM_THREADS=1 python benchmarks/popularity_accuracy.py --dataset ml-100k --repeats 10 --strata none
    python benchmarks/popularity_accuracy.py --repeats 0 --merge a.json b.json   # summarise earlier runs

Sharded over processes (each trains the five recommenders once, then runs its repeats; seeds depend on the repeat
index only, so shards merge into the same rows as one run): ``--first-repeat F --repeats R --out shard.json`` per
process, then ``--repeats 0 --merge shard*.json``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import reco_sampled_plugin as rsp  # noqa: E402
from reco_sampled_plugin import baselines, datasets, metric_values  # noqa: E402

METRICS = ("auc", "hit@10", "ndcg@10")
CORRECTED = {"auc": "hh", "hit@10": "pl_fit", "ndcg@10": "pl_fit"}


def load(dataset: str, seed: int = 0):
    """(scores per recommender (U x n float64), held-out items (U, 1), training items (U, E) padded with -1,
    all-phase item counts (n,), candidates per user (U,))."""
    split = datasets.load_ml100k() if dataset == "ml-100k" else datasets.load_ml_latest_small()
    models = baselines.train_benchmark(split.train, seed=seed)
    users = split.test_users
    test = torch.from_numpy(split.test_items[users]).view(-1, 1)
    train = split.train[users]
    lens = np.diff(train.indptr)
    exc = np.full((len(users), int(lens.max())), -1, dtype=np.int64)
    col = np.arange(int(lens.max()))[None, :] < lens[:, None]
    exc[col] = train.indices
    counts = np.asarray(split.train.sum(axis=0), dtype=np.float64).reshape(-1)
    np.add.at(counts, split.test_items[users], 1.0)  # all phases: train and held-out (RecBole's counts)
    scores = {name: torch.cat([m.score(users[i:i + 256]).double() for i in range(0, len(users), 256)])
              for name, m in models.items()}
    n_u = torch.from_numpy(split.n_items - lens)
    return scores, test, torch.from_numpy(exc), torch.from_numpy(counts), n_u


#: pl_fit's options on every row of this run (``--strata``)
PL_OPTIONS: dict = {}


def em_prior(metric: str, sampled) -> dict:
    """pl_fit under ``rank_prior="em"`` (the default before the g-modelling prior) on the same fit: its value and
    interval."""
    e = rsp.estimate(metric, sampled, rsp.registry.PlFit(rank_prior="em", **PL_OPTIONS))
    lo, hi = e.interval(0.95)
    return {"value": e.value, "lo": lo, "hi": hi}


def run(dataset: str, repeats: int, alphas, ms, first: int = 0, out: str | None = None) -> list[dict]:
    """Every row of the module docstring; repeats outermost (all recommenders and settings of a repeat, then the
    next), the rows so far written to ``out`` after each repeat, so a run cut short leaves whole repeats."""
    scores, test, exc, counts, n_u = load(dataset)
    truths = {}
    for name, sc in scores.items():
        exact = rsp.exact_ranks(sc, test, exc, count_other_positives=False).view(-1)
        truths[name] = {s: float(metric_values(s, exact, n_u).double().mean()) for s in METRICS}
    rows = []
    for rep in range(first, first + repeats):
        for name, sc in scores.items():
            truth = truths[name]
            for alpha in alphas:
                for m in ms:
                    t0 = time.time()
                    g = torch.Generator().manual_seed(10_000 * rep + m)
                    pop = rsp.sampled_ranks(sc, test, rsp.SamplingDesign(m, popularity=counts ** alpha), exclude=exc,
                                            generator=g)
                    uni = rsp.sampled_ranks(sc, test, rsp.SamplingDesign(m), exclude=exc, generator=g)
                    for s in METRICS:
                        for label, sampled, method in (("corrected", pop, CORRECTED[s]), ("none", pop, "none"),
                                                       ("uniform", uni, rsp.registry.DEFAULT_ESTIMATOR)):
                            if label == "uniform" and alpha != alphas[0]:
                                continue  # the uniform draw does not depend on alpha
                            e = rsp.estimate(
                                s,
                                sampled,
                                rsp.registry.method_class(method)(**PL_OPTIONS if method == "pl_fit" else {}),
                            )
                            lo, hi = e.interval(0.95)
                            row = {"dataset": dataset, "recommender": name, "alpha": alpha, "m": m, "rep": rep,
                                   "metric": s, "label": label, "method": method, "truth": truth[s],
                                   "value": e.value, "lo": lo, "hi": hi, "flags": list(e.flags)}
                            rows.append(row)
                            if method == "pl_fit":
                                row.update(beta=e.details["beta"], niche_top=e.details["niche_top"],
                                           niche_lr=e.details["niche_lr"])
                                rows.append({**row, "label": "em", **em_prior(s, sampled)})
                                h = rsp.estimate(
                                    s,
                                    sampled,
                                    rsp.registry.method_class(method)(niche="hedge", **PL_OPTIONS),
                                )  # same fit
                                rows.append({**row, "label": "hedge", "value": h.value,
                                             "lo": h.interval(0.95)[0], "hi": h.interval(0.95)[1]})
                    print(f"{dataset} {name} alpha={alpha} m={m} rep={rep} {time.time() - t0:.1f}s", flush=True)
        if out:
            with open(out, "w") as fh:
                json.dump(rows, fh)
    return rows


def summarise(rows: list[dict]) -> str:
    """The markdown table of the module docstring."""
    keys = sorted({(r["dataset"], r["metric"], r["label"], r["alpha"] if r["label"] != "uniform" else None, r["m"])
                   for r in rows}, key=lambda k: (k[0], METRICS.index(k[1]), k[4], str(k[3]), k[2]))
    out = ["| data | metric | m | alpha | estimate | mean abs rel err | rel bias | worst rec. | coverage | median rel width |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for ds, s, label, alpha, m in keys:
        sel = [r for r in rows if (r["dataset"], r["metric"], r["label"], r["m"]) == (ds, s, label, m)
               and (label == "uniform" or r["alpha"] == alpha)]
        v = np.array([[r["value"], r["truth"], r["lo"], r["hi"]] for r in sel])
        rel = v[:, 0] / v[:, 1] - 1.0
        cov = np.mean((v[:, 2] <= v[:, 1]) & (v[:, 1] <= v[:, 3]))
        width = np.median((v[:, 3] - v[:, 2]) / v[:, 1])
        recs = sorted({r["recommender"] for r in sel})
        worst = max(np.mean([abs(r["value"] / r["truth"] - 1) for r in sel if r["recommender"] == x]) for x in recs)
        name = {"corrected": sel[0]["method"], "none": "none (uncorrected)", "uniform": f"uniform, {sel[0]['method']}",
                "em": "pl_fit rank_prior=em (before)", "constrained": "pl_fit niche=constrained",
                "hedge": "pl_fit niche=hedge"}[label]
        out.append(f"| {ds} | {s} | {m} | {alpha if alpha is not None else '-'} | {name} | {np.mean(np.abs(rel)):.3f} | "
                   f"{np.mean(rel):+.3f} | {worst:.3f} | {cov:.2f} | {width:.3f} |")
    return "\n".join(out)


def ratio_table(rows: list[dict]) -> str:
    """The 1.5x ratio goal per (data, metric, m, alpha): the worst recommender's mean |relative error| of pl_fit
    (after: the default, the g-modelling prior at the constrained fit's tilt, the interval over both branches;
    before: ``rank_prior="em"``, the default before the g-modelling prior; hedge: ``niche="hedge"``) over that of the
    default estimator on uniform draws at the same m, with coverage and the share of fits whose niche test rejected."""
    def worst(sel: list[dict]) -> float:
        recs = sorted({r["recommender"] for r in sel})
        return max(float(np.mean([abs(r["value"] / r["truth"] - 1) for r in sel if r["recommender"] == x]))
                   for x in recs)

    def cover(sel: list[dict]) -> float:
        return float(np.mean([r["lo"] <= r["truth"] <= r["hi"] for r in sel]))

    out = ["| data | metric | m | alpha | uniform worst | before worst | before ratio | before cov. | after worst | "
           "after ratio | after cov. | hedge worst | hedge ratio | hedge cov. | niche share |", "| --- " * 15 + "|"]
    keys = sorted({(r["dataset"], r["metric"], r["m"], r["alpha"]) for r in rows if r["label"] == "corrected"
                   and r["method"] == "pl_fit"}, key=lambda k: (k[0], METRICS.index(k[1]), k[2], k[3]))
    for ds, s, m, alpha in keys:
        pick = lambda label, a=alpha: [r for r in rows if (r["dataset"], r["metric"], r["m"], r["label"]) ==  # noqa
                                       (ds, s, m, label) and (a is None or r["alpha"] == a)]
        uni, before, after, hedge = (worst(pick("uniform", None)), pick("em") or pick("constrained"),
                                     pick("corrected"), pick("hedge"))
        wb, wa, wh = worst(before), worst(after), worst(hedge)
        niche = np.mean([bool(r.get("niche_top")) for r in after])
        out.append(f"| {ds} | {s} | {m} | {alpha} | {uni:.3f} | {wb:.3f} | {wb / uni:.2f} | {cover(before):.2f} | "
                   f"{wa:.3f} | {wa / uni:.2f} | {cover(after):.2f} | {wh:.3f} | {wh / uni:.2f} | "
                   f"{cover(hedge):.2f} | {niche:.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="ml-100k", choices=("ml-100k", "ml-latest-small"))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--ms", type=int, nargs="+", default=[100, 500])
    ap.add_argument("--first-repeat", type=int, default=0, help="seed index of the first repeat (to extend a run)")
    ap.add_argument("--out", default=None, help="write every row as JSON here")
    ap.add_argument("--merge", nargs="*", default=[], help="JSON files of earlier runs to summarise with this one")
    ap.add_argument("--count-term", default=None, choices=("off", "on"),
                    help="pl_fit's count term on every row (default: the estimator's default)")
    ap.add_argument("--strata", default=None, choices=("positive", "none"),
                    help="pl_fit's strata on every row (default: the estimator's default, positive)")
    args = ap.parse_args()
    if args.strata is not None:
        PL_OPTIONS["strata"] = args.strata
    if args.count_term is not None:
        PL_OPTIONS["count_term"] = args.count_term
    rows = run(args.dataset, args.repeats, args.alphas, args.ms, args.first_repeat, args.out) \
        if args.repeats > 0 else []
    for path in args.merge:
        with open(path) as fh:
            rows += json.load(fh)
    print(summarise(rows))
    if any(r["label"] in ("em", "constrained") for r in rows):
        print()
        print(ratio_table(rows))


if __name__ == "__main__":
    main()
