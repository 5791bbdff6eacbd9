"""Every registered estimator's estimates on fixed seeds, as JSON: the check that a refactor changes no number.

Four designs (uniform, without replacement, adaptive, popularity) on one synthetic score matrix (600 users x 3,000
items, seed 0), each drawn with seed 1; every registered method that takes the design, on hit@10, ndcg@10, auc and
ap: value, stderr, 95% interval and flags (a refusal as its message's first part). Run it before and after a change
and compare the files byte for byte::

    python benchmarks/fixed_seed_values.py > before.json   # at the base commit
    python benchmarks/fixed_seed_values.py > after.json
    cmp before.json after.json
"""

from __future__ import annotations

import json
import sys

import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import registry
from reco_sampled_plugin.design import SamplingDesign

METRICS = ("hit@10", "ndcg@10", "auc", "ap")


def values() -> dict:
    """{"design/method/metric": [value, stderr, [lo, hi], flags] or "refused: ..."}."""
    g = torch.Generator().manual_seed(0)
    users, n = 600, 3000
    scores = torch.randn(users, n, generator=g, dtype=torch.float64)
    pos = torch.randint(0, n, (users, 1), generator=g)
    weights = torch.arange(1, n + 1, dtype=torch.float64) ** -0.8 * 1000 + 1
    designs = {
        "uniform": SamplingDesign(100),
        "without": SamplingDesign(100, replacement=False),
        "adaptive": SamplingDesign(50, adaptive_max=800),
        "popularity": SamplingDesign(100, popularity=weights),
    }
    out: dict = {}
    for dname, design in designs.items():
        gen = torch.Generator().manual_seed(1)
        draw = rsp.adaptive_sampled_ranks if design.adaptive_max is not None else rsp.sampled_ranks
        sample = draw(scores, pos, design, generator=gen)
        for method in registry.names(design=design):
            entry = registry.get(method)
            for metric in METRICS:
                if not entry.takes_metric(rsp.parse_metric(metric).kind):
                    continue
                opts: dict = {"n_bootstrap": 4} if entry.option("n_bootstrap") is not None else {}
                if method == "beta":
                    opts["a"] = 1.0
                try:
                    e = rsp.estimate(metric, sample, registry.method_class(method)(**opts))
                    out[f"{dname}/{method}/{metric}"] = [e.value, e.stderr, list(e.interval(0.95)), sorted(e.flags)]
                except ValueError as exc:
                    out[f"{dname}/{method}/{metric}"] = "refused: " + str(exc).split(":")[0]
    return out


if __name__ == "__main__":
    json.dump(values(), sys.stdout, indent=0, default=float)
