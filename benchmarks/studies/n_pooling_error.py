"""Error of grouping candidate counts n on a geometric grid (``max_rel_n_spread``) against exact per-n tables.

For every estimator that is a mean of per-positive table values (corrections, mappings), compares
``estimate(..., max_rel_n_spread=s)`` with the exact per-distinct-n estimate on the same sampled ranks:
ml-100k (four recommenders, n in 946..1663, 279 distinct n) and a synthetic set with a wide n range
(n log-uniform in 1e3..1e5, 2000 positives, 2000 distinct n). Prints the largest relative and absolute
differences over metrics, methods, recommenders and repeats.

Run:  python benchmarks/studies/n_pooling_error.py [--repeats 5]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from reco_sampled_plugin.estimators import estimate  # noqa: E402
from reco_sampled_plugin.simulate import draw_sampled_ranks  # noqa: E402
from reco_sampled_plugin import SampledRanks
from reco_sampled_plugin import registry

METHODS = [("none", {}), ("rank_estimate", {}), ("cls", {}), ("bv", {"gamma": 0.1}), ("bv", {"gamma": 0.01}),
           ("bound", {}), ("beta", {"a": 0.5})]
METRICS = ["hit@1", "hit@10", "hit@50", "ndcg@10", "ndcg@50"]
SPREADS = [0.02, 0.05, 0.1, 0.2, 0.4]


def synthetic(seed: int = 0):
    rng = np.random.default_rng(seed)
    n = np.rint(np.exp(rng.uniform(np.log(1e3), np.log(1e5), 2000))).astype(np.int64)
    r = 1 + np.floor((n - 1) * rng.beta(0.3, 1.0, n.size)).astype(np.int64)
    return {"synthetic": r}, n


def measure(ranks, n, m: int, repeats: int, seed: int = 0) -> dict:
    worst = {(s, meth + "".join(f"({v})" for v in kw.values())): (0.0, 0.0, "") for s in SPREADS for meth, kw in METHODS}
    for i, (name, r) in enumerate(ranks.items()):
        draws = draw_sampled_ranks(r, n, m, repeats=repeats, seed=seed + i)
        for d in draws:
            for meth, kw in METHODS:
                for mt in METRICS:
                    ref = estimate(mt, SampledRanks.from_arrays(d, n, m), registry.method_class(meth)(**kw)).value
                    for s in SPREADS:
                        v = estimate(
                            mt,
                            SampledRanks.from_arrays(d, n, m),
                            registry.method_class(meth)(max_rel_n_spread=s, **kw),
                        ).value
                        rel = abs(v - ref) / abs(ref) if ref else 0.0
                        key = (s, meth + "".join(f"({v})" for v in kw.values()))
                        if rel > worst[key][0]:
                            worst[key] = (rel, abs(v - ref), f"{name} {mt}")
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--m", type=int, default=100)
    args = ap.parse_args()
    sets = [synthetic()]
    try:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
        from accuracy_ml100k import exact_rank_data

        sets.insert(0, exact_rank_data())
    except (ImportError, FileNotFoundError) as exc:  # pragma: no cover - recbole wheel absent
        print(f"ml-100k unavailable: {exc}")
    for ranks, n in sets:
        label = "ml-100k" if len(ranks) > 1 else "synthetic"
        worst = measure(ranks, torch.as_tensor(n), args.m, args.repeats)
        print(f"\n{label}: {len(np.unique(n))} distinct n in {int(n.min())}..{int(n.max())}, m = {args.m}")
        labels = list(dict.fromkeys(k[1] for k in worst))
        print("worst relative difference (absolute in parentheses) over metrics, recommenders and repeats")
        print("| max_rel_n_spread | " + " | ".join(f"`{x}`" for x in labels) + " |")
        print("|---|" + "---|" * len(labels))
        for s in SPREADS:
            print(f"| {s} | " + " | ".join(f"{worst[(s, x)][0]:.0e} ({worst[(s, x)][1]:.0e})" for x in labels) + " |")


if __name__ == "__main__":
    main()
