"""Exact ranks in three input forms, each as a share of the score matmul's throughput.

One run, one data set: U users x n items, d float32 factors, ``--positives`` held-out items and ``--exclude``
training items per user (distinct, drawn uniformly), ranked with the training items excluded. For each user
batch size the users are processed batch by batch and timed (best of ``--repeats``) as

* floor: the score matmul alone, ``torch.matmul(u_batch, v.T, out=buf)`` into a reused full (B, n) buffer;
* index: that matmul + ``exact_ranks(scores, positives_index, exclude=exclude_index)`` ((B, P) / (B, E) int64);
* masks: that matmul + ``exact_ranks(scores, positive_mask, exclude=exclude_mask)`` ((B, n) bool each, built
  before the clock starts);
* factors: ``exact_ranks_from_factors(u_batch, v, positives_index, exclude=exclude_index)`` (the whole call).

The share is floor time / form time (1.0 = as fast as the matmul alone; above 1 is possible for the factor
form, which never writes the full score matrix). The goals: masks >= 0.6, index >= 0.75, factors >= 0.95.
The ranks of the three forms are checked equal (integer-valued factors: every score exact, so the factor
path's dot products and tiles round identically).

    python benchmarks/bench_input_forms.py [--users 4096 --items 100000 --dim 64 --batches 256,512,1024,4096]
    python benchmarks/bench_input_forms.py --users 256 --items 5000 --batches 64,256 --repeats 1   # smoke run
    python benchmarks/bench_input_forms.py --threads 1 --clock cpu   # steadier on a busy shared machine
    python benchmarks/bench_input_forms.py --device cuda --batches 256,1024,4096   # on a GPU
    python benchmarks/bench_input_forms.py --tile-items 8192 --tile-elements 4194304   # the former default tile
    python benchmarks/bench_input_forms.py --first --users 1024 --batches 256,1024 --repeats 3   # first evaluations

``--first``: the first evaluation as a user meets it, at the default settings: each form's first pass over all
users in a fresh process (nothing compiled, nothing cached; no warm-up), against the matmul floor timed in the same
process after it; median of ``--repeats`` processes per form and batch size.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
import torch

from reco_sampled_plugin import exact_ranks, exact_ranks_from_factors, factor_ranks


def make_data(n_users: int, n_items: int, d: int, n_pos: int, n_exc: int, seed: int = 0):
    """(U, d) and (n, d) float32 factors with small integer values (exact scores, many ties), and distinct
    (U, P) positives (ascending, as a mask orders them) and (U, E) exclusions per user (int64)."""
    rng = np.random.default_rng(seed)
    u = torch.from_numpy(rng.integers(-3, 4, (n_users, d)).astype(np.float32))
    v = torch.from_numpy(rng.integers(-3, 4, (n_items, d)).astype(np.float32))
    k = min(n_pos + n_exc, n_items)
    items = np.stack([rng.choice(n_items, size=k, replace=False) for _ in range(n_users)])
    items = torch.from_numpy(items.astype(np.int64))
    pos = items[:, :n_pos].sort(dim=1).values  # ascending: the slot order a mask gives (tied positives alike)
    return u, v, pos, items[:, n_pos:].contiguous()


def _mask(idx: torch.Tensor, n: int) -> torch.Tensor:
    m = torch.zeros((idx.shape[0], n), dtype=torch.bool, device=idx.device)
    return m.scatter_(1, idx, True)


def run_forms(u, v, pos, exc, batch: int, repeats: int, clock=time.perf_counter,
              tile_elements: int | None = None) -> tuple[dict[str, float], bool]:
    """Best-of-``repeats`` seconds (by ``clock``) of each form over all users in batches of ``batch``; and whether
    the three forms gave equal ranks. Tensors may live on any device; on CUDA each timing ends with a
    synchronisation (the work queued, not only launched)."""
    n = v.shape[0]
    sync = torch.cuda.synchronize if u.device.type == "cuda" else (lambda: None)
    buf = torch.empty((min(batch, u.shape[0]), n), dtype=u.dtype, device=u.device)
    starts = range(0, u.shape[0], batch)
    masks = {s: (_mask(pos[s : s + batch], n), _mask(exc[s : s + batch], n)) for s in starts}
    out: dict[str, list[torch.Tensor]] = {"index": [], "masks": [], "factors": []}

    def floor():
        for s in starts:
            torch.matmul(u[s : s + batch], v.T, out=buf[: min(batch, u.shape[0] - s)])

    def form(name):
        def go():
            res = []
            for s in starts:
                ub = u[s : s + batch]
                if name == "factors":
                    res.append(exact_ranks_from_factors(ub, v, pos[s : s + batch], exclude=exc[s : s + batch],
                                                        tile_elements=tile_elements))
                    continue
                scores = buf[: ub.shape[0]]
                torch.matmul(ub, v.T, out=scores)
                if name == "index":
                    res.append(exact_ranks(scores, pos[s : s + batch], exclude=exc[s : s + batch]))
                else:
                    pm, em = masks[s]
                    res.append(exact_ranks(scores, pm, exclude=em))
            out[name] = res
        return go

    fns = {"floor": floor, "index": form("index"), "masks": form("masks"), "factors": form("factors")}
    for fn in fns.values():  # warm-up: compiles the counting kernels, touches the buffers
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):  # interleaved, so that a noisy moment hits every form alike
        for name, fn in fns.items():
            sync()
            t0 = clock()
            fn()
            sync()
            best[name] = min(best[name], clock() - t0)
    r_idx = torch.cat(out["index"])
    r_fac = torch.cat(out["factors"])
    r_msk = torch.cat(out["masks"])
    same = torch.equal(r_idx, r_fac) and torch.equal(r_idx, r_msk)
    return best, same


def first_once(args, form: str, batch: int) -> None:
    """``--first-once``: one fresh process's first pass of ``form`` over all users, then the floor; prints JSON."""
    import json

    u, v, pos, exc = make_data(args.users, args.items, args.dim, args.positives, args.exclude)
    n = v.shape[0]
    starts = range(0, u.shape[0], batch)
    masks = {s: (_mask(pos[s : s + batch], n), _mask(exc[s : s + batch], n)) for s in starts} if form == "masks" else {}
    buf = torch.zeros((min(batch, u.shape[0]), n), dtype=u.dtype)  # touched: the scores' pages are the model's cost
    t0 = time.perf_counter()
    for s in starts:
        ub = u[s : s + batch]
        if form == "factors":
            exact_ranks_from_factors(ub, v, pos[s : s + batch], exclude=exc[s : s + batch])
            continue
        scores = buf[: ub.shape[0]]
        torch.matmul(ub, v.T, out=scores)
        if form == "index":
            exact_ranks(scores, pos[s : s + batch], exclude=exc[s : s + batch])
        else:
            exact_ranks(scores, *masks[s][:1], exclude=masks[s][1])
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in starts:
        torch.matmul(u[s : s + batch], v.T, out=buf[: min(batch, u.shape[0] - s)])
    print(json.dumps({"form": form, "first": first, "floor": time.perf_counter() - t0}))


