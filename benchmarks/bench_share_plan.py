"""The planner's cost goal with exact shares, on ``bench_scorer.py``'s workload (5,000 users x 50,000 items, an MLP
scorer called per (user, item) pair).

One run, on the same scorer, users and machine:

1. full ranking (``bench_scorer.full_ranking``): every pair scored, the exact NDCG@10 and HR@10, its wall time;
2. a pilot on ``--pilot-users`` users (``planner.pilot_design``: adaptive 100 -> 12,800, which resolves K = 10),
   then ``planner.plan`` for a ``--target`` relative error (default 2%) on NDCG@10 and on HR@10 over all users, on
   the planner's default grid (``planner.default_designs``, its active exact shares included); the pick is the
   costlier of the two plans' picks (it meets both forecasts);
3. the pick run ``--repeats`` times through ``sampled_ranks_from_scorer`` (seeds ``--seed + r``), each estimated
   with ``auto`` (``diff`` on a sample with an exact share) for NDCG@10 and HR@10: relative error against the exact
   value, whether the 95% interval holds it, and the wall time (loop and estimates).

Reported: the pick's wall time (mean over repeats, the estimates included) plus the pilot and both plans, as a share
of full ranking's wall time (the goal: <= 10%), and per metric the relative errors (the goal: <= the target) and
interval coverage.

Run:  OMP_NUM_THREADS=1 python benchmarks/bench_share_plan.py [--users 5000] [--items 50000] [--repeats 2]
      [--target 0.02] [--threads 1] [--json out.json] [--full-users K]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_scorer import METRICS, DotMLP, World, full_ranking, make_world, sampled_run  # noqa: E402

from reco_sampled_plugin import estimate, planner  # noqa: E402


def pilot_and_plans(scorer, world, *, pilot_users: int, target: float, seed: int, repeats: int) -> dict:
    """Pilot (adaptive, resolving K = 10) on ``pilot_users`` random users, then one plan per metric on the default
    grid; the pick is the costlier of the plans' picks (None where either recommends full ranking)."""
    t0 = time.perf_counter()
    pick_users = torch.randperm(world.n_users, generator=torch.Generator().manual_seed(seed + 99))[:pilot_users]
    n_u = world.n_candidates.cpu().numpy()
    design = planner.pilot_design(int(n_u.max()), "ndcg@10", n_samples=100)
    pilot = sampled_run(scorer, world, design, seed=seed + 10_000, methods=(), users=pick_users)
    plans = {mt: planner.plan(n_u, world.n_users, mt, target, pilot=pilot["sampled"], seed=seed) for mt in METRICS}
    picks = [p.recommended for p in plans.values()]
    pick = None if any(f is None for f in picks) else max(picks, key=lambda f: f.pairs)
    return {"plans": plans, "pick": pick, "seconds": time.perf_counter() - t0, "pilot_pairs": pilot["cost"].pairs}


def run_pick(scorer, world, design, exact: dict, *, seed: int, repeats: int) -> dict:
    """The pick ``repeats`` times: wall (loop + estimates), pairs, and per metric the estimates and intervals."""
    rows = []
    for r in range(repeats):
        run = sampled_run(scorer, world, design, seed=seed + r, methods=())
        t = time.perf_counter()
        est = {mt: estimate(mt, run["sampled"]) for mt in METRICS}
        est_s = time.perf_counter() - t
        rows.append({"wall": run["wall"] + est_s, "loop": run["wall"], "estimates_s": est_s,
                     "pairs": run["cost"].pairs,
                     "metrics": {mt: {"value": e.value, "lo": e.interval(0.95)[0], "hi": e.interval(0.95)[1],
                                      "method": e.details.get("auto", {}).get("method", e.details.get("method")),
                                      "rel_error": (e.value - exact[mt]) / exact[mt],
                                      "holds": bool(e.interval(0.95)[0] <= exact[mt] <= e.interval(0.95)[1])}
                                 for mt, e in est.items()}})
    return {"runs": rows, "wall": float(np.mean([r["wall"] for r in rows])),
            "pairs": float(np.mean([r["pairs"] for r in rows]))}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.02)
    ap.add_argument("--pilot-users", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--full-users", type=int, default=None,
                    help="time full ranking on the first K users only and scale its wall time to all users (every "
                         "user scores the whole catalogue: linear in users); no exact metric, so the pick's estimates "
                         "are reported without their errors (a loaded machine; default: every user)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    world = make_world(args.users, args.items, seed=args.seed, device=torch.device("cpu"))
    scorer = DotMLP(world.user_emb, world.item_emb, 128, 0.1, args.seed)
    print(f"{world.n_users:,} users x {world.n_items:,} items, {torch.get_num_threads()} thread(s), load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    k = world.n_users if args.full_users is None else min(args.full_users, world.n_users)
    part = World(world.user_emb[:k], world.item_emb, world.positives[:k], world.exclude[:k], world.n_candidates[:k],
                 world.users[:k])
    full = full_ranking(scorer, part)
    full["wall"] *= world.n_users / k  # scaled to every user where only k were ranked
    exact = full["exact"] if k == world.n_users else {mt: math.nan for mt in METRICS}
    print(f"full ranking: {full['wall']:.1f} s" + (f" (scaled from {k} users)" if k < world.n_users else "")
          + f", exact {exact}", flush=True)
    planned = pilot_and_plans(scorer, world, pilot_users=args.pilot_users, target=args.target, seed=args.seed,
                              repeats=args.repeats)
    for p in planned["plans"].values():
        print(p.format(), flush=True)
    pick = planned["pick"]
    out = {"args": vars(args), "full_wall": full["wall"], "exact": exact, "plan_seconds": planned["seconds"],
           "pick": None if pick is None else pick.label}
    print(f"pilot and plans: {planned['seconds']:.1f} s; pick: {out['pick']}", flush=True)
    if pick is not None:
        res = run_pick(scorer, world, pick.design, exact, seed=args.seed, repeats=args.repeats)
        share = (res["wall"] + planned["seconds"]) / full["wall"]
        out.update(pick_wall=res["wall"], pick_pairs=res["pairs"], share_of_full_wall=share, runs=res["runs"])
        for r in res["runs"]:
            print(f"  run: wall {r['wall']:.1f} s (loop {r['loop']:.1f}, estimates {r['estimates_s']:.1f}), "
                  f"{r['pairs']:,} pairs; " + "; ".join(
                      f"{mt} {m['method']} {m['value']:.5f} [{m['lo']:.5f}, {m['hi']:.5f}] rel.err "
                      f"{m['rel_error']:+.2%} holds {m['holds']}" for mt, m in r["metrics"].items()), flush=True)
        print(f"pick + pilot + plans: {res['wall'] + planned['seconds']:.1f} s = {share:.1%} of full ranking's "
              f"{full['wall']:.1f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


if __name__ == "__main__":
    main()
