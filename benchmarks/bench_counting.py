"""The CPU's eager compare-and-count kernel against plain numpy and torch on the same scores.

For each (B, n, P) the scores are float32 standard normal and the references P scores of each row; every contender
returns the (B, P) counts of scores above each reference (the work behind every exact rank), with the rows' NaN/inf
flags where it says so:

* ours: ``counting.count_beating_checked`` on the eager backend (numpy's comparisons in cache-sized blocks, counted
  8 bytes at a time, the NaN/inf flags from each block's min and max; rows split between torch's threads);
* ``numpy``: ``(s[rows, None, :] > t[rows, :, None]).sum(-1)`` over blocks of rows of 2^24 comparisons, and
  ``np.isfinite(s).all(1)``;
* ``torch``: the same in torch;
* the score matmul of the same (B, n) from d = 64 factors, for scale.

Median of ``--repeats`` runs after one warm-up, milliseconds; ratios are the contender's time over ours.

    python benchmarks/bench_counting.py [--threads 1] [--repeats 5]
    python benchmarks/bench_counting.py --shapes 1024x100000x5,256x1000000x5   # B x n x P
"""

from __future__ import annotations

import argparse
import platform

import numpy as np
import torch
from bench_recbole_floor import _median_ms  # median ms after a warm-up call (this folder: run as a script)

from reco_sampled_plugin import counting

SHAPES = "1024x100000x5,1024x100000x1,1024x100000x20,4096x20000x5,16384x2000x5,256x1000000x5"


def _plain(s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = max(1, (1 << 24) // (t.shape[1] * s.shape[1]))
    out = np.concatenate([(s[lo:lo + rows, None, :] > t[lo:lo + rows, :, None]).sum(-1)
                          for lo in range(0, s.shape[0], rows)])
    return out, np.isfinite(s).all(1)


def _plain_torch(s: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = max(1, (1 << 24) // (t.shape[1] * s.shape[1]))
    out = torch.cat([(s[lo:lo + rows, None, :] > t[lo:lo + rows, :, None]).sum(-1)
                     for lo in range(0, s.shape[0], rows)])
    return out, torch.isfinite(s).all(1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=SHAPES, help="comma-separated B x n x P")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    counting.set_backend("eager")
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, numpy {np.__version__}, "
          f"{torch.get_num_threads()} torch threads, block budget {counting._NUMPY_CHUNK_BYTES >> 10} KiB")
    print("| B x n x P | ours (ms) | numpy (ms, x ours) | torch (ms, x ours) | matmul d = 64 (ms) |")
    print("| --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        b, n, k = (int(x) for x in shape.split("x"))
        s = rng.standard_normal((b, n), dtype=np.float32)
        t = s[np.arange(b)[:, None], rng.integers(0, n, (b, k))]
        st, tt = torch.from_numpy(s), torch.from_numpy(t)
        ours, flags = counting.count_beating_checked(st, tt)
        plain, finite = _plain(s, t)
        assert np.array_equal(ours.numpy(), plain) and np.array_equal(flags.numpy(), finite)
        u, v = torch.randn(b, 64), torch.randn(n, 64)
        out = torch.empty(b, n)
        mine = _median_ms(lambda: counting.count_beating_checked(st, tt), args.repeats)
        ref_np = _median_ms(lambda: _plain(s, t), args.repeats)
        ref_t = _median_ms(lambda: _plain_torch(st, tt), args.repeats)
        mm = _median_ms(lambda: torch.matmul(u, v.T, out=out), args.repeats)
        print(f"| {b:,} x {n:,} x {k} | {mine:.1f} | {ref_np:.1f} ({ref_np / mine:.1f}x) | {ref_t:.1f} "
              f"({ref_t / mine:.1f}x) | {mm:.1f} |", flush=True)


if __name__ == "__main__":
    main()
