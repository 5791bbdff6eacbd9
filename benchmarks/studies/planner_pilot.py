"""Does the planner pick a design that meets its target? Pilots of different resolution on the scorer benchmark's
world.

The world of ``bench_scorer.py`` (iALS on ml-latest-small grown to 5,000 users x 50,000 items, training items
excluded), ranked exactly by u.v (the MLP's exact part; no scorer is run). For each pilot cap and each of
``--draws`` pilots (1,000 random users, adaptive 100 -> cap, drawn from the exact ranks), ``planner.plan`` for a 10%
relative RMSE on NDCG@10 over the 5,000 users (its default grid plus 100 -> 25,600 and 100 -> 51,200, 20 Monte Carlo
repeats, the default estimator). The pick is then judged by simulation on the real exact ranks: ``--repeats`` fresh
draws of its design (users resampled, as the plan's own forecast is over sets of users), relative RMSE of the
default estimator against each set's exact NDCG@10.

    OMP_NUM_THREADS=1 python benchmarks/studies/planner_pilot.py --draws 6 --caps 3200,12800
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/ (siblings)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/studies/

from bench_scorer import TARGET, TARGET_METRIC, make_world  # noqa: E402

from reco_sampled_plugin import estimate, planner  # noqa: E402
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact  # noqa: E402
from reco_sampled_plugin.design import SamplingDesign  # noqa: E402
from reco_sampled_plugin.factor_ranks import exact_ranks_from_factors  # noqa: E402
from reco_sampled_plugin.metrics import metric_values  # noqa: E402
from reco_sampled_plugin.simulate import simulate_sampled_ranks  # noqa: E402
from reco_sampled_plugin import SampledRanks, SamplingDesign
from reco_sampled_plugin import registry


def simulated_error(r: np.ndarray, n_u: np.ndarray, design: tuple[int, int | None], repeats: int, seed: int = 7) -> float:
    """Relative RMSE of the default estimator for ``design`` over ``repeats`` resampled user sets."""
    m, cap = design
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    err, truths = [], []
    for _ in range(repeats):
        idx = rng.integers(0, len(r), len(r))
        rt, nt = torch.from_numpy(r[idx]), torch.from_numpy(n_u[idx])
        truth = float(metric_values(TARGET_METRIC, rt, nt).mean())
        if cap is None:
            s = simulate_sampled_ranks(rt, nt, m, "binomial", gen)
            value = estimate(TARGET_METRIC, SampledRanks.from_arrays(s, nt, m), registry.Auto(n_bootstrap=0)).value
        else:
            drawn = adaptive_sampled_ranks_from_exact(rt, nt, SamplingDesign(m, adaptive_max=cap), gen)
            s, sizes = drawn.ranks, drawn.n_samples
            value = estimate(
                TARGET_METRIC,
                SampledRanks.from_arrays(s, nt, sizes, SamplingDesign(m, adaptive_max=cap)),
                registry.Auto(n_bootstrap=0),
            ).value
        err.append(value - truth)
        truths.append(truth)
    return math.sqrt(float(np.mean(np.square(err)))) / float(np.mean(truths))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=6, help="pilot draws per cap")
    ap.add_argument("--caps", default="3200,12800", help="pilot caps (adaptive from m = 100)")
    ap.add_argument("--pilot-users", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=8, help="simulated repeats judging each pick")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    w = make_world(5000, 50_000)
    r = exact_ranks_from_factors(w.user_emb.double(), w.item_emb.double(), w.positives, w.exclude,
                                 count_other_positives=False).reshape(-1).numpy()
    n_u = w.n_candidates.numpy()
    exact = float(metric_values(TARGET_METRIC, torch.from_numpy(r), torch.from_numpy(n_u)).mean())
    print(f"world: {time.perf_counter() - t0:.0f} s; exact {TARGET_METRIC} {exact:.5f}; "
          f"planner.pilot_design: {planner.pilot_design(int(n_u.max()), TARGET_METRIC)}", flush=True)
    grid = planner.default_designs(int(n_u.min())) + [SamplingDesign(100, adaptive_max=25_600),
                                                      SamplingDesign(100, adaptive_max=51_200)]
    judged: dict = {}
    print("| pilot cap | draw | pilot pairs / user | pilot fit's NDCG@10 | plan (s) | pick | forecast | simulated |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for cap in (int(c) for c in args.caps.split(",")):
        for draw in range(args.draws):
            pick = np.random.default_rng(99 + draw).choice(len(r), args.pilot_users, replace=False)
            gen = torch.Generator().manual_seed(2024 + draw)
            pr = adaptive_sampled_ranks_from_exact(torch.from_numpy(r[pick]), torch.from_numpy(n_u[pick]),
                                                   SamplingDesign(100, adaptive_max=cap), generator=gen)
            p = planner.plan(n_u, len(n_u), TARGET_METRIC, TARGET, pilot=pr, designs=grid, repeats=20, seed=1)
            rec = p.recommended
            if rec is None:
                shown = ("full ranking", "", "exact")
            else:
                key = (rec.n_samples, rec.adaptive_max)
                if key not in judged:
                    judged[key] = simulated_error(r, n_u, key, args.repeats)
                shown = (rec.label, f"{rec.rel_error:.1%}", f"{judged[key]:.1%}")
            print(f"| 100 -> {cap} | {draw} | {float(pr.n_samples.double().mean()) + 1:.0f} | {p.truth:.4f} | {p.seconds:.0f} | "
                  f"{shown[0]} | {shown[1]} | {shown[2]} |", flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
