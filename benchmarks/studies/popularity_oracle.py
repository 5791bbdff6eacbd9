"""How well *any* estimator can do under popularity sampling (the 1.5x goal): the Bayes oracle given the truth.

The goal asks the worst recommender's relative error of HR@10 / NDCG@10 under popularity-sampled negatives to be at
most 1.5x that of the default estimator on uniform draws at the same m. This script measures what the draws allow:
for each recommender of ``baselines.train_benchmark`` (ml-100k or ml-latest-small, leave-last-out, the setting of
``popularity_accuracy.py``) it simulates each user's m negatives with replacement from the user's drawable items
(not trained on, not the held-out item) with q proportional to count^alpha, or uniformly, and computes the
**oracle**: each positive's posterior mean of the metric under

* the prior: the recommender's true rank distribution (the users' exact ranks, each weight 1/N: the oracle of
  ``accuracy_at_scale.py`` and ``gmod_oracle.py``), and
* the exact likelihood of what a draw shows, given that the positive sits at rank R of *its own user's true
  ranking* (known to the oracle): the draws fall in popularity class c and beat the positive with probability
  Q_c(R), the q-mass of class-c items among the user's top R - 1 drawable items, and miss it with q_c - Q_c(R);
  so the class counts (B_c, M_c) have log-likelihood sum_c B_c log Q_c(R) + M_c log(q_c - Q_c(R)).

Three oracles: ``classes`` (the 16 popularity classes of ``_popularity.weight_bins``, what ``pl_fit`` reads),
``count`` (the number of beating draws alone, Binomial(m, Q(R))) and ``uniform`` (uniform draws: Binomial(m,
(R - 1)/(n_u - 1)), the oracle of ``accuracy_at_scale.py``). The oracle knows what no estimator can (the prior and
each user's composition curve), so its error is a floor: an estimator whose worst error must stay within 1.5x of
the uniform default's cannot, where the popularity oracle's own worst error already exceeds that.

Output: per (alpha, m, metric, recommender) the mean |relative error| of each oracle against the users' exact
metric over ``--repeats`` draws, and the mean number of beating draws per positive at exact ranks <= 10 under each
design (how much the draws say about the top).

    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_oracle.py --dataset ml-100k --repeats 10
    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_oracle.py --dataset ml-latest-small --repeats 10
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/ (siblings)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/studies/

import reco_sampled_plugin as rsp  # noqa: E402
from reco_sampled_plugin import metric_values  # noqa: E402
from reco_sampled_plugin._popularity import POP_BINS, weight_bins  # noqa: E402

from popularity_accuracy import load  # noqa: E402

METRICS = ("hit@10", "ndcg@10")


def ordered_world(scores: torch.Tensor, test: torch.Tensor, exc: torch.Tensor, exact: torch.Tensor):
    """Each user's drawable items (not excluded, not the held-out item) in the order of the user's ranking (score
    descending, ties in item order), as a (U, n) boolean drawable mask gathered in that order, and the order
    itself. The held-out item's exact rank R says that the first R - 1 drawable items of the order beat it (the
    oracle's world: ties resolved as the exact rank counts them)."""
    U, n = scores.shape
    drawable = torch.ones(U, n, dtype=torch.bool)
    rows = torch.arange(U).unsqueeze(1).expand_as(exc)
    valid = exc >= 0
    drawable[rows[valid], exc[valid]] = False
    drawable[torch.arange(U), test.view(-1)] = False
    s = scores.masked_fill(~drawable, -torch.inf)
    order = torch.sort(s, dim=1, descending=True, stable=True).indices  # drawable items first, in ranking order
    return order, drawable.gather(1, order)


def class_curves(order: torch.Tensor, dmask: torch.Tensor, weights: torch.Tensor, classes: torch.Tensor,
                 support: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, N, C) Q_c(R_v): the normalised q-mass of class-c drawable items among the user's top R_v - 1, at every
    support point R_v (N of them); and (U, C) q_c, the class totals. Normalised by the user's drawable mass."""
    w = weights[order] * dmask  # (U, n) in ranking order, 0 for non-drawable
    total = w.sum(1, keepdim=True)
    q = w / total
    cls = classes[order]
    U, N = order.shape[0], support.numel()
    idx = (support - 1).clamp(min=0).view(1, N).expand(U, N)  # the first R - 1 items: cumsum up to position R - 2
    out = torch.zeros(U, N, n_classes, dtype=torch.float64)
    qc = torch.zeros(U, n_classes, dtype=torch.float64)
    for c in range(n_classes):
        qcls = torch.where(cls == c, q, torch.zeros_like(q))
        cum = torch.cat([torch.zeros(U, 1, dtype=torch.float64), qcls.cumsum(1)], 1)  # cum[:, k]: first k items
        out[:, :, c] = cum.gather(1, idx.clamp(max=cum.shape[1] - 1))
        qc[:, c] = cum[:, -1]
    return out, qc


