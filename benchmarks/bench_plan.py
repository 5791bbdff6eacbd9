"""The planner's own time: ``planner.plan`` on the scorer benchmark's pilot and on the README's
plan example, with its forecasts, so that two trees (main and a branch) can be timed back to back on the same input.

Two inputs:

* ``scorer``: the world of ``bench_scorer.py`` (iALS on ml-latest-small grown to 5,000 users x 50,000 items,
  training items excluded, the MLP scorer), a pilot on 1,000 random users through ``sampled_ranks_from_scorer``
  with ``planner.pilot_design``'s adaptive design (100 -> 12,800 for NDCG@10 at 50,000 items), then
  ``planner.plan`` for 10% relative RMSE on NDCG@10 over the 5,000 users on the default grid plus adaptive
  100 -> ``--plan-caps`` (bench_scorer's ``planner_pick``, the same arguments). The pilot is drawn once and saved
  (``--pilot-file``, .npz: its ranks, n, final m, design and seconds per pair), so that both trees plan from the
  very same pilot;
* ``readme``: the README's example, ``plan(50_000, 6000, "ndcg@10", 0.05)`` (the default rank family).

After an untimed warm-up plan (the imports' lazy work), each case runs ``--rounds`` times, round k with seed
``--seed`` + k (fresh draws, so no likelihood is reused from an earlier round; the table takes the median), and
prints one JSON line per case: the seconds, and round 0's forecasts (label, estimator, relative error and its Monte Carlo
se, bias, sd, pairs, screened). Main against a branch, back to back under the same load:

    OMP_NUM_THREADS=1 python benchmarks/bench_plan.py --make-pilot /tmp/pilot.npz      # once (ALS + pilot: ~1 min)
    OMP_NUM_THREADS=1 PYTHONPATH=/work/main python benchmarks/bench_plan.py --pilot-file /tmp/pilot.npz --json main.json
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_plan.py --pilot-file /tmp/pilot.npz --json branch.json
    python benchmarks/bench_plan.py --compare main.json branch.json                    # the markdown table
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def make_pilot(path: str, *, pilot_users: int = 1000, seed: int = 0, users: int = 5000, items: int = 50_000) -> None:
    """Draw bench_scorer's pilot (``planner_pick``'s: the same users, seed and design) and save it to ``path``."""
    from bench_scorer import TARGET_METRIC, DotMLP, make_world, sampled_run

    from reco_sampled_plugin import planner
    from reco_sampled_plugin.design import SamplingDesign

    world = make_world(users, items, seed=seed)
    scorer = DotMLP(world.user_emb, world.item_emb, 128, 0.1, seed)
    pick = torch.randperm(world.n_users, generator=torch.Generator().manual_seed(seed + 99))[:pilot_users]
    cap = planner.pilot_design(int(world.n_candidates.max()), TARGET_METRIC, n_samples=100).adaptive_max or 0
    pilot = sampled_run(scorer, world, SamplingDesign(100, adaptive_max=cap), seed=seed + 10_000, methods=(),
                        users=pick)
    s = pilot["sampled"]
    ranks, keep = s.ranks.reshape(-1), s.ranks.reshape(-1) > 0
    sizes = s.sizes()
    sizes = sizes.reshape(-1)[keep] if isinstance(sizes, torch.Tensor) else torch.full((int(keep.sum()),), int(sizes))
    np.savez(path, ranks=ranks[keep].numpy(), n_items=s.candidates().reshape(-1)[keep].numpy(), sizes=sizes.numpy(),
             m=100, cap=cap, seconds_per_pair=pilot["cost"].scorer_seconds / max(pilot["cost"].pairs, 1),
             n_candidates=world.n_candidates.numpy(), n_users=world.n_users)
    print(f"pilot: {int(keep.sum())} positives, adaptive 100 -> {cap}, {pilot['cost'].pairs:,} pairs; saved {path}")


def forecasts(p) -> list[dict]:
    """The plan's forecasts as plain numbers."""
    return [{"label": f.label, "method": f.method, "rel_error": f.rel_error, "rel_error_se": f.rel_error_se,
             "rel_bias": f.rel_bias, "rel_sd": f.rel_sd, "pairs": f.pairs, "screened": f.screened,
             "repeats": f.repeats, "meets": f.meets_target, "rel_width": f.rel_width, "pruned": getattr(f, "pruned", False)}
            for f in p.forecasts]


def run_case(name: str, call, rounds: int, seed: int) -> dict:
    """``rounds`` plans, round k with seed ``seed + k`` (fresh draws: no likelihood cached from an earlier round);
    the forecasts are round 0's."""
    seconds, first = [], None
    for k in range(rounds):
        t = time.perf_counter()
        p = call(seed + k)
        seconds.append(time.perf_counter() - t)
        first = p if first is None else first
    p = first
    rec = p.recommended
    out = {"case": name, "seconds": seconds, "median": statistics.median(seconds), "truth": p.truth,
           "recommended": None if rec is None else rec.label, "forecasts": forecasts(p)}
    print(json.dumps({"case": name, "seconds": [round(s, 3) for s in seconds], "recommended": out["recommended"]}),
          flush=True)
    return out


