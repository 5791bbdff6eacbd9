"""What no estimator can do under popularity sampling: Le Cam's two-point bound against the 1.5x accuracy goal.

The goal asks the worst recommender's mean |relative error| of HR@10 / NDCG@10 on popularity-sampled negatives to be
at most 1.5x that of the default estimator on uniform draws at the same m. ``popularity_oracle.py`` shows that the
draws carry enough *given each user's composition* (which items of which popularity sit above the positive): the
Bayes oracle, which knows it, is as accurate as the uniform oracle. This script asks whether an estimator can learn
that composition from the draws, with the argument of ``gmod_oracle.py --two-point`` (docs/research-notes.md, "What no
estimator can do").

**The worlds.** A draw shows an item and whether it beats the positive; items of equal weight are exchangeable (a
world is defined up to which items of one weight sit where; relabelling them changes no metric), so what a
positive's m draws can tell about its world is, per weight class c, how many of the class's N_c drawable items lie
above it (m1_c): each draw falls in class c and beats with probability m1_c q_c, misses with (N_c - m1_c) q_c, q_c
the per-item probability (count^alpha normalised over the user's drawable items, RecBole's ``popN`` law with its
redraw of positives). A second world moves some positives: up by j ranks (the j least popular items above the
positive put below it) or down by j (j of the least popular items below put above it; never a class's last item
below, whose move would make the worlds distinguishable for sure). Its cost, the KL between the two worlds' laws of
the positive's m draws, is m times a sum over the touched classes of

    up, removing k of m1 (KL(world 2 || world 1)):  q_c [(m1 - k) log((m1 - k) / m1) + (N - m1 + k) log((N - m1 + k) / (N - m1))]
    down, adding k (KL(world 1 || world 2)):        q_c [m1 log(m1 / (m1 + k)) + (N - m1) log((N - m1) / (N - m1 - k))]

about m q_c per moved item: the expected number of draws that would have hit it. Popularity sampling draws niche
items rarely, so the niche items around a positive move almost for free. :func:`gmod_oracle.best_prefix` picks the
moves (best metric change per nat first, one direction, each user once) that maximise Le Cam's bound: every estimator
has a mean absolute error of at least |theta_1 - theta_2| (1 - TV) / 2 in one of the two worlds.

**Against the goal.** With W_1 the uniform default's worst relative error over the five recommenders (first world)
and W_2 = max(W_1, U(X')) (the second world: the recommender X replaced by its twin X', whose uniform error U(X')
is measured here on uniform draws of X''s ranking), an estimator meeting the goal in both worlds would have
E_1|T - theta_1| + E_2|T - theta_2| <= 1.5 (W_1 theta_1 + W_2 theta_2). Where Le Cam's left side exceeds that, i.e.
``ratio`` = |theta_1 - theta_2| (1 - TV) / (1.5 (W_1 theta_1 + W_2 theta_2)) > 1, no estimator that sees the draws
can meet the goal for recommenders of that kind.

Next to it, ``uniform draws' bound``: the same bound for uniform draws of the same m on the first world
(``gmod_oracle.two_point_bound``: moves of up to 10 ranks), what the uniform design allows by the same argument.
Second worlds keep the metric within +-50% of the first's (``MAX_GAP``). ``--min-uniform-kl X``: only moves that
uniform draws of the same m see clearly (KL >= X nats under them), so that the uniform default can follow the
second world (docs/research-notes.md, "What the draws and the design allow").

``--estimators``: ``pl_fit`` (the corrected default) on popularity draws of both worlds too, its mean |relative
error| in each (the second world's score matrix: the moved items' scores set just past the positive's; the exact
ranks are checked to be the intended ones).

    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_two_point.py --dataset ml-100k --repeats 10 [--estimators]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.special import xlogy  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/ (siblings)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/studies/

import reco_sampled_plugin as rsp  # noqa: E402
from reco_sampled_plugin import metric_values  # noqa: E402

from gmod_oracle import best_prefix, kl_bernoulli, two_point_bound  # noqa: E402
from popularity_accuracy import load  # noqa: E402
from popularity_oracle import ordered_world  # noqa: E402,F401 (re-exported for the tests)

METRICS = ("hit@10", "ndcg@10")
GOAL = 1.5  # the accuracy goal: the worst recommender's error at most 1.5x the uniform default's
#: a second world of the same kind: its metric within +-50% of the first's (a world with HR@10 = 0 would make every
#: relative error in it infinite)
MAX_GAP = 0.5


def kl_up(m1: np.ndarray, big_n: np.ndarray, k: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Per draw, KL(world 2 || world 1) of one weight class (per-item probability ``q``, ``big_n`` drawable items,
    ``m1`` above the positive) when ``k`` of its items above are put below the positive (module docstring)."""
    rest = big_n - m1
    with np.errstate(divide="ignore", invalid="ignore"):
        out = q * (xlogy(m1 - k, (m1 - k) / m1) + (rest + k) * np.log((rest + k) / rest))
    return np.where(k == 0, 0.0, np.where(rest > 0, out, np.inf))


