"""Keyed popularity draws with and without replacement (``_keyed.keyed_negatives``): what the adapters' draws cost.

With replacement a draw is an inverse-cdf lookup of m keyed numbers per positive (O(P m log n) per user); without
replacement a keyed exponential race over the catalogue (O(P n) hashes per user, ``_keyed._race_negatives``). One
batch of B users with P positives each, uniform-random weights in [0.01, 1.01); milliseconds per user, best of
``--repeats``. On a CUDA device each timing ends with a synchronisation.

    python benchmarks/bench_keyed_popularity.py --items 10000,100000,1000000
    python benchmarks/bench_keyed_popularity.py --device cuda --users 1024 --items 100000,1000000,10000000
"""

from __future__ import annotations

import argparse
import time

import torch

from reco_sampled_plugin._keyed import RowKeys, keyed_negatives
from reco_sampled_plugin.design import SamplingDesign


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--users", type=int, default=256)
    ap.add_argument("--positives", type=int, default=1)
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--items", default="10000,100000,1000000")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"device {device}, threads {torch.get_num_threads()}, B = {a.users}, P = {a.positives}, m = {a.m}")
    print("| n | with replacement (ms/user) | without replacement (ms/user) |")
    print("| --- | --- | --- |")
    for n in (int(x) for x in a.items.split(",")):
        g = torch.Generator().manual_seed(0)
        w = (torch.rand(n, generator=g, dtype=torch.float64) + 0.01).to(device)
        pos = torch.randint(0, n, (a.users, a.positives), generator=g).to(device)
        keys = RowKeys.of(0, torch.arange(a.users), device)
        out = []
        for replacement in (True, False):
            design = SamplingDesign(a.m, replacement=replacement, popularity=w)
            keyed_negatives(pos[:2], None, n, design, keys.take(slice(0, 2)))  # warm-up
            best = float("inf")
            for _ in range(a.repeats):
                sync()
                t = time.perf_counter()
                keyed_negatives(pos, None, n, design, keys)
                sync()
                best = min(best, time.perf_counter() - t)
            out.append(best / a.users * 1e3)
        print(f"| {n:,} | {out[0]:.3f} | {out[1]:.3f} |")


if __name__ == "__main__":
    main()
