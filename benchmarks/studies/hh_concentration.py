"""Does ``weights_concentrated`` fire where the Hansen-Hurwitz AUC is far off, and not on ordinary designs?

Known truth: random scores over n items, one positive per user at a known exact rank, so the exact AUC of the
positives is known. Each world draws m popularity-sampled negatives per user with a weight family from uniform to
all mass on a few items, ``estimate("auc", ..., "hh")`` and ``"auto"`` (which runs hh) are read, and each run is
scored by |error| / stderr (the z of the truth). A design is far off when |z| > 4. Prints one line per design: the
share of runs flagged, the share far off, and the share far off but not flagged (the silent wrong numbers; must be 0).

    PYTHONPATH=. python benchmarks/studies/hh_concentration.py [--runs 20]

``rare``: the mean ``details["rare_share"]`` (the drawable catalogue's share in popularity classes that all the
draws together are expected to hit fewer than RARE_DRAWS times), the design-based half of the flag; the other half
is the Kish share of the drawn weights (ESS_SHARE_FLAG), which alone misses the designs whose rare items were never
drawn.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import popularity
from reco_sampled_plugin.design import SamplingDesign


def weights(kind: str, n: int, rng: np.random.Generator) -> torch.Tensor:
    """The popularity weights of a design family, from uniform to nearly one item."""
    zipf = 1.0 / np.arange(1, n + 1)
    table = {
        "uniform": np.ones(n),
        "zipf^0.5": zipf ** 0.5,
        "zipf^1": zipf,
        "counts+1 (ml-like)": np.floor(rng.pareto(1.2, n) * 5) + 1.0,
        "zipf^2": zipf ** 2,
        "4 items x 1e3": np.r_[np.full(4, 1e3), np.ones(n - 4)],
        "4 items x 1e6": np.r_[np.full(4, 1e6), np.ones(n - 4)],
        "1 item x 1e9": np.r_[1e9, np.ones(n - 1)],
    }
    return torch.tensor(rng.permutation(table[kind]), dtype=torch.float64)


def run(kind: str, seed: int, n: int = 400, users: int = 300, m: int = 20) -> tuple[bool, bool, bool, float]:
    """(flagged by hh, flagged by auto, far off, rare_share) of one world."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    w = weights(kind, n, rng)
    scores = torch.rand(users, n, generator=g, dtype=torch.float64)
    pos = torch.randint(0, n, (users, 1), generator=g)
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(m, popularity=w), generator=g)
    exact = (scores > scores.gather(1, pos)).sum(1).double() + 1.0  # no ties (continuous scores)
    truth = float(((n - exact) / (n - 1)).mean())
    hh = rsp.estimate("auc", s, method="hh")
    auto = rsp.estimate("auc", s)
    z = abs(hh.value - truth) / hh.stderr
    return ("weights_concentrated" in hh.flags, "weights_concentrated" in auto.flags, z > 4,
            hh.details["rare_share"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    runs = ap.parse_args().runs
    kinds = ("uniform", "zipf^0.5", "zipf^1", "counts+1 (ml-like)", "zipf^2", "4 items x 1e3", "4 items x 1e6",
             "1 item x 1e9")
    print(f"{'design':<20} {'flagged':>8} {'auto':>6} {'far off':>8} {'silent':>7} {'rare':>6}  "
          f"(n=400, 300 users, m=20, {runs} runs)")
    for kind in kinds:
        res = [run(kind, seed) for seed in range(runs)]
        out = np.array([r[:3] for r in res], dtype=bool)
        silent = float(np.mean(out[:, 2] & ~out[:, 0]))
        print(f"{kind:<20} {out[:, 0].mean():8.2f} {out[:, 1].mean():6.2f} {out[:, 2].mean():8.2f} {silent:7.2f} "
              f"{np.mean([r[3] for r in res]):6.3f}")
    print(f"thresholds: RARE_DRAWS = {popularity.RARE_DRAWS}, RARE_SHARE_FLAG = {popularity.RARE_SHARE_FLAG}, "
          f"ESS_SHARE_FLAG = {popularity.ESS_SHARE_FLAG}")


if __name__ == "__main__":
    main()
