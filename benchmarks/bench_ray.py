"""Ray Data evaluation (reco_sampled_plugin.adapters.ray): throughput of 1 vs 2 actors, driver state vs users, and a
killed actor's run against the clean run. Figures in BENCHMARKS.md ("Offline evaluation on Ray Data").

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/bench_ray.py [--users 100000] [--big 1000000]
        [--parts throughput,state,faults]

* throughput: an MLP scorer (pairs through a 2-layer MLP, one torch thread per actor), uniform m = 100 over
  ``--users`` users, on 1 then 2 actors in the same run; pairs per second over the scoring span (first to last scorer
  call of any actor: actor start-up and the driver's merge excluded; the whole call's wall time beside it) and the
  ratio. The machine's 2 cores are shared with other jobs: the ratio is of this run only.
* driver state: a cheap dot-product scorer, uniform m = 20, 0-20 excluded items per user, at 10^4 and ``--big``
  users: the pickled merged state's bytes (what the driver holds), flat in the users.
* faults: the scorer kills its actor (``os._exit``) on its first call; Ray restarts it and retries the block; the
  estimates equal the clean run's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import ray
import torch

from reco_sampled_plugin import SamplingDesign
from reco_sampled_plugin.adapters.ray import Engine, evaluate_dataset

N_ITEMS = 20_000


class MlpScorer:
    """Scorer factory: user and item embeddings (32) concatenated through a 256-unit MLP, one thread per actor; the
    same model in every actor (seeded: a factory must build identical scorers). With ``log_dir``, each actor writes
    the wall-clock times of its first and latest scorer call there (the span of the scoring, start-up excluded)."""

    def __init__(self, log_dir: str | None = None) -> None:
        self.log_dir = log_dir

    def __call__(self, device: torch.device):
        torch.set_num_threads(1)
        torch.manual_seed(0)
        users, items = torch.randn(1 << 16, 32).to(device), torch.randn(N_ITEMS, 32).to(device)
        mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)

        log = None if self.log_dir is None else os.path.join(self.log_dir, f"{os.getpid()}.txt")
        first: list[float] = []

        @torch.no_grad()
        def scorer(u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            t = time.time()
            x = torch.cat([users[u % users.shape[0]].unsqueeze(1).expand(-1, i.shape[1], -1), items[i]], -1)
            out = mlp(x).squeeze(-1)
            if log is not None:
                first[:] = first or [t]
                with open(log, "w") as f:
                    f.write(f"{first[0]} {time.time()}\n")
            return out

        return scorer


class DotScorer:
    """A cheap scorer factory (8-dim dot products); with ``marker`` the first call kills the actor unless the
    marker file exists (it creates it first)."""

    def __init__(self, marker: str | None = None) -> None:
        self.marker = marker

    def __call__(self, device: torch.device):
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(1)
        users, items = torch.randn(1 << 16, 8, generator=g).to(device), torch.randn(N_ITEMS, 8, generator=g).to(device)
        marker = self.marker

        def scorer(u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            if marker is not None and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)
            return (users[u % users.shape[0]].unsqueeze(1) * items[i]).sum(-1)

        return scorer


def rows(n_users: int, max_exclude: int, seed: int = 0) -> pa.Table:
    """One held-out item per user and 0..max_exclude excluded items (CSR lists: consecutive items from the row's
    offset; the held-out item lies past them, so never excluded)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_exclude + 1, n_users)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    row = np.repeat(np.arange(n_users), lengths)
    exc = (row * 7919 + np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)) % N_ITEMS  # distinct per row
    held = (np.arange(n_users) * 7919 + max_exclude + 1 + rng.integers(0, 1000, n_users)) % N_ITEMS
    return pa.table({"user": np.arange(n_users), "items": held,
                     "exclude": pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(exc, pa.int64()))})


