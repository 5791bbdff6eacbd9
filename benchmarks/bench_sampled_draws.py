"""Sampled ranks from a score matrix, uniform and popularity draws, as a share of the score matmul's throughput.

One data set: U users x n items, d float32 factors, ``--positives`` held-out and ``--exclude`` training items per user
(the plain-exclusion workload of ``bench_input_forms.py``), Zipf popularity weights. For each user batch size the users
are processed batch by batch and timed (best of ``--repeats``, interleaved) as

* floor: the score matmul alone into a reused (B, n) buffer;
* uniform: that matmul + ``sampled_ranks(scores, positives, m, exclude)`` (with replacement);
* popularity: that matmul + ``sampled_ranks(scores, positives, SamplingDesign(m, popularity=w), exclude)``: the
  inverse-cdf draw and the per-positive statistics ``pl_fit`` and ``hh`` read (``PopularityStats``);
* exact: that matmul + ``exact_ranks`` (the full ranking the sample stands in for).

share = floor time / path time (1.0 = as fast as the matmul alone). On a CUDA device each timing ends with a
synchronisation.

    python benchmarks/bench_sampled_draws.py --device cuda --batches 256,1024,4096
    python benchmarks/bench_sampled_draws.py --users 512 --items 5000 --batches 128 --repeats 1   # smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch

from reco_sampled_plugin import exact_ranks, sampled_ranks
from reco_sampled_plugin.design import SamplingDesign

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_input_forms import add_data_args, make_data  # noqa: E402


def run_paths(u, v, pos, exc, w, m: int, batch: int, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` wall seconds of each path over all users in batches of ``batch``."""
    n = v.shape[0]
    sync = torch.cuda.synchronize if u.device.type == "cuda" else (lambda: None)
    buf = torch.empty((min(batch, u.shape[0]), n), dtype=u.dtype, device=u.device)
    starts = range(0, u.shape[0], batch)
    pop = SamplingDesign(m, popularity=w)
    gen = torch.Generator(device=u.device).manual_seed(0)

    def path(name):
        def go():
            for s in starts:
                ub = u[s : s + batch]
                scores = buf[: ub.shape[0]]
                torch.matmul(ub, v.T, out=scores)
                p, e = pos[s : s + batch], exc[s : s + batch]
                if name == "uniform":
                    sampled_ranks(scores, p, m, e, generator=gen)
                elif name == "popularity":
                    sampled_ranks(scores, p, pop, e, generator=gen)
                elif name == "exact":
                    exact_ranks(scores, p, exclude=e)
        return go

    fns = {name: path(name) for name in ("floor", "uniform", "popularity", "exact")}
    for fn in fns.values():  # warm-up
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_args(p)
    p.add_argument("--samples", type=int, default=100, help="m, the sampled items per positive")
    p.add_argument("--batches", default="256,1024,4096", help="comma-separated user batch sizes")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu", help="torch device of the factors and scores (cpu, cuda)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    u, v, pos, exc = (t.to(device) for t in make_data(args.users, args.items, args.dim, args.positives, args.exclude))
    w = (torch.floor(2000.0 / torch.arange(1, args.items + 1, dtype=torch.float64) ** 0.9) + 1.0).to(device)
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), device {device}{gpu}")
    print(f"data: {args.users} users x {args.items} items, d = {args.dim} float32, {args.positives} positives and "
          f"{args.exclude} excluded items per user, m = {args.samples}, Zipf(0.9) weights; best of {args.repeats}")
    print(f"command: python benchmarks/bench_sampled_draws.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print()
    print("| users per batch | matmul floor (s) | uniform (s) | popularity (s) | exact (s) | uniform / floor "
          "| popularity / floor | exact / floor | popularity / uniform (time) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for batch in (int(b) for b in args.batches.split(",")):
        t = run_paths(u, v, pos, exc, w, args.samples, batch, args.repeats)
        f = t["floor"]
        print(f"| {batch} | {f:.3f} | {t['uniform']:.3f} | {t['popularity']:.3f} | {t['exact']:.3f} | "
              f"{f / t['uniform']:.2f} | {f / t['popularity']:.2f} | {f / t['exact']:.2f} | "
              f"{t['popularity'] / t['uniform']:.2f} |")
    print("\nshare = matmul-floor time / path time (1.0 = as fast as the matmul alone)")


if __name__ == "__main__":
    main()