def draw(order: torch.Tensor, dmask: torch.Tensor, weights: torch.Tensor, classes: torch.Tensor, exact: torch.Tensor,
         m: int, gen: torch.Generator, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """m draws with replacement per user from its drawable items (prob. proportional to ``weights``): (U, C)
    beating and missing draws per class (a draw beats when it lies among the first R - 1 items of the order)."""
    w = weights[order] * dmask
    pos = torch.multinomial(w, m, replacement=True, generator=gen)  # (U, m) positions in the order
    beats = pos < (exact.view(-1, 1) - 1)
    cls = classes[order].gather(1, pos)
    U = order.shape[0]
    b = torch.zeros(U, n_classes, dtype=torch.float64)
    mi = torch.zeros(U, n_classes, dtype=torch.float64)
    b.scatter_add_(1, cls, beats.double())
    mi.scatter_add_(1, cls, (~beats).double())
    return b, mi


def oracle_value(b: torch.Tensor, mi: torch.Tensor, curves: torch.Tensor, qc: torch.Tensor, valid: torch.Tensor,
                 mv: torch.Tensor) -> np.ndarray:
    """The mean over users of the posterior mean of each metric: prior uniform over the N support points (the
    users' exact ranks), log-likelihood sum_c B_c log Q_c + M_c log(q_c - Q_c) (0 log 0 = 0; -inf where a count
    falls on a zero mass or where R_v exceeds the user's candidates)."""
    rest = (qc.unsqueeze(1) - curves).clamp(min=0.0)
    bb, mm = b.unsqueeze(1), mi.unsqueeze(1)
    ll = (torch.where(bb > 0, bb * torch.log(curves), torch.zeros_like(curves))
          + torch.where(mm > 0, mm * torch.log(rest), torch.zeros_like(rest))).sum(2)
    ll = torch.where(valid, torch.nan_to_num(ll, nan=-torch.inf), torch.tensor(-torch.inf, dtype=torch.float64))
    post = torch.softmax(ll, dim=1)  # (U, N)
    return (post @ mv).mean(0).numpy()


def run(dataset: str, repeats: int, alphas, ms) -> list[dict]:
    scores, test, exc, counts, n_u = load(dataset)
    rows = []
    for name, sc in scores.items():
        t0 = time.time()
        exact = rsp.exact_ranks(sc, test, exc, count_other_positives=False).view(-1)
        truth = {s: float(metric_values(s, exact, n_u).double().mean()) for s in METRICS}
        support = exact.clone()  # the prior's support: the users' exact ranks, weight 1/N each
        mv = torch.stack([metric_values(s, support, n_u).double() for s in METRICS], 1)  # (N, S)
        order, dmask = ordered_world(sc, test, exc, exact)
        valid = support.view(1, -1) <= n_u.view(-1, 1)  # (U, N): R_v within the user's candidates
        top = exact <= 10
        for law, alpha in [("uniform", None)] + [("popularity", a) for a in alphas]:
            weights = torch.ones_like(counts) if alpha is None else counts ** alpha
            classes = weight_bins(weights)
            curves, qc = class_curves(order, dmask, weights, classes, support, POP_BINS)
            c1, q1 = curves.sum(2, keepdim=True), qc.sum(1, keepdim=True)  # one class: the count alone
            for m in ms:
                est = {"classes": [], "count": []}
                beating_top = []
                for rep in range(repeats):
                    g = torch.Generator().manual_seed(10_000 * rep + m + (0 if alpha is None else int(100 * alpha)))
                    b, mi = draw(order, dmask, weights, classes, exact, m, g, POP_BINS)
                    beating_top.append(float(b.sum(1)[top].mean()))
                    if alpha is not None:
                        est["classes"].append(oracle_value(b, mi, curves, qc, valid, mv))
                    est["count"].append(oracle_value(b.sum(1, keepdim=True), mi.sum(1, keepdim=True), c1, q1, valid,
                                                     mv))
                for kind, vals in est.items():
                    if not vals:
                        continue
                    v = np.array(vals)  # (repeats, S)
                    for k, s in enumerate(METRICS):
                        rel = np.abs(v[:, k] - truth[s]) / truth[s]
                        rows.append({"dataset": dataset, "recommender": name, "law": law, "alpha": alpha, "m": m,
                                     "metric": s, "oracle": "uniform" if alpha is None else kind,
                                     "mean_abs_rel_err": float(rel.mean()),
                                     "rel_bias": float((v[:, k].mean() - truth[s]) / truth[s]),
                                     "beating_draws_top10": float(np.mean(beating_top)), "repeats": repeats})
        print(f"{dataset} {name}: {time.time() - t0:.0f} s", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Per (alpha, m, metric): each recommender's oracle errors, popularity (classes / count) against uniform."""
    lines = ["| alpha | m | metric | recommender | oracle, popularity classes | oracle, popularity count | "
             "oracle, uniform | beating draws at R <= 10: popularity / uniform |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    key = {(r["recommender"], r["law"], r["alpha"], r["m"], r["metric"], r["oracle"]): r for r in rows}
    alphas = sorted({r["alpha"] for r in rows if r["alpha"] is not None})
    for alpha in alphas:
        for m in sorted({r["m"] for r in rows}):
            for s in METRICS:
                for name in dict.fromkeys(r["recommender"] for r in rows):
                    pc = key[(name, "popularity", alpha, m, s, "classes")]
                    pn = key[(name, "popularity", alpha, m, s, "count")]
                    un = key[(name, "uniform", None, m, s, "uniform")]
                    lines.append(f"| {alpha} | {m} | {s} | {name} | {pc['mean_abs_rel_err']:.3f} | "
                                 f"{pn['mean_abs_rel_err']:.3f} | {un['mean_abs_rel_err']:.3f} | "
                                 f"{pc['beating_draws_top10']:.2f} / {un['beating_draws_top10']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="ml-100k", choices=("ml-100k", "ml-latest-small"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--ms", type=int, nargs="+", default=[100, 500])
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    rows = run(args.dataset, args.repeats, args.alphas, args.ms)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh)
    print(table(rows))


if __name__ == "__main__":
    main()