def main(argv=None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make-pilot", metavar="NPZ", help="draw bench_scorer's pilot and save it here, then stop")
    ap.add_argument("--pilot-file", metavar="NPZ", help="the saved pilot (the scorer case runs only with one)")
    ap.add_argument("--cases", default="scorer,readme")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20, help="the plan's Monte Carlo repeats")
    ap.add_argument("--seed", type=int, default=0, help="the plan's seed")
    ap.add_argument("--plan-caps", default="25600,51200", help="as bench_scorer.py's --plan-caps")
    ap.add_argument("--workers", type=int, default=None,
                    help="PlanExecution(workers=...); not given: the plan's default")
    ap.add_argument("--forecast-all", action="store_true",
                    help="PlanExecution(forecast_all=True): every design forecast (default: the plan's own default)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--compare", nargs=2, metavar=("A_JSON", "B_JSON"), help="print the table of two runs")
    args = ap.parse_args(argv)
    if args.compare:
        print(compare(*args.compare))
        return None
    if args.make_pilot:
        make_pilot(args.make_pilot)
        return None
    import reco_sampled_plugin
    from reco_sampled_plugin import SampledRanks, SamplingDesign, planner

    extra = {"execution": planner.PlanExecution(workers=args.workers, forecast_all=args.forecast_all)}

    print(f"reco_sampled_plugin from {os.path.dirname(reco_sampled_plugin.__file__)}; torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.2f}; workers: {args.workers}; "
          f"CPUs {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()}", flush=True)
    # warm-up, not timed: the lazy imports and first-call costs of both paths (another catalogue, other seed)
    planner.plan(20_000, 500, "ndcg@10", 0.1, designs=[SamplingDesign(100), SamplingDesign(100, adaptive_max=800)],
                 repeats=2, seed=12345)
    cases = {}
    wanted = args.cases.split(",")
    if "scorer" in wanted and args.pilot_file:
        z = np.load(args.pilot_file)
        n_u = z["n_candidates"]
        grid = planner.default_designs(int(n_u.min())) + [SamplingDesign(100, adaptive_max=int(c))
                                                          for c in args.plan_caps.split(",") if c]
        pilot = SampledRanks(torch.from_numpy(z["ranks"]), torch.from_numpy(z["n_items"]),
                             design=SamplingDesign(int(z["m"]), adaptive_max=int(z["cap"])),
                             n_samples=torch.from_numpy(z["sizes"]))

        def scorer_plan(seed: int):
            return planner.plan(n_u, int(z["n_users"]), "ndcg@10", 0.10, designs=grid, pilot=pilot,
                                seconds_per_pair=float(z["seconds_per_pair"]), repeats=args.repeats, seed=seed,
                                **extra)

        cases["scorer"] = run_case("scorer", scorer_plan, args.rounds, args.seed)
    if "readme" in wanted:
        cases["readme"] = run_case("readme", lambda seed: planner.plan(50_000, 6000, "ndcg@10", 0.05,
                                                                       repeats=args.repeats, seed=seed, **extra),
                                   args.rounds, args.seed)
    out = {"args": vars(args), "load": os.getloadavg(), "cases": cases}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


def compare(a_path: str, b_path: str) -> str:
    """A markdown table: per case and design, both runs' forecasts (rel. error +- MC se) and their difference in
    units of the combined Monte Carlo se; per case the median seconds and their ratio."""
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    lines = [f"A: {a_path} (load {a['load'][0]:.1f}), B: {b_path} (load {b['load'][0]:.1f})"]
    for case in a["cases"]:
        if case not in b["cases"]:
            continue
        ca, cb = a["cases"][case], b["cases"][case]
        lines.append(f"\n{case}: {ca['median']:.2f} s -> {cb['median']:.2f} s (x{ca['median'] / cb['median']:.1f}; rounds "
                     f"{', '.join(f'{x:.1f}' for x in ca['seconds'])} / {', '.join(f'{x:.1f}' for x in cb['seconds'])}); "
                     f"recommended {ca['recommended']} / {cb['recommended']}; truth {ca['truth']:.5g} / {cb['truth']:.5g}\n")
        lines.append("| design | estimator | A rel. error (MC se) | B rel. error (MC se) | difference / se | A screened | B screened |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for fa, fb in zip(ca["forecasts"], cb["forecasts"]):
            if fa.get("pruned") or fb.get("pruned"):  # no error to compare: costlier than the pick in A or B
                cell = (lambda f: "not forecast" if f.get("pruned") else f"{f['rel_error']:.1%} ({f['rel_error_se']:.1%})")
                lines.append(f"| {fa['label']} | {fa['method']} | {cell(fa)} | {cell(fb)} | - | {fa['screened']} | "
                             f"{fb['screened']} |")
                continue
            se = math.hypot(fa["rel_error_se"], fb["rel_error_se"])
            z = (fb["rel_error"] - fa["rel_error"]) / se if se > 0 else 0.0
            lines.append(f"| {fa['label']} | {fa['method']} | {fa['rel_error']:.1%} ({fa['rel_error_se']:.1%}) | "
                         f"{fb['rel_error']:.1%} ({fb['rel_error_se']:.1%}) | {z:+.2f} | {fa['screened']} | {fb['screened']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
