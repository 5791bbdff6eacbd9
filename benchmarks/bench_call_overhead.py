"""Fixed cost per call of the hot paths, where it matters on accelerators: time, operators and kernels per batch.

On a GPU a batch of a few hundred users x 1e5 items is scored in ~0.1 ms, so what a call costs beyond the work
itself (Python, operator dispatch, kernel launches, host synchronisations) decides the overhead users see. For
each call this prints the median wall time per batch (synchronised), the aten operators it dispatches, and on
CUDA the kernels it launches and their summed device time (torch.profiler), for a small and a large batch. On CUDA
the calls of index inputs are replayed from CUDA graphs after two calls (``_graphs``): their operators are the
replay's, their kernels the graph's.

    python benchmarks/bench_call_overhead.py [--device cuda] [--items 100000] [--batches 256,4096]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from reco_sampled_plugin import SamplingDesign, exact_ranks, per_user_metrics, sampled_ranks
from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics


def cases(b: int, n: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(b, n, generator=g).to(device)
    picks = torch.stack([torch.randperm(n, generator=g)[:56] for _ in range(min(b, 64))]).repeat((b + 63) // 64, 1)[:b]
    pos, exc = picks[:, :1].contiguous().to(device), picks[:, 1:].contiguous().to(device)
    dg = torch.Generator(device=device).manual_seed(0)
    metric = SampledRankingMetrics(("ndcg@10", "hit@10"), n_samples=100, estimators=("none", "bv")).to(device)
    shared = SampledRankingMetrics(("ndcg@10", "hit@10"), n_samples=SamplingDesign(100, exact_share=0.05),
                                   estimators=("none", "diff")).to(device)
    exact = ExactRankingMetrics().to(device)
    return {
        "exact_ranks (1 positive, 55 excluded)": lambda: exact_ranks(scores, pos, exclude=exc),
        "sampled_ranks (m = 100)": lambda: sampled_ranks(scores, pos, 100, exclude=exc, generator=dg),
        "per_user_metrics (ndcg@10, recall@10)": lambda: per_user_metrics(scores, pos, ("ndcg@10", "recall@10"),
                                                                           exclude=exc, as_frame=False),
        "SampledRankingMetrics.update (m = 100)": lambda: metric.update(scores, pos, exclude=exc),
        "SampledRankingMetrics.update (m = 100, exact share 0.05)": lambda: shared.update(scores, pos, exclude=exc),
        "ExactRankingMetrics.update (ndcg@10, recall@10)": lambda: exact.update(scores, pos, exclude=exc),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--batches", default="256,4096")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gpu = f" ({torch.cuda.get_device_name(device)})" if cuda else ""
    print(f"device {device}{gpu}, torch {torch.__version__}, {torch.get_num_threads()} threads, n = {args.items:,}")
    print("| call | users per batch | ms per batch (median) | aten operators | kernels launched | device time (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for b in (int(x) for x in args.batches.split(",")):
        for name, fn in cases(b, args.items, device).items():
            for _ in range(3):
                fn()
            times = []
            for _ in range(args.repeats):
                sync()
                t = time.perf_counter()
                fn()
                sync()
                times.append(time.perf_counter() - t)
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts) as prof:
                fn()
                sync()
            events = prof.events()
            ops = sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None)
            kernels = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
            ktime = sum(e.device_time for e in kernels) / 1e3 if kernels else float("nan")
            print(f"| {name} | {b} | {statistics.median(times) * 1e3:.2f} | {ops} | {len(kernels) if cuda else '-'} "
                  f"| {ktime:.2f} |")


if __name__ == "__main__":
    main()