def first_table(args) -> None:
    """``--first``: each form's first evaluation in fresh processes (:func:`first_once`), medians."""
    import json
    import statistics
    import subprocess

    print("| users per batch | form | first evaluation (s) | matmul floor (s) | share (floor / first) |")
    print("| --- | --- | --- | --- | --- |")
    for batch in (int(b) for b in args.batches.split(",")):
        for form in ("index", "masks", "factors"):
            runs = []
            for _ in range(args.repeats):
                cmd = [sys.executable, __file__, "--first-once", form, "--batches", str(batch), "--users",
                       str(args.users), "--items", str(args.items), "--dim", str(args.dim), "--positives",
                       str(args.positives), "--exclude", str(args.exclude)]
                if args.threads is not None:
                    cmd += ["--threads", str(args.threads)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
            first = statistics.median(r["first"] for r in runs)
            floor = statistics.median(r["floor"] for r in runs)
            shares = ", ".join(f"{r['floor'] / r['first']:.2f}" for r in runs)
            print(f"| {batch} | {form} | {first:.3f} | {floor:.3f} | {floor / first:.2f} ({shares}) |", flush=True)


def add_data_args(p: argparse.ArgumentParser) -> None:
    """The data set's options (``make_data``), shared with ``bench_sampled_draws.py``."""
    p.add_argument("--users", type=int, default=4096)
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--positives", type=int, default=5)
    p.add_argument("--exclude", type=int, default=50)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_args(p)
    p.add_argument("--batches", default="256,512,1024,4096", help="comma-separated user batch sizes")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--tile-elements", type=int, default=None,
                   help="scores per factor tile (default: factor_ranks.tile_shape's choice for the device)")
    p.add_argument("--tile-items", type=int, default=None,
                   help="items per factor tile at most on the CPU (factor_ranks._TILE_ITEMS; 8192 with "
                        "--tile-elements 4194304 is the former default tile)")
    p.add_argument("--device", default="cpu", help="torch device of the factors and scores (cpu, cuda)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall-clock time, or this process's CPU time (steadier on a shared machine with --threads 1)")
    p.add_argument("--first", action="store_true", help="each form's first evaluation, a fresh process per run")
    p.add_argument("--first-once", choices=("index", "masks", "factors"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.first_once:
        first_once(args, args.first_once, int(args.batches))
        return
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    if args.tile_items is not None:
        factor_ranks._TILE_ITEMS = args.tile_items

    device = torch.device(args.device)
    u, v, pos, exc = (t.to(device) for t in make_data(args.users, args.items, args.dim, args.positives, args.exclude))
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), device {device}{gpu}, {args.clock} clock")
    print(f"data: {args.users} users x {args.items} items, d = {args.dim} float32, {args.positives} positives and "
          f"{args.exclude} excluded items per user; best of {args.repeats}")
    print(f"command: python benchmarks/bench_input_forms.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print()
    if args.first:
        first_table(args)
        return
    print("| users per batch | matmul floor (s) | index (s) | masks (s) | factors (s) | index / floor | masks / floor "
          "| factors / floor | equal ranks | factor tile (users x items) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for batch in (int(b) for b in args.batches.split(",")):
        t, same = run_forms(u, v, pos, exc, batch, args.repeats, clock, args.tile_elements)
        f = t["floor"]
        rows, cols = factor_ranks.tile_shape(batch, args.items, device, args.tile_elements)
        print(f"| {batch} | {f:.3f} | {t['index']:.3f} | {t['masks']:.3f} | {t['factors']:.3f} | "
              f"{f / t['index']:.2f} | {f / t['masks']:.2f} | {f / t['factors']:.2f} | {'yes' if same else 'NO'} | "
              f"{rows} x {cols} |")
    print("\nshare = matmul-floor time / form time (goals: index >= 0.75, masks >= 0.6, factors >= 0.95)")


if __name__ == "__main__":
    main()
