"""Regenerate the pickle fixtures of tests/test_compat.py: ``python tests/data/make_pickles.py``.

Each fixture is an object the package returned (``Estimate`` from ``estimate()`` (a correction table among them), a
``RankDistribution``), pickled with protocol 4 under ``tests/data/pickles/<name>.pkl``; ``expected.json`` holds
what it said when it was made (value, stderr, flags, the 0.95 interval). The test loads each pickle with the
current code and checks it still says the same: results saved by an older version keep loading.

The committed fixtures were made with the code of commit b143a75 (before issue 24's refactor); regenerate them
only on purpose (a deliberate break of the pickle format), never to make the test pass.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.rank_distribution import RankDistribution, estimate_rank_distribution


HERE = Path(__file__).resolve().parent / "pickles"
N, M = 2000, 50


def _exact_ranks(n_users: int = 400, seed: int = 7) -> torch.Tensor:
    """Exact ranks of a toy recommender: log-uniform-ish over 1..N (a heavy top, as real ones have)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n_users, generator=g, dtype=torch.float64)
    return torch.clamp(torch.floor(torch.exp(u * torch.log(torch.tensor(float(N))))), 1, N).to(torch.int64)


def fixtures() -> dict:
    g = torch.Generator().manual_seed(11)
    exact = _exact_ranks()
    sampled = rsp.simulate_sampled_ranks(exact, N, M, generator=g)
    out = {
        "estimate_bv": rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(sampled, N, M), "bv"),
        "estimate_mes": rsp.estimate(
            "ndcg@10",
            rsp.SampledRanks.from_arrays(sampled, N, M),
            rsp.registry.Mes(n_bootstrap=4, seed=0),
        ),
        "estimate_bound": rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(sampled, N, M), "bound"),
        "estimate_none": rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(sampled, N, M), "none"),
        # the cut-off 5 lies below the resolution b = (N - 1)/(M + 1) + 1 ~ 40: flag top_unresolved, and the
        # interval also spans the identified set (the pickled Identification)
        "estimate_identified": rsp.estimate(
            "hit@5",
            rsp.SampledRanks.from_arrays(sampled, N, M),
            rsp.registry.Mes(n_bootstrap=0),
        ),
        "corrected_metric": rsp.estimate("recall@20", rsp.SampledRanks.from_arrays(sampled, N, M), "bv"),
    }
    g = torch.Generator().manual_seed(13)
    ranks_a, m_a = adaptive_sampled_ranks_from_exact(exact, N, 20, 160, generator=g)
    out["estimate_adaptive"] = rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(ranks_a, N, m_a, rsp.SamplingDesign(20, adaptive_max=160)),
        rsp.registry.Mes(n_bootstrap=0),
    )
    # a tiny rank distribution (few users, coarse grid) keeps the file small
    small = sampled[:60]
    out["rank_distribution"] = estimate_rank_distribution(small, N, M, method="mle", n_bootstrap=0,
                                                              delta=0.5, kappa=1.0)
    return out


def summary(obj) -> dict:
    """What a fixture says: value, stderr, flags and the 0.95 interval (an Estimate), or the same of its
    ``metric("hit@10")`` plus its cdf at a few ranks (a RankDistribution)."""
    if isinstance(obj, RankDistribution):
        est = obj.metric("hit@10")
        return {
            "value": float(est.value),
            "stderr": float(est.stderr),
            "flags": list(obj.flags),
            "cdf": [float(x) for x in obj.cdf([1, 10, 100, 1000, N])],
        }
    lo, hi = obj.interval(0.95)
    return {"value": float(obj.value), "stderr": float(obj.stderr), "flags": list(obj.flags),
            "interval": [float(lo), float(hi)]}


def main() -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    expected = {}
    for name, obj in fixtures().items():
        with open(HERE / f"{name}.pkl", "wb") as f:
            pickle.dump(obj, f, protocol=4)
        expected[name] = summary(obj)
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    for name, s in expected.items():
        print(name, s)


if __name__ == "__main__":
    main()