def kl_down(m1: np.ndarray, big_n: np.ndarray, k: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Per draw, KL(world 1 || world 2) of one weight class when ``k`` of its items below the positive are put above
    it (finite while k < big_n - m1: a class is never emptied below)."""
    rest = big_n - m1
    with np.errstate(divide="ignore", invalid="ignore"):
        out = q * (xlogy(m1, m1 / (m1 + k)) + rest * np.log(rest / (rest - k)))
    return np.where(k == 0, 0.0, np.where(rest > k, out, np.inf))


def user_moves(w: np.ndarray, r: int, reach: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One user's candidate moves. ``w``: the weights of its drawable items in ranking order (the positive's exact
    rank ``r``: the first r - 1 beat it). Returns, for "up" and "down", (positions in ``w`` of the items to move, in
    the order they are moved; KL per draw of moving the first j of them, j = 1..len)."""
    q = w / w.sum()
    above = np.zeros(len(w), dtype=bool)
    above[: r - 1] = True
    vals, cls, big_n = np.unique(w, return_inverse=True, return_counts=True)
    m1 = np.bincount(cls[above], minlength=len(vals))
    qc = vals / w.sum()
    out = {}
    for kind in ("up", "down"):
        if kind == "up":  # items above whose class has members below: removing them keeps the worlds comparable
            pos = np.flatnonzero(above & (big_n - m1 > 0)[cls])
        else:  # items below, never the last one of a class
            pos = np.flatnonzero(~above)
            last = len(pos) - 1 - np.unique(cls[pos][::-1], return_index=True)[1]  # each class's last item below
            pos = np.delete(pos, last)
        pos = pos[np.argsort(q[pos], kind="stable")][:reach]  # the least popular first
        if not len(pos):
            out[kind] = (pos, np.zeros(0))
            continue
        c = cls[pos]
        start = np.r_[True, c[1:] != c[:-1]]  # runs of one class (sorted by weight: contiguous)
        run = np.cumsum(start) - 1
        k = np.arange(len(pos)) - np.flatnonzero(start)[run] + 1  # the item's place in its run
        f = kl_up if kind == "up" else kl_down
        part = f(m1[c], big_n[c], k, qc[c])
        ends = np.r_[np.flatnonzero(start)[1:] - 1, len(pos) - 1]
        done = np.r_[0.0, np.cumsum(part[ends])][run]  # the classes moved whole before this run
        out[kind] = (pos, done + part)
    return out


def second_world(sc: torch.Tensor, test: torch.Tensor, order: torch.Tensor, dmask: torch.Tensor,
                 plan: dict[int, tuple[str, np.ndarray]]) -> torch.Tensor:
    """The second world's score matrix: per moved user, its moved items' scores set just past the positive's
    (below it for "up", above it for "down"); nothing else changes."""
    sc2 = sc.clone()
    for u, (kind, pos) in plan.items():
        items = order[u][dmask[u]][torch.from_numpy(pos)]
        s = sc[u, test[u, 0]]
        sc2[u, items] = torch.nextafter(s, torch.tensor(-torch.inf if kind == "up" else torch.inf, dtype=s.dtype))
    return sc2


def errors(sc: torch.Tensor, test, exc, counts, n_u, alpha: float, m: int, repeats: int, estimators: bool) -> dict:
    """Mean |relative error| per metric of the uniform default (``auto``) on uniform draws and, with ``estimators``,
    of ``pl_fit`` on popularity draws (alpha), against this world's exact metric."""
    exact = rsp.exact_ranks(sc, test, exc, count_other_positives=False).view(-1)
    truth = {s: float(metric_values(s, exact, n_u).double().mean()) for s in METRICS}
    out: dict = {s: {"truth": truth[s], "uniform": [], "pl_fit": []} for s in METRICS}
    for rep in range(repeats):
        g = torch.Generator().manual_seed(20_000 + 10_000 * rep + m)
        uni = rsp.sampled_ranks(sc, test, rsp.SamplingDesign(m), exclude=exc, generator=g)
        pop = rsp.sampled_ranks(sc, test, rsp.SamplingDesign(m, popularity=counts ** alpha), exclude=exc,
                                generator=g) if estimators else None
        for s in METRICS:
            out[s]["uniform"].append(abs(rsp.estimate(s, uni, method=rsp.registry.DEFAULT_ESTIMATOR).value / truth[s] - 1))
            if pop is not None:
                out[s]["pl_fit"].append(abs(rsp.estimate(s, pop, method="pl_fit").value / truth[s] - 1))
    return {s: {k: (float(np.mean(v)) if isinstance(v, list) and v else v) for k, v in d.items()}
            for s, d in out.items()}


def run(dataset: str, repeats: int, alphas, ms, reach: int, estimators: bool,
        min_uniform_kl: float = 0.0) -> list[dict]:
    scores, test, exc, counts, n_u = load(dataset)
    n_np = n_u.numpy().astype(np.float64)
    rows = []
    first: dict = {}  # (name, m) -> the first world's errors (alpha matters to pl_fit only)
    for name, sc in scores.items():
        t0 = time.time()
        exact = rsp.exact_ranks(sc, test, exc, count_other_positives=False).view(-1)
        r = exact.numpy().astype(np.int64)
        order, dmask = ordered_world(sc, test, exc, exact)
        pos_score = sc.gather(1, test)
        ties = ((sc == pos_score).sum(1) > 1).numpy()  # a positive tied with another item: left where it is
        base = {s: metric_values(s, exact, n_u).double().numpy() for s in METRICS}
        theta = {s: float(base[s].mean()) for s in METRICS}
        for alpha in alphas:
            w_all = (counts ** alpha).numpy()
            cand = {}
            for u in np.flatnonzero(~ties):
                w = w_all[order[u][dmask[u]].numpy()]
                cand[u] = user_moves(w, int(r[u]), reach)
            for m in ms:
                for s in METRICS:
                    best = None
                    for kind in ("up", "down"):
                        for raises in (True, False):
                            users, gain, cost, js = [], [], [], []
                            for u, mv in cand.items():
                                kl = mv[kind][1]
                                if not len(kl):
                                    continue
                                j = np.arange(1, len(kl) + 1)
                                dest = r[u] - j if kind == "up" else r[u] + j
                                ok = (dest >= 1) & (dest <= n_np[u])
                                val = metric_values(s, torch.from_numpy(dest[ok]), int(n_np[u])).double().numpy()
                                delta = (val - base[s][u]) / len(r)
                                keep = (delta > 0) if raises else (delta < 0)
                                if min_uniform_kl > 0:  # only moves that uniform draws of the same m see clearly
                                    p1 = (r[u] - 1) / (n_np[u] - 1)
                                    keep &= m * kl_bernoulli(np.full(int(ok.sum()), p1),
                                                              (dest[ok] - 1) / (n_np[u] - 1)) >= min_uniform_kl
                                users.append(np.full(int(keep.sum()), u))
                                gain.append(np.abs(delta[keep]))
                                cost.append(m * kl[ok][keep])
                                js.append(j[ok][keep])
                            if not users:
                                continue
                            u_, g_, c_, j_ = (np.concatenate(x) for x in (users, gain, cost, js))
                            pick = best_prefix(u_, g_, c_, theta[s], raises, max_gap=MAX_GAP)
                            if pick is not None and (best is None or pick.bound > best[0].bound):
                                best = (pick, kind, u_[pick.moves], j_[pick.moves])
                    if best is None:
                        continue
                    pick, kind, mu, mj = best
                    plan = {int(u): (kind, cand[int(u)][kind][0][: int(j)]) for u, j in zip(mu, mj)}
                    sc2 = second_world(sc, test, order, dmask, plan)
                    r2 = rsp.exact_ranks(sc2, test, exc, count_other_positives=False).view(-1).numpy()
                    want = r.copy()
                    want[mu] = r[mu] - mj if kind == "up" else r[mu] + mj
                    assert (r2 == want).all(), "the second world's exact ranks are not the intended ones"
                    key = (name, alpha if estimators else None, m)
                    if key not in first:
                        first[key] = errors(sc, test, exc, counts, n_u, alpha, m, repeats, estimators)
                    e1 = first[key][s]
                    e2 = errors(sc2, test, exc, counts, n_u, alpha, m, repeats, estimators)[s]
                    rows.append({"dataset": dataset, "recommender": name, "alpha": alpha, "m": m, "metric": s,
                                 "uniform_bound": two_point_bound(r, n_np, s, str(m))[0],
                                 "kind": kind, "moved": int(len(mu)), "items_moved": int(mj.sum()),
                                 "kl": pick.kl, "tv": pick.tv, "bound": pick.bound,
                                 "theta1": e1["truth"], "theta2": e2["truth"], "gap": pick.gap,
                                 "uniform1": e1["uniform"], "uniform2": e2["uniform"],
                                 "pl_fit1": e1["pl_fit"], "pl_fit2": e2["pl_fit"], "repeats": repeats})
                    print(f"{dataset} {name} alpha={alpha} m={m} {s}: {kind} {len(mu)} users / {int(mj.sum())} items, "
                          f"KL {pick.kl:.3f}, TV <= {pick.tv:.2f}, gap {pick.gap / theta[s]:.1%}, bound "
                          f"{pick.bound:.1%}, uniform {e1['uniform']:.3f} / {e2['uniform']:.3f}", flush=True)
        print(f"{dataset} {name}: {time.time() - t0:.0f} s", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Per (data, metric, m, alpha): the bound's recommender rows and the ratio of the module docstring, W_1 being the
    worst uniform error over the recommenders of the cell's first world."""
    out = ["| data | metric | m | alpha | recommender | second world | KL (nats) / TV | gap | bound | "
           "uniform draws' bound | uniform err. (world 1 / 2) | pl_fit err. (world 1 / 2) | ratio |",
           "| --- " * 13 + "|"]
    cells = sorted({(r["dataset"], r["metric"], r["m"], r["alpha"]) for r in rows})
    for ds, s, m, alpha in cells:
        sel = [r for r in rows if (r["dataset"], r["metric"], r["m"], r["alpha"]) == (ds, s, m, alpha)]
        w1 = max(r["uniform1"] for r in sel)
        for r in sel:
            w2 = max(w1, r["uniform2"])
            ratio = r["gap"] * (1 - r["tv"]) / (GOAL * (w1 * r["theta1"] + w2 * r["theta2"]))
            pl = (f"{r['pl_fit1']:.3f} / {r['pl_fit2']:.3f}" if isinstance(r["pl_fit1"], float) else "-")
            out.append(f"| {ds} | {s} | {m} | {alpha} | {r['recommender']} | {r['kind']}: {r['moved']} users, "
                       f"{r['items_moved']} items | {r['kl']:.2f} / {r['tv']:.2f} | {r['gap'] / r['theta1']:+.1%} | "
                       f"{r['bound']:.1%} | {r['uniform_bound']:.1%} | {r['uniform1']:.3f} / {r['uniform2']:.3f} | {pl} | "
                       f"{'**' if ratio > 1 else ''}{ratio:.2f}{'**' if ratio > 1 else ''} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="ml-100k", choices=("ml-100k", "ml-latest-small"))
    ap.add_argument("--repeats", type=int, default=10, help="draws per world for the estimators' errors")
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--ms", type=int, nargs="+", default=[100, 500])
    ap.add_argument("--reach", type=int, default=200, help="the most items one positive's move may take")
    ap.add_argument("--min-uniform-kl", type=float, default=0.0,
                    help="only moves whose KL under uniform draws of the same m is at least this (nats)")
    ap.add_argument("--estimators", action="store_true", help="also pl_fit on popularity draws of both worlds")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--merge", nargs="*", default=[], help="JSON files of earlier runs to tabulate with this one")
    args = ap.parse_args()
    rows = run(args.dataset, args.repeats, args.alphas, args.ms, args.reach, args.estimators,
               args.min_uniform_kl) if args.repeats else []
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh)
    for f in args.merge:
        with open(f) as fh:
            rows += json.load(fh)
    print(table(rows))


if __name__ == "__main__":
    main()
