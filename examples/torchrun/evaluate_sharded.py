"""Evaluate a factor model with users sharded across processes (torchrun), exact and sampled metrics.

    torchrun --nproc_per_node 2 --standalone examples/torchrun/evaluate_sharded.py --out results.json
    python examples/torchrun/evaluate_sharded.py --out results.json          # one process, same numbers

Every process builds the same synthetic, seeded model and data (in a real run: loads the same checkpoint and
interaction files), takes its shard of the users (rank r evaluates users r, r + W, r + 2W... with
``--shard strided``, or one contiguous block with ``--shard blocks``) and adds them batch by batch to two
torchmetrics states: :class:`ExactRankingMetrics` (sums of M(r) per metric) and :class:`SampledRankingMetrics`
(the sampled-rank histogram). ``compute()`` / ``estimates()`` sum the states across processes (an all-gather
and a sum: a few kilobytes whatever the number of users), so every process holds the same results; rank 0
prints them and writes them as JSON.

Sampled metrics are keyed: a user's m negatives are a function of (seed, user id, relevant item), so passing
``ids`` (the user indices) makes the histogram, and every estimate computed from it, exactly the same whatever
the number of processes, the sharding or the batch size. The exact metrics agree to float rounding (sums in a
different order).

The model: item factors V (n x d) and user factors U (users x d) of a "true" preference U V^T, plus noise for the
model evaluated; each user has ``--train`` training items (excluded from the ranking) and ``--held-out`` relevant
items drawn with probability proportional to exp(true score). Device: ``cuda:{LOCAL_RANK}`` when CUDA is there
(backend nccl), else the CPU (backend gloo); ``--device`` / ``--backend`` override. See README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist

from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics
from reco_sampled_plugin.registry import Mes

METRICS = ("ndcg@10", "recall@10", "mrr", "auc")
ESTIMATORS = ("none", "bv", Mes(n_bootstrap=0))  # mes without bootstrap, reported as mes_n_bootstrap-0


def make_data(users: int, items: int, dim: int, n_train: int, n_held_out: int, seed: int):
    """(model user factors, item factors, held-out items (users, H), training items (users, T)): the same on
    every process (seeded, generated on the CPU in user blocks)."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(items, dim, generator=g) / math.sqrt(dim)
    u_true = torch.randn(users, dim, generator=g)
    u_model = u_true + 0.7 * torch.randn(users, dim, generator=g)  # an imperfect model of the same preferences
    held, train = [], []
    for lo in range(0, users, 512):
        logits = 2.0 * (u_true[lo:lo + 512] @ v.T)
        picks = torch.multinomial(torch.softmax(logits, dim=1), n_held_out + n_train, replacement=False, generator=g)
        held.append(picks[:, :n_held_out])
        train.append(picks[:, n_held_out:])
    return u_model, v, torch.cat(held), torch.cat(train)


def shard(users: int, rank: int, world: int, how: str) -> torch.Tensor:
    """The user indices process ``rank`` of ``world`` evaluates."""
    if how == "strided":
        return torch.arange(rank, users, world)
    per = -(-users // world)
    return torch.arange(rank * per, min(users, (rank + 1) * per))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--train", type=int, default=20, help="training items per user (excluded)")
    parser.add_argument("--held-out", type=int, default=3, help="relevant (held-out) items per user")
    parser.add_argument("--n-samples", type=int, default=100, help="m sampled irrelevant items per relevant item")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--shard", choices=("strided", "blocks"), default="strided")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="default: cuda:{LOCAL_RANK} when available, else cpu")
    parser.add_argument("--backend", default=None, help="default: nccl on CUDA, gloo on the CPU")
    parser.add_argument("--out", default=None, help="JSON file rank 0 writes the results to")
    args = parser.parse_args(argv)

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(args.device or (f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    distributed = "WORLD_SIZE" in os.environ  # started by torchrun (one process or several)
    if distributed and not dist.is_initialized():
        dist.init_process_group(args.backend or ("nccl" if device.type == "cuda" else "gloo"))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    t0 = time.perf_counter()
    u, v, held, train = make_data(args.users, args.items, args.dim, args.train, args.held_out, args.seed)
    mine = shard(args.users, rank, world, args.shard)
    exact = ExactRankingMetrics(METRICS).to(device)
    sampled = SampledRankingMetrics(METRICS, n_samples=args.n_samples, estimators=ESTIMATORS,
                                    seed=args.seed).to(device)
    v_dev = v.to(device)
    with torch.no_grad():
        for lo in range(0, len(mine), args.batch_size):
            users = mine[lo:lo + args.batch_size]
            uf, pos, exc = u[users].to(device), held[users].to(device), train[users].to(device)
            ids = users.to(device)  # keys the sampled negatives: results independent of sharding and batching
            # factors in, scores computed in cache-sized tiles and never stored (exact ranks); the sampled
            # negatives are scored by one dot product each
            exact.update_factors(uf, v_dev, pos, exc)
            sampled.update_factors(uf, v_dev, pos, exc, ids=ids)
    # estimates() syncs the states across processes (every process must call it), then runs the estimators
    est = {**exact.estimates(), **sampled.estimates()}
    hist = sampled.histogram()
    out = {
        "world_size": world,
        "users": args.users,
        "users_on_rank0": len(shard(args.users, 0, world, args.shard)),
        "relevant_items": hist.total,
        "histogram_groups": hist.n_groups,
        "results": {k: {"value": e.value, "stderr": e.stderr, "n": e.n_instances} for k, e in est.items()},
        "seconds": time.perf_counter() - t0,
    }
    if rank == 0:
        print(f"{world} process(es), {args.users} users x {args.items} items, device {device}")
        for k, e in est.items():  # the 95% interval (widened where the top is unresolved), then the flags
            lo, hi = e.interval(0.95)
            print(f"  {k:24s} {e.value:.6f}  95% [{lo:.6f}, {hi:.6f}]  {' '.join(e.flags) or '-'}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return out


if __name__ == "__main__":
    main()