def run(table: pa.Table, factory, design: SamplingDesign, workers: int, blocks: int, batch: int):
    ds = ray.data.from_arrow([table.slice(lo, -(-table.num_rows // blocks))
                              for lo in range(0, table.num_rows, -(-table.num_rows // blocks))])
    t0 = time.perf_counter()
    ev = evaluate_dataset(ds, factory, N_ITEMS, design, seed=5,
                          engine=Engine(workers=workers, num_cpus=0.9, batch_size=batch, progress=False))
    return ev, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=100_000, help="users of the throughput runs")
    ap.add_argument("--big", type=int, default=1_000_000, help="users of the large driver-state run")
    ap.add_argument("--parts", default="throughput,state,faults", help="which measurements, comma-separated")
    args = ap.parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"ray {ray.__version__}, {os.cpu_count()} cores (shared with other jobs), torch {torch.__version__}")

    parts = set(args.parts.split(","))
    if "throughput" in parts:
        throughput(args.users)
    if "state" in parts:
        state_sizes(args.big)
    if "faults" in parts:
        faults()
    ray.shutdown()


def throughput(n_users: int) -> None:
    """1 then 2 actors on the MLP scorer: pairs per second over the span from the first scorer call of any actor to
    the last (actor start-up and the driver's merge excluded), and over the whole call."""
    table, rates = rows(n_users, 0), {}
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            ev, wall = run(table, MlpScorer(tmp), SamplingDesign(100), workers, 16, 512)
            spans = np.array([np.loadtxt(os.path.join(tmp, f)) for f in os.listdir(tmp)]).reshape(-1, 2)
        span = spans[:, 1].max() - spans[:, 0].min()
        rates[workers] = ev.cost.pairs / span
        print(f"throughput, {workers} actor(s): {n_users:,} users, {ev.cost.pairs:,} pairs, scoring span {span:.1f} s "
              f"= {rates[workers]:,.0f} pairs/s ({wall:.1f} s wall with start-up and the merge: "
              f"{ev.cost.pairs / wall:,.0f} pairs/s); in the actors: scorer {ev.cost.scorer_seconds:.1f} s, loop "
              f"{ev.cost.loop_seconds:.1f} s; ndcg@10 {ev.estimate('ndcg@10').value:.6f}")
    print(f"throughput ratio 2 vs 1 actors (scoring span): {rates[2] / rates[1]:.2f}x")



def state_sizes(big: int) -> None:
    """The driver's merged state at 10^4 and ``big`` users (cheap scorer, 0-20 exclusions: 21 candidate counts)."""
    for n_users in (10_000, big):
        ev, wall = run(rows(n_users, 20, seed=1), DotScorer(), SamplingDesign(20), 2, 16, 65_536)
        print(f"driver state, {n_users:>9,} users: {ev.state.nbytes():,} bytes ({ev.cost.pairs:,} pairs, "
              f"{wall:.1f} s wall)")


def faults() -> None:
    """The scorer kills its actor on the first call; the run equals the clean run."""
    with tempfile.TemporaryDirectory() as tmp:
        table = rows(10_000, 20, seed=2)
        clean, _ = run(table, DotScorer(), SamplingDesign(20, adaptive_max=160), 1, 4, 4096)
        killed, wall = run(table, DotScorer(os.path.join(tmp, "killed")), SamplingDesign(20, adaptive_max=160), 1, 4,
                           4096)
        same = all((clean.estimate(m, k).value, clean.estimate(m, k).stderr)
                   == (killed.estimate(m, k).value, killed.estimate(m, k).stderr)
                   for m in ("ndcg@10", "recall@10") for k in ("auto", "mle"))
        print(f"killed actor (restarted, block retried): killed={os.path.exists(os.path.join(tmp, 'killed'))}, "
              f"users {killed.state.users} = {clean.state.users}, pairs {killed.cost.pairs} = {clean.cost.pairs}, "
              f"estimates equal to the clean run: {same} ({wall:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
